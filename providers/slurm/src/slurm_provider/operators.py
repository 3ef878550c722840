"""``SlurmSubmitOperator``: submit a batch job over SSH, wait deferred, interpret the end.

Submission is idempotent. Every job of a task carries a deterministic name and a JSON comment
(DAG, task, run, stage, submission number); the job ids are kept in the task state store and in
the trigger event. Before submitting, and after a submit whose answer was lost (SSH dropped after
``sbatch`` ran), the operator looks the job up on the cluster and adopts it instead of submitting
a duplicate. Waiting states never fail the task; an interrupted end (time limit, node failure,
preemption without requeue) is resubmitted within per-cause budgets when the job made progress.

A login node that does not answer is waited out, not failed: the watch waits in the triggerer, and
the task's own steps defer on :class:`~slurm_provider.login_wait.SlurmLoginTrigger` until it answers,
both up to ``watch_deadline``. Task retries are for a lost watch only (worker or triggerer lost,
the login node unreachable for longer than that): every task retries by default, and a retry adopts
the job it finds. A job that itself ended badly (failed, out of memory, cancelled, can never start,
resubmission budget spent) fails the task with :class:`AirflowFailException`, which Airflow never
retries, so a broken job is not submitted again behind anyone's back.

When the task gives up on a job that Slurm still keeps in its queue (a reason that means it can
never start, ``SPECIAL_EXIT`` held for a person, an interrupted job Slurm requeued but the policy
refuses to wait for again), the job is cancelled with the reason logged, unless
``keep_job_on_give_up`` asks to leave it there for a person; the failure message says which.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import uuid
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    retry_if_not_result,
    stop_after_attempt,
    stop_after_delay,
    wait_fixed,
)
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

if TYPE_CHECKING:
    from airflow.sdk import Context

    from slurm_provider.hooks import SlurmHook

from slurm_provider.timing import (
    FIRST_POLL_DELAY,
    LOOKUP_RETRY,
    MAX_POLL_INTERVAL,
    POLL_INTERVAL,
    SHORT_JOB_READ_INTERVAL,
    SHORT_JOB_WAIT,
    NODE_FAULT_RETRY,
)
from slurm_provider.bad_nodes import (
    LEFT_OUT_XCOM_KEY,
    NODE_FAULT,
    NODE_LEVEL_CAUSES,
    NodeFault,
    is_node_fault,
    job_faults,
    left_out_words,
    left_out_xcom,
    nodes_to_leave_out,
    same_fault_elsewhere,
)
from slurm_provider.end_records import end_record_path, parse_end_record
from slurm_provider.file_verbs import RemoteCommandError
from slurm_provider.cli.job_files import job_log_name
from slurm_provider.cli.sbatch import (
    DEFAULT_PROJECT_TAG,
    JobComment,
    SbatchRefused,
    exclusive_dir_marker,
    parse_job_comment,
)
from slurm_provider.exit_codes import explain_exit
from slurm_provider.followed_files import FOLLOW_INTERVAL, followed_files, load_fold
from slurm_provider.hints import find_submit_hints, format_hints, hint_for
from slurm_provider.job_status import JobStatus
from slurm_provider.links import JOB_ID_XCOM_KEY, SlurmJobLogLink
from slurm_provider.login_wait import SlurmLoginTrigger
from slurm_provider.outage import (
    DEFAULT_WATCH_DEADLINE,
    STEP_FAILURES_WHILE_REACHABLE,
    Outage,
    command_failed_line,
    gave_up_line,
    still_failing_line,
    timeout_seconds,
    unreachable_line,
)
from slurm_provider.resubmission import (
    ADOPTED,
    DEFAULT_BUDGETS,
    KILLED,
    WATCHED_AGAIN,
    Submission,
    SubmissionHistory,
    decide_resubmission,
    killed_from_outside,
)
from slurm_provider.state_vocabulary import SlurmState, StateCategory
from slurm_provider.transport import TransportError
from slurm_provider.triggers import SlurmJobTrigger
from slurm_provider.watch.events import ERROR, LOST, NEVER_STARTS, REACHABLE, LoginEvent, WatchEvent
from slurm_provider.watch.end_confirmation import EndConfirmation, confirm_schedule
from slurm_provider.validation import (
    ValidationError,
    validate_account,
    validate_extra_sbatch_options,
    validate_partition,
    validate_remote_path,
    validate_time_limit,
)

HISTORY_KEY = "slurm_submissions"
SUBMITTER_KEY = "slurm_submitter"
"""Task state store key of the task's submitter token (``JobComment.by``)."""
LOG_TAIL_BYTES = 12000
TAIL_LINES = 25
TRACEBACK_LINES = 80
_TRACEBACK_START = "Traceback (most recent call last):"


def log_excerpt(text: str, lines: int = TAIL_LINES, traceback_lines: int = TRACEBACK_LINES) -> str:
    """The end of a log for a failure message: its last ``lines`` lines, or, when the end holds a
    Python traceback, everything from the last traceback's first line (at most ``traceback_lines``),
    so the frames that say where it went wrong are not cut off."""
    all_lines = text.splitlines()
    start = next((i for i in range(len(all_lines) - 1, -1, -1) if _TRACEBACK_START in all_lines[i]), None)
    if start is None or len(all_lines) - start <= lines:
        return "\n".join(all_lines[-lines:])
    return "\n".join(all_lines[start:][-traceback_lines:])


_CODE_VERSION = re.compile(r"^[A-Za-z0-9._:+-]{1,128}$")

# Task retries of a job task: enough to ride out a lost worker or a cluster login node that is down
# for a while (2-4 min, then 4-8 min with Airflow's jittered doubling), never resubmitting a failed job.
DEFAULT_RETRIES = 2
DEFAULT_RETRY_DELAY = timedelta(minutes=2)
DEFAULT_RETRY_EXPONENTIAL_BACKOFF = 2.0
DEFAULT_MAX_RETRY_DELAY = timedelta(minutes=30)


def _with_note(exc: Exception, note: str) -> Exception:
    """``exc`` again, of the same type where it can be rebuilt from a message, with ``note`` appended."""
    try:
        return type(exc)(f"{exc}\n{note}")
    except Exception:
        return AirflowException(f"{exc}\n{note}")


def _seconds(value: timedelta | float) -> float:
    """A duration given as a timedelta or as seconds, in seconds."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _utc_stamp() -> str:
    """A stamp for the directories a fresh start moves aside (``<dir>.replaced-<stamp>``)."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _submitter(job: JobStatus, comment: JobComment | None) -> str:
    """Which task submitted a job, for people: DAG, run and task from its comment."""
    if comment is None:
        return f"job name {job.name}"
    return f"DAG {comment.dag}, run {comment.run}, task {comment.task}"


def job_name_for(dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> str:
    """Deterministic, Slurm-safe job name of one task in one DAG run (the key adoption searches by)."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{dag_id}.{task_id}")[:80]
    digest = hashlib.sha1(f"{dag_id}\0{task_id}\0{run_id}\0{map_index}".encode()).hexdigest()[:10]
    return f"{base}.{digest}"


class SlurmSubmitOperator(BaseOperator):
    """Submit a batch script to Slurm and succeed when the job completes.

    :param conn_id: Airflow connection of the cluster's login node (type ``slurm``, or ``ssh`` with the
        same extras).
    :param script: the complete batch script (``#!/bin/bash`` + ``#SBATCH`` lines + body); sent on
        stdin to ``sbatch --parsable``, never left in a file the user must manage.
    :param log_dir: directory on the cluster for the job's output (``<job name>.<job id>.out``) and
        error output (``<job name>.<job id>.err``); both are streamed into the task log.
    :param partition, account, time_limit: override the script's ``#SBATCH`` values (validated).
    :param sbatch_options: further ``sbatch`` flags; flags the operator owns (``--job-name``,
        ``--output``, ``--comment``, ``--parsable``...) are refused.
    :param export: extra environment variables for the job (``--export=ALL,K=V``).
    :param stage: a label stored in the job comment (e.g. the training stage).
    :param project_tag: the ``project`` of the job comment (default ``airflow``): tells one project's
        jobs from another's in ``squeue``/``sacct`` (``--comment``), e.g. for a ledger of its GPU-hours.
    :param code_version: the version of the code the script runs (e.g. a content hash), stored in
        the job comment so that cleanups on the cluster keep what live jobs use, and so that a live
        job of ``exclusive_dir`` running other code is never adopted.
    :param progress_path: a file on the cluster that grows when the job makes progress (e.g. the
        trainer's ``progress.json``); read before resubmitting an interrupted job.
    :param resubmit_budgets: resubmissions allowed per interrupting state (``TIMEOUT``, ``NODE_FAIL``,
        ``PREEMPTED``, ``BOOT_FAIL``).
    :param pending_policy: ``fail`` (default) or ``warn`` when the pending reason means the job can
        never start.
    :param gpu_billing_factor: GPU-hours billed per GPU wall-hour (1.0 where one GPU-hour is billed as one).
    :param exit_code_meanings: what the script's own exit codes mean (``{86: "..."}``), said in the
        failure message next to Slurm's state; signals and shell codes are explained without it.
    :param exclusive_dir: the directory on the cluster the job writes (e.g. a training stage's
        output directory). At most one live job writes it, whatever DAG run, clear, Airflow
        deployment or project member submitted it: before submitting, the operator looks
        (atomically, under a lock in that directory held by a live holder) for a live job of the
        project's account whose comment names it. A job of the login user is adopted (watched
        instead of submitting a second writer); one of another user, or one running another
        ``code_version``, fails the task, naming the job and what to do.
    :param done_markers: files inside ``exclusive_dir`` (e.g. ``COMPLETE``) whose presence means the
        job's work is done. Looked at under the same lock, after the live-writer lookup: a directory
        that is done gets no job, and the task is skipped (:meth:`on_already_done`).
    :param replace_outputs: a fresh start: under the lock, after the live-writer lookup, what
        ``exclusive_dir`` holds is moved to ``<exclusive_dir>.replaced-<UTC stamp>`` before ``sbatch``
        (``done_markers`` are not looked at), and what each of ``supersede_dirs`` holds (outputs
        computed from the old ones) to ``<dir>.superseded-<stamp>``; a live job writing any of them
        fails the task instead.
    :param retries, retry_delay, retry_exponential_backoff, max_retry_delay: Airflow's task retries,
        here on by default (``DEFAULT_RETRIES`` tries more, from 2 minutes apart, doubling). A retry
        adopts the job it finds; a job that ended badly fails the task without retry. Set them per
        task or per DAG (``default_args``); ``retries=0`` turns them off.
    :param hint_overrides: a site's own advice for known failure signatures, by hint key (see
        :mod:`slurm_provider.hints`), used instead of the generic text.
    :param keep_job_on_give_up: when the task fails while its job is still in Slurm's queue (pending
        for a reason that never resolves, held after ``SPECIAL_EXIT``, requeued after an end the
        policy does not resubmit), leave the job there for a person instead of cancelling it.
    :param follow: more files of the job its watch reads as they grow, each ``{"path", "fold"}``
        (:mod:`slurm_provider.followed_files`): a UI shows what the fold made of them while the job runs.
    :param follow_interval: least seconds between two size checks of the followed files (60).
    :param short_job_wait: seconds the task watches a job it just submitted itself, reading the job's
        exit record (:mod:`slurm_provider.end_records`) every second, before it defers (0, the default:
        it defers at once). A job that ends within them (a preflight, a data check) completes the task
        there, its output in the task log, without waiting for the trigger's first poll (at least
        ``first_poll_delay`` after the deferral); the task holds its worker slot meanwhile, and one
        Slurm call confirms the end. A job that runs on, requeues itself or cannot be read is watched by
        the trigger as usual.
    :param writes_end_record: the script writes its exit record (:func:`slurm_provider.end_records.end_record_shell`)
        whenever it ends on its own. A job Slurm calls ``FAILED`` by a signal with no record of that
        run was then killed from outside before its script could end (an administrator's kill, a
        controller that lost the job's start): an interruption, resubmitted within the ``KILLED``
        budget like a node failure, never taken for a failure of what the job ran.
    :param watch_deadline: how long (a timedelta or seconds; 24 hours by default) the task waits for
        something outside its job before it gives up on this try: a login node that does not answer
        (a retry adopts the job), or a job pending on its account's allocation
        (``AssocGrpBillingMinutes``) while the account's running jobs hold what it needs (then it
        fails, and the job is cancelled like any job the task gives up on). A job whose allocation
        the usage alone has spent fails at once.
    :param release_held: release the job (once per watch) when it is put on user hold
        (``JobHeldUser``), as some sites do to queued GPU jobs after a maintenance break, saying so in the
        task log; False (the default): the task log says that the job waits for a release and how to
        give it (``scontrol release``).
    :param leave_out_bad_nodes_for: how long (a timedelta or seconds; 0, the default: never) a node where
        this login user's jobs failed for the node's fault (``NODE_FAIL``, ``BOOT_FAIL``, or one of
        ``node_fault_exit_codes``) is left out of this task's submissions (``--exclude``, said in the
        task log; :mod:`slurm_provider.bad_nodes`). A job that ended so is resubmitted (``NODE_FAULT``
        budget for the exit codes) to start no sooner than ``node_fault_first_retry`` seconds later,
        doubling with each such resubmission (``--begin``: the job waits in Slurm's queue, not in a worker).
    :param node_fault_exit_codes: exit codes of the script that mean the node is at fault (its container
        runtime would not start, its GPUs are missing), counted only with ``leave_out_bad_nodes_for``.
    :param node_fault_first_retry: seconds the first resubmission after a node's fault waits before it may start.

    A login node that does not answer (refused, reset, timed out, no ``slurmctld``) is a wait, not a
    failure, because the jobs run on without it: maintenance breaks at HPC sites last hours, longer than
    any sensible retry budget (the default retries cover about six minutes), and a retry that meets
    the node still down would only spend another one. So the watch waits in the triggerer and says
    so once in the task log ("login node of ... unreachable since 14:02 ...; job 123 last seen
    RUNNING; waiting up to 24 h"); and when one of the task's own steps meets the outage (adopting or
    submitting, reading how the job ended, a subclass's checks before submitting) the task defers on
    :class:`~slurm_provider.login_wait.SlurmLoginTrigger`, which holds no worker slot and spends no
    retry, and starts its step over when the node answers: what was submitted is adopted (by the
    job ids in the task state store, or by name and comment when ``sbatch``'s answer was lost). Both
    waits end past ``watch_deadline`` with a plain :class:`AirflowException`, which a task retry
    follows, adopting the job. A busy submit lock (``exclusive_dir``) or a controller that refused to
    talk is retried by Airflow's task retries, as nothing was submitted.
    """

    template_fields: Sequence[str] = ("script", "log_dir", "partition", "account", "time_limit",
                                      "sbatch_options", "export", "stage", "progress_path", "code_version",
                                      "exclusive_dir")
    template_fields_renderers = {"script": "bash"}
    operator_extra_links = (SlurmJobLogLink(),)
    ui_color = "#d9ecf2"

    def __init__(self, *, conn_id: str, script: str, log_dir: str, partition: str | None = None,
                 account: str | None = None, time_limit: str | None = None,
                 sbatch_options: Sequence[str] = (), export: Mapping[str, str] | None = None,
                 stage: str | None = None, progress_path: str | None = None, code_version: str | None = None,
                 resubmit_budgets: Mapping[str, int] | None = None, pending_policy: str = "fail",
                 poll_interval: float = POLL_INTERVAL, max_poll_interval: float = MAX_POLL_INTERVAL,
                 first_poll_delay: float = FIRST_POLL_DELAY, gpu_billing_factor: float = 1.0,
                 exit_code_meanings: Mapping[int, str] | None = None, exclusive_dir: str | None = None,
                 hint_overrides: Mapping[str, str] | None = None, project_tag: str = DEFAULT_PROJECT_TAG,
                 retries: int | None = DEFAULT_RETRIES, retry_delay: timedelta | float = DEFAULT_RETRY_DELAY,
                 retry_exponential_backoff: float = DEFAULT_RETRY_EXPONENTIAL_BACKOFF,
                 max_retry_delay: timedelta | float | None = DEFAULT_MAX_RETRY_DELAY,
                 keep_job_on_give_up: bool = False, done_markers: Sequence[str] = (),
                 replace_outputs: bool = False, supersede_dirs: Sequence[str] = (),
                 short_job_wait: float = SHORT_JOB_WAIT, writes_end_record: bool = False,
                 watch_deadline: timedelta | float = DEFAULT_WATCH_DEADLINE,
                 follow: Sequence[Mapping[str, str]] = (), follow_interval: float = FOLLOW_INTERVAL,
                 release_held: bool = False, leave_out_bad_nodes_for: timedelta | float = 0.0,
                 node_fault_exit_codes: Sequence[int] = (), node_fault_first_retry: float = NODE_FAULT_RETRY.base,
                 **kwargs: Any) -> None:
        # Named parameters (not kwargs.setdefault): Airflow fills a parameter of this signature from
        # the DAG's default_args when the task does not set it, so default_args win over these defaults.
        super().__init__(retries=retries, retry_delay=retry_delay, max_retry_delay=max_retry_delay,
                         retry_exponential_backoff=retry_exponential_backoff, **kwargs)
        self.conn_id = conn_id
        self.script = script
        self.log_dir = log_dir
        self.partition = partition
        self.account = account
        self.time_limit = time_limit
        self.sbatch_options = sbatch_options
        self.export = export
        self.stage = stage
        self.progress_path = progress_path
        self.code_version = code_version
        self.resubmit_budgets = dict(DEFAULT_BUDGETS if resubmit_budgets is None else resubmit_budgets)
        self.pending_policy = pending_policy
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        self.first_poll_delay = first_poll_delay
        self.gpu_billing_factor = gpu_billing_factor
        self.exit_code_meanings = {int(k): str(v) for k, v in (exit_code_meanings or {}).items()}
        self.exclusive_dir = exclusive_dir
        self.hint_overrides = dict(hint_overrides or {})
        self.project_tag = project_tag
        self.keep_job_on_give_up = keep_job_on_give_up
        self.done_markers = tuple(done_markers)
        self.replace_outputs = replace_outputs
        self.supersede_dirs = tuple(supersede_dirs)
        self.release_held = release_held
        self.leave_out_bad_nodes_for = leave_out_bad_nodes_for
        self.node_fault_exit_codes = tuple(int(code) for code in node_fault_exit_codes)
        self.node_fault_first_retry = node_fault_first_retry
        self.short_job_wait = short_job_wait
        self.writes_end_record = writes_end_record
        self.watch_deadline = watch_deadline
        self.follow = [dict(spec) for spec in follow]
        self.follow_interval = follow_interval
        self._outage: tuple[float, int] | None = None
        """(since, probes) of the outage this try already waited through, carried by the login wait's event."""
        self._failures_while_reachable = 0
        """Steps of this try that failed right after the login node answered again (carried likewise)."""

    # --- execute: adopt or submit, then defer ------------------------------------------------------

    def execute(self, context: Context) -> Any:
        try:
            self._validate()
        except ValidationError as exc:
            raise AirflowFailException(str(exc)) from exc
        with self.waiting_out_outages(context), self._hook() as hook:
            return self._adopt_or_submit(context, hook)

    # --- a login node that does not answer --------------------------------------------------------

    @contextlib.contextmanager
    def waiting_out_outages(self, context: Context) -> Iterator[None]:
        """Run steps that talk to the cluster; when the login node does not answer, defer on
        :class:`SlurmLoginTrigger` and start over in :meth:`execute_after_outage` once it does.

        A failure waiting cannot heal (host key, authentication, configuration) raises
        :class:`AirflowException`: a person fixes the connection and a task retry goes on.
        """
        try:
            yield
        except TransportError as exc:
            if not exc.retryable:
                raise AirflowException(f"cannot use the cluster connection {self.conn_id}: {exc}. Once it is "
                                       "fixed, a retry of this task adopts any job it submitted") from exc
            self._wait_for_login_node(context, exc)

    def _wait_for_login_node(self, context: Context, exc: TransportError) -> None:
        from slurm_provider.hooks import SlurmCommandFailed

        since, tries = self._outage if self._outage is not None else (time.time(), 0)
        outage = Outage(since, str(exc))
        deadline = self._deadline_seconds()
        if outage.is_past(deadline):
            raise AirflowException(f"{gave_up_line(self.conn_id, outage, deadline)}. A retry "
                                   "of this task adopts any job it submitted") from exc
        failures = self._failures_while_reachable
        if self._outage is not None and isinstance(exc, SlurmCommandFailed) and not exc.slurm_away:
            failures += 1  # the login node answered a moment ago, and a command of this step ran and failed
            if failures >= STEP_FAILURES_WHILE_REACHABLE:
                raise AirflowException(f"{still_failing_line(self.conn_id, failures, str(exc))}. A retry of "
                                       "this task adopts any job it submitted") from exc
        if self._outage is None:
            self.log.warning("%s", command_failed_line(self.conn_id, str(exc), deadline)
                             if isinstance(exc, SlurmCommandFailed) else unreachable_line(self.conn_id, outage, deadline))
        else:
            self.log.warning("Login node of %s answers scontrol ping, but this step still failed (%s): waiting "
                             "on", self.conn_id, exc)
        self.defer(trigger=SlurmLoginTrigger(conn_id=self.conn_id, since=since, cause=str(exc),
                                             watch_deadline=deadline,
                                             poll_interval=self.poll_interval,
                                             max_poll_interval=self.max_poll_interval, tries=tries,
                                             carry={"failures_while_reachable": failures}),
                   method_name="execute_after_outage")

    def execute_after_outage(self, context: Context, event: dict[str, Any]) -> Any:
        """The login node answers again: do this try's work from the start (``execute``), adopting
        whatever it submitted before the outage. Past the deadline: a retryable failure."""
        try:
            ended = LoginEvent.from_json(event)
        except ValueError as exc:
            raise AirflowException(f"{exc}. A retry of this task adopts any job it submitted") from None
        if ended.kind != REACHABLE:
            raise AirflowException(f"{ended.message}. A retry of this task adopts any job it submitted")
        self._outage = (ended.since, ended.tries)
        self._failures_while_reachable = int(ended.carry.get("failures_while_reachable") or 0)
        return self.execute(context)

    def _adopt_or_submit(self, context: Context, hook: SlurmHook) -> Any:
        stored = self._stored_history(context)
        history = stored.since_clear(self._clear_number(context))
        if len(history.submissions) < len(stored.submissions):
            self.log.info("The DAG run was cleared since jobs %s: this task submits afresh",
                          ", ".join(j for j in stored.job_ids if j not in history.job_ids))
        current = history.current
        if current is not None:
            status = hook.statuses([current.job_id]).get(current.job_id)
            if status is not None and status.state.category is StateCategory.WAITING:
                self.log.info("Adopting job %s (%s) submitted earlier by this task", current.job_id,
                              status.state.value)
                return self._defer(context, history)
            if status is not None and status.state.is_success:
                self.log.info("Job %s already completed", current.job_id)
                return self._finish(context, hook, history, status)
            if status is not None and status.state.is_retryable:
                return self._after_interruption(context, hook, history, status)
            if status is not None and self._node_fault(hook, history, status):
                return self._after_interruption(context, hook, history, status, cause=NODE_FAULT)
            if status is not None and status.state.is_terminal:
                # The watch was lost and the job ended badly meanwhile: the same as seeing it end.
                ended = status if status.state.keeps_place_in_queue else self._accounted(hook, status)
                left = self._give_up(context, hook, current.job_id, f"it ended {ended.state.value}", history)
                raise AirflowFailException(f"{self._failure_message(hook, ended, context)}\n{left}".rstrip())
            self.log.info("Previous job %s is known neither to squeue nor to sacct; this try submits a new "
                          "job", current.job_id)
            return self._submit(context, hook, history, cause="retry")
        adopted = self._find_own_job(context, hook, number=1)
        if adopted is not None:
            self.log.info("Adopting job %s (%s) found by name %s", adopted.job_id, adopted.state.value,
                          self._job_name(context))
            history.add(Submission(adopted.job_id, 1, "initial", self._try_number(context),
                                   clear_number=self._clear_number(context)))
            self._store_history(context, history)
            if adopted.state.is_success:
                return self._finish(context, hook, history, adopted)
            return self._defer(context, history)
        return self._submit(context, hook, history, cause="initial")

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        try:
            ended = WatchEvent.from_json(event)
        except ValueError as exc:
            raise AirflowFailException(str(exc)) from None
        history = SubmissionHistory.merge(self.history_since_clear(context),
                                          SubmissionHistory.from_json(ended.carry.get("history")),
                                          ).since_clear(self._clear_number(context))
        self._store_history(context, history)
        with self.waiting_out_outages(context), self._hook() as hook:
            return self._interpret(context, hook, history, ended)

    def _interpret(self, context: Context, hook: SlurmHook, history: SubmissionHistory, ended: WatchEvent) -> Any:
        """Map the trigger's event to success, a resubmission, a retry (lost watch) or a final failure."""
        if ended.kind == ERROR:
            raise AirflowException(f"{ended.message}. The job may still be running: a retry of this "
                                   "task adopts it instead of submitting again.")
        if ended.kind == LOST:
            raise AirflowException(f"{ended.message}; check `sacct -j {ended.job_id}` on the cluster. A retry "
                                   "of this task looks for the job again before submitting another.")
        if ended.kind == NEVER_STARTS:
            left = self._give_up(context, hook, ended.job_id, ended.message, history)
            raise AirflowFailException(f"{ended.message}.\n{left}".rstrip())
        assert ended.status is not None  # a finished event always carries one (WatchEvent)
        return self._conclude(context, hook, history, ended.status)

    def _conclude(self, context: Context, hook: SlurmHook, history: SubmissionHistory, status: JobStatus) -> Any:
        """Success, a resubmission or a final failure for a job that ended in ``status``."""
        job_id = status.job_id
        if not status.state.keeps_place_in_queue:  # SPECIAL_EXIT has no final accounting row yet
            status = self._accounted(hook, status)
        if status.state.is_success:
            return self._finish(context, hook, history, status)
        if status.state.is_retryable:
            return self._after_interruption(context, hook, history, status)
        if self._killed_from_outside(context, hook, status):
            return self._after_interruption(context, hook, history, status, cause=KILLED)
        if self._node_fault(hook, history, status):
            return self._after_interruption(context, hook, history, status, cause=NODE_FAULT)
        message = self._failure_message(hook, status, context)
        left = self._give_up(context, hook, job_id, f"it ended {status.state.value}", history)
        raise AirflowFailException(f"{message}\n{left}".rstrip())

    # --- submitting ------------------------------------------------------------------------------

    def _submit(self, context: Context, hook: SlurmHook, history: SubmissionHistory, *, cause: str,
                progress: str | None = None, ended: JobStatus | None = None) -> Any:
        """``ended``: the job whose end this submission follows (its node may be at fault)."""
        number = len(history.submissions) + 1
        name = self._job_name(context)
        comment = self._comment(context, number)
        left_out = self._bad_nodes(hook, ended)
        begin_in = self._node_fault_back_off(history, cause)
        options: dict[str, Any] = dict(job_name=name, comment=comment, output=self._output_pattern(context),
                       error=self._error_pattern(context), partition=self.partition, account=self.account,
                       time_limit=self.time_limit, extra_options=self.sbatch_options,
                       export=dict(self.export or {}) or None, begin_in=begin_in or None)
        nodes = list(left_out)  # the newest fault first
        try:
            while True:
                try:
                    return self._sbatch(context, hook, history, number, cause, progress,
                                        {**options, "exclude": nodes or None}, {n: left_out[n] for n in nodes})
                except SbatchRefused as exc:
                    if not nodes:
                        raise
                    # Leaving these out may leave too few nodes for the request (a small partition):
                    # the node that failed longest ago goes back in first.
                    self.log.warning("sbatch refused %s leaving out %s (%s): trying again with %s back in", name,
                                     ", ".join(nodes), exc, nodes[-1])
                    nodes.pop()
        except SbatchRefused as exc:
            hints = format_hints(find_submit_hints(str(exc)))
            raise AirflowFailException(f"sbatch refused {name}: {exc}"
                                       + (f"\nHint: {hints}" if hints else "")) from exc

    def _sbatch(self, context: Context, hook: SlurmHook, history: SubmissionHistory, number: int, cause: str,
                progress: str | None, options: dict[str, Any], left_out: Mapping[str, NodeFault]) -> Any:
        """One ``sbatch`` (under the submit lock with ``exclusive_dir``), recorded, then watched."""
        name = options["job_name"]
        try:
            if self.exclusive_dir:
                outcome = hook.submit_exclusive(
                    self.script, self.exclusive_dir, done_markers=self.done_markers,
                    replace=_utc_stamp() if self.replace_outputs else None,
                    supersede=self.supersede_dirs if self.replace_outputs else (), **options)
                if outcome.done:
                    return self.on_already_done(context)
                if outcome.job_id is None:
                    return self._adopt_live_writer(context, history, outcome.live, number, outcome.login_user)
                for moved in outcome.moved:
                    self.log.warning("Fresh start: moved the earlier outputs aside to %s", moved)
                job_id = str(outcome.job_id)
            else:
                job_id = str(hook.submit(self.script, **options).job_id)
        except TransportError as exc:
            if not exc.retryable:
                raise AirflowException(f"cannot submit {name} on {self.conn_id}: {exc}") from exc
            # sbatch may have run before the connection dropped: look before submitting again.
            self.log.warning("Submit of %s interrupted (%s); checking whether the job exists", name, exc)
            adopted = self._find_own_job(context, hook, number=number, attempts=5)
            if adopted is None:
                raise AirflowException(f"submitting {name} failed ({exc}) and no such job exists on the "
                                       "cluster; a retry of this task submits it again") from exc
            job_id = adopted.job_id
            self.log.info("Adopting job %s that was submitted before the connection dropped", job_id)
        history.add(Submission(job_id, number, cause, self._try_number(context), progress,
                               clear_number=self._clear_number(context)))
        self._store_history(context, history)
        self.log.info("Submitted job %s (%s, submission %d, cause %s)", job_id, name, number, cause)
        if options.get("begin_in"):
            self.log.warning("Job %s may start %d s from now at the earliest (sbatch --begin): back-off after a "
                             "node's fault", job_id, options["begin_in"])
        if left_out:
            context["ti"].xcom_push(key=LEFT_OUT_XCOM_KEY, value=left_out_xcom(job_id, left_out))
        return self._watch_then_defer(context, hook, history)

    def _bad_nodes(self, hook: SlurmHook, ended: JobStatus | None = None) -> dict[str, NodeFault]:
        """The nodes to leave out of the next submission (:mod:`slurm_provider.bad_nodes`), said in the
        task log; none when ``leave_out_bad_nodes_for`` is 0. The job that just ended counts whether or
        not accounting lists its end yet (slurmdbd may lag a few seconds behind)."""
        from slurm_provider.hooks import SlurmCommandFailed

        window = _seconds(self.leave_out_bad_nodes_for)
        if window <= 0:
            return {}
        try:
            faults = hook.node_faults(f"now-{int(window)}seconds", self.node_fault_exit_codes)
        except SlurmCommandFailed as exc:
            self.log.warning("Could not read which nodes failed recently (%s): only the last job's are left out", exc)
            faults = []
        if ended is not None:  # the newest fault
            faults += job_faults(ended.job_id, ended.state, ended.exit_code, ended.node_list, ended.end,
                                 self.node_fault_exit_codes)
        left_out = nodes_to_leave_out(faults)
        if left_out:
            self.log.warning("%s", left_out_words(left_out, window / 3600))
        return left_out

    def _node_fault_back_off(self, history: SubmissionHistory, cause: str) -> int:
        """Seconds a resubmission after a node's fault waits in the queue before it may start (0: none):
        ``node_fault_first_retry``, doubling with each earlier such resubmission of this task."""
        if cause not in NODE_LEVEL_CAUSES or self.node_fault_first_retry <= 0:
            return 0
        earlier = sum(1 for s in history.submissions if s.cause in NODE_LEVEL_CAUSES)
        return round(replace(NODE_FAULT_RETRY, base=self.node_fault_first_retry).scheduled(earlier))

    def _node_fault(self, hook: SlurmHook, history: SubmissionHistory, status: JobStatus) -> bool:
        """The job's script said its node was at fault, bad nodes are left out (so another node runs it),
        and no earlier job of this task ended so on another node (then every node fails it: the job's
        environment, e.g. a site image without its GPU libraries, is at fault)."""
        if _seconds(self.leave_out_bad_nodes_for) <= 0 or \
                not is_node_fault(status.state, status.exit_code, self.node_fault_exit_codes):
            return False
        earlier = [s for s in hook.statuses(history.job_ids).values() if s.job_id != status.job_id]
        other = same_fault_elsewhere(status, earlier)
        if other is not None:
            self.log.warning("Job %s failed with exit code %s on %s, as job %s did on %s: not a node's fault but "
                             "the job's, not resubmitted", status.job_id, status.exit_code, status.node_list,
                             other.job_id, other.node_list)
            return False
        self.log.warning("Job %s failed with exit code %s on %s, which says its node is at fault: an "
                         "interruption, resubmitted to other nodes", status.job_id, status.exit_code,
                         status.node_list or "its node")
        return True

    def _adopt_live_writer(self, context: Context, history: SubmissionHistory, live: Sequence[JobStatus],
                           number: int, login_user: str | None = None) -> Any:
        """Watch the live job of the login user that already writes ``exclusive_dir`` instead of
        submitting a second one. Fail, naming the job, when it belongs to another user (never
        adopted), runs another version (two versions must never write one directory), or when this
        task was to move the directory's outputs aside for a fresh start."""
        own_dir = exclusive_dir_marker(self.exclusive_dir or "/")
        job = next((j for j in live if (c := parse_job_comment(j.comment)) is not None and c.xdir == own_dir),
                   live[0])
        theirs = parse_job_comment(job.comment)
        who = _submitter(job, theirs)
        writes = self._directory_of(theirs)
        if self.replace_outputs:
            raise AirflowFailException(
                f"a fresh start would move {writes} aside while job {job.job_id} ({who}, {job.state.value}) "
                f"still writes it. Wait for it to end, or cancel it (scancel {job.job_id}), then run again.")
        if job.user and login_user and job.user != login_user:
            raise AirflowFailException(
                f"job {job.job_id} of user {job.user} ({who}) is {job.state.value} and writes {writes}; "
                f"this task logs in as {login_user}, and a job of another user is never adopted or "
                f"duplicated. Wait for job {job.job_id} to end and clear this task (a stage it completed is "
                f"then skipped), or ask {job.user} to cancel it (scancel {job.job_id}).")
        ours = self._comment(context, number)
        own = (theirs is not None and theirs.by is not None
               and (theirs.dag, theirs.task, theirs.run, theirs.by) == (ours.dag, ours.task, ours.run, ours.by))
        cause = WATCHED_AGAIN if own else ADOPTED  # own: this task's job from before the DAG run was cleared
        mine = self.code_version or None
        if mine is not None and (theirs is None or theirs.code != mine):
            raise AirflowFailException(
                f"job {job.job_id} ({who}) is {job.state.value} and writes {self.exclusive_dir}, but it runs "
                f"code {theirs.code if theirs else 'unknown'} and this task runs {mine}: two jobs must never "
                f"write one directory. Wait for job {job.job_id} to end, or cancel it (scancel {job.job_id}), "
                "then clear this task.")
        history.add(Submission(job.job_id, number, cause, self._try_number(context),
                               clear_number=self._clear_number(context), name=job.name,
                               submitted_by=None if cause == WATCHED_AGAIN else
                               (f"user {job.user}, {who}" if job.user else who)))
        self._store_history(context, history)
        self.log.info("Job %s (%s, %s) already writes %s: watching it instead of submitting a second job",
                      job.job_id, who, job.state.value, self.exclusive_dir)
        if cause == ADOPTED:
            self.log.info("This task did not submit job %s: it leaves it running if it is stopped or gives up",
                          job.job_id)
        return self._defer(context, history)

    def _directory_of(self, comment: JobComment | None) -> str:
        """Which of the directories this submit guards a live job's comment names."""
        for directory in (self.exclusive_dir, *self.supersede_dirs):
            if directory and comment is not None and comment.xdir == exclusive_dir_marker(directory):
                return directory
        return self.exclusive_dir or "the directory"

    def on_already_done(self, context: Context) -> Any:
        """The directory's ``done_markers`` exist (found under the submit lock): nothing is submitted.

        Skips the task; a subclass may return a result instead."""
        markers = ", ".join(self.done_markers)
        self.log.info("%s is already done (%s found under the submit lock): nothing submitted", self.exclusive_dir,
                      markers)
        raise AirflowSkipException(f"{self.exclusive_dir} is already done ({markers} exist): nothing submitted")

    def _killed_from_outside(self, context: Context, hook: SlurmHook, status: JobStatus) -> bool:
        """A ``FAILED`` job whose script writes an exit record, killed by a signal with no record of
        that run left (:func:`slurm_provider.resubmission.killed_from_outside`)."""
        if not self.writes_end_record or status.state is not SlurmState.FAILED or not status.signal:
            return False
        record = parse_end_record(hook.read_file(end_record_path(self._log_path(context, status.job_id))) or "")
        logs = "\n".join(self._log_tail(hook, self._log_path(context, status.job_id, stream=stream))
                         for stream in ("out", "err"))
        if not killed_from_outside(status, record, logs):
            return False
        self.log.warning("Job %s ended FAILED of signal %s before its script could end (no exit record of the "
                         "run): killed from outside the job, an interruption", status.job_id, status.signal)
        return True

    def _after_interruption(self, context: Context, hook: SlurmHook, history: SubmissionHistory,
                            status: JobStatus, *, cause: str | None = None) -> Any:
        progress = hook.read_file(self.progress_path) if self.progress_path else None
        decision = decide_resubmission(status.state, history, self.resubmit_budgets, progress_now=progress,
                                       probe_configured=bool(self.progress_path), cause=cause)
        self.log.warning("Job %s ended %s: %s", status.job_id, decision.cause, decision.message)
        if not decision.resubmit:
            left = self._give_up(context, hook, status.job_id, f"not resubmitted: {decision.message}", history)
            raise AirflowFailException(f"{self._failure_message(hook, status, context)}\nNot resubmitted: "
                                       f"{decision.message}\n{left}".rstrip())
        try:
            self.check_before_resubmit(context, hook)
        except TransportError:
            raise  # the check could not be made: wait for the login node, then decide again
        except Exception as exc:
            left = self._give_up(context, hook, status.job_id, f"resubmission refused: {exc}", history)
            if not left:
                raise
            raise _with_note(exc, left) from exc
        return self._submit(context, hook, history, cause=decision.cause, progress=progress, ended=status)

    def check_before_resubmit(self, context: Context, hook: SlurmHook) -> None:
        """Raise to stop a resubmission the policy allows (e.g. the allocation cannot pay for it)."""

    def _find_own_job(self, context: Context, hook: SlurmHook, *, number: int,
                      attempts: int = 1) -> JobStatus | None:
        """The newest job on the cluster with this task's name and comment (submission ``number``); a
        lookup the cluster did not answer is tried ``attempts`` times on ``timing.LOOKUP_RETRY``."""
        name = self._job_name(context)
        expected = self._comment(context, number)

        def said(state: RetryCallState) -> None:
            self.log.warning("Looking up %s failed (%s); retrying", name, state.outcome.exception() if state.outcome
                             else "?")

        jobs = Retrying(stop=stop_after_attempt(attempts), retry=retry_if_exception_type(TransportError),
                        wait=lambda state: LOOKUP_RETRY.delay(state.attempt_number - 1), before_sleep=said,
                        reraise=True)(hook.find_jobs, name=name)
        mine = [j for j in jobs if (c := parse_job_comment(j.comment)) is not None
                and c.same_task(expected) and c.attempt == number]
        return max(mine, key=lambda j: int(j.job_id.split("_")[0])) if mine else None

    def _watch_then_defer(self, context: Context, hook: SlurmHook, history: SubmissionHistory) -> Any:
        """Watch the job just submitted for ``short_job_wait`` seconds from its exit record; conclude
        here when it ended, defer otherwise."""
        current = history.current
        assert current is not None
        ended = self._ended_soon(context, hook, current.job_id) if self.short_job_wait > 0 else None
        if ended is None:
            return self._defer(context, history)
        context["ti"].xcom_push(key=JOB_ID_XCOM_KEY, value=current.job_id)
        self.log.info("Job %s ended within %.0f s of its submit: %s", current.job_id, self.short_job_wait,
                      ended.state.value)
        self._show_output(context, hook, current.job_id)
        return self._conclude(context, hook, history, ended)

    def _ended_soon(self, context: Context, hook: SlurmHook, job_id: str) -> JobStatus | None:
        """The job's status once its exit record says it ended and Slurm agrees, within
        ``short_job_wait`` seconds; None when it runs on, requeued itself, or could not be read (the
        trigger then watches it, outages included)."""
        record_path = end_record_path(self._log_path(context, job_id))
        deadline = time.monotonic() + self.short_job_wait
        confirmation = EndConfirmation(confirm_schedule(self.max_poll_interval))
        try:
            while (left := deadline - time.monotonic()) > 0:
                time.sleep(min(SHORT_JOB_READ_INTERVAL, left))
                record = parse_end_record(hook.read_file(record_path) or "")
                if record is None or not confirmation.due(record, time.monotonic()):
                    continue
                if record.job_id != str(job_id) or record.requeued:
                    return None  # another run follows: the trigger follows it
                status = hook.statuses([job_id]).get(job_id)
                if status is not None and status.state.is_terminal:
                    return status
                confirmation.not_confirmed(record, time.monotonic())  # still completing
        except (TransportError, RemoteCommandError) as exc:  # SlurmCommandFailed is a TransportError
            self.log.info("Watching job %s from the worker stopped (%s); the trigger watches it", job_id, exc)
        return None

    def _show_output(self, context: Context, hook: SlurmHook, job_id: str) -> None:
        """The output of a job that ended before any trigger streamed it, into the task log as the
        trigger writes it."""
        for stream, prefix in (("out", f"[job {job_id}]"), ("err", f"[job {job_id} stderr]")):
            try:
                text, _ = hook.read_log(self._log_path(context, job_id, stream=stream))
            except (TransportError, RemoteCommandError) as exc:
                self.log.warning("Could not read the %s output of job %s: %s", stream, job_id, exc)
                continue
            for line in text.splitlines():
                self.log.info("%s %s", prefix, line)

    def _defer(self, context: Context, history: SubmissionHistory) -> None:
        current = history.current
        assert current is not None
        context["ti"].xcom_push(key=JOB_ID_XCOM_KEY, value=current.job_id)
        self.defer(
            trigger=SlurmJobTrigger(
                conn_id=self.conn_id, job_id=current.job_id, poll_interval=self.poll_interval,
                max_poll_interval=self.max_poll_interval, first_poll_delay=self.first_poll_delay,
                log_path=self._log_path(context, current.job_id),
                err_log_path=self._log_path(context, current.job_id, stream="err"), pending_policy=self.pending_policy,
                expected_job_name=current.name or self._job_name(context), carry={"history": history.to_json()},
                adopted_from=(current.submitted_by or "another task") if current.adopted else None,
                watch_deadline=self._deadline_seconds(),
                follow=self.follow or None, follow_interval=self.follow_interval,
                release_held=self.release_held,
            ),
            method_name="execute_complete",
        )

    # --- ending ----------------------------------------------------------------------------------

    def billed_gpu_hours(self, run: JobStatus) -> float:
        """What one run of a job cost: its GPUs x elapsed hours x ``gpu_billing_factor``. A subclass
        that knows the site's billing rule (whole nodes on some partitions) says so here."""
        return run.gpu_hours(self.gpu_billing_factor)

    def _finish(self, context: Context, hook: SlurmHook, history: SubmissionHistory,
                status: JobStatus) -> dict[str, Any]:
        gpu_hours = 0.0
        for job_id in history.job_ids:
            for run in hook.runs(job_id):
                gpu_hours += self.billed_gpu_hours(run)
        summary = {
            "job_id": status.job_id,
            "job_ids": history.job_ids,
            "state": status.state.value,
            "exit_code": status.exit_code,
            "elapsed_s": status.elapsed_s,
            "restarts": status.restarts,
            "node_list": status.node_list,
            "gpus": status.gpus,
            "gpu_hours": round(gpu_hours, 4),
            "submissions": history.to_json(),
        }
        context["ti"].xcom_push(key=JOB_ID_XCOM_KEY, value=status.job_id)
        self.log.info("Job %s completed: %s GPU-hours over %d submission(s)", status.job_id,
                      summary["gpu_hours"], len(history.submissions))
        return summary

    def _accounted(self, hook: SlurmHook, status: JobStatus, wait_s: float = 15.0) -> JobStatus:
        """The job's final row from accounting (exit code, elapsed, node list are complete there).

        The trigger may have seen the end in ``squeue``; slurmdbd receives the record a moment later:
        asked every second for up to ``wait_s``, then the status at hand stands.
        """
        def final(runs: list[JobStatus]) -> bool:
            return bool(runs) and runs[-1].state.is_terminal

        runs = Retrying(stop=stop_after_delay(wait_s), wait=wait_fixed(1.0), retry=retry_if_not_result(final),
                        retry_error_callback=lambda state: [])(hook.runs, status.job_id)
        return runs[-1] if final(runs) else status

    def _failure_message(self, hook: SlurmHook, status: JobStatus, context: Context) -> str:
        log_path = self._log_path(context, status.job_id)
        err_path = self._log_path(context, status.job_id, stream="err")
        tail, err_tail = self._log_tail(hook, log_path), self._log_tail(hook, err_path)
        parts = [f"Slurm job {status.job_id} ended {status.state.value}: {status.state.description}"]
        if status.cancelled_by:
            parts.append(f"Cancelled by uid/user {status.cancelled_by}.")
        if status.reason and status.reason not in ("None", ""):
            parts.append(f"Reason: {status.reason}.")
        if status.exit_code is not None:
            parts.append(f"Exit code {status.exit_code}" + (f", signal {status.signal}" if status.signal else "") + ".")
        explained = explain_exit(status.exit_code, status.signal, self.exit_code_meanings)
        if explained:
            parts.append(explained)
        parts.append(f"Logs: {log_path} (output), {err_path} (errors)")
        hint = hint_for(f"{tail}\n{err_tail}", state=status.state, overrides=self.hint_overrides)
        if hint:
            parts.append(f"Hint: {hint}")
        if err_tail.strip():
            parts.append("Last lines of the job's error output (stderr):\n" + log_excerpt(err_tail))
        if tail.strip():
            parts.append("Last lines of the job's output:\n" + log_excerpt(tail))
        return "\n".join(parts)

    def _log_tail(self, hook: SlurmHook, path: str) -> str:
        try:
            size = hook.file_sizes([path]).get(path, 0)
            text, _ = hook.read_log(path, max(0, size - LOG_TAIL_BYTES))
            return text
        except TransportError as exc:
            return f"(could not read the log: {exc})"

    def _give_up(self, context: Context, hook: SlurmHook, job_id: str, why: str,
                 history: SubmissionHistory | None = None) -> str:
        """The task fails: leave none of its jobs in Slurm's queue unless ``keep_job_on_give_up``.

        Asks Slurm once more (the event may be a poll old) and returns the sentence for the failure
        message: what happened to the job, or "" when Slurm no longer keeps it.
        """
        try:
            status = hook.statuses([job_id]).get(job_id)
        except TransportError as exc:
            self.log.warning("Giving up on job %s (%s), but cannot ask Slurm about it: %s", job_id, why, exc)
            return (f"Job {job_id} may still be in the queue (could not ask Slurm: {exc}); "
                    f"check with `squeue -j {job_id}` and cancel it with `scancel {job_id}` if it is.")
        if status is None or not status.state.keeps_place_in_queue:
            return ""
        reason = status.reason if status.reason not in (None, "", "None") else None
        where = status.state.value + (f", reason {reason}" if reason else "")
        adopted = self._adopted_submission(context, job_id, history)
        if status.name != (adopted.name if adopted is not None and adopted.name else
                           self._name_of_job(context, job_id)):
            self.log.warning("Job id %s now names %r, not this task's job: left alone", job_id, status.name)
            return ""
        if adopted is not None:
            self.log.warning("Giving up on job %s (%s): %s. It was submitted by %s, not by this task, which only "
                             "watched it: left running", job_id, where, why, adopted.submitted_by or "another task")
            return (f"Job {job_id} ({where}) was left running: it was submitted by "
                    f"{adopted.submitted_by or 'another task'}, and this task only watched it.")
        if self.keep_job_on_give_up:
            self.log.warning("Giving up on job %s (%s): %s. Keeping it in the queue for a person "
                             "(keep_job_on_give_up=True)", job_id, where, why)
            return (f"Job {job_id} was kept in the queue ({where}) because keep_job_on_give_up=True: "
                    f"release it with `scontrol release {job_id}` or cancel it with `scancel {job_id}`.")
        try:
            cancelled = hook.cancel(job_id)
        except TransportError as exc:
            problem = str(exc)
        else:
            problem = "" if cancelled.accepted else (cancelled.message or f"scancel exited {cancelled.exit_status}")
        if problem:
            self.log.error("Giving up on job %s (%s): %s; cancelling it failed: %s", job_id, where, why,
                           problem)
            return (f"Job {job_id} ({where}) could not be cancelled ({problem}): "
                    f"cancel it with `scancel {job_id}`.")
        self.log.warning("Cancelled job %s (%s): the task gives up on it: %s", job_id, where, why)
        return (f"Job {job_id} was cancelled ({where}), so that it is not left in the queue "
                "(keep_job_on_give_up=True keeps such a job for a person).")

    def on_kill(self) -> None:
        """Worker-side kill while not deferred (e.g. during submit): nothing running to stop here."""
        self.log.info("Task killed outside the deferred wait; the job (if any) is left to the trigger's on_kill")

    # --- naming and persistence -------------------------------------------------------------------

    def _deadline_seconds(self) -> float:
        """``watch_deadline`` in seconds; a :class:`ValidationError` when it is not a positive duration."""
        try:
            return timeout_seconds(self.watch_deadline)
        except ValueError:
            raise ValidationError("watch_deadline", "must be a positive number of seconds or a timedelta, e.g. "
                                  "86400 or timedelta(days=1)", self.watch_deadline) from None

    def _validate(self) -> None:
        """Every value that reaches a remote command is checked before any SSH connection."""
        self._deadline_seconds()
        if not isinstance(self.script, str) or not self.script.startswith("#!"):
            raise ValidationError("script", "must be a complete batch script starting with '#!'")
        validate_remote_path(self.log_dir, "log_dir", absolute=True)
        try:
            for file in followed_files(self.follow):
                validate_remote_path(file.path, "follow", absolute=True)
                load_fold(file.fold)
        except ValueError as exc:
            raise ValidationError("follow", str(exc), self.follow) from None
        if not isinstance(self.project_tag, str) or not self.project_tag.strip():
            raise ValidationError("project_tag", "must be a non-empty name such as 'airflow' or your project's")
        if self.partition is not None:
            validate_partition(self.partition)
        if self.account is not None:
            validate_account(self.account)
        if self.time_limit is not None:
            validate_time_limit(self.time_limit)
        if isinstance(self.sbatch_options, str):
            raise ValidationError("sbatch_options", "must be a list of flags such as ['--requeue'], not a string")
        self.sbatch_options = list(validate_extra_sbatch_options(list(self.sbatch_options or ()), "sbatch_options"))
        if self.export is not None and not isinstance(self.export, Mapping):
            raise ValidationError("export", "must be a mapping of environment variable names to values")
        if self.progress_path is not None:
            validate_remote_path(self.progress_path, "progress_path", absolute=True)
        if self.exclusive_dir is not None:
            validate_remote_path(self.exclusive_dir, "exclusive_dir", absolute=True)
        elif self.done_markers or self.replace_outputs or self.supersede_dirs:
            raise ValidationError("exclusive_dir", "done_markers, replace_outputs and supersede_dirs guard an "
                                  "exclusive_dir: give the directory the job writes")
        if isinstance(self.done_markers, str) or isinstance(self.supersede_dirs, str):
            raise ValidationError("done_markers", "done_markers and supersede_dirs are lists of paths, not a string")
        for directory in self.supersede_dirs:
            validate_remote_path(directory, "supersede_dirs", absolute=True)
        for field, value in (("leave_out_bad_nodes_for", self.leave_out_bad_nodes_for),
                             ("node_fault_first_retry", self.node_fault_first_retry)):
            if isinstance(value, bool) or not isinstance(value, (int, float, timedelta)) or _seconds(value) < 0:
                raise ValidationError(field, "must be a number of seconds (or a timedelta) of at least 0", value)
        if self.code_version is not None and not _CODE_VERSION.match(str(self.code_version)):
            raise ValidationError("code_version", "must be 1-128 letters, digits or '._:+-' (it goes into the "
                                  "job comment), e.g. a content hash", self.code_version)

    def _hook(self) -> Any:
        from slurm_provider.hooks import SlurmHook

        return SlurmHook(self.conn_id)

    @staticmethod
    def _try_number(context: Context) -> int:
        return int(getattr(context["ti"], "try_number", 1) or 1)

    @staticmethod
    def _clear_number(context: Context) -> int:
        """How often the DAG run was cleared: Airflow counts up on every clear of its tasks."""
        return int(getattr(context.get("dag_run"), "clear_number", 0) or 0)

    def _job_name(self, context: Context) -> str:
        ti = context["ti"]
        return job_name_for(ti.dag_id, ti.task_id, ti.run_id, getattr(ti, "map_index", -1) or -1)

    def _comment(self, context: Context, number: int) -> JobComment:
        ti = context["ti"]
        return JobComment(dag=ti.dag_id, task=ti.task_id, run=ti.run_id, attempt=number, stage=self.stage,
                          project=self.project_tag,
                          clear=self._clear_number(context), place=self._place(), code=self.code_version or None,
                          xdir=exclusive_dir_marker(self.exclusive_dir) if self.exclusive_dir else None,
                          by=self._submitter_token(context))

    def _submitter_token(self, context: Context) -> str | None:
        """This task's own token (``JobComment.by``), made on first use and kept in its task state
        store, which every try and clear of the task in this deployment shares; None without a store."""
        store = context.get("task_state_store")
        if store is None:
            return None
        token = store.get(SUBMITTER_KEY)
        if not token:
            from airflow.sdk import NEVER_EXPIRE  # type: ignore[attr-defined]

            token = uuid.uuid4().hex[:12]
            store.set(SUBMITTER_KEY, token, retention=NEVER_EXPIRE)
        return str(token)

    def _place(self) -> str:
        """Short digest of the connection and log directory the jobs write to."""
        return hashlib.sha1(f"{self.conn_id}\0{self.log_dir.rstrip('/')}".encode()).hexdigest()[:10]

    def _output_pattern(self, context: Context) -> str:
        return f"{self.log_dir.rstrip('/')}/{job_log_name(self._job_name(context), '%j', 'out')}"

    def _error_pattern(self, context: Context) -> str:
        return f"{self.log_dir.rstrip('/')}/{job_log_name(self._job_name(context), '%j', 'err')}"

    def _log_path(self, context: Context, job_id: str, stream: str = "out") -> str:
        """The file job ``job_id`` writes its output (``out``) or error output (``err``) to."""
        return f"{self.log_dir.rstrip('/')}/{job_log_name(self._name_of_job(context, job_id), job_id, stream)}"

    def _adopted_submission(self, context: Context, job_id: str,
                            history: SubmissionHistory | None = None) -> Submission | None:
        """The record of ``job_id`` when this task adopted it instead of submitting it."""
        known = [*(history.submissions if history is not None else ()), *self._stored_history(context).submissions]
        return next((s for s in known if s.job_id == job_id and s.adopted), None)

    def _name_of_job(self, context: Context, job_id: str) -> str:
        """This task's job name, or the name of a job it adopted from another submitter."""
        adopted = next((s.name for s in self._stored_history(context).submissions
                        if s.job_id == job_id and s.name), None)
        return adopted or self._job_name(context)

    def history_since_clear(self, context: Context) -> SubmissionHistory:
        """This task's submissions (task state store) since the DAG run was last cleared."""
        return self._stored_history(context).since_clear(self._clear_number(context))

    def _stored_history(self, context: Context) -> SubmissionHistory:
        store = context.get("task_state_store")
        return SubmissionHistory() if store is None else SubmissionHistory.from_json(store.get(HISTORY_KEY))

    def _store_history(self, context: Context, history: SubmissionHistory) -> None:
        store = context.get("task_state_store")
        if store is not None:
            from airflow.sdk import NEVER_EXPIRE  # type: ignore[attr-defined]

            store.set(HISTORY_KEY, history.to_json(), retention=NEVER_EXPIRE)  # type: ignore[arg-type]
