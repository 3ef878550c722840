"""What every Slurm command here shares: the field separator, the pinned time format, and the
small values (durations, exit codes, TRES, job ids, host lists) that several commands print.

Output we cannot read raises :class:`SlurmOutputError`, which the hook and trigger treat as a
transient failure of the status call (warn and retry), never as a job failure.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slurm_provider.validation import duration_seconds

FIELD_SEPARATOR = "|"


TIME_FORMAT_ENV = "SLURM_TIME_FORMAT=standard"


def join_argv(argv: Sequence[str]) -> str:
    return shlex.join(argv)


class SlurmOutputError(ValueError):
    """Slurm printed something this module cannot read; the text is in the message."""


EMPTY_VALUES = {"", "None", "none", "N/A", "n/a", "(null)", "Unknown", "UNKNOWN", "None assigned"}




def parse_duration(text: str | None) -> int | None:
    """Seconds in a Slurm duration as printed by squeue/sacct/scontrol.

    ``1-02:03:04``, ``02:03:04``, ``03:04`` (minutes:seconds), ``1-02`` (days-hours), read by
    :func:`slurm_provider.validation.duration_seconds`, and a bare number (seconds). ``UNLIMITED``,
    ``INVALID``, ``Partition_Limit`` and empty text give None.
    """
    value = (text or "").strip()
    if value in EMPTY_VALUES:
        return None
    if value.isdigit():
        return int(value)
    return duration_seconds(value)


def format_duration(seconds: float | None, unknown: str = "") -> str:
    """``D-HH:MM:SS`` (``HH:MM:SS`` under a day) as Slurm prints a duration; ``unknown`` for None.

    The inverse of :func:`parse_duration` for whole seconds."""
    if seconds is None:
        return unknown
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def parse_exit_code(text: str | None) -> tuple[int | None, int | None]:
    """``(exit_code, signal)`` from Slurm's ``E:S``: ``3:0`` is exit code 3, ``0:9`` killed by signal 9.

    squeue's ``exit_code`` field prints the raw wait status (exit code times 256 plus signal);
    a bare number is read that way. Empty text gives ``(None, None)``.
    """
    value = (text or "").strip()
    if value in EMPTY_VALUES:
        return None, None
    if ":" in value:
        code, _, signal = value.partition(":")
        try:
            return int(code), int(signal)
        except ValueError:
            return None, None
    if value.isdigit():
        status = int(value)
        return status >> 8, status & 0x7F
    return None, None


def parse_slurm_time(text: str | None) -> str | None:
    """An ISO timestamp (``2026-02-16T08:30:00``, cluster local time) or None for Unknown/None/N/A."""
    value = (text or "").strip()
    if value in EMPTY_VALUES:
        return None
    if not re.match(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}$", value):
        return None
    return value


def slurm_minutes(stamp: str | None) -> str | None:
    """Slurm's ``2026-12-01T08:00:00`` to the minute, for people: ``2026-12-01 08:00``; None for no time."""
    return stamp.replace("T", " ")[:16] if stamp and stamp[:1].isdigit() else None


def parse_int(text: str | None) -> int | None:
    value = (text or "").strip()
    return int(value) if value.lstrip("-").isdigit() else None


def parse_tres(text: str | None) -> dict[str, str]:
    """``billing=4,cpu=1,gres/gpu=1,mem=1G,node=1`` as a dict (empty for empty text)."""
    result: dict[str, str] = {}
    for item in (text or "").split(","):
        key, sep, value = item.strip().partition("=")
        if sep and key:
            result[key] = value
    return result


def gpus_from_tres(text: str | None) -> int:
    """Number of GPUs (each GPU Slurm schedules, e.g. one GCD of a dual-die card) in a TRES string.

    Slurm reports typed GPUs twice (``gres/gpu=8,gres/gpu:mi250=8``); the untyped total wins,
    otherwise the typed counts are summed.
    """
    tres = parse_tres(text)
    if "gres/gpu" in tres:
        return parse_int(tres["gres/gpu"]) or 0
    return sum(parse_int(v) or 0 for k, v in tres.items() if k.startswith("gres/gpu:"))


def empty_to_none(text: str | None) -> str | None:
    value = (text or "").strip()
    return None if value in EMPTY_VALUES else value


_JOB_ID_TEXT = re.compile(
    r"^(?P<base>\d+)"
    r"(?:_(?P<task>\d+|\[[^\]]*\]))?"
    r"(?:\+(?P<het>\d+))?"
    r"(?:\.(?P<step>[A-Za-z0-9_+-]+))?$"
)


@dataclass(frozen=True)
class JobIdParts:
    """A Slurm job id taken apart: ``123``, ``123_4``, ``123_[5-7]``, ``123.batch``, ``123_4.0``."""

    text: str
    base: str
    array_task: str | None
    het_offset: str | None
    step: str | None

    @property
    def job(self) -> str:
        """The id without any step: ``123_4.batch`` -> ``123_4``."""
        return self.text.split(".", 1)[0]

    @property
    def is_step(self) -> bool:
        return self.step is not None

    @property
    def is_array_element(self) -> bool:
        return self.array_task is not None and not self.array_task.startswith("[")

    @property
    def is_array_range(self) -> bool:
        """A pending array remainder printed as one row (``123_[5-7]``)."""
        return self.array_task is not None and self.array_task.startswith("[")


def parse_job_id(text: str) -> JobIdParts:
    value = (text or "").strip()
    match = _JOB_ID_TEXT.match(value)
    if not match:
        raise SlurmOutputError(f"not a Slurm job id: {text!r}")
    return JobIdParts(
        value, match.group("base"), match.group("task"), match.group("het"), match.group("step")
    )


def is_invalid_job_id_error(stderr: str | None) -> bool:
    """squeue/scontrol's answer when none of the asked ids exists any more (exit status 1)."""
    return "Invalid job id specified" in (stderr or "")


CONTROLLER_UNAVAILABLE = (
    "Unable to contact slurm controller",
    "Socket timed out on send/recv operation",
    "Slurm temporarily unable to accept job",
    "Slurm backup controller in standby mode",
    "Zero Bytes were transmitted or received",
)
"""What sbatch and squeue print when ``slurmctld`` is down, restarting or overloaded: the request may
be tried again later (a timed-out ``sbatch`` may even have submitted the job: look before trying)."""

DATABASE_UNAVAILABLE = (
    "Problem talking to the database",
    "failed to open persistent connection",
    "Unable to connect to database",
)
"""What sacct (and sshare) print when ``slurmdbd`` does not answer: accounting is away for a while
(restarting, in maintenance), the jobs are not."""


def is_controller_unavailable(stderr: str | None) -> bool:
    """True when a Slurm command failed because no controller answered, not because of the request."""
    return any(message in (stderr or "") for message in CONTROLLER_UNAVAILABLE)


def is_slurm_unavailable(stderr: str | None) -> bool:
    """True when no controller or accounting database answered the command: Slurm is away, which
    passes, unlike an error Slurm answered with (an option it refuses, an unknown user, output that
    cannot be read), which stays until a person acts."""
    return is_controller_unavailable(stderr) or any(message in (stderr or "") for message in DATABASE_UNAVAILABLE)


def split_fields(line: str, names: Sequence[str], what: str) -> dict[str, str]:
    parts = line.split(FIELD_SEPARATOR)
    if len(parts) < len(names):
        raise SlurmOutputError(f"{what} line has {len(parts)} fields, expected {len(names)}: {line!r}")
    # Only the last field (Comment) is free text; separators inside it are joined back.
    head, tail = parts[: len(names) - 1], FIELD_SEPARATOR.join(parts[len(names) - 1 :])
    return dict(zip(names, [*head, tail], strict=True))


def output_lines(stdout: str | None) -> Iterable[str]:
    for line in (stdout or "").splitlines():
        if line.strip():
            yield line.rstrip("\r\n")


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in (p.strip() for p in parts) if p]


def expand_hostlist(text: str | None) -> list[str]:
    """``nid[005001-005003,005007],vcnode1`` -> every node name, zero padding kept."""
    nodes: list[str] = []
    for item in _split_top_level((text or "").strip()):
        nodes.extend(_expand_one(item))
    return nodes


def _expand_one(item: str) -> list[str]:
    match = re.match(r"^(?P<prefix>[^\[]*)\[(?P<ranges>[^\]]+)\](?P<rest>.*)$", item)
    if not match:
        return [item]
    expanded: list[str] = []
    for part in match.group("ranges").split(","):
        low, _, high = part.partition("-")
        if not high:
            values = [low]
        else:
            width = len(low)
            values = [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
        for value in values:
            for rest in _expand_one(match.group("rest")) if match.group("rest") else [""]:
                expanded.append(f"{match.group('prefix')}{value}{rest}")
    return expanded


def parse_tres_minutes(text: str | None) -> dict[str, int]:
    """``billing=60000,cpu=0,mem=1133`` -> TRES-minutes per TRES; ``N`` (no limit) and empty are left out."""
    minutes: dict[str, int] = {}
    for key, value in parse_tres(text).items():
        number = parse_int(value)
        if number is not None:
            minutes[key] = number
    return minutes
