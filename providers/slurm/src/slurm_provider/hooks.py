"""``SlurmHook`` and ``SlurmAsyncHook``: one typed method per Slurm verb, over one SSH connection.

The hooks run the command lines of :mod:`slurm_provider.cli` through a transport
(:mod:`slurm_provider.transport`) and return what :mod:`slurm_provider.cli` and
:mod:`slurm_provider.job_status` make of the output. They never decide whether a job succeeded.

The file operations a workflow needs on the login node (make directories, write a file atomically,
list a tree, keep records) are verbs of the hook too (:mod:`slurm_provider.file_verbs`), so the
layers above never compose shell.

Each verb is written once, as a *plan* (:mod:`slurm_provider.verb_plans`, the file reads in
:mod:`slurm_provider.file_plans`): a generator that validates its arguments, yields the
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
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.sdk import BaseHook
from slurm_provider.cli.job_files import LogChunk
from slurm_provider.cli.sbatch import SubmitOptions, SubmitResult, TestOnlyResult
from slurm_provider.cli.squeue import SqueueRow
from slurm_provider.cli.sshare import TresMinutes
from slurm_provider.connection_form import CONN_TYPE, CONNECTION_FIELDS, HOOK_NAME, ui_field_behaviour
from slurm_provider.file_verbs import FileVerbs, RemoteCommandError
from slurm_provider.job_status import JobStatus
from slurm_provider.bad_nodes import NodeFault
from slurm_provider.watch.maintenance import Window
from slurm_provider.plans import Plan, RemoteCommand
from slurm_provider.scheduler_calls import calls_of, is_rate_limited, min_call_interval, slurm_verbs
from slurm_provider.slurm_versions import parse_slurm_version, version_words
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

from slurm_provider.file_plans import (
    read_log_plan,
    read_file_plan,
    file_sizes_plan,
    file_stamps_plan,
    poll_files_plan,
)
from slurm_provider.verb_plans import (
    CancelResult,
    DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_FIND_SINCE,
    ExclusiveSubmitResult,
    LOG_CHUNK_BYTES,
    SlurmCommandFailed,
    SlurmRateLimited,
    SlurmUnavailable,
    SubmitLockBusy,
    _options,
    account_jobs_plan,
    account_tres_plan,
    cancel_plan,
    exclusive_submit_plan,
    find_jobs_plan,
    live_writers_plan,
    maintenance_plan,
    node_faults_plan,
    ping_plan,
    release_plan,
    runs_plan,
    scontrol_show_plan,
    site_config_plan,
    statuses_plan,
    submit_plan,
    test_only_plan,
    unavailable_nodes_plan,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

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
        said = result.stdout.strip()
        version = parse_slurm_version(said)
        source = "sinfo --version" if version is not None else f"sinfo --version, which printed {said!r}"
        return True, f"logged in; {version_words(version, source)}"

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
