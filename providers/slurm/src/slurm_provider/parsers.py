"""Pure parsers for what Slurm prints, matched to the command lines in :mod:`slurm_provider.commands`.

Parsers return rows of plain values exactly as Slurm meant them (times as ISO text in the
cluster's local time, durations in seconds, ids as text). They do not decide what a state
means; :mod:`slurm_provider.states` and :mod:`slurm_provider.status` do.

Output we cannot read raises :class:`SlurmOutputError`, which the hook/trigger treat as a
transient failure of the status call (warn and retry), never as a job failure.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slurm_provider.commands import (
    FIELD_SEPARATOR,
    LOG_MARKER,
    NOT_FOUND_MARKER,
    SACCT_FIELDS,
    SQUEUE_FIELDS,
    SSHARE_FIELDS,
)


class SlurmOutputError(ValueError):
    """Slurm printed something this module cannot read; the text is in the message."""


class SbatchRefused(RuntimeError):
    """sbatch refused the job (bad partition, account, limits...). ``message`` is Slurm's own text."""

    def __init__(self, message: str, stderr: str) -> None:
        super().__init__(message)
        self.message = message
        self.stderr = stderr


# --- small values --------------------------------------------------------------------------------

_EMPTY_VALUES = {"", "None", "none", "N/A", "n/a", "(null)", "Unknown", "UNKNOWN", "None assigned"}
_DURATION = re.compile(r"^(?:(?P<d>\d+)-)?(?P<rest>\d+(?::\d+){0,2})$")


def parse_duration(text: str | None) -> int | None:
    """Seconds in a Slurm duration as printed by squeue/sacct/scontrol.

    ``1-02:03:04``, ``02:03:04``, ``03:04`` (minutes:seconds), ``1-02`` (days-hours) and a bare
    number (seconds). ``UNLIMITED``, ``INVALID``, ``Partition_Limit`` and empty text give None.
    """
    value = (text or "").strip()
    if value in _EMPTY_VALUES:
        return None
    match = _DURATION.match(value)
    if not match:
        return None
    days = int(match.group("d") or 0)
    parts = [int(p) for p in match.group("rest").split(":")]
    if match.group("d") is not None and len(parts) == 1:
        hours, minutes, seconds = parts[0], 0, 0
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) == 2:
        hours, (minutes, seconds) = 0, parts
    else:
        hours, minutes, seconds = 0, 0, parts[0]
    return days * 86400 + hours * 3600 + minutes * 60 + seconds


def parse_exit_code(text: str | None) -> tuple[int | None, int | None]:
    """``(exit_code, signal)`` from Slurm's ``E:S``: ``3:0`` is exit code 3, ``0:9`` killed by signal 9.

    squeue's ``exit_code`` field prints the raw wait status (exit code times 256 plus signal);
    a bare number is read that way. Empty text gives ``(None, None)``.
    """
    value = (text or "").strip()
    if value in _EMPTY_VALUES:
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
    if value in _EMPTY_VALUES:
        return None
    if not re.match(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}$", value):
        return None
    return value


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


def _empty_to_none(text: str | None) -> str | None:
    value = (text or "").strip()
    return None if value in _EMPTY_VALUES else value


# --- job ids -------------------------------------------------------------------------------------

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


# --- sbatch --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmitResult:
    job_id: str
    cluster: str | None


_PARSABLE = re.compile(r"^(?P<id>\d+)(?:;(?P<cluster>\S+))?$")
_SBATCH_ERROR = re.compile(r"^sbatch: error: (?P<msg>.*)$", re.MULTILINE)


def parse_sbatch_parsable(stdout: str, stderr: str = "") -> SubmitResult:
    """``<id>`` or ``<id>;<cluster>`` from ``sbatch --parsable`` (the last such line; sbatch may
    print warnings first). Raises :class:`SbatchRefused` with Slurm's message when there is no id."""
    for line in reversed((stdout or "").strip().splitlines()):
        match = _PARSABLE.match(line.strip())
        if match:
            return SubmitResult(match.group("id"), match.group("cluster"))
    message = sbatch_error_message(stderr) or sbatch_error_message(stdout)
    raise SbatchRefused(
        message
        or f"sbatch printed no job id (stdout: {stdout.strip()!r}, stderr: {(stderr or '').strip()!r})",
        stderr,
    )


def sbatch_error_message(stderr: str | None) -> str | None:
    """Slurm's own error sentence(s) from sbatch's stderr, without the ``sbatch: error:`` prefix."""
    messages = [m.group("msg").strip() for m in _SBATCH_ERROR.finditer(stderr or "")]
    return "; ".join(messages) if messages else None


@dataclass(frozen=True)
class TestOnlyResult:
    """What ``sbatch --test-only`` predicts."""

    __test__ = False  # not a pytest test class

    job_id: str
    start: str | None
    processors: int | None
    nodes: str | None
    partition: str | None


_TEST_ONLY = re.compile(
    r"sbatch: Job (?P<id>\d+) to start at (?P<start>\S+) using (?P<procs>\d+) processors? "
    r"on nodes? (?P<nodes>\S+) in partition (?P<partition>\S+)"
)


def parse_sbatch_test_only(stderr: str) -> TestOnlyResult:
    """The estimate ``sbatch --test-only`` prints on stderr; :class:`SbatchRefused` if it refused."""
    match = _TEST_ONLY.search(stderr or "")
    if match:
        return TestOnlyResult(
            job_id=match.group("id"),
            start=parse_slurm_time(match.group("start")),
            processors=int(match.group("procs")),
            nodes=match.group("nodes"),
            partition=match.group("partition"),
        )
    message = sbatch_error_message(stderr)
    fallback = f"sbatch --test-only printed no estimate: {(stderr or '').strip()!r}"
    raise SbatchRefused(message or fallback, stderr)


# --- squeue --------------------------------------------------------------------------------------


def _split_fields(line: str, names: Sequence[str], what: str) -> dict[str, str]:
    parts = line.split(FIELD_SEPARATOR)
    if len(parts) < len(names):
        raise SlurmOutputError(f"{what} line has {len(parts)} fields, expected {len(names)}: {line!r}")
    # Only the last field (Comment) is free text; separators inside it are joined back.
    head, tail = parts[: len(names) - 1], FIELD_SEPARATOR.join(parts[len(names) - 1 :])
    return dict(zip(names, [*head, tail], strict=True))


def _lines(stdout: str | None) -> Iterable[str]:
    for line in (stdout or "").splitlines():
        if line.strip():
            yield line.rstrip("\r\n")


@dataclass(frozen=True)
class SqueueRow:
    """One job (or array element) from ``commands.build_squeue``."""

    job_id: str
    """``123``, or ``123_4`` for an array element (squeue's own JobID field is the element's raw id)."""
    job_id_raw: str
    array_job_id: str | None
    array_task_id: str | None
    state: str
    reason: str | None
    restarts: int
    name: str
    partition: str | None
    account: str | None
    user: str | None
    node_list: str | None
    time_used_s: int | None
    time_limit_s: int | None
    submit: str | None
    start: str | None
    end: str | None
    tres: str | None
    exit_code: int | None
    signal: int | None
    std_out: str | None
    std_err: str | None
    work_dir: str | None
    comment: str | None


def parse_squeue(stdout: str | None) -> list[SqueueRow]:
    """Rows of ``squeue -h -O ...`` output in the fixed field order of ``SQUEUE_FIELDS``.

    Empty output (no such jobs) gives an empty list.
    """
    rows = []
    for line in _lines(stdout):
        f = _split_fields(line, SQUEUE_FIELDS, "squeue")
        parse_job_id(f["JobID"])  # refuse lines that are not job rows
        exit_code, signal = parse_exit_code(f["exit_code"])
        raw_id = f["JobID"].strip()
        array_job_id = _empty_to_none(f["ArrayJobID"])
        array_task_id = _empty_to_none(f["ArrayTaskID"])
        is_element = array_task_id is not None and array_job_id is not None
        rows.append(
            SqueueRow(
                job_id=f"{array_job_id}_{array_task_id}" if is_element else raw_id,
                job_id_raw=raw_id,
                array_job_id=array_job_id if is_element else None,
                array_task_id=array_task_id if is_element else None,
                state=f["State"].strip(),
                reason=_empty_to_none(f["Reason"]),
                restarts=parse_int(f["RestartCnt"]) or 0,
                name=f["Name"],
                partition=_empty_to_none(f["Partition"]),
                account=_empty_to_none(f["Account"]),
                user=_empty_to_none(f["UserName"]),
                node_list=_empty_to_none(f["NodeList"]),
                time_used_s=parse_duration(f["TimeUsed"]),
                time_limit_s=parse_duration(f["TimeLimit"]),
                submit=parse_slurm_time(f["SubmitTime"]),
                start=parse_slurm_time(f["StartTime"]),
                end=parse_slurm_time(f["EndTime"]),
                tres=_empty_to_none(f["tres-alloc"]),
                exit_code=exit_code,
                signal=signal,
                std_out=_empty_to_none(f["STDOUT"]),
                std_err=_empty_to_none(f["STDERR"]),
                work_dir=_empty_to_none(f["WorkDir"]),
                comment=_empty_to_none(f["Comment"]),
            )
        )
    return rows


# --- sacct ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SacctRow:
    """One row of ``commands.build_sacct``: a job, an array element, or a step of one."""

    job_id: str
    job_id_raw: str
    name: str
    state: str
    exit_code: int | None
    signal: int | None
    derived_exit_code: int | None
    reason: str | None
    elapsed_s: int | None
    start: str | None
    end: str | None
    submit: str | None
    node_list: str | None
    alloc_tres: str | None
    partition: str | None
    account: str | None
    user: str | None
    time_limit_s: int | None
    work_dir: str | None
    comment: str | None
    row_index: int
    """Position in sacct's output (sacct prints the runs of a requeued job oldest first)."""

    @property
    def id_parts(self) -> JobIdParts:
        return parse_job_id(self.job_id)

    @property
    def is_step(self) -> bool:
        return self.id_parts.is_step

    @property
    def step(self) -> str | None:
        return self.id_parts.step

    @property
    def job(self) -> str:
        """The job (or array element) this row belongs to: ``123_4.batch`` -> ``123_4``."""
        return self.id_parts.job


def parse_sacct(stdout: str | None) -> list[SacctRow]:
    """Rows of ``sacct --parsable2 --noheader --format=<SACCT_FIELDS>``; empty output gives []."""
    rows = []
    for index, line in enumerate(_lines(stdout)):
        f = _split_fields(line, SACCT_FIELDS, "sacct")
        parse_job_id(f["JobID"])
        exit_code, signal = parse_exit_code(f["ExitCode"])
        derived, _ = parse_exit_code(f["DerivedExitCode"])
        elapsed = parse_int(f["ElapsedRaw"])
        rows.append(
            SacctRow(
                job_id=f["JobID"].strip(),
                job_id_raw=f["JobIDRaw"].strip(),
                name=f["JobName"],
                state=f["State"].strip(),
                exit_code=exit_code,
                signal=signal,
                derived_exit_code=derived,
                reason=_empty_to_none(f["Reason"]),
                elapsed_s=elapsed if elapsed is not None else parse_duration(f["Elapsed"]),
                start=parse_slurm_time(f["Start"]),
                end=parse_slurm_time(f["End"]),
                submit=parse_slurm_time(f["Submit"]),
                node_list=_empty_to_none(f["NodeList"]),
                alloc_tres=_empty_to_none(f["AllocTRES"]),
                partition=_empty_to_none(f["Partition"]),
                account=_empty_to_none(f["Account"]),
                user=_empty_to_none(f["User"]),
                time_limit_s=parse_duration(f["Timelimit"]),
                work_dir=_empty_to_none(f["WorkDir"]),
                comment=_empty_to_none(f["Comment"]),
                row_index=index,
            )
        )
    return rows


def _run_order(row: SacctRow) -> tuple[str, int]:
    return (row.submit or "", row.row_index)


def latest_job_rows(rows: Iterable[SacctRow]) -> dict[str, SacctRow]:
    """The newest run of each job (step rows ignored), keyed by its JobID (``123``, ``123_4``).

    ``sacct -D`` prints one row per run of a requeued job. Slurm stamps a new Submit time on
    every requeue, so the row with the latest Submit wins; equal Submit times (same second)
    go to the later row, because sacct prints runs oldest first.
    """
    latest: dict[str, SacctRow] = {}
    for row in rows:
        if row.is_step:
            continue
        current = latest.get(row.job_id)
        if current is None or _run_order(row) >= _run_order(current):
            latest[row.job_id] = row
    return latest


def runs_of(rows: Iterable[SacctRow], job_id: str) -> list[SacctRow]:
    """Every run of one job, oldest first (step rows ignored)."""
    return sorted((r for r in rows if not r.is_step and r.job_id == job_id), key=_run_order)


def steps_of(rows: Iterable[SacctRow], job_id: str) -> list[SacctRow]:
    """The step rows (``.batch``, ``.extern``, ``.0`` ...) of one job or array element."""
    return [r for r in rows if r.is_step and r.job == job_id]


# --- scontrol ------------------------------------------------------------------------------------

_SCONTROL_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")


def parse_scontrol_show_job(stdout: str | None) -> list[dict[str, str]]:
    """``scontrol show job -o``: one dict per line (per array element), every ``Key=Value``.

    Values may contain spaces (``JobName=probe one``, ``StdOut=/path with space/x.out``); a value
    ends where the next `` Key=`` begins. Keys with a colon (``AllocNode:Sid``) are kept whole.
    """
    records = []
    for line in _lines(stdout):
        text = line.strip()
        matches = list(_SCONTROL_KEY.finditer(text))
        if not matches or not text.startswith("JobId="):
            raise SlurmOutputError(f"not a 'scontrol show job -o' line: {text[:200]!r}")
        record: dict[str, str] = {}
        for i, match in enumerate(matches):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
            record[match.group(1)] = text[match.end() : end].strip()
        records.append(record)
    return records


# --- sinfo and host lists ------------------------------------------------------------------------


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
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


def parse_sinfo_unavailable(stdout: str | None) -> dict[str, str]:
    """``node -> state`` from ``commands.build_sinfo_unavailable_nodes`` (``drained``, ``down*`` ...)."""
    nodes: dict[str, str] = {}
    for line in _lines(stdout):
        node_list, _, rest = line.partition(FIELD_SEPARATOR)
        state = rest.partition(FIELD_SEPARATOR)[0].strip()
        for node in expand_hostlist(node_list):
            nodes[node] = state
    return nodes


# --- sshare: association limits and usage ------------------------------------------------------


def parse_tres_minutes(text: str | None) -> dict[str, int]:
    """``billing=60000,cpu=0,mem=1133`` -> TRES-minutes per TRES; ``N`` (no limit) and empty are left out."""
    minutes: dict[str, int] = {}
    for key, value in parse_tres(text).items():
        number = parse_int(value)
        if number is not None:
            minutes[key] = number
    return minutes


@dataclass(frozen=True)
class AssociationRow:
    """One association as ``sshare`` prints it (``commands.build_sshare_account``), in TRES-minutes."""

    account: str
    user: str | None
    """``None`` for the account's own association (the one a project allocation is set on)."""
    limits: dict[str, int]
    """``GrpTRESMins``: TRES -> minutes the association may use in total; a TRES without a limit is absent."""
    used: dict[str, int]
    """``GrpTRESRaw``: TRES -> minutes used so far (what Slurm compares with ``limits``)."""
    running: dict[str, int]
    """``TRESRunMins``: TRES -> minutes the association's running jobs may still use (time limit left)."""


def parse_sshare(stdout: str | None) -> list[AssociationRow]:
    """Rows of ``commands.build_sshare_account``; sshare indents user rows with a space."""
    rows = []
    for line in _lines(stdout):
        fields = _split_fields(line, SSHARE_FIELDS, "sshare")
        account = fields["Account"].strip()
        if not account:
            raise SlurmOutputError(f"sshare line names no account: {line!r}")
        rows.append(AssociationRow(
            account=account,
            user=fields["User"].strip() or None,
            limits=parse_tres_minutes(fields["GrpTRESMins"]),
            used=parse_tres_minutes(fields["GrpTRESRaw"]),
            running=parse_tres_minutes(fields["TRESRunMins"]),
        ))
    return rows


@dataclass(frozen=True)
class TresMinutes:
    """One TRES of an account's own association, in TRES-minutes, as Slurm enforces ``GrpTRESMins``."""

    account: str
    tres: str
    limit: int | None
    """``None``: the account has no ``GrpTRESMins`` limit on this TRES."""
    used: int
    running: int

    @property
    def left(self) -> int | None:
        """What a new job may still use: the limit less usage and running jobs' remaining time."""
        return None if self.limit is None else self.limit - self.used - self.running


def account_tres_minutes(rows: Iterable[AssociationRow], account: str,
                         tres: str = "billing") -> TresMinutes | None:
    """The account's own association (no user) for ``tres``; ``None`` when sshare did not list it."""
    for row in rows:
        if row.account == account and row.user is None:
            return TresMinutes(account=account, tres=tres, limit=row.limits.get(tres),
                               used=row.used.get(tres, 0), running=row.running.get(tres, 0))
    return None


# --- log tail and progress file ------------------------------------------------------------------


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
    """Read the output of ``commands.build_read_log``."""
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
    """The progress file's text, or None when ``commands.build_read_progress`` found no file."""
    if output is None or output.strip() == NOT_FOUND_MARKER:
        return None
    return output
