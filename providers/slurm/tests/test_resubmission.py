"""Resubmission policy: budgets per cause, progress evidence, history bookkeeping."""

from __future__ import annotations

import json

import pytest

from slurm_provider.resubmission import (
    DEFAULT_BUDGETS,
    Submission,
    SubmissionHistory,
    decide_resubmission,
    progress_made,
)
from slurm_provider.state_vocabulary import SlurmState


def _history(*causes: str, progress: str | None = None) -> SubmissionHistory:
    history = SubmissionHistory()
    for number, cause in enumerate(causes, start=1):
        history.add(Submission(str(100 + number), number, cause, try_number=1, progress=progress))
    return history


def _progress(epoch: int, step: int) -> str:
    return json.dumps({"epoch": epoch, "step": step})


def test_timeout_with_progress_is_resubmitted() -> None:
    history = _history("initial", progress=_progress(0, 0))
    decision = decide_resubmission(SlurmState.TIMEOUT, history, DEFAULT_BUDGETS,
                                   progress_now=_progress(3, 120), probe_configured=True)
    assert decision.resubmit
    assert decision.cause == "TIMEOUT"
    assert "1 of 10" in decision.message


def test_timeout_without_progress_is_not_resubmitted() -> None:
    history = _history("initial", progress=_progress(3, 120))
    decision = decide_resubmission(SlurmState.TIMEOUT, history, DEFAULT_BUDGETS,
                                   progress_now=_progress(3, 120), probe_configured=True)
    assert not decision.resubmit
    assert "without progress" in decision.message


def test_missing_progress_file_means_no_progress() -> None:
    decision = decide_resubmission(SlurmState.NODE_FAIL, _history("initial"), DEFAULT_BUDGETS,
                                   progress_now=None, probe_configured=True)
    assert not decision.resubmit
    assert "missing" in decision.message


def test_budget_is_per_cause() -> None:
    history = _history("initial", "NODE_FAIL", "NODE_FAIL", "NODE_FAIL")
    spent = decide_resubmission(SlurmState.NODE_FAIL, history, DEFAULT_BUDGETS, progress_now=None,
                                probe_configured=False)
    assert not spent.resubmit
    assert "used up (3 of 3)" in spent.message
    other = decide_resubmission(SlurmState.TIMEOUT, history, DEFAULT_BUDGETS, progress_now=None,
                                probe_configured=False)
    assert other.resubmit


@pytest.mark.parametrize("state", [SlurmState.FAILED, SlurmState.CANCELLED, SlurmState.OUT_OF_MEMORY,
                                   SlurmState.COMPLETED, SlurmState.UNKNOWN])
def test_non_interruptions_are_never_resubmitted(state: SlurmState) -> None:
    decision = decide_resubmission(state, _history("initial"), DEFAULT_BUDGETS, progress_now=_progress(9, 9),
                                   probe_configured=True)
    assert not decision.resubmit


@pytest.mark.parametrize(("before", "after", "expected"), [
    (None, _progress(0, 1), True),
    (_progress(1, 10), _progress(1, 11), True),
    (_progress(2, 0), _progress(1, 999), False),
    (_progress(1, 10), _progress(1, 10), False),
    ("epoch 3", "epoch 4", True),
    ("epoch 3", "epoch 3", False),
    (_progress(1, 1), None, False),
])
def test_progress_made(before: str | None, after: str | None, expected: bool) -> None:
    assert progress_made(before, after) is expected


def test_history_round_trips_and_merges_without_duplicates() -> None:
    stored = _history("initial", "TIMEOUT")
    carried = SubmissionHistory.from_json(json.dumps(stored.to_json()))
    carried.add(Submission("103", 3, "TIMEOUT", try_number=1))
    merged = SubmissionHistory.merge(stored, carried)
    assert merged.job_ids == ["101", "102", "103"]
    assert merged.current.number == 3
    assert SubmissionHistory.from_json(None).submissions == []


def test_history_since_the_last_clear_keeps_only_that_clears_jobs() -> None:
    history = SubmissionHistory([Submission("101", 1, "initial", 1), Submission("102", 2, "TIMEOUT", 1),
                                 Submission("205", 1, "initial", 2, clear_number=1)])
    assert history.since_clear(1).job_ids == ["205"]
    assert history.since_clear(0).job_ids == ["101", "102"]
    assert SubmissionHistory.from_json(history.to_json()).since_clear(1).job_ids == ["205"]
    # histories stored before clear numbers were recorded belong to the first clear
    assert SubmissionHistory.from_json([{"job_id": "7", "number": 1, "cause": "initial",
                                         "try_number": 1}]).since_clear(0).job_ids == ["7"]


@pytest.mark.parametrize(("state", "signal", "record", "killed"), [
    (SlurmState.FAILED, 9, None, True),
    (SlurmState.FAILED, 15, "job=7 restart=0 exit=0 end=1 requeued=0", True),  # another job's record
    (SlurmState.FAILED, 9, "job=101 restart=0 exit=0 end=1 requeued=0", True),  # an earlier run's record
    (SlurmState.FAILED, 9, "job=101 restart=1 exit=137 end=1 requeued=0", False),  # this run ended on its own
    (SlurmState.FAILED, 0, None, False),  # a non-zero exit, no signal: the job itself failed
    (SlurmState.CANCELLED, 9, None, False),  # a person's scancel is a gesture, not an interruption
    (SlurmState.OUT_OF_MEMORY, 9, None, False),
], ids=["sigkill-no-record", "other-jobs-record", "earlier-runs-record", "own-record", "no-signal",
        "cancelled", "oom"])
def test_killed_from_outside_is_a_signal_without_the_runs_exit_record(state: SlurmState, signal: int,
                                                                     record: str | None, killed: bool) -> None:
    from slurm_provider.watch.end_records import parse_end_record
    from slurm_provider.job_status import JobStatus
    from slurm_provider.resubmission import killed_from_outside

    status = JobStatus("101", state, signal=signal, restarts=1)
    assert killed_from_outside(status, parse_end_record(record) if record else None) is killed


@pytest.mark.parametrize("logs", [
    "slurmstepd: error: Exceeded job memory limit",  # Slurm's own enforcement (OverMemoryKill)
    "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=101.batch",  # the cgroup's OOM events
], ids=["over-memory-kill", "cgroup-oom"])
def test_a_job_slurm_killed_for_its_memory_is_no_kill_from_outside(logs: str) -> None:
    """Where Slurm enforces memory itself the batch shell dies of SIGKILL too, with no record: its
    logs tell the kill apart, and running the job again would end the same way."""
    from slurm_provider.job_status import JobStatus
    from slurm_provider.resubmission import killed_from_outside

    status = JobStatus("101", SlurmState.FAILED, signal=9)
    assert killed_from_outside(status, None, "slurmstepd: error: *** JOB 101 ON nid1 CANCELLED AT now ***")
    assert not killed_from_outside(status, None, f"loading\n{logs}\n")


def test_a_kill_from_outside_is_resubmitted_within_its_own_budget() -> None:
    from slurm_provider.resubmission import KILLED

    history = SubmissionHistory([Submission("1", 1, "initial", 1)])
    first = decide_resubmission(SlurmState.FAILED, history, {KILLED: 1}, progress_now=None,
                                probe_configured=False, cause=KILLED)
    assert (first.resubmit, first.cause) == (True, "KILLED") and "(1 of 1)" in first.message
    history.add(Submission("2", 2, KILLED, 1))
    second = decide_resubmission(SlurmState.FAILED, history, {KILLED: 1}, progress_now=None,
                                 probe_configured=False, cause=KILLED)
    assert not second.resubmit and "budget for KILLED used up" in second.message
    assert not decide_resubmission(SlurmState.FAILED, history, {KILLED: 5}, progress_now=None,
                                   probe_configured=False).resubmit, "a plain FAILED is no interruption"


def test_a_node_fault_needs_no_progress_only_its_budget() -> None:
    from slurm_provider.bad_nodes import NODE_FAULT

    history = SubmissionHistory([Submission("1", 1, "initial", 1, progress='{"epoch": 3}')])
    first = decide_resubmission(SlurmState.FAILED, history, {NODE_FAULT: 1}, progress_now='{"epoch": 3}',
                                probe_configured=True, cause=NODE_FAULT)
    assert (first.resubmit, first.cause) == (True, NODE_FAULT)
    history.add(Submission("2", 2, NODE_FAULT, 1))
    again = decide_resubmission(SlurmState.FAILED, history, {NODE_FAULT: 1}, progress_now='{"epoch": 3}',
                                probe_configured=True, cause=NODE_FAULT)
    assert not again.resubmit and "budget for NODE_FAULT used up (1 of 1)" in again.message
    timeout = decide_resubmission(SlurmState.TIMEOUT, SubmissionHistory(history.submissions[:1]), {"TIMEOUT": 5},
                                  progress_now='{"epoch": 3}', probe_configured=True)
    assert not timeout.resubmit and "without progress" in timeout.message
