"""``SlurmHook`` and ``SlurmAsyncHook``: one typed method per Slurm verb, over one SSH connection.

The hooks run the command lines of :mod:`slurm_provider.cli` through a transport
(:mod:`slurm_provider.transport`) and return what :mod:`slurm_provider.cli` and
:mod:`slurm_provider.job_status` make of the output. They never decide whether a job succeeded.

The file operations a workflow needs on the login node (make directories, write a file atomically,
list a tree, keep records) are verbs of the hook too (:mod:`slurm_provider.file_verbs`), so the
layers above never compose shell.

Each verb is written once, as a *plan* (:mod:`slurm_provider.plans`): a generator that validates its arguments, yields the
:class:`RemoteCommand` it needs, receives the :class:`CommandResult`, maybe yields one more, and
returns the value. The sync hook drives plans with a blocking runner, the async hook with an
asyncio runner, so both hooks issue exactly the same commands. Every argument is validated in
the plan's first step, before anything reaches the cluster.

Failures: a :class:`TransportError` when the login node cannot be reached;
:class:`SlurmCommandFailed` (a retryable ``TransportError``: the status call failed, the job did
not) when a read-only Slurm command gives no usable answer, and when ``sbatch`` met no controller
(:class:`SubmitLockBusy` when another submit held an exclusive directory's lock): nothing says the
request was wrong, so trying later is the answer; ``slurm_provider.cli.sbatch.SbatchRefused`` with Slurm's own
message when sbatch refuses a job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.sdk import BaseHook

from slurm_provider.cli.job_files import (
    LogChunk,
    build_file_sizes,
    build_file_stamps,
    build_poll_files,
    build_read_log,
    build_read_progress,
    parse_file_stamps,
    parse_log_chunk,
    parse_poll_files,
    parse_progress,
)
from slurm_provider.cli.sacct import (
    SacctRow,
    build_sacct,
    build_sacct_by_name,
    build_sacct_own_jobs,
    parse_sacct,
    rows_by_job,
    runs_of,
)
from slurm_provider.cli.sbatch import (
    DONE_MARKER,
    EXIT_LOCK_BUSY,
    EXIT_NO_DIRECTORY,
    EXIT_QUERY_FAILED,
    LIVE_MARKER,
    MOVED_MARKER,
    SbatchRefused,
    JobComment,
    SubmitOptions,
    SubmitResult,
    TestOnlyResult,
    build_exclusive_sbatch_submit,
    build_sbatch_submit,
    build_sbatch_test_only,
    exclusive_dir_marker,
    parse_sbatch_parsable,
    parse_sbatch_test_only,
    sbatch_error_message,
    script_account,
)
from slurm_provider.cli.scancel import build_scancel
from slurm_provider.cli.scontrol import (
    build_scontrol_ping,
    build_scontrol_release,
    build_scontrol_show_config,
    build_scontrol_show_job,
    build_scontrol_show_reservations,
    parse_scontrol_ping,
    parse_scontrol_show_config,
    parse_scontrol_show_job,
    parse_scontrol_show_reservations,
)
from slurm_provider.cli.sinfo import build_sinfo_unavailable_nodes, parse_sinfo_unavailable
from slurm_provider.cli.squeue import (
    SqueueRow,
    build_squeue,
    build_squeue_account_jobs,
    build_squeue_by_name,
    build_squeue_live_jobs,
    build_squeue_own_jobs,
    parse_squeue,
)
from slurm_provider.cli.sshare import TresMinutes, account_tres_minutes, build_sshare_account, parse_sshare
from slurm_provider.cli.values import (
    SlurmOutputError,
    is_controller_unavailable,
    is_invalid_job_id_error,
    is_slurm_unavailable,
)
from slurm_provider.connection_form import CONN_TYPE, CONNECTION_FIELDS, HOOK_NAME, ui_field_behaviour
from slurm_provider.file_verbs import FileVerbs, RemoteCommandError
from slurm_provider.job_status import JobStatus, resolve_statuses
from slurm_provider.bad_nodes import NodeFault, node_faults
from slurm_provider.watch.maintenance import Window, maintenance_windows
from slurm_provider.plans import Plan, RemoteCommand
from slurm_provider.scheduler_calls import calls_of, is_rate_limited, min_call_interval, slurm_verbs
from slurm_provider.transport import (
    AsyncConnectionRunner,
    AsyncRemoteCommandRunner,
    CommandResult,
    RemoteCommandRunner,
    SSHCommand,
    TransportError,
    async_runner_for_connection,
    remote_user_for_connection,
    runner_for_connection,
    ssh_command_for_connection,
)
from slurm_provider.validation import (
    ValidationError,
    validate_job_id,
    validate_job_ids,
    validate_job_name,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_COMMAND_TIMEOUT = 60.0
SUBMIT_TIMEOUT = 120.0
"""sbatch on a busy production cluster can take tens of seconds to answer."""
DEFAULT_FIND_SINCE = "now-7days"
LOG_CHUNK_BYTES = 65536


class SlurmCommandFailed(TransportError):
    """A read-only Slurm command ran but gave no usable answer (slurmctld busy, unreadable output).

    Nothing is known about the jobs, so this is retryable like a dropped connection: the status
    call failed, the job did not. ``result`` holds the exit status and Slurm's stderr.
    """

    retryable = True
    slurm_away = False
    """True for :class:`SlurmUnavailable`: no controller or database answered (an outage), rather than
    an error Slurm answered with."""

    def __init__(self, message: str, result: CommandResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class SlurmRateLimited(SlurmCommandFailed):
    """Slurm answered that it will not serve us now (its rate limiter, or a controller too busy or away
    to answer): ask again later and less often; nothing is known about the jobs, none failed."""


class SlurmUnavailable(SlurmCommandFailed):
    """No controller or accounting database answered the command (``slurmctld`` or ``slurmdbd``
    restarting, a maintenance): Slurm is away while the login node answers. Waited out like a login
    node that does not answer, up to a watch's deadline. Any other :class:`SlurmCommandFailed` is an
    error Slurm answered with, which a watch retries only a few times (``outage.STEP_FAILURES_WHILE_REACHABLE``)."""

    slurm_away = True


class SubmitLockBusy(SlurmCommandFailed):
    """Another submit held the exclusive directory's lock for all of the wait: nothing was submitted.

    Retryable: the other submit ends, or its lock goes stale and is taken over, within minutes.
    """


@dataclass(frozen=True)
class CancelResult:
    """What ``scancel`` said. Slurm accepts cancelling a finished job silently."""

    job_id: str
    signal: str | None
    exit_status: int
    message: str | None
    """Slurm's error text, if it printed one."""

    @property
    def accepted(self) -> bool:
        return self.exit_status == 0 and not self.message


# --- plans: one per verb, pure apart from the commands they yield ---------------------------------

def _options(options: SubmitOptions | None, fields: Mapping[str, Any]) -> SubmitOptions:
    return SubmitOptions.of(options, **fields)


def _validate_script(script: str) -> str:
    if not isinstance(script, str) or not script.startswith("#!"):
        raise ValidationError(
            "script", "must be the text of a batch script starting with '#!' (e.g. #!/bin/bash)"
        )
    return script


def _failed(verb: str, result: CommandResult) -> SlurmCommandFailed:
    detail = result.stderr.strip() or result.stdout.strip() or "no output"
    kind = (SlurmRateLimited if is_rate_limited(result.stderr)
            else SlurmUnavailable if is_slurm_unavailable(result.stderr) else SlurmCommandFailed)
    return kind(f"{verb} exited {result.exit_status}: {detail[-1000:]}", result)


def _check_submit(result: CommandResult) -> None:
    """Raise the retryable error when ``sbatch`` (or the exclusive submit around it) failed for a
    reason that passes (no controller answered, the submit lock was busy) instead of refusing the job."""
    if result.exit_status == 0:
        return
    if result.exit_status in (EXIT_LOCK_BUSY, EXIT_QUERY_FAILED):
        raise SubmitLockBusy(f"{sbatch_error_message(result.stderr) or 'squeue did not answer under the submit lock'}"
                             ": nothing was submitted; try again in a few minutes", result)
    if is_controller_unavailable(result.stderr):
        raise _failed("sbatch", result)


def submit_plan(script: str, options: SubmitOptions) -> Plan[SubmitResult]:
    command = build_sbatch_submit(options)
    _validate_script(script)
    result = yield RemoteCommand(command, "sbatch", stdin=script, timeout=SUBMIT_TIMEOUT)
    _check_submit(result)
    return parse_sbatch_parsable(result.stdout, result.stderr)


@dataclass(frozen=True)
class ExclusiveSubmitResult:
    """A submit for a directory at most one live job may write: the new job, the live ones found, or
    the news that the directory's work is done."""

    job_id: str | None
    """The submitted job; None when a live job already writes the directory or it is done."""
    live: tuple[JobStatus, ...] = ()
    """Live jobs of the project (any user) whose comment names the directory, oldest first."""
    login_user: str | None = None
    """The user the login node ran the command as (set when ``live`` is): a live job of another
    user is never adopted."""
    done: bool = False
    """Every done marker of the directory exists: nothing was submitted, nothing is left to do."""
    moved: tuple[str, ...] = ()
    """Where a replacing submit moved the directories' earlier outputs."""


def exclusive_submit_plan(script: str, options: SubmitOptions, exclusive_dir: str, *,
                          done_markers: Sequence[str] = (), replace: str | None = None,
                          supersede: Sequence[str] = ()) -> Plan[ExclusiveSubmitResult]:
    _validate_script(script)
    command = build_exclusive_sbatch_submit(
        exclusive_dir=exclusive_dir, done_markers=done_markers, replace=replace, supersede=supersede,
        live_account=options.account or script_account(script), **options.as_kwargs())
    result = yield RemoteCommand(command, "sbatch", stdin=script, timeout=SUBMIT_TIMEOUT)
    _check_submit(result)
    _, found, rows_text = result.stdout.partition(LIVE_MARKER)
    if found:
        user_line, _, rows_text = rows_text.partition("\n")
        rows = parse_squeue(rows_text)
        statuses = resolve_statuses(sorted({row.job_id for row in rows}, key=_job_order), squeue_rows=rows)
        return ExclusiveSubmitResult(None, tuple(statuses.values()), login_user=user_line.strip() or None)
    if DONE_MARKER in result.stdout.split():
        return ExclusiveSubmitResult(None, done=True)
    moved = tuple(line.split(" ", 1)[1] for line in result.stdout.splitlines()
                  if line.startswith(MOVED_MARKER + " "))
    if result.exit_status == EXIT_NO_DIRECTORY:
        raise SbatchRefused(f"cannot create {exclusive_dir} or move its outputs aside: "
                            f"{(result.stderr or '').strip()[-1000:]}", result.stderr)
    return ExclusiveSubmitResult(parse_sbatch_parsable(result.stdout, result.stderr).job_id, moved=moved)


def account_jobs_plan(account: str) -> Plan[list[SqueueRow]]:
    """Every job Slurm lists for the account (all its users) and for the login user, every state."""
    return _squeue_rows((yield RemoteCommand(build_squeue_account_jobs(account), "squeue")))


def live_writers_plan(exclusive_dir: str, account: str | None = None) -> Plan[list[JobStatus]]:
    """Live jobs of the project (every user's, ``account``'s when given) whose comment names
    ``exclusive_dir`` (see ``exclusive_submit_plan``)."""
    rows = _squeue_rows((yield RemoteCommand(build_squeue_live_jobs(account), "squeue")))
    needle = f'"xdir":"{exclusive_dir_marker(exclusive_dir.rstrip("/") or "/")}"'
    writers = [row for row in rows if needle in (row.comment or "")]
    statuses = resolve_statuses(sorted({row.job_id for row in writers}, key=_job_order), squeue_rows=writers)
    return list(statuses.values())


def test_only_plan(script: str, options: SubmitOptions) -> Plan[TestOnlyResult]:
    command = build_sbatch_test_only(options)
    _validate_script(script)
    result = yield RemoteCommand(command, "sbatch", stdin=script, timeout=SUBMIT_TIMEOUT)
    return parse_sbatch_test_only(result.stderr)


test_only_plan.__test__ = False  # type: ignore[attr-defined]  # a plan, not a pytest test


def _squeue_rows(result: CommandResult) -> list[SqueueRow]:
    if result.exit_status != 0:
        if is_invalid_job_id_error(result.stderr):
            return []  # the only asked id is gone from slurmctld's memory
        raise _failed("squeue", result)
    try:
        return parse_squeue(result.stdout)
    except SlurmOutputError as exc:
        raise SlurmCommandFailed(f"squeue printed output that cannot be read: {exc}", result) from exc


def _sacct_rows(result: CommandResult) -> list[SacctRow]:
    if result.exit_status != 0:
        raise _failed("sacct", result)
    try:
        return parse_sacct(result.stdout)
    except SlurmOutputError as exc:
        raise SlurmCommandFailed(f"sacct printed output that cannot be read: {exc}", result) from exc


def statuses_plan(job_ids: Iterable[str | int]) -> Plan[dict[str, JobStatus]]:
    """One squeue for every id; one sacct only for ids squeue lists as finished or not at all."""
    ids = validate_job_ids(job_ids)
    if not ids:
        return {}
    squeue_rows = _squeue_rows((yield RemoteCommand(build_squeue(ids), "squeue")))
    live = {row.job_id for row in squeue_rows if not JobStatus.from_squeue(row).is_terminal}
    ask_sacct = [job_id for job_id in ids if job_id not in live]
    sacct_rows: list[SacctRow] = []
    if ask_sacct:
        sacct_rows = _sacct_rows((yield RemoteCommand(build_sacct(ask_sacct), "sacct")))
    return resolve_statuses(ids, squeue_rows=squeue_rows, sacct_rows=sacct_rows)


def runs_plan(job_id: str | int) -> Plan[list[JobStatus]]:
    """Every run of a (requeued) job from ``sacct -D``, oldest first; ``restarts`` = the run's index."""
    job = validate_job_id(job_id)
    rows = _sacct_rows((yield RemoteCommand(build_sacct([job], duplicates=True), "sacct")))
    return [JobStatus.from_sacct(row, restarts=index) for index, row in enumerate(runs_of(rows, job))]


def find_jobs_plan(name: str | None, comment_contains: str | None, since: str,
                   every_run: bool = False) -> Plan[list[JobStatus]]:
    """Jobs with this exact name and/or a comment containing the text, live (squeue) or since ``since``
    (sacct), oldest first. Used to adopt a job submitted before a worker died.

    ``every_run`` adds the earlier runs of requeued jobs (one status each, from ``sacct -D``) after
    the jobs themselves: each run ran on its own allocation, and billing counts them all.
    """
    if name is None and not comment_contains:
        raise ValidationError("name", "give a job name, comment_contains or both")
    if name is not None:
        validate_job_name(name)
        # Adoption by name stays within the login user: squeue --me, and sacct shows only the
        # caller's jobs (no --allusers).
        squeue_line, sacct_line = build_squeue_by_name(name, own=True), build_sacct_by_name(name, since=since)
    else:
        squeue_line, sacct_line = build_squeue_own_jobs(), build_sacct_own_jobs(since)
    squeue_rows = _squeue_rows((yield RemoteCommand(squeue_line, "squeue")))
    sacct_rows = _sacct_rows((yield RemoteCommand(sacct_line, "sacct")))
    ids = {row.job_id for row in squeue_rows} | {row.job_id for row in sacct_rows if not row.is_step}
    found = resolve_statuses(sorted(ids, key=_job_order), squeue_rows=squeue_rows, sacct_rows=sacct_rows)
    matching = [
        status for status in found.values()
        if (name is None or status.name == name)
        and (not comment_contains or comment_contains in (status.comment or ""))
    ]
    if not every_run:
        return matching
    by_job = rows_by_job(sacct_rows)
    earlier = [JobStatus.from_sacct(row, restarts=index)
               for status in matching if status.job_id in by_job
               for index, row in enumerate(by_job[status.job_id].runs[:-1])]
    return matching + earlier


def node_faults_plan(since: str, fault_exit_codes: Collection[int]) -> Plan[list[NodeFault]]:
    """The node faults (:mod:`slurm_provider.bad_nodes`) of the login user's jobs alive since ``since``:
    one ``sacct``, of the hours a bad node is left out for."""
    rows = _sacct_rows((yield RemoteCommand(build_sacct_own_jobs(since), "sacct")))
    return node_faults(rows, fault_exit_codes)


def _job_order(job_id: str | int) -> tuple[int, int]:
    base, _, task = str(job_id).partition("_")
    return int(base), int(task) if task.isdigit() else -1


def cancel_plan(job_id: str | int, signal: str | int | None) -> Plan[CancelResult]:
    job = validate_job_id(job_id)
    result = yield RemoteCommand(build_scancel([job], signal=signal), "scancel")
    message = result.stderr.strip() or None
    return CancelResult(job, None if signal is None else str(signal), result.exit_status, message)


def read_log_plan(path: str, offset: int, max_bytes: int) -> Plan[LogChunk]:
    result = yield RemoteCommand(build_read_log(path, offset, max_bytes), "read_log")
    if result.exit_status != 0:
        raise _failed(f"reading {path}", result)
    try:
        return parse_log_chunk(result.stdout, offset)
    except SlurmOutputError as exc:
        raise SlurmCommandFailed(f"reading {path}: {exc}", result) from exc


def read_file_plan(path: str) -> Plan[str | None]:
    result = yield RemoteCommand(build_read_progress(path), "read_file")
    if result.exit_status != 0:
        raise _failed(f"reading {path}", result)
    return parse_progress(result.stdout)


def file_sizes_plan(paths: Iterable[str]) -> Plan[dict[str, int]]:
    """Byte sizes of the files that exist (missing ones are left out), in one command."""
    wanted = list(dict.fromkeys(paths))
    if not wanted:
        return {}
    result = yield RemoteCommand(build_file_sizes(wanted), "file_sizes")
    if result.exit_status != 0:
        raise _failed("file size check", result)
    sizes = {}
    for line in result.stdout.splitlines():
        index, _, size = line.strip().partition(" ")
        if not (index.isdigit() and size.strip().isdigit() and int(index) < len(wanted)):
            raise SlurmCommandFailed(f"file size check printed {line!r}", result)
        sizes[wanted[int(index)]] = int(size)
    return sizes


def file_stamps_plan(paths: Iterable[str]) -> Plan[dict[str, tuple[int, int]]]:
    """Size and modification time of the files that exist (missing ones are left out), in one command."""
    wanted = list(dict.fromkeys(paths))
    if not wanted:
        return {}
    result = yield RemoteCommand(build_file_stamps(wanted), "file_stamps")
    if result.exit_status != 0:
        raise _failed("file stamp check", result)
    try:
        return parse_file_stamps(result.stdout, wanted)
    except SlurmOutputError as exc:
        raise SlurmCommandFailed(f"file stamp check printed output that cannot be read: {exc}", result) from exc


def poll_files_plan(size_paths: Iterable[str],
                    record_paths: Iterable[str]) -> Plan[tuple[dict[str, int], dict[str, str]]]:
    """Log sizes and exit records (:mod:`slurm_provider.watch.end_records`) in one command, no Slurm call
    (one more per ``POLL_FILES_CHUNK`` characters of paths: a shell takes a command line of 128 KiB)."""
    sizes, records = list(dict.fromkeys(size_paths)), list(dict.fromkeys(record_paths))
    found_sizes: dict[str, int] = {}
    found_records: dict[str, str] = {}
    for size_part, record_part in _chunks(sizes, records, POLL_FILES_CHUNK):
        result = yield RemoteCommand(build_poll_files(size_part, record_part), "poll_files")
        if result.exit_status != 0:
            raise _failed("reading the jobs' files", result)
        try:
            part_sizes, part_records = parse_poll_files(result.stdout, size_part, record_part)
        except SlurmOutputError as exc:
            raise SlurmCommandFailed(str(exc), result) from exc
        found_sizes.update(part_sizes)
        found_records.update(part_records)
    return found_sizes, found_records


POLL_FILES_CHUNK = 60_000
"""Characters of paths in one file-reading command."""


def _chunks(sizes: list[str], records: list[str], budget: int) -> list[tuple[list[str], list[str]]]:
    """``(size paths, record paths)`` parts whose paths add up to at most ``budget`` characters each."""
    parts: list[tuple[list[str], list[str]]] = []
    current: tuple[list[str], list[str]] = ([], [])
    used = 0
    for kind, path in [*((0, p) for p in sizes), *((1, p) for p in records)]:
        if used + len(path) > budget and (current[0] or current[1]):
            parts.append(current)
            current, used = ([], []), 0
        current[kind].append(path)
        used += len(path) + 3
    if current[0] or current[1]:
        parts.append(current)
    return parts


def scontrol_show_plan(job_id: str | int) -> Plan[list[dict[str, str]]]:
    """``scontrol show job``: one ``Key -> Value`` dict per job (per element for arrays); [] if unknown."""
    result = yield RemoteCommand(build_scontrol_show_job(job_id), "scontrol")
    if result.exit_status != 0:
        if is_invalid_job_id_error(result.stderr):
            return []
        raise _failed("scontrol show job", result)
    return parse_scontrol_show_job(result.stdout)


def ping_plan() -> Plan[dict[str, str]]:
    """The login node answers and a ``slurmctld`` answers it; the controllers' states.

    Raises :class:`SlurmUnavailable` (retryable) when no controller is up."""
    result = yield RemoteCommand(build_scontrol_ping(), "scontrol")
    try:
        states = parse_scontrol_ping(result.stdout)
    except SlurmOutputError as exc:
        raise _failed("scontrol ping", result) from exc
    if "UP" not in states.values():
        said = ", ".join(f"{role} {state}" for role, state in states.items())
        raise SlurmUnavailable(f"no slurmctld answers the login node ({said})", result)
    return states


def site_config_plan() -> Plan[dict[str, str]]:
    """The controller's running settings (``scontrol show config``), by name: what a workflow checks
    about the site it relies on (accounting flags, private data)."""
    result = yield RemoteCommand(build_scontrol_show_config(), "scontrol")
    if result.exit_status != 0:
        raise _failed("scontrol show config", result)
    try:
        return parse_scontrol_show_config(result.stdout)
    except SlurmOutputError as exc:
        raise SlurmCommandFailed(f"scontrol show config printed output that cannot be read: {exc}", result) from exc


def release_plan(job_id: str | int) -> Plan[None]:
    """Release a held job (``scontrol release``); Slurm's refusal is raised with its words."""
    result = yield RemoteCommand(build_scontrol_release(job_id), "scontrol")
    if result.exit_status != 0:
        raise _failed("scontrol release", result)


def maintenance_plan() -> Plan[tuple[Window, ...]]:
    """The site's maintenance reservations that have not ended (``scontrol show reservation``)."""
    result = yield RemoteCommand(build_scontrol_show_reservations(), "scontrol")
    if result.exit_status != 0:
        raise _failed("scontrol show reservation", result)
    try:
        return maintenance_windows(parse_scontrol_show_reservations(result.stdout))
    except SlurmOutputError as exc:
        raise SlurmCommandFailed(f"scontrol show reservation printed output that cannot be read: {exc}",
                                 result) from exc


def unavailable_nodes_plan(partition: str | None) -> Plan[dict[str, str]]:
    """Nodes sinfo reports down/drained/failing -> their state (feeds pending-reason classification)."""
    result = yield RemoteCommand(build_sinfo_unavailable_nodes(partition), "sinfo")
    if result.exit_status != 0:
        raise _failed("sinfo", result)
    return parse_sinfo_unavailable(result.stdout)


def account_tres_plan(account: str, tres: str) -> Plan[TresMinutes | None]:
    """The account's ``GrpTRESMins`` limit on ``tres``, its usage and what running jobs hold (one sshare)."""
    result = yield RemoteCommand(build_sshare_account(account), "sshare")
    if result.exit_status != 0:
        raise _failed("sshare", result)
    try:
        rows = parse_sshare(result.stdout)
    except SlurmOutputError as exc:
        raise SlurmCommandFailed(f"sshare printed output that cannot be read: {exc}", result) from exc
    return account_tres_minutes(rows, account, tres)


# --- the hooks ------------------------------------------------------------------------------------


class _CommandCounter:
    """Commands issued per verb, so callers (and the poll-cost benchmark) can see what a poll costs;
    the Slurm client calls among them also go to the connection's tally
    (:func:`slurm_provider.scheduler_calls.calls_of`)."""

    ssh_conn_id: str

    def __init__(self) -> None:
        self.command_counts: Counter[str] = Counter()

    @property
    def commands_issued(self) -> int:
        return sum(self.command_counts.values())

    def _count(self, command: RemoteCommand) -> None:
        self.command_counts[command.verb] += 1

    def _tally(self, verbs: tuple[str, ...], result: CommandResult, started: float) -> None:
        """Count the scheduler calls a command made once it ran (a refused call counts too), at the
        ``time.monotonic()`` it was started."""
        if not verbs:
            return
        calls = calls_of(self.ssh_conn_id)
        calls.record(verbs, now=started)
        if not result.ok and is_rate_limited(result.stderr):
            calls.rate_limited += 1


class SlurmHook(BaseHook, _CommandCounter, FileVerbs):
    """Slurm over SSH for operators and sensors (blocking). One connection, opened on first use.

    :param ssh_conn_id: Airflow connection of type ``slurm`` (or a plain ``ssh`` one); its extra
        ``transport`` picks ``paramiko`` (default) or ``openssh`` (ssh_config alias with a shared
        ControlMaster).
    :param command_timeout: seconds any one command may take (sbatch gets at least 120).
    :param runner: a ready transport, instead of the one the connection asks for.
    """

    conn_name_attr = "ssh_conn_id"
    default_conn_name = "slurm_default"
    conn_type = CONN_TYPE
    hook_name = HOOK_NAME

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """The ``slurm`` form's extra fields as WTForms fields (for Airflow versions that ask the hook).

        Airflow 3.2 and later read the same fields from the provider info without importing this hook.
        """
        from wtforms import BooleanField, PasswordField, StringField

        widgets: dict[str, Any] = {}
        for name, field in CONNECTION_FIELDS.items():
            kinds = field["schema"]["type"]
            if "boolean" in kinds:
                kind = BooleanField
            elif field["schema"].get("format") == "password":
                kind = PasswordField
            else:
                kind = StringField
            widgets[name] = kind(field["label"], description=field.get("description", ""),
                                 default=field["schema"].get("default"))
        return widgets

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Hidden and relabelled standard fields and placeholders of the ``slurm`` form."""
        return ui_field_behaviour()

    def __init__(
        self,
        ssh_conn_id: str = default_conn_name,
        *,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
        runner: RemoteCommandRunner | None = None,
    ) -> None:
        BaseHook.__init__(self)
        _CommandCounter.__init__(self)
        self.ssh_conn_id = ssh_conn_id
        self.command_timeout = command_timeout
        self._runner = runner

    @property
    def runner(self) -> RemoteCommandRunner:
        if self._runner is None:
            self._runner = runner_for_connection(self.ssh_conn_id)
        return self._runner

    @property
    def connections_opened(self) -> int:
        return getattr(self._runner, "connections_opened", 0) if self._runner is not None else 0

    def _drive(self, plan: Plan[T]) -> T:
        try:
            command = next(plan)
            while True:
                self._count(command)
                timeout = max(command.timeout or 0.0, self.command_timeout)
                started = time.monotonic()
                result = self.runner.run(command.line, stdin=command.stdin, timeout=timeout)
                self._tally(slurm_verbs(command.line), result, started)
                command = plan.send(result)
        except StopIteration as done:
            return done.value

    def submit(self, script: str, options: SubmitOptions | None = None, **fields: Any) -> SubmitResult:
        """Submit ``script`` (sent on stdin, never written to a file by us); returns the job id."""
        resolved = _options(options, fields)
        result = self._drive(submit_plan(script, resolved))
        log.info("Submitted job %s (%s) on %s", result.job_id, resolved.job_name, self.ssh_conn_id)
        return result

    def submit_exclusive(self, script: str, exclusive_dir: str, options: SubmitOptions | None = None, *,
                         done_markers: Sequence[str] = (), replace: str | None = None,
                         supersede: Sequence[str] = (), **fields: Any) -> ExclusiveSubmitResult:
        """Submit ``script`` unless a live job of the project already writes ``exclusive_dir`` or its
        ``done_markers`` exist (atomically, under a lock in that directory); the comment must carry
        the directory's digest. ``replace``/``supersede``: see ``build_exclusive_sbatch_submit``."""
        resolved = _options(options, fields)
        result = self._drive(exclusive_submit_plan(script, resolved, exclusive_dir, done_markers=done_markers,
                                                   replace=replace, supersede=supersede))
        for moved in result.moved:
            log.info("Moved the earlier outputs aside to %s", moved)
        if result.job_id is not None:
            log.info("Submitted job %s (%s) on %s", result.job_id, resolved.job_name, self.ssh_conn_id)
        return result

    def account_jobs(self, account: str) -> list[SqueueRow]:
        """Every job Slurm lists for ``account`` and for the login user, in any state (a job in both
        is listed twice): what still uses a code directory, for example."""
        return self._drive(account_jobs_plan(account))

    def live_writers(self, exclusive_dir: str, account: str | None = None) -> list[JobStatus]:
        """Live jobs of the project that write ``exclusive_dir`` (submitted with ``submit_exclusive``),
        oldest first, whoever submitted them."""
        return self._drive(live_writers_plan(exclusive_dir, account))

    def test_only(self, script: str, options: SubmitOptions | None = None, **fields: Any) -> TestOnlyResult:
        """``sbatch --test-only``: is the request valid, and when would it start? Consumes a job id."""
        return self._drive(test_only_plan(script, _options(options, fields)))

    def statuses(self, job_ids: Iterable[str | int]) -> dict[str, JobStatus]:
        """A status for every id (as text); an id neither squeue nor sacct knows is UNKNOWN."""
        return self._drive(statuses_plan(job_ids))

    def runs(self, job_id: str | int) -> list[JobStatus]:
        return self._drive(runs_plan(job_id))

    def find_jobs(self, name: str | None = None, comment_contains: str | None = None,
                  since: str = DEFAULT_FIND_SINCE, every_run: bool = False) -> list[JobStatus]:
        return self._drive(find_jobs_plan(name, comment_contains, since, every_run))

    def node_faults(self, since: str, fault_exit_codes: Collection[int] = ()) -> list[NodeFault]:
        """This login user's jobs since ``since`` that failed for their node's fault, oldest first."""
        return self._drive(node_faults_plan(since, fault_exit_codes))

    def cancel(self, job_id: str | int, signal: str | int | None = None) -> CancelResult:
        result = self._drive(cancel_plan(job_id, signal))
        log.info("Asked Slurm to %s job %s on %s", f"signal {signal}" if signal else "cancel", job_id,
                 self.ssh_conn_id)
        return result

    def read_log_chunk(self, path: str, offset: int = 0, max_bytes: int = LOG_CHUNK_BYTES) -> LogChunk:
        return self._drive(read_log_plan(path, offset, max_bytes))

    def read_log(self, path: str, offset: int = 0, max_bytes: int = LOG_CHUNK_BYTES) -> tuple[str, int]:
        """Text from byte ``offset`` and the offset to continue from; a missing file gives ("", offset)."""
        chunk = self.read_log_chunk(path, offset, max_bytes)
        return chunk.text, chunk.new_offset

    def read_file(self, path: str) -> str | None:
        """A small text file (progress marker), or None when it does not exist."""
        return self._drive(read_file_plan(path))

    def file_sizes(self, paths: Iterable[str]) -> dict[str, int]:
        return self._drive(file_sizes_plan(paths))

    def file_stamps(self, paths: Iterable[str]) -> dict[str, tuple[int, int]]:
        """``{path: (size, mtime)}`` of the files that exist, in one command."""
        return self._drive(file_stamps_plan(paths))

    def scontrol_show(self, job_id: str | int) -> list[dict[str, str]]:
        return self._drive(scontrol_show_plan(job_id))

    def unavailable_nodes(self, partition: str | None = None) -> dict[str, str]:
        return self._drive(unavailable_nodes_plan(partition))

    def site_config(self) -> dict[str, str]:
        """``scontrol show config``: the controller's settings by name (``{"PrivateData": "none", ...}``)."""
        return self._drive(site_config_plan())

    def ping(self) -> dict[str, str]:
        """``scontrol ping``: raises a retryable ``TransportError`` unless the login node and a
        controller answer; the controllers' states (``{"primary": "UP"}``)."""
        return self._drive(ping_plan())

    @contextlib.contextmanager
    def ssh_command(self) -> Iterator[SSHCommand]:
        """The system ``ssh`` command (and destination) that logs in exactly as this hook does, for
        ``rsync -e``: the connection's key and pinned host key, or its ssh_config alias and
        ControlMaster. Private files (key, known_hosts) exist only inside the ``with`` block."""
        with ssh_command_for_connection(self.ssh_conn_id) as command:
            yield command

    def remote_user(self) -> str:
        """The user name the login node sees (for paths such as ``/scratch/<user>``). No network."""
        return remote_user_for_connection(self.ssh_conn_id)

    def account_tres(self, account: str, tres: str = "billing") -> TresMinutes | None:
        """Limit (``GrpTRESMins``), usage and running jobs' share of one TRES of ``account``, in
        TRES-minutes; ``limit`` is None where the site sets none, the result None when sshare does
        not list the account. Raises :class:`SlurmCommandFailed` when sshare fails (no accounting)."""
        return self._drive(account_tres_plan(account, tres))

    def maintenance(self) -> tuple[Window, ...]:
        """The site's maintenance reservations that have not ended, earliest first."""
        return self._drive(maintenance_plan())

    def release(self, job_id: str | int) -> None:
        """Release a job held by a user hold (``JobHeldUser``); raises :class:`SlurmCommandFailed`."""
        self._drive(release_plan(job_id))

    def test_connection(self) -> tuple[bool, str]:
        """What the connection form's Test button shows: log in and ask Slurm for its version."""
        try:
            result = self.runner.run("sinfo --version", timeout=self.command_timeout)
        except (TransportError, ValueError) as exc:  # ValueError: extras the transport cannot use
            return False, str(exc)
        finally:
            self.close()
        if not result.ok:
            detail = (result.stderr or result.stdout).strip() or f"exit status {result.exit_status}"
            return False, f"logged in, but 'sinfo --version' failed ({detail}): is Slurm on the login node's PATH?"
        return True, f"logged in; {result.stdout.strip()}"

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()

    def __enter__(self) -> SlurmHook:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SlurmAsyncHook(BaseHook, _CommandCounter):
    """Slurm over SSH for triggers (asyncio). Keeps ONE connection open until :meth:`close`.

    Creating it does no I/O; the connection is looked up and opened by the first command.
    ``commands_issued``, ``command_counts`` and ``connections_opened`` say what polling cost.

    :param min_call_interval: least seconds between two scheduler calls of this connection in this
        process (every hook of the connection shares the pace); None: the connection's
        ``min_call_interval`` extra, or no ceiling.
    """

    conn_name_attr = "ssh_conn_id"
    default_conn_name = "slurm_default"
    conn_type = CONN_TYPE
    hook_name = "Slurm (async)"

    def __init__(
        self,
        ssh_conn_id: str = default_conn_name,
        *,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
        runner: AsyncRemoteCommandRunner | None = None,
        min_call_interval: float | None = None,
    ) -> None:
        BaseHook.__init__(self)
        _CommandCounter.__init__(self)
        self.ssh_conn_id = ssh_conn_id
        self.command_timeout = command_timeout
        self.runner = runner if runner is not None else async_runner_for_connection(ssh_conn_id)
        self._min_call_interval = min_call_interval

    async def min_call_interval(self) -> float:
        """The site's ceiling for this connection: seconds between scheduler calls (0: none)."""
        if self._min_call_interval is None:
            extra = await self.runner.extra() if isinstance(self.runner, AsyncConnectionRunner) else {}
            self._min_call_interval = min_call_interval(extra)
        return self._min_call_interval

    async def _wait_turn(self) -> None:
        """Keep the connection's scheduler calls ``min_call_interval`` apart, whoever makes them."""
        gap = await self.min_call_interval()
        if gap <= 0:
            return
        calls = calls_of(self.ssh_conn_id)
        delay = calls.reserve(gap)
        while True:
            if delay > 0:
                await asyncio.sleep(delay)
            delay = calls.claim(gap)
            if delay <= 0:
                return

    @property
    def connections_opened(self) -> int:
        return getattr(self.runner, "connections_opened", 0)

    async def _drive(self, plan: Plan[T]) -> T:
        try:
            command = next(plan)
            while True:
                self._count(command)
                timeout = max(command.timeout or 0.0, self.command_timeout)
                verbs = slurm_verbs(command.line)
                if verbs:
                    await self._wait_turn()
                started = time.monotonic()
                result = await self.runner.run(command.line, stdin=command.stdin, timeout=timeout)
                self._tally(verbs, result, started)
                command = plan.send(result)
        except StopIteration as done:
            return done.value

    async def submit(self, script: str, options: SubmitOptions | None = None, **fields: Any) -> SubmitResult:
        return await self._drive(submit_plan(script, _options(options, fields)))

    async def test_only(
        self, script: str, options: SubmitOptions | None = None, **fields: Any
    ) -> TestOnlyResult:
        return await self._drive(test_only_plan(script, _options(options, fields)))

    async def statuses(self, job_ids: Iterable[str | int]) -> dict[str, JobStatus]:
        return await self._drive(statuses_plan(job_ids))

    async def runs(self, job_id: str | int) -> list[JobStatus]:
        return await self._drive(runs_plan(job_id))

    async def find_jobs(self, name: str | None = None, comment_contains: str | None = None,
                        since: str = DEFAULT_FIND_SINCE, every_run: bool = False) -> list[JobStatus]:
        return await self._drive(find_jobs_plan(name, comment_contains, since, every_run))

    async def cancel(self, job_id: str | int, signal: str | int | None = None) -> CancelResult:
        return await self._drive(cancel_plan(job_id, signal))

    async def read_log_chunk(self, path: str, offset: int = 0, max_bytes: int = LOG_CHUNK_BYTES) -> LogChunk:
        return await self._drive(read_log_plan(path, offset, max_bytes))

    async def read_log(self, path: str, offset: int = 0, max_bytes: int = LOG_CHUNK_BYTES) -> tuple[str, int]:
        chunk = await self.read_log_chunk(path, offset, max_bytes)
        return chunk.text, chunk.new_offset

    async def read_file(self, path: str) -> str | None:
        return await self._drive(read_file_plan(path))

    async def file_sizes(self, paths: Iterable[str]) -> dict[str, int]:
        return await self._drive(file_sizes_plan(paths))

    async def poll_files(self, size_paths: Iterable[str],
                         record_paths: Iterable[str]) -> tuple[dict[str, int], dict[str, str]]:
        return await self._drive(poll_files_plan(size_paths, record_paths))

    async def scontrol_show(self, job_id: str | int) -> list[dict[str, str]]:
        return await self._drive(scontrol_show_plan(job_id))

    async def unavailable_nodes(self, partition: str | None = None) -> dict[str, str]:
        return await self._drive(unavailable_nodes_plan(partition))

    async def ping(self) -> dict[str, str]:
        return await self._drive(ping_plan())

    async def site_config(self) -> dict[str, str]:
        return await self._drive(site_config_plan())

    async def account_tres(self, account: str, tres: str = "billing") -> TresMinutes | None:
        return await self._drive(account_tres_plan(account, tres))

    async def maintenance(self) -> tuple[Window, ...]:
        return await self._drive(maintenance_plan())

    async def release(self, job_id: str | int) -> None:
        await self._drive(release_plan(job_id))

    async def close(self) -> None:
        await self.runner.close()


if TYPE_CHECKING:
    from slurm_provider.protocols import SlurmVerbs

    def _verbs(hook: SlurmHook) -> SlurmVerbs:
        """The blocking hook offers every verb of :class:`~slurm_provider.protocols.SlurmVerbs` (mypy checks)."""
        return hook
