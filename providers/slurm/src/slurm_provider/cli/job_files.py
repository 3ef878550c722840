"""A job's files on the login node: log names, reading logs from an offset, file sizes and the
progress file, each read framed by markers so that a missing file is told from an empty one.
"""

from __future__ import annotations

import base64
import binascii
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_provider.cli.values import SlurmOutputError
from slurm_provider.validation import ValidationError, validate_remote_path

LOG_STREAMS = ("out", "err")
"""A job's output (``--output``) and error output (``--error``)."""


def job_log_name(job_name: str, job_id: str, stream: str = "out") -> str:
    """``<job name>.<job id>.out`` (or ``.err``): the one name of a job's log files, so that a job
    script's own ``#SBATCH --output``/``--error`` (``job_log_name("%x", "%j")``) and the operator's
    write where the operator reads."""
    if stream not in LOG_STREAMS:
        raise ValueError(f"log stream {stream!r} is not one of {', '.join(LOG_STREAMS)}")
    return f"{job_name}.{job_id}.{stream}"


LOG_MARKER = "__SLURM_PROVIDER_LOG__"


NOT_FOUND_MARKER = "__SLURM_PROVIDER_NOT_FOUND__"


def build_read_log(path: str, offset: int, max_bytes: int = 65536) -> str:
    """Read at most ``max_bytes`` of a log file from byte ``offset``.

    Prints one header line ``__SLURM_PROVIDER_LOG__ size=S offset=O count=N truncated=T`` and
    then exactly those N bytes, base64-encoded, so the parser gets the bytes unchanged and
    advances the offset by bytes, never by decoded characters. If the file is shorter than
    ``offset`` (log truncated, e.g. after a requeue), reading restarts at 0 with ``truncated=1``.
    A missing file prints ``__SLURM_PROVIDER_LOG__ missing``. Parse with ``slurm_provider.cli.job_files.parse_log_chunk``.
    """
    validate_remote_path(path, "log_path")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ValidationError("offset", f"{offset!r} is not a byte offset (an integer >= 0)", offset)
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or not 4 <= max_bytes <= 16 * 2**20:
        raise ValidationError(
            "max_bytes",
            f"{max_bytes!r} must be an integer between 4 (one UTF-8 character) and 16 MiB",
            max_bytes,
        )
    return (
        f"f={shlex.quote(path)}; o={offset}; m={max_bytes}; "
        'if [ -f "$f" ] && [ -r "$f" ]; then '
        's=$(wc -c < "$f" | tr -d " "); t=0; '
        'if [ "$s" -lt "$o" ]; then o=0; t=1; fi; '
        'n=$((s - o)); if [ "$n" -gt "$m" ]; then n=$m; fi; '
        f'printf "{LOG_MARKER} size=%s offset=%s count=%s truncated=%s\\n" "$s" "$o" "$n" "$t"; '
        'if [ "$n" -gt 0 ]; then tail -c +$((o + 1)) -- "$f" | head -c "$n" | base64; fi; '
        f'else printf "{LOG_MARKER} missing\\n"; fi'
    )


def build_file_sizes(paths: Sequence[str]) -> str:
    """Byte size of each existing file, one ``<index> <size>`` line each (missing files print nothing).

    One command for every log the poller streams, so only the logs that grew are read.
    """
    quoted = " ".join(shlex.quote(validate_remote_path(p, "paths")) for p in paths)
    return (f'i=0; for f in {quoted}; do if [ -f "$f" ]; then printf "%s %s\\n" "$i" "$(wc -c < "$f")"; fi; '
            "i=$((i + 1)); done")


def build_file_stamps(paths: Sequence[str]) -> str:
    """Size and modification time (whole seconds) of each existing file, one ``<index> <size> <mtime>``
    line each (missing files print nothing): what a file's identity is, where its size alone does
    not change when it is rewritten (a checkpoint of the same model). Parse with :func:`parse_file_stamps`."""
    quoted = " ".join(shlex.quote(validate_remote_path(p, "paths")) for p in paths)
    return (f'i=0; for f in {quoted}; do if [ -f "$f" ]; then printf "%s %s\\n" "$i" '
            "\"$(stat -L -c '%s %Y' -- \"$f\")\"; fi; i=$((i + 1)); done")


def parse_file_stamps(stdout: str, paths: Sequence[str]) -> dict[str, tuple[int, int]]:
    """``{path: (size, mtime)}`` of the files :func:`build_file_stamps` found, by the paths it was given."""
    stamps = {}
    for line in stdout.splitlines():
        words = line.split()
        if len(words) != 3 or not all(w.isdigit() for w in words) or int(words[0]) >= len(paths):
            raise SlurmOutputError(f"file stamps: unexpected line {line!r}")
        stamps[paths[int(words[0])]] = (int(words[1]), int(words[2]))
    return stamps


def build_poll_files(size_paths: Sequence[str], record_paths: Sequence[str]) -> str:
    """One command for what a poll reads of its jobs' files: the size of each log (``size <index>
    <bytes>``) and the first line of each exit record (``end <index> <line>``); missing files print
    nothing. Parse with :func:`parse_poll_files`."""
    def quoted(paths: Sequence[str], field: str) -> str:
        return " ".join(shlex.quote(validate_remote_path(p, field)) for p in paths)

    parts = []
    if size_paths:
        parts.append(f'i=0; for f in {quoted(size_paths, "size_paths")}; do if [ -f "$f" ]; then '
                     'printf "size %s %s\\n" "$i" "$(wc -c < "$f")"; fi; i=$((i + 1)); done')
    if record_paths:
        parts.append(f'i=0; for f in {quoted(record_paths, "record_paths")}; do if [ -f "$f" ]; then '
                     'printf "end %s %s\\n" "$i" "$(head -n 1 -- "$f" | head -c 200)"; fi; i=$((i + 1)); done')
    return "; ".join(parts) or "true"


def parse_poll_files(stdout: str, size_paths: Sequence[str],
                     record_paths: Sequence[str]) -> tuple[dict[str, int], dict[str, str]]:
    """``({log path: bytes}, {record path: its first line})`` from :func:`build_poll_files`'s output."""
    sizes: dict[str, int] = {}
    records: dict[str, str] = {}
    for line in stdout.splitlines():
        kind, _, rest = line.strip().partition(" ")
        index, _, value = rest.partition(" ")
        if kind == "size" and index.isdigit() and int(index) < len(size_paths) and value.strip().isdigit():
            sizes[size_paths[int(index)]] = int(value)
        elif kind == "end" and index.isdigit() and int(index) < len(record_paths):
            records[record_paths[int(index)]] = value
        else:
            raise SlurmOutputError(f"file read printed {line!r}")
    return sizes, records


def build_read_progress(path: str) -> str:
    """``cat`` a small progress file; prints ``__SLURM_PROVIDER_NOT_FOUND__`` if it does not exist
    (``slurm_provider.cli.job_files.parse_progress`` returns None then)."""
    validate_remote_path(path, "progress_path")
    quoted = shlex.quote(path)
    return f"if [ -f {quoted} ]; then cat -- {quoted}; else printf '%s\\n' {NOT_FOUND_MARKER}; fi"


_FILENAME_PATTERN = re.compile(r"%(?P<width>\d*)(?P<letter>[%AaJjNnstux])")


def expand_filename_pattern(
    pattern: str,
    *,
    job_id: str,
    job_name: str,
    user: str | None = None,
    array_job_id: str | None = None,
    array_task_id: str | None = None,
    first_node: str | None = None,
) -> str:
    """The file a batch job actually writes for an ``--output``/``--error`` pattern (``%x_%j.out``).

    squeue prints the pattern, not the file; the log reader needs the file. ``job_id`` is the
    job's own (raw) id, which for an array element differs from ``array_job_id``. A pattern
    containing a backslash is used verbatim, as Slurm does. Unknown values stay as written.
    """
    if "\\" in pattern:
        return pattern.replace("\\", "")

    def replace(match: re.Match[str]) -> str:
        letter, width = match.group("letter"), match.group("width")
        numeric = {
            "j": job_id,
            "A": array_job_id or job_id,
            "a": array_task_id,
            "n": "0",
            "t": "0",
        }
        if letter == "%":
            return "%"
        if letter in numeric:
            value = numeric[letter]
            if value is None:
                return match.group(0)
            return value.zfill(int(width)) if width and value.isdigit() else value
        text = {
            "x": job_name,
            "u": user,
            "N": first_node.split(".")[0] if first_node else None,
            "s": "batch",
            "J": f"{job_id}.batch",
        }[letter]
        return match.group(0) if text is None else text

    return _FILENAME_PATTERN.sub(replace, pattern)


@dataclass(frozen=True)
class LogChunk:
    """New bytes of a log file, decoded, and where to continue next time."""

    text: str
    offset: int
    """Byte offset the text starts at (0 after a truncation)."""
    new_offset: int
    """Offset for the next read: start + bytes consumed (an incomplete UTF-8 character at the end is
    left for the next read)."""
    file_size: int
    missing: bool
    truncated: bool
    """The file was shorter than the requested offset (rewritten, e.g. after a requeue); reading
    restarted at 0."""

    @property
    def has_more(self) -> bool:
        return self.new_offset < self.file_size


_LOG_HEADER = re.compile(
    rf"^{LOG_MARKER} size=(?P<size>\d+) offset=(?P<offset>\d+) count=(?P<count>\d+) truncated=(?P<t>[01])$"
)


def _incomplete_utf8_tail(data: bytes) -> int:
    """How many bytes at the end start a UTF-8 character that is not complete yet."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if byte & 0xE0 == 0xC0:
            needed = 2
        elif byte & 0xF0 == 0xE0:
            needed = 3
        elif byte & 0xF8 == 0xF0:
            needed = 4
        else:
            return 0
        return back if back < needed else 0
    return 0


def parse_log_chunk(output: str | bytes, requested_offset: int) -> LogChunk:
    """Read the output of ``slurm_provider.cli.job_files.build_read_log``."""
    text = output.decode("ascii", errors="replace") if isinstance(output, bytes) else output
    lines = text.splitlines()
    if not lines:
        raise SlurmOutputError("log read printed nothing (expected a header line)")
    header = lines[0].strip()
    if header == f"{LOG_MARKER} missing":
        return LogChunk("", requested_offset, requested_offset, 0, missing=True, truncated=False)
    match = _LOG_HEADER.match(header)
    if not match:
        raise SlurmOutputError(f"log read printed an unexpected header: {header[:200]!r}")
    start, count = int(match.group("offset")), int(match.group("count"))
    try:
        data = base64.b64decode("".join(line.strip() for line in lines[1:]), validate=True)
    except (binascii.Error, ValueError) as error:
        raise SlurmOutputError(f"log read returned invalid base64: {error}") from error
    if len(data) != count:
        raise SlurmOutputError(f"log read returned {len(data)} bytes, header announced {count}")
    keep = len(data) - _incomplete_utf8_tail(data)
    return LogChunk(
        text=data[:keep].decode("utf-8", errors="replace"),
        offset=start,
        new_offset=start + keep,
        file_size=int(match.group("size")),
        missing=False,
        truncated=match.group("t") == "1",
    )


def parse_progress(output: str | None) -> str | None:
    """The progress file's text, or None when ``slurm_provider.cli.job_files.build_read_progress`` found no file."""
    if output is None or output.strip() == NOT_FOUND_MARKER:
        return None
    return output
