"""How a job's end becomes the task's outcome: success and what it cost, a resubmission within the
budgets, or a failure that leaves nothing in Slurm's queue and says why in the job's own words.

A job that itself ended badly (failed, out of memory, cancelled, can never start, resubmission budget
spent) fails the task with :class:`AirflowFailException`, which Airflow never retries, so a broken job
is not submitted again behind anyone's back. When the task gives up on a job that Slurm still keeps in
its queue, the job is cancelled with the reason logged, unless ``keep_job_on_give_up`` asks to leave it
for a person; the failure message says which.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException
from tenacity import Retrying, retry_if_not_result, stop_after_delay, wait_fixed

from slurm_provider.bad_nodes import NODE_FAULT, is_node_fault, same_fault_elsewhere
from slurm_provider.watch.end_records import end_record_path, parse_end_record
from slurm_provider.exit_codes import explain_exit
from slurm_provider.hints import hint_for
from slurm_provider.job_status import JobStatus
from slurm_provider.job_task import naming, submission
from slurm_provider.job_task.summary import JobSummary
from slurm_provider.links import JOB_ID_XCOM_KEY
from slurm_provider.resubmission import KILLED, SubmissionHistory, decide_resubmission, killed_from_outside
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.transport import TransportError
from slurm_provider.watch.events import ERROR, LOST, NEVER_STARTS, WatchEvent

if TYPE_CHECKING:
    from airflow.sdk import Context

    from slurm_provider.hooks import SlurmHook
    from slurm_provider.operators import SlurmSubmitOperator

LOG_TAIL_BYTES = 12000
"""How much of the end of a job's log a failure message reads."""
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


def _with_note(exc: Exception, note: str) -> Exception:
    """``exc`` again, of the same type where it can be rebuilt from a message, with ``note`` appended."""
    try:
        return type(exc)(f"{exc}\n{note}")
    except Exception:
        return AirflowException(f"{exc}\n{note}")


def interpret(op: SlurmSubmitOperator, context: Context, hook: SlurmHook, history: SubmissionHistory, ended: WatchEvent) -> Any:
    """Map the trigger's event to success, a resubmission, a retry (lost watch) or a final failure."""
    if ended.kind == ERROR:
        raise AirflowException(f"{ended.message}. The job may still be running: a retry of this "
                               "task adopts it instead of submitting again.")
    if ended.kind == LOST:
        raise AirflowException(f"{ended.message}; check `sacct -j {ended.job_id}` on the cluster. A retry "
                               "of this task looks for the job again before submitting another.")
    if ended.kind == NEVER_STARTS:
        left = give_up(op, context, hook, ended.job_id, ended.message, history)
        raise AirflowFailException(f"{ended.message}.\n{left}".rstrip())
    assert ended.status is not None  # a finished event always carries one (WatchEvent)
    return conclude(op, context, hook, history, ended.status)


def conclude(op: SlurmSubmitOperator, context: Context, hook: SlurmHook, history: SubmissionHistory, status: JobStatus) -> Any:
    """Success, a resubmission or a final failure for a job that ended in ``status``."""
    job_id = status.job_id
    if not status.state.keeps_place_in_queue:  # SPECIAL_EXIT has no final accounting row yet
        status = accounted(hook, status)
    if status.state.is_success:
        return finish(op, context, hook, history, status)
    if status.state.is_retryable:
        return after_interruption(op, context, hook, history, status)
    if killed_from_outside_its_script(op, context, hook, status):
        return after_interruption(op, context, hook, history, status, cause=KILLED)
    if ended_for_its_node(op, hook, history, status):
        return after_interruption(op, context, hook, history, status, cause=NODE_FAULT)
    message = failure_message(op, hook, status, context)
    left = give_up(op, context, hook, job_id, f"it ended {status.state.value}", history)
    raise AirflowFailException(f"{message}\n{left}".rstrip())


def ended_for_its_node(op: SlurmSubmitOperator, hook: SlurmHook, history: SubmissionHistory, status: JobStatus) -> bool:
    """The job's script said its node was at fault, bad nodes are left out (so another node runs it),
    and no earlier job of this task ended so on another node (then every node fails it: the job's
    environment, e.g. a site image without its GPU libraries, is at fault)."""
    if submission.seconds(op.leave_out_bad_nodes_for) <= 0 or \
            not is_node_fault(status.state, status.exit_code, op.node_fault_exit_codes):
        return False
    earlier = [s for s in hook.statuses(history.job_ids).values() if s.job_id != status.job_id]
    other = same_fault_elsewhere(status, earlier)
    if other is not None:
        op.log.warning("Job %s failed with exit code %s on %s, as job %s did on %s: not a node's fault but "
                         "the job's, not resubmitted", status.job_id, status.exit_code, status.node_list,
                         other.job_id, other.node_list)
        return False
    op.log.warning("Job %s failed with exit code %s on %s, which says its node is at fault: an "
                     "interruption, resubmitted to other nodes", status.job_id, status.exit_code,
                     status.node_list or "its node")
    return True


def killed_from_outside_its_script(op: SlurmSubmitOperator, context: Context, hook: SlurmHook, status: JobStatus) -> bool:
    """A ``FAILED`` job whose script writes an exit record, killed by a signal with no record of
    that run left (:func:`slurm_provider.resubmission.killed_from_outside`)."""
    if not op.writes_end_record or status.state is not SlurmState.FAILED or not status.signal:
        return False
    record = parse_end_record(hook.read_file(end_record_path(naming.log_path(op, context, status.job_id))) or "")
    logs = "\n".join(log_tail(hook, naming.log_path(op, context, status.job_id, stream=stream))
                     for stream in ("out", "err"))
    if not killed_from_outside(status, record, logs):
        return False
    op.log.warning("Job %s ended FAILED of signal %s before its script could end (no exit record of the "
                     "run): killed from outside the job, an interruption", status.job_id, status.signal)
    return True


def after_interruption(op: SlurmSubmitOperator, context: Context, hook: SlurmHook, history: SubmissionHistory,
                        status: JobStatus, *, cause: str | None = None) -> Any:
    progress = hook.read_file(op.progress_path) if op.progress_path else None
    decision = decide_resubmission(status.state, history, op.resubmit_budgets, progress_now=progress,
                                   probe_configured=bool(op.progress_path), cause=cause)
    op.log.warning("Job %s ended %s: %s", status.job_id, decision.cause, decision.message)
    if not decision.resubmit:
        left = give_up(op, context, hook, status.job_id, f"not resubmitted: {decision.message}", history)
        raise AirflowFailException(f"{failure_message(op, hook, status, context)}\nNot resubmitted: "
                                   f"{decision.message}\n{left}".rstrip())
    try:
        op.check_before_resubmit(context, hook)
    except TransportError:
        raise  # the check could not be made: wait for the login node, then decide again
    except Exception as exc:
        left = give_up(op, context, hook, status.job_id, f"resubmission refused: {exc}", history)
        if not left:
            raise
        raise _with_note(exc, left) from exc
    return submission.submit(op, context, hook, history, cause=decision.cause, progress=progress, ended=status)


def finish(op: SlurmSubmitOperator, context: Context, hook: SlurmHook, history: SubmissionHistory,
            status: JobStatus) -> dict[str, Any]:
    """The task's return value (:class:`~slurm_provider.job_task.summary.JobSummary` as JSON) once its job completed."""
    gpu_hours = 0.0
    for job_id in history.job_ids:
        for run in hook.runs(job_id):
            gpu_hours += op.billed_gpu_hours(run)
    summary = JobSummary.of(status, history.job_ids, gpu_hours, history.to_json())
    context["ti"].xcom_push(key=JOB_ID_XCOM_KEY, value=status.job_id)
    op.log.info("Job %s completed: %s GPU-hours over %d submission(s)", status.job_id,
                  summary.gpu_hours, len(history.submissions))
    return summary.to_json()


def accounted(hook: SlurmHook, status: JobStatus, wait_s: float = 15.0) -> JobStatus:
    """The job's final row from accounting (exit code, elapsed, node list are complete there).

    The trigger may have seen the end in ``squeue``; slurmdbd receives the record a moment later:
    asked every second for up to ``wait_s``, then the status at hand stands.
    """
    def final(runs: list[JobStatus]) -> bool:
        return bool(runs) and runs[-1].state.is_terminal

    runs = Retrying(stop=stop_after_delay(wait_s), wait=wait_fixed(1.0), retry=retry_if_not_result(final),
                    retry_error_callback=lambda state: [])(hook.runs, status.job_id)
    return runs[-1] if final(runs) else status


def failure_message(op: SlurmSubmitOperator, hook: SlurmHook, status: JobStatus, context: Context) -> str:
    log_path = naming.log_path(op, context, status.job_id)
    err_path = naming.log_path(op, context, status.job_id, stream="err")
    tail, err_tail = log_tail(hook, log_path), log_tail(hook, err_path)
    parts = [f"Slurm job {status.job_id} ended {status.state.value}: {status.state.description}"]
    if status.cancelled_by:
        parts.append(f"Cancelled by uid/user {status.cancelled_by}.")
    if status.reason and status.reason not in ("None", ""):
        parts.append(f"Reason: {status.reason}.")
    if status.exit_code is not None:
        parts.append(f"Exit code {status.exit_code}" + (f", signal {status.signal}" if status.signal else "") + ".")
    explained = explain_exit(status.exit_code, status.signal, op.exit_code_meanings)
    if explained:
        parts.append(explained)
    parts.append(f"Logs: {log_path} (output), {err_path} (errors)")
    hint = hint_for(f"{tail}\n{err_tail}", state=status.state, overrides=op.hint_overrides)
    if hint:
        parts.append(f"Hint: {hint}")
    if err_tail.strip():
        parts.append("Last lines of the job's error output (stderr):\n" + log_excerpt(err_tail))
    if tail.strip():
        parts.append("Last lines of the job's output:\n" + log_excerpt(tail))
    return "\n".join(parts)


def log_tail(hook: SlurmHook, path: str) -> str:
    try:
        size = hook.file_sizes([path]).get(path, 0)
        text, _ = hook.read_log(path, max(0, size - LOG_TAIL_BYTES))
        return text
    except TransportError as exc:
        return f"(could not read the log: {exc})"


def give_up(op: SlurmSubmitOperator, context: Context, hook: SlurmHook, job_id: str, why: str,
             history: SubmissionHistory | None = None) -> str:
    """The task fails: leave none of its jobs in Slurm's queue unless ``keep_job_on_give_up``.

    Asks Slurm once more (the event may be a poll old) and returns the sentence for the failure
    message: what happened to the job, or "" when Slurm no longer keeps it.
    """
    try:
        status = hook.statuses([job_id]).get(job_id)
    except TransportError as exc:
        op.log.warning("Giving up on job %s (%s), but cannot ask Slurm about it: %s", job_id, why, exc)
        return (f"Job {job_id} may still be in the queue (could not ask Slurm: {exc}); "
                f"check with `squeue -j {job_id}` and cancel it with `scancel {job_id}` if it is.")
    if status is None or not status.state.keeps_place_in_queue:
        return ""
    reason = status.reason if status.reason not in (None, "", "None") else None
    where = status.state.value + (f", reason {reason}" if reason else "")
    adopted = naming.adopted_submission(context, job_id, history)
    if status.name != (adopted.name if adopted is not None and adopted.name else
                       naming.name_of_job(context, job_id)):
        op.log.warning("Job id %s now names %r, not this task's job: left alone", job_id, status.name)
        return ""
    if adopted is not None:
        op.log.warning("Giving up on job %s (%s): %s. It was submitted by %s, not by this task, which only "
                         "watched it: left running", job_id, where, why, adopted.submitted_by or "another task")
        return (f"Job {job_id} ({where}) was left running: it was submitted by "
                f"{adopted.submitted_by or 'another task'}, and this task only watched it.")
    if op.keep_job_on_give_up:
        op.log.warning("Giving up on job %s (%s): %s. Keeping it in the queue for a person "
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
        op.log.error("Giving up on job %s (%s): %s; cancelling it failed: %s", job_id, where, why,
                       problem)
        return (f"Job {job_id} ({where}) could not be cancelled ({problem}): "
                f"cancel it with `scancel {job_id}`.")
    op.log.warning("Cancelled job %s (%s): the task gives up on it: %s", job_id, where, why)
    return (f"Job {job_id} was cancelled ({where}), so that it is not left in the queue "
            "(keep_job_on_give_up=True keeps such a job for a person).")
