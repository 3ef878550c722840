"""Which Slurm jobs a task has submitted, and whether an interrupted one may be submitted again.

Pure: the operator records every submission here (persisted in the task state store and carried
through trigger events), and asks :func:`decide_resubmission` after a job ended *interrupted*
(time limit, node failure, preemption without requeue, boot failure, a batch script killed from
outside before it could end on its own). A resubmission needs a
budget left for that cause and, when a progress probe is configured, evidence that the last run
moved the training forward: a job that keeps timing out without writing a checkpoint would
otherwise burn the allocation one walltime at a time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from slurm_provider.bad_nodes import NODE_FAULT
from slurm_provider.watch.end_records import EndRecord
from slurm_provider.hints import MEMORY_KILL
from slurm_provider.job_status import JobStatus
from slurm_provider.state_vocabulary import SlurmState

KILLED = "KILLED"
"""The cause of a job whose batch script was killed by a signal from outside before it could end on its
own (Slurm: ``FAILED`` with a signal, and no exit record of that run): an administrator's kill, a
controller restarted after losing the job's start. An interruption like a node failure, not a failure
of what the job ran."""

DEFAULT_BUDGETS: Mapping[str, int] = {
    SlurmState.TIMEOUT.value: 10,
    SlurmState.NODE_FAIL.value: 3,
    SlurmState.PREEMPTED.value: 5,
    SlurmState.BOOT_FAIL.value: 3,
    KILLED: 3,
    NODE_FAULT: 2,
}

NO_PROGRESS_EXPECTED = frozenset({SlurmState.BOOT_FAIL.value, NODE_FAULT})
"""Causes of jobs that never got to work (the node did not boot, or the job script found the node at
fault before it started its work): no progress to ask of them, the budget alone bounds them."""


ADOPTED = "adopted"
"""The ``cause`` of a live job of the same directory, submitted by another task (another DAG run or
deployment), that a task watches instead of submitting. It is never cancelled by the watching task."""

WATCHED_AGAIN = "watched-again"
"""The ``cause`` of a live job this very task submitted before its DAG run was cleared, watched again."""


@dataclass(frozen=True)
class Submission:
    """One ``sbatch`` this task made (or adopted)."""

    job_id: str
    number: int
    """1 for the first submission of the task in this DAG run, 2 for the first resubmission, ..."""
    cause: str
    """Why it was submitted: ``initial``, ``retry`` or the Slurm state that ended the previous job."""
    try_number: int
    progress: str | None = None
    """The progress probe's reading when this job was submitted (None: no probe)."""
    clear_number: int = 0
    """The DAG run's clear count at submission: a cleared task starts a new history."""
    name: str | None = None
    """The job's Slurm name when it is not this task's own (a live job of the same directory,
    submitted by another DAG run, clear or deployment, that this task adopted)."""
    submitted_by: str | None = None
    """Who submitted an adopted job (user, DAG, run, task), from its comment. A task cancels only
    the jobs it submitted itself: an adopted job is left running when the task stops or gives up."""

    @property
    def adopted(self) -> bool:
        """The job was submitted by someone else (another clear, run or deployment) and only watched here."""
        return self.cause == ADOPTED


@dataclass
class SubmissionHistory:
    submissions: list[Submission] = field(default_factory=list)

    @property
    def current(self) -> Submission | None:
        return self.submissions[-1] if self.submissions else None

    @property
    def job_ids(self) -> list[str]:
        return [s.job_id for s in self.submissions]

    def add(self, submission: Submission) -> None:
        if submission.job_id in self.job_ids:
            return
        self.submissions.append(submission)

    def resubmissions_for(self, cause: str) -> int:
        return sum(1 for s in self.submissions if s.cause == cause)

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(s) for s in self.submissions]

    @classmethod
    def from_json(cls, data: Any) -> SubmissionHistory:
        if isinstance(data, str):
            data = json.loads(data)
        return cls([Submission(**item) for item in data or []])

    def since_clear(self, clear_number: int) -> SubmissionHistory:
        """Only the submissions made since the DAG run was last cleared.

        Clearing a task in Airflow (or reprocessing its run in a backfill) asks for the work to be
        done again: the jobs of earlier clears are records, not jobs to wait for or adopt.
        """
        return SubmissionHistory([s for s in self.submissions if s.clear_number == clear_number])

    @classmethod
    def merge(cls, *histories: SubmissionHistory) -> SubmissionHistory:
        """Union by job id, in submission order (the store and an event may each hold a part)."""
        merged = cls()
        for sub in sorted((s for h in histories for s in h.submissions), key=lambda s: s.number):
            merged.add(sub)
        return merged


@dataclass(frozen=True)
class ResubmitDecision:
    resubmit: bool
    cause: str
    message: str


def progress_made(before: str | None, after: str | None) -> bool:
    """Did the progress file move forward? JSON with ``epoch``/``step`` compares them; else any change."""
    if after is None:
        return False
    if before is None:
        return True
    try:
        old, new = json.loads(before), json.loads(after)
        key = lambda p: (int(p.get("epoch", -1)), int(p.get("step", -1)))  # noqa: E731
        return key(new) > key(old)
    except (ValueError, TypeError, AttributeError):
        return before != after


def killed_from_outside(status: JobStatus, record: EndRecord | None, logs: str = "") -> bool:
    """The job's batch script died of a signal before it could write its exit record: Slurm says
    ``FAILED`` with a signal (``ExitCode 0:9``), and no record of this run exists. A script that ends
    on its own, even of a signal its program died of, writes the record (its exit status then holds
    the signal, and Slurm's ``ExitCode`` has none). A job Slurm killed for its memory looks the same
    where Slurm enforces memory itself (``OverMemoryKill``, no cgroup): ``logs`` (the tails of its
    output and error output) saying so (:data:`slurm_provider.hints.MEMORY_KILL`) make it no
    interruption, since running it again ends the same way."""
    if status.state is not SlurmState.FAILED or not status.signal or MEMORY_KILL.search(logs):
        return False
    return record is None or record.job_id != status.job_id or record.restart < status.restarts


def decide_resubmission(state: SlurmState, history: SubmissionHistory, budgets: Mapping[str, int],
                        *, progress_now: str | None, probe_configured: bool,
                        cause: str | None = None) -> ResubmitDecision:
    """Resubmit after an interrupted end, within the cause's budget and only if progress was made.

    ``cause``: an interruption the caller found that Slurm's state does not name (``KILLED``:
    :func:`killed_from_outside`; ``NODE_FAULT``: :mod:`slurm_provider.bad_nodes`); None: the state's."""
    interruption = cause is not None or state.is_retryable
    cause = cause or state.value
    if not interruption:
        return ResubmitDecision(False, cause, f"{cause} is not an interruption that a resubmission fixes")
    budget = int(budgets.get(cause, 0))
    used = history.resubmissions_for(cause)
    if used >= budget:
        return ResubmitDecision(False, cause, f"resubmission budget for {cause} used up ({used} of {budget}); "
                                              f"jobs so far: {', '.join(history.job_ids)}")
    current = history.current
    if probe_configured and cause not in NO_PROGRESS_EXPECTED and not progress_made(current.progress if current else None, progress_now):
        return ResubmitDecision(False, cause, (
            f"job {current.job_id if current else '?'} ended {cause} without progress "
            f"(progress file {'missing' if progress_now is None else 'unchanged'}: {progress_now!r}); "
            "not resubmitting, since another run would likely end the same way"))
    return ResubmitDecision(True, cause, f"resubmitting after {cause} ({used + 1} of {budget})")
