"""Adopt or submit: the steps of a task before its job is watched.

Submission is idempotent: before submitting, and after a submit whose answer was lost (SSH dropped
after ``sbatch`` ran), the task looks its job up on the cluster (by name and comment) and adopts it
instead of submitting a duplicate. With an exclusive directory, a live job of the login user that
already writes it is watched instead of submitting a second writer (one of another user, or running
other code, fails the task naming it). Nodes where jobs failed for the node's fault are left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt

from slurm_provider.bad_nodes import (
    LEFT_OUT_XCOM_KEY,
    NODE_FAULT,
    NODE_LEVEL_CAUSES,
    NodeFault,
    job_faults,
    left_out_words,
    left_out_xcom,
    nodes_to_leave_out,
)
from slurm_provider.cli.sbatch import JobComment, SbatchRefused, parse_job_comment
from slurm_provider.cli.exclusive_submit import exclusive_dir_marker
from slurm_provider.hints import find_submit_hints, format_hints
from slurm_provider.job_status import JobStatus
from slurm_provider.job_task import ending, naming
from slurm_provider.resubmission import ADOPTED, WATCHED_AGAIN, Submission, SubmissionHistory
from slurm_provider.state_vocabulary import StateCategory
from slurm_provider.timing import LOOKUP_RETRY, NODE_FAULT_RETRY
from slurm_provider.transport import TransportError

if TYPE_CHECKING:
    from airflow.sdk import Context

    from slurm_provider.hooks import SlurmHook
    from slurm_provider.operators import SlurmSubmitOperator


def seconds(value: timedelta | float) -> float:
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


def adopt_or_submit(op: SlurmSubmitOperator, context: Context, hook: SlurmHook) -> Any:
    stored = naming.stored_history(context)
    history = stored.since_clear(naming.clear_number(context))
    if len(history.submissions) < len(stored.submissions):
        op.log.info("The DAG run was cleared since jobs %s: this task submits afresh",
                      ", ".join(j for j in stored.job_ids if j not in history.job_ids))
    current = history.current
    if current is not None:
        status = hook.statuses([current.job_id]).get(current.job_id)
        if status is not None and status.state.category is StateCategory.WAITING:
            op.log.info("Adopting job %s (%s) submitted earlier by this task", current.job_id,
                          status.state.value)
            return op._defer(context, history)
        if status is not None and status.state.is_success:
            op.log.info("Job %s already completed", current.job_id)
            return ending.finish(op, context, hook, history, status)
        if status is not None and status.state.is_retryable:
            return ending.after_interruption(op, context, hook, history, status)
        if status is not None and ending.ended_for_its_node(op, hook, history, status):
            return ending.after_interruption(op, context, hook, history, status, cause=NODE_FAULT)
        if status is not None and status.state.is_terminal:
            # The watch was lost and the job ended badly meanwhile: the same as seeing it end.
            ended = status if status.state.keeps_place_in_queue else ending.accounted(hook, status)
            left = ending.give_up(op, context, hook, current.job_id, f"it ended {ended.state.value}", history)
            raise AirflowFailException(f"{ending.failure_message(op, hook, ended, context)}\n{left}".rstrip())
        op.log.info("Previous job %s is known neither to squeue nor to sacct; this try submits a new "
                      "job", current.job_id)
        return submit(op, context, hook, history, cause="retry")
    adopted = find_own_job(op, context, hook, number=1)
    if adopted is not None:
        op.log.info("Adopting job %s (%s) found by name %s", adopted.job_id, adopted.state.value,
                      naming.job_name(context))
        history.add(Submission(adopted.job_id, 1, "initial", naming.try_number(context),
                               clear_number=naming.clear_number(context)))
        naming.store_history(context, history)
        if adopted.state.is_success:
            return ending.finish(op, context, hook, history, adopted)
        return op._defer(context, history)
    return submit(op, context, hook, history, cause="initial")


def submit(op: SlurmSubmitOperator, context: Context, hook: SlurmHook, history: SubmissionHistory, *, cause: str,
            progress: str | None = None, ended: JobStatus | None = None) -> Any:
    """``ended``: the job whose end this submission follows (its node may be at fault)."""
    number = len(history.submissions) + 1
    name = naming.job_name(context)
    comment = naming.comment(op, context, number)
    left_out = bad_nodes(op, hook, ended)
    begin_in = node_fault_back_off(op, history, cause)
    options: dict[str, Any] = dict(job_name=name, comment=comment, output=naming.output_pattern(op, context),
                                   error=naming.error_pattern(op, context), partition=op.partition,
                                   account=op.account, time_limit=op.time_limit, extra_options=op.sbatch_options,
                                   export=dict(op.export or {}) or None, begin_in=begin_in or None)
    nodes = nodes_that_fit(op, hook, options, list(left_out))  # the newest fault first
    try:
        while True:
            try:
                return sbatch(op, context, hook, history, number, cause, progress,
                              {**options, "exclude": nodes or None}, {n: left_out[n] for n in nodes})
            except SbatchRefused as exc:
                if not nodes:
                    raise
                # Leaving these out may leave too few nodes for the request (a small partition):
                # the node that failed longest ago goes back in first.
                op.log.warning("sbatch refused %s leaving out %s (%s): trying again with %s back in", name,
                               ", ".join(nodes), exc, nodes[-1])
                nodes.pop()
    except SbatchRefused as exc:
        hints = format_hints(find_submit_hints(str(exc)))
        raise AirflowFailException(f"sbatch refused {name}: {exc}"
                                   + (f"\nHint: {hints}" if hints else "")) from exc


def nodes_that_fit(op: SlurmSubmitOperator, hook: SlurmHook, options: Mapping[str, Any],
                   nodes: list[str]) -> list[str]:
    """The nodes to leave out of this submission, newest fault first, as many as Slurm can leave out
    and still place the job: asked with ``sbatch --test-only`` (which leaves no record), the node that
    failed longest ago going back in first. Leaving out too many (a small partition) would have
    ``sbatch`` refuse the job, and Slurm keeps even a refused job in accounting, as ``FAILED``."""
    while nodes:
        try:
            hook.test_only(op.script, **{**options, "exclude": nodes})
            return nodes
        except SbatchRefused as exc:
            op.log.warning("Slurm cannot place %s leaving out %s (%s): %s goes back in", options["job_name"],
                           ", ".join(nodes), exc, nodes[-1])
            nodes = nodes[:-1]
        except TransportError:  # not asked: the submission itself decides, as without the check
            return nodes
    return nodes


def sbatch(op: SlurmSubmitOperator, context: Context, hook: SlurmHook, history: SubmissionHistory, number: int, cause: str,
            progress: str | None, options: dict[str, Any], left_out: Mapping[str, NodeFault]) -> Any:
    """One ``sbatch`` (under the submit lock with ``exclusive_dir``), recorded, then watched."""
    name = options["job_name"]
    try:
        if op.exclusive_dir:
            outcome = hook.submit_exclusive(
                op.script, op.exclusive_dir, done_markers=op.done_markers,
                replace=_utc_stamp() if op.replace_outputs else None,
                supersede=op.supersede_dirs if op.replace_outputs else (), **options)
            if outcome.done:
                return op.on_already_done(context)
            if outcome.job_id is None:
                return adopt_live_writer(op, context, history, outcome.live, number, outcome.login_user)
            for moved in outcome.moved:
                op.log.warning("Fresh start: moved the earlier outputs aside to %s", moved)
            job_id = str(outcome.job_id)
        else:
            job_id = str(hook.submit(op.script, **options).job_id)
    except TransportError as exc:
        if not exc.retryable:
            raise AirflowException(f"cannot submit {name} on {op.conn_id}: {exc}") from exc
        # sbatch may have run before the connection dropped: look before submitting again.
        op.log.warning("Submit of %s interrupted (%s); checking whether the job exists", name, exc)
        adopted = find_own_job(op, context, hook, number=number, attempts=5)
        if adopted is None:
            raise AirflowException(f"submitting {name} failed ({exc}) and no such job exists on the "
                                   "cluster; a retry of this task submits it again") from exc
        job_id = adopted.job_id
        op.log.info("Adopting job %s that was submitted before the connection dropped", job_id)
    history.add(Submission(job_id, number, cause, naming.try_number(context), progress,
                           clear_number=naming.clear_number(context)))
    naming.store_history(context, history)
    op.log.info("Submitted job %s (%s, submission %d, cause %s)", job_id, name, number, cause)
    if options.get("begin_in"):
        op.log.warning("Job %s may start %d s from now at the earliest (sbatch --begin): back-off after a "
                         "node's fault", job_id, options["begin_in"])
    if left_out:
        context["ti"].xcom_push(key=LEFT_OUT_XCOM_KEY, value=left_out_xcom(job_id, left_out))
    return op._watch_then_defer(context, hook, history)


def bad_nodes(op: SlurmSubmitOperator, hook: SlurmHook, ended: JobStatus | None = None) -> dict[str, NodeFault]:
    """The nodes to leave out of the next submission (:mod:`slurm_provider.bad_nodes`), said in the
    task log; none when ``leave_out_bad_nodes_for`` is 0. The job that just ended counts whether or
    not accounting lists its end yet (slurmdbd may lag a few seconds behind)."""
    from slurm_provider.hooks import SlurmCommandFailed

    window = seconds(op.leave_out_bad_nodes_for)
    if window <= 0:
        return {}
    try:
        faults = hook.node_faults(f"now-{int(window)}seconds", op.node_fault_exit_codes)
    except SlurmCommandFailed as exc:
        op.log.warning("Could not read which nodes failed recently (%s): only the last job's are left out", exc)
        faults = []
    if ended is not None:  # the newest fault
        faults += job_faults(ended.job_id, ended.state, ended.exit_code, ended.node_list, ended.end,
                             op.node_fault_exit_codes)
    left_out = nodes_to_leave_out(faults)
    if left_out:
        op.log.warning("%s", left_out_words(left_out, window / 3600))
    return left_out


def node_fault_back_off(op: SlurmSubmitOperator, history: SubmissionHistory, cause: str) -> int:
    """Seconds a resubmission after a node's fault waits in the queue before it may start (0: none):
    ``node_fault_first_retry``, doubling with each earlier such resubmission of this task."""
    if cause not in NODE_LEVEL_CAUSES or op.node_fault_first_retry <= 0:
        return 0
    earlier = sum(1 for s in history.submissions if s.cause in NODE_LEVEL_CAUSES)
    return round(replace(NODE_FAULT_RETRY, base=op.node_fault_first_retry).scheduled(earlier))


def adopt_live_writer(op: SlurmSubmitOperator, context: Context, history: SubmissionHistory, live: Sequence[JobStatus],
                       number: int, login_user: str | None = None) -> Any:
    """Watch the live job of the login user that already writes ``exclusive_dir`` instead of
    submitting a second one. Fail, naming the job, when it belongs to another user (never
    adopted), runs another version (two versions must never write one directory), or when this
    task was to move the directory's outputs aside for a fresh start."""
    own_dir = exclusive_dir_marker(op.exclusive_dir or "/")
    job = next((j for j in live if (c := parse_job_comment(j.comment)) is not None and c.xdir == own_dir),
               live[0])
    theirs = parse_job_comment(job.comment)
    who = _submitter(job, theirs)
    writes = directory_of(op, theirs)
    if op.replace_outputs:
        raise AirflowFailException(
            f"a fresh start would move {writes} aside while job {job.job_id} ({who}, {job.state.value}) "
            f"still writes it. Wait for it to end, or cancel it (scancel {job.job_id}), then run again.")
    if job.user and login_user and job.user != login_user:
        raise AirflowFailException(
            f"job {job.job_id} of user {job.user} ({who}) is {job.state.value} and writes {writes}; "
            f"this task logs in as {login_user}, and a job of another user is never adopted or "
            f"duplicated. Wait for job {job.job_id} to end and clear this task (a stage it completed is "
            f"then skipped), or ask {job.user} to cancel it (scancel {job.job_id}).")
    ours = naming.comment(op, context, number)
    own = (theirs is not None and theirs.by is not None
           and (theirs.dag, theirs.task, theirs.run, theirs.by) == (ours.dag, ours.task, ours.run, ours.by))
    cause = WATCHED_AGAIN if own else ADOPTED  # own: this task's job from before the DAG run was cleared
    mine = op.code_version or None
    if mine is not None and (theirs is None or theirs.code != mine):
        raise AirflowFailException(
            f"job {job.job_id} ({who}) is {job.state.value} and writes {op.exclusive_dir}, but it runs "
            f"code {theirs.code if theirs else 'unknown'} and this task runs {mine}: two jobs must never "
            f"write one directory. Wait for job {job.job_id} to end, or cancel it (scancel {job.job_id}), "
            "then clear this task.")
    history.add(Submission(job.job_id, number, cause, naming.try_number(context),
                           clear_number=naming.clear_number(context), name=job.name,
                           submitted_by=None if cause == WATCHED_AGAIN else
                           (f"user {job.user}, {who}" if job.user else who)))
    naming.store_history(context, history)
    op.log.info("Job %s (%s, %s) already writes %s: watching it instead of submitting a second job",
                  job.job_id, who, job.state.value, op.exclusive_dir)
    if cause == ADOPTED:
        op.log.info("This task did not submit job %s: it leaves it running if it is stopped or gives up",
                      job.job_id)
    return op._defer(context, history)


def directory_of(op: SlurmSubmitOperator, comment: JobComment | None) -> str:
    """Which of the directories this submit guards a live job's comment names."""
    for directory in (op.exclusive_dir, *op.supersede_dirs):
        if directory and comment is not None and comment.xdir == exclusive_dir_marker(directory):
            return directory
    return op.exclusive_dir or "the directory"


def find_own_job(op: SlurmSubmitOperator, context: Context, hook: SlurmHook, *, number: int,
                  attempts: int = 1) -> JobStatus | None:
    """The newest job on the cluster with this task's name and comment (submission ``number``); a
    lookup the cluster did not answer is tried ``attempts`` times on ``timing.LOOKUP_RETRY``."""
    name = naming.job_name(context)
    expected = naming.comment(op, context, number)

    def said(state: RetryCallState) -> None:
        op.log.warning("Looking up %s failed (%s); retrying", name, state.outcome.exception() if state.outcome
                         else "?")

    jobs = Retrying(stop=stop_after_attempt(attempts), retry=retry_if_exception_type(TransportError),
                    wait=lambda state: LOOKUP_RETRY.delay(state.attempt_number - 1), before_sleep=said,
                    reraise=True)(hook.find_jobs, name=name)
    mine = [j for j in jobs if (c := parse_job_comment(j.comment)) is not None
            and c.same_task(expected) and c.attempt == number]
    return max(mine, key=lambda j: int(j.job_id.split("_")[0])) if mine else None
