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
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from slurm_provider.cli.sbatch import DEFAULT_PROJECT_TAG
from slurm_provider.watch.end_records import end_record_path, parse_end_record
from slurm_provider.file_verbs import RemoteCommandError
from slurm_provider.watch.followed_files import FOLLOW_INTERVAL
from slurm_provider.job_handles import JOB_HANDLES_XCOM_KEY, JobHandles
from slurm_provider.job_status import JobStatus
from slurm_provider.job_task import ending, naming, settings, submission
from slurm_provider.job_task.naming import HISTORY_KEY, SUBMITTER_KEY, job_name_for
from slurm_provider.links import JOB_ID_XCOM_KEY, SlurmJobLogLink
from slurm_provider.login_wait import SlurmLoginTrigger
from slurm_provider.watch.outage import (
    DEFAULT_WATCH_DEADLINE,
    STEP_FAILURES_WHILE_REACHABLE,
    Outage,
    command_failed_line,
    gave_up_line,
    still_failing_line,
    timeout_seconds,
    unreachable_line,
)
from slurm_provider.resubmission import DEFAULT_BUDGETS, SubmissionHistory
from slurm_provider.timing import (
    FIRST_POLL_DELAY,
    MAX_POLL_INTERVAL,
    NODE_FAULT_RETRY,
    POLL_INTERVAL,
    SHORT_JOB_READ_INTERVAL,
    SHORT_JOB_WAIT,
)
from slurm_provider.transport import TransportError, person_login_argv
from slurm_provider.triggers import SlurmJobTrigger
from slurm_provider.watch.watch_request import FollowedFiles, WatchedJob, WatchSchedule
from slurm_provider.validation import ValidationError
from slurm_provider.watch.end_confirmation import EndConfirmation, confirm_schedule
from slurm_provider.watch.events import FINISHED
from slurm_provider.watch.job_watch import End, JobWatch
from slurm_provider.watch.subscription import PollUpdate
from slurm_provider.watch.events import REACHABLE, LoginEvent, WatchEvent

if TYPE_CHECKING:
    from airflow.sdk import Context

    from slurm_provider.hooks import SlurmHook

__all__ = ["DEFAULT_MAX_RETRY_DELAY", "DEFAULT_RETRIES", "DEFAULT_RETRY_DELAY", "DEFAULT_RETRY_EXPONENTIAL_BACKOFF",
           "HISTORY_KEY", "SUBMITTER_KEY", "SlurmSubmitOperator", "job_name_for"]


# Task retries of a job task: enough to ride out a lost worker or a cluster login node that is down
# for a while (2-4 min, then 4-8 min with Airflow's jittered doubling), never resubmitting a failed job.
DEFAULT_RETRIES = 2
DEFAULT_RETRY_DELAY = timedelta(minutes=2)
DEFAULT_RETRY_EXPONENTIAL_BACKOFF = 2.0
DEFAULT_MAX_RETRY_DELAY = timedelta(minutes=30)


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
        (:mod:`slurm_provider.watch.followed_files`): a UI shows what the fold made of them while the job runs.
    :param follow_interval: least seconds between two size checks of the followed files (60).
    :param short_job_wait: seconds the task watches a job it just submitted itself, reading the job's
        exit record (:mod:`slurm_provider.watch.end_records`) every second, before it defers (0, the default:
        it defers at once). A job that ends within them (a preflight, a data check) completes the task
        there, its output in the task log, without waiting for the trigger's first poll (at least
        ``first_poll_delay`` after the deferral); the task holds its worker slot meanwhile, and one
        Slurm call confirms the end. A job that runs on, requeues itself or cannot be read is watched by
        the trigger as usual.
    :param writes_end_record: the script writes its exit record (:func:`slurm_provider.watch.end_records.end_record_shell`)
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
            settings.validate(self)
        except ValidationError as exc:
            raise AirflowFailException(str(exc)) from exc
        with self.waiting_out_outages(context), self._hook() as hook:
            return submission.adopt_or_submit(self, context, hook)

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

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        try:
            ended = WatchEvent.from_json(event)
        except ValueError as exc:
            raise AirflowFailException(str(exc)) from None
        history = SubmissionHistory.merge(self.history_since_clear(context),
                                          SubmissionHistory.from_json(ended.carry.get("history")),
                                          ).since_clear(naming.clear_number(context))
        naming.store_history(context, history)
        with self.waiting_out_outages(context), self._hook() as hook:
            return ending.interpret(self, context, hook, history, ended)

    # --- what a subclass may change (the steps themselves: slurm_provider.job_task) ---------------

    def on_already_done(self, context: Context) -> Any:
        """The directory's ``done_markers`` exist (found under the submit lock): nothing is submitted.

        Skips the task; a subclass may return a result instead."""
        markers = ", ".join(self.done_markers)
        self.log.info("%s is already done (%s found under the submit lock): nothing submitted", self.exclusive_dir,
                      markers)
        raise AirflowSkipException(f"{self.exclusive_dir} is already done ({markers} exist): nothing submitted")

    def check_before_resubmit(self, context: Context, hook: SlurmHook) -> None:
        """Raise to stop a resubmission the policy allows (e.g. the allocation cannot pay for it)."""

    def billed_gpu_hours(self, run: JobStatus) -> float:
        """What one run of a job cost: its GPUs x elapsed hours x ``gpu_billing_factor``. A subclass
        that knows the site's billing rule (whole nodes on some partitions) says so here."""
        return run.gpu_hours(self.gpu_billing_factor)

    # --- the job just submitted: watched in the task a moment, then deferred ---------------------

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
        return ending.conclude(self, context, hook, history, ended)

    def _ended_soon(self, context: Context, hook: SlurmHook, job_id: str) -> JobStatus | None:
        """The job's status once its exit record says it ended and Slurm agrees, within
        ``short_job_wait`` seconds; None when it runs on, requeued itself, or could not be read (the
        trigger then watches it, outages included). What Slurm answers is judged by the same
        :class:`~slurm_provider.watch.job_watch.JobWatch` the trigger steps."""
        record_path = end_record_path(naming.log_path(self, context, job_id))
        deadline = time.monotonic() + self.short_job_wait
        confirmation = EndConfirmation(confirm_schedule(self.max_poll_interval))
        watch = JobWatch(self.conn_id, str(job_id), pending_policy=self.pending_policy,
                         expected_job_name=naming.job_name(context), release_held=False)
        try:
            while (left := deadline - time.monotonic()) > 0:
                time.sleep(min(SHORT_JOB_READ_INTERVAL, left))
                record = parse_end_record(hook.read_file(record_path) or "")
                if record is None or not confirmation.due(record, time.monotonic()):
                    continue
                if record.job_id != str(job_id) or record.requeued:
                    return None  # another run follows: the trigger follows it
                update = PollUpdate(status=hook.statuses([job_id]).get(job_id), end_record=record)
                # Only the end counts here: what the watch would say of a job that runs on, the trigger says.
                ended = next((a for a in watch.step(update, time.time()) if isinstance(a, End)), None)
                if ended is not None:
                    return ended.status if ended.kind == FINISHED else None
                confirmation.not_confirmed(record, time.monotonic())  # still completing
        except (TransportError, RemoteCommandError) as exc:  # SlurmCommandFailed is a TransportError
            self.log.info("Watching job %s from the worker stopped (%s); the trigger watches it", job_id, exc)
        return None

    def _show_output(self, context: Context, hook: SlurmHook, job_id: str) -> None:
        """The output of a job that ended before any trigger streamed it, into the task log as the
        trigger writes it."""
        for stream, prefix in (("out", f"[job {job_id}]"), ("err", f"[job {job_id} stderr]")):
            try:
                text, _ = hook.read_log(naming.log_path(self, context, job_id, stream=stream))
            except (TransportError, RemoteCommandError) as exc:
                self.log.warning("Could not read the %s output of job %s: %s", stream, job_id, exc)
                continue
            for line in text.splitlines():
                self.log.info("%s %s", prefix, line)

    def _defer(self, context: Context, history: SubmissionHistory) -> None:
        current = history.current
        assert current is not None
        context["ti"].xcom_push(key=JOB_ID_XCOM_KEY, value=current.job_id)
        self._hand_over(context, current.job_id)
        self.defer(
            trigger=SlurmJobTrigger(
                job=WatchedJob(
                    conn_id=self.conn_id, job_id=current.job_id,
                    log_path=naming.log_path(self, context, current.job_id),
                    err_log_path=naming.log_path(self, context, current.job_id, stream="err"),
                    expected_job_name=current.name or naming.job_name(context),
                    adopted_from=(current.submitted_by or "another task") if current.adopted else None,
                    pending_policy=self.pending_policy, release_held=self.release_held),
                schedule=WatchSchedule(poll_interval=self.poll_interval, max_poll_interval=self.max_poll_interval,
                                       first_poll_delay=self.first_poll_delay, watch_deadline=self._deadline_seconds()),
                follow=FollowedFiles(tuple(self.follow or ()), self.follow_interval),
                carry={"history": history.to_json()},
            ),
            method_name="execute_complete",
        )

    def _hand_over(self, context: Context, job_id: str) -> None:
        """Say, once per job the trigger takes, how a person looks at it while it runs (and keep it in
        XCom for a view of the running jobs). Naming the login is never worth failing the task for."""
        try:
            handles = JobHandles.of(person_login_argv(self.conn_id), job_id, naming.log_path(self, context, job_id))
        except Exception as exc:  # a connection that cannot be read (any backend's error) costs only these lines
            self.log.info("No commands to reach job %s by hand: %s", job_id, exc)
            return
        context["ti"].xcom_push(key=JOB_HANDLES_XCOM_KEY, value=handles.to_json())
        for line in handles.lines():
            self.log.info("%s", line)

    def on_kill(self) -> None:
        """Worker-side kill while not deferred (e.g. during submit): nothing running to stop here."""
        self.log.info("Task killed outside the deferred wait; the job (if any) is left to the trigger's on_kill")

    # --- settings, the connection, the task's history ------------------------------------------

    def _deadline_seconds(self) -> float:
        """``watch_deadline`` in seconds; a :class:`ValidationError` when it is not a positive duration."""
        try:
            return timeout_seconds(self.watch_deadline)
        except ValueError:
            raise ValidationError("watch_deadline", "must be a positive number of seconds or a timedelta, e.g. "
                                  "86400 or timedelta(days=1)", self.watch_deadline) from None

    def _hook(self) -> Any:
        from slurm_provider.hooks import SlurmHook

        return SlurmHook(self.conn_id)

    def history_since_clear(self, context: Context) -> SubmissionHistory:
        """This task's submissions (task state store) since the DAG run was last cleared."""
        return naming.stored_history(context).since_clear(naming.clear_number(context))
