"""Every Slurm verb the hooks offer, written once as a command plan (:mod:`slurm_provider.plans`):
a generator that validates its arguments, yields the :class:`RemoteCommand` it needs, receives the
:class:`CommandResult`, maybe yields one more, and returns the value. Pure: the sync hook drives a
plan with a blocking runner, the async hook with an asyncio runner, so both issue exactly the same
commands, and a plan is tested by feeding it answers.

Failures: :class:`SlurmCommandFailed` (a retryable ``TransportError``: the status call failed, the job
did not) when a read-only Slurm command gives no usable answer, and when ``sbatch`` met no controller
(:class:`SubmitLockBusy` when another submit held an exclusive directory's lock);
``slurm_provider.cli.sbatch.SbatchRefused`` with Slurm's own message when sbatch refuses a job.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
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
    SbatchRefused,
    SubmitOptions,
    SubmitResult,
    TestOnlyResult,
    build_sbatch_submit,
    build_sbatch_test_only,
    parse_sbatch_parsable,
    parse_sbatch_test_only,
    sbatch_error_message,
    script_account,
)
from slurm_provider.cli.exclusive_submit import (
    DONE_MARKER,
    EXIT_LOCK_BUSY,
    EXIT_NO_DIRECTORY,
    EXIT_QUERY_FAILED,
    LIVE_MARKER,
    MOVED_MARKER,
    build_exclusive_sbatch_submit,
    exclusive_dir_marker,
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
from slurm_provider.job_status import JobStatus, resolve_statuses
from slurm_provider.bad_nodes import NodeFault, node_faults
from slurm_provider.watch.maintenance import Window, maintenance_windows
from slurm_provider.plans import Plan, RemoteCommand
from slurm_provider.scheduler_calls import is_rate_limited
from slurm_provider.transport import CommandResult, TransportError
from slurm_provider.validation import (
    ValidationError,
    validate_job_id,
    validate_job_ids,
    validate_job_name,
)

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


def command_failed(verb: str, result: CommandResult) -> SlurmCommandFailed:
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
        raise command_failed("sbatch", result)


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
        raise command_failed("squeue", result)
    try:
        return parse_squeue(result.stdout)
    except SlurmOutputError as exc:
        raise SlurmCommandFailed(f"squeue printed output that cannot be read: {exc}", result) from exc


def _sacct_rows(result: CommandResult) -> list[SacctRow]:
    if result.exit_status != 0:
        raise command_failed("sacct", result)
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


def scontrol_show_plan(job_id: str | int) -> Plan[list[dict[str, str]]]:
    """``scontrol show job``: one ``Key -> Value`` dict per job (per element for arrays); [] if unknown."""
    result = yield RemoteCommand(build_scontrol_show_job(job_id), "scontrol")
    if result.exit_status != 0:
        if is_invalid_job_id_error(result.stderr):
            return []
        raise command_failed("scontrol show job", result)
    return parse_scontrol_show_job(result.stdout)


def ping_plan() -> Plan[dict[str, str]]:
    """The login node answers and a ``slurmctld`` answers it; the controllers' states.

    Raises :class:`SlurmUnavailable` (retryable) when no controller is up."""
    result = yield RemoteCommand(build_scontrol_ping(), "scontrol")
    try:
        states = parse_scontrol_ping(result.stdout)
    except SlurmOutputError as exc:
        raise command_failed("scontrol ping", result) from exc
    if "UP" not in states.values():
        said = ", ".join(f"{role} {state}" for role, state in states.items())
        raise SlurmUnavailable(f"no slurmctld answers the login node ({said})", result)
    return states


def site_config_plan() -> Plan[dict[str, str]]:
    """The controller's running settings (``scontrol show config``), by name: what a workflow checks
    about the site it relies on (accounting flags, private data)."""
    result = yield RemoteCommand(build_scontrol_show_config(), "scontrol")
    if result.exit_status != 0:
        raise command_failed("scontrol show config", result)
    try:
        return parse_scontrol_show_config(result.stdout)
    except SlurmOutputError as exc:
        raise SlurmCommandFailed(f"scontrol show config printed output that cannot be read: {exc}", result) from exc


def release_plan(job_id: str | int) -> Plan[None]:
    """Release a held job (``scontrol release``); Slurm's refusal is raised with its words."""
    result = yield RemoteCommand(build_scontrol_release(job_id), "scontrol")
    if result.exit_status != 0:
        raise command_failed("scontrol release", result)


def maintenance_plan() -> Plan[tuple[Window, ...]]:
    """The site's maintenance reservations that have not ended (``scontrol show reservation``)."""
    result = yield RemoteCommand(build_scontrol_show_reservations(), "scontrol")
    if result.exit_status != 0:
        raise command_failed("scontrol show reservation", result)
    try:
        return maintenance_windows(parse_scontrol_show_reservations(result.stdout))
    except SlurmOutputError as exc:
        raise SlurmCommandFailed(f"scontrol show reservation printed output that cannot be read: {exc}",
                                 result) from exc


def unavailable_nodes_plan(partition: str | None) -> Plan[dict[str, str]]:
    """Nodes sinfo reports down/drained/failing -> their state (feeds pending-reason classification)."""
    result = yield RemoteCommand(build_sinfo_unavailable_nodes(partition), "sinfo")
    if result.exit_status != 0:
        raise command_failed("sinfo", result)
    return parse_sinfo_unavailable(result.stdout)


def account_tres_plan(account: str, tres: str) -> Plan[TresMinutes | None]:
    """The account's ``GrpTRESMins`` limit on ``tres``, its usage and what running jobs hold (one sshare)."""
    result = yield RemoteCommand(build_sshare_account(account), "sshare")
    if result.exit_status != 0:
        raise command_failed("sshare", result)
    try:
        rows = parse_sshare(result.stdout)
    except SlurmOutputError as exc:
        raise SlurmCommandFailed(f"sshare printed output that cannot be read: {exc}", result) from exc
    return account_tres_minutes(rows, account, tres)


# --- the hooks ------------------------------------------------------------------------------------
