"""JobStatus: built from real squeue/sacct/scontrol output, combined by clear rules, sent as events."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from slurm_provider.cli.sacct import parse_sacct
from slurm_provider.cli.scontrol import parse_scontrol_show_job
from slurm_provider.cli.squeue import parse_squeue
from slurm_provider.state_vocabulary import SlurmState, StateCategory
from slurm_provider.pending_reasons import ReasonKind
from slurm_provider.job_status import JobStatus, resolve_statuses, statuses_from_sacct

GOLDEN = Path(__file__).parent / "golden"
JOBS = dict(line.split("=", 1) for line in (GOLDEN / "jobs.env").read_text().split())


def squeue(name: str):
    return parse_squeue((GOLDEN / f"{name}.txt").read_text())


def sacct(name: str):
    return parse_sacct((GOLDEN / f"{name}.txt").read_text())


def all_golden_statuses() -> list[JobStatus]:
    statuses = []
    for name in ("squeue_live", "squeue_recent", "squeue_requeued"):
        statuses += [JobStatus.from_squeue(row) for row in squeue(name)]
    for name in ("sacct_finished", "sacct_requeue", "sacct_steps", "sacct_pending", "sacct_array_steps"):
        statuses += list(statuses_from_sacct(sacct(name)).values())
    for name in ("scontrol_requeued", "scontrol_pending", "scontrol_running", "scontrol_array"):
        records = parse_scontrol_show_job((GOLDEN / f"{name}.txt").read_text())
        statuses += [JobStatus.from_scontrol(r) for r in records]
    return statuses


# --- from each source ---------------------------------------------------------------------------


def test_finished_jobs_from_sacct() -> None:
    statuses = statuses_from_sacct(sacct("sacct_finished"))
    failed = statuses[JOBS["FAILED_ID"]]
    assert (failed.state, failed.category, failed.exit_code, failed.signal) == (
        SlurmState.FAILED,
        StateCategory.FAILED,
        3,
        0,
    )
    timeout = statuses[JOBS["TIMEOUT_ID"]]
    assert timeout.category is StateCategory.INTERRUPTED and timeout.is_retryable and timeout.is_terminal
    cancelled = statuses[JOBS["CANCEL_ID"]]
    assert cancelled.state is SlurmState.CANCELLED and cancelled.cancelled_by == "1001"
    assert cancelled.raw_state == "CANCELLED by 1001"
    completed = statuses[JOBS["COMPLETED_ID"]]
    assert completed.is_success and completed.gpus == 1 and completed.elapsed_s == 3 and completed.source == "sacct"
    killed = statuses[JOBS["OOM_ID"]]
    assert (killed.state, killed.signal) == (SlurmState.FAILED, 9)


def test_requeued_job_from_sacct_counts_restarts() -> None:
    status = statuses_from_sacct(sacct("sacct_requeue"))[JOBS["REQUEUE_ID"]]
    assert status.state is SlurmState.COMPLETED and status.restarts == 2
    assert "requeued 2x" in status.summary()
    assert "BeginTime" not in status.summary(), "a leftover queue reason is noise on a finished job"


def test_steps_are_reported_on_the_job() -> None:
    statuses = statuses_from_sacct(sacct("sacct_steps"))
    assert statuses[JOBS["OOM_ID"]].step_states == ("batch:CANCELLED by 0",)
    assert statuses[JOBS["FAILED_ID"]].step_states == ("batch:FAILED",)
    assert set(statuses) == {JOBS["OOM_ID"], JOBS["FAILED_ID"], JOBS["CANCEL_ID"]}, "steps are not jobs"


def test_from_squeue_expands_the_log_path() -> None:
    rows = {r.job_id: r for r in squeue("squeue_live")}
    running = JobStatus.from_squeue(rows[JOBS["CANCEL_ID"]])
    assert running.state is SlurmState.RUNNING and running.node_list == "vcnode1"
    assert running.std_out == f"{JOBS['WORK']}/logs/gc-cancelled_{JOBS['CANCEL_ID']}.out"
    assert running.exit_code is None and running.end is None, "no exit code before the end"
    pending = JobStatus.from_squeue(rows[JOBS["PARTLIMIT_ID"]])
    assert pending.gpus == 0 and pending.start is None
    reason = pending.pending_reason()
    assert reason is not None and reason.kind is ReasonKind.NEVER and "partition" in reason.explanation
    assert running.pending_reason() is None


def test_from_scontrol() -> None:
    record = parse_scontrol_show_job((GOLDEN / "scontrol_requeued.txt").read_text())[0]
    status = JobStatus.from_scontrol(record)
    assert (status.state, status.restarts, status.reason) == (SlurmState.PENDING, 1, "BeginTime")
    assert status.std_out == f"{JOBS['WORK']}/logs/gc-requeue_{JOBS['REQUEUE_ID']}.out"
    array = [JobStatus.from_scontrol(r) for r in parse_scontrol_show_job((GOLDEN / "scontrol_array.txt").read_text())]
    assert any(s.job_id == f"{JOBS['THROTTLED_ID']}_0" for s in array)


# --- combining squeue and sacct --------------------------------------------------------------------


def test_resolve_live_and_finished_jobs_together() -> None:
    ids = [JOBS[k] for k in ("CANCEL_ID", "FAILED_ID", "PARTLIMIT_ID", "COMPLETED_ID", "TIMEOUT_ID")] + ["999999"]
    statuses = resolve_statuses(ids, squeue_rows=squeue("squeue_live"), sacct_rows=sacct("sacct_finished"))
    assert list(statuses) == ids
    # While slurmctld (squeue) says the job runs, it runs: sacct can only lag behind it.
    assert statuses[JOBS["CANCEL_ID"]].state is SlurmState.RUNNING
    assert statuses[JOBS["CANCEL_ID"]].source == "squeue"
    # Finished in both: sacct's record is used, the expanded log path comes from squeue.
    failed = statuses[JOBS["FAILED_ID"]]
    assert (failed.source, failed.exit_code) == ("sacct", 3)
    assert failed.std_out.endswith(f"gc-failed_{JOBS['FAILED_ID']}.out")
    assert statuses[JOBS["PARTLIMIT_ID"]].source == "squeue"
    assert statuses[JOBS["COMPLETED_ID"]].is_success
    unknown = statuses["999999"]
    assert unknown.state is SlurmState.UNKNOWN and not unknown.is_success and not unknown.is_terminal
    assert not unknown.found and "not found" in unknown.summary()


def test_live_squeue_beats_stale_sacct_during_a_requeue() -> None:
    """Right after a requeue squeue says PENDING (restart 1); sacct's newest row may still be an old run."""
    stale = [r for r in sacct("sacct_requeue") if r.row_index == 0]
    stale = [dataclasses.replace(stale[0], state="PREEMPTED")]
    status = resolve_statuses([JOBS["REQUEUE_ID"]], squeue_rows=squeue("squeue_requeued"), sacct_rows=stale)[
        JOBS["REQUEUE_ID"]
    ]
    assert status.state is SlurmState.PENDING and status.source == "squeue" and status.restarts == 1


def test_sacct_is_the_truth_once_squeue_forgot() -> None:
    ids = [JOBS["COMPLETED_ID"], JOBS["FAILED_ID"]]
    statuses = resolve_statuses(ids, squeue_rows=squeue("squeue_finished"), sacct_rows=sacct("sacct_finished"))
    assert [s.state for s in statuses.values()] == [SlurmState.COMPLETED, SlurmState.FAILED]
    assert all(s.source == "sacct" for s in statuses.values())


def test_finished_in_squeue_before_accounting_catches_up() -> None:
    ids = [JOBS["COMPLETED_ID"]]
    pending_in_db = [dataclasses.replace(r, state="RUNNING") for r in sacct("sacct_finished") if r.job_id == ids[0]]
    status = resolve_statuses(ids, squeue_rows=squeue("squeue_recent"), sacct_rows=pending_in_db)[ids[0]]
    assert status.state is SlurmState.COMPLETED and status.source == "squeue"


def test_whole_array_is_aggregated() -> None:
    done = resolve_statuses([JOBS["ARRAY_ID"]], sacct_rows=sacct("sacct_array_steps"))[JOBS["ARRAY_ID"]]
    assert done.state is SlurmState.COMPLETED and done.source == "array" and done.elapsed_s == 6
    throttled = JOBS["THROTTLED_ID"]
    waiting = resolve_statuses([throttled], squeue_rows=squeue("squeue_live"), sacct_rows=sacct("sacct_pending"))[throttled]
    assert waiting.state is SlurmState.RUNNING and not waiting.is_terminal and waiting.job_id == throttled
    one_failed = [
        dataclasses.replace(r, state="FAILED", exit_code=2) if r.job_id.endswith("_1") else r
        for r in sacct("sacct_array_steps")
    ]
    failed = resolve_statuses([JOBS["ARRAY_ID"]], sacct_rows=one_failed)[JOBS["ARRAY_ID"]]
    assert failed.state is SlurmState.FAILED and failed.exit_code == 2


def test_array_element_by_display_id_and_by_raw_id() -> None:
    throttled = JOBS["THROTTLED_ID"]
    rows = squeue("squeue_live")
    element = next(r for r in rows if r.job_id == f"{throttled}_0")
    statuses = resolve_statuses([f"{throttled}_0", element.job_id_raw], squeue_rows=rows)
    assert statuses[f"{throttled}_0"].state is SlurmState.RUNNING
    assert statuses[element.job_id_raw].array_task_id == "0"


# --- events and accounting ------------------------------------------------------------------------


def test_event_round_trip_for_every_captured_status() -> None:
    statuses = all_golden_statuses()
    assert len(statuses) > 25
    for status in statuses:
        payload = json.loads(json.dumps(status.to_event()))
        assert payload["state"] == status.state.value and payload["category"] == status.category.value
        assert JobStatus.from_event(payload) == status


def test_from_event_names_what_is_missing() -> None:
    with pytest.raises(ValueError, match="lacks state"):
        JobStatus.from_event({"job_id": "1"})
    with pytest.raises(ValueError, match="unknown state 'DONE'"):
        JobStatus.from_event({"job_id": "1", "state": "DONE"})
    minimal = JobStatus.from_event({"job_id": "1", "state": "UNKNOWN"})
    assert minimal == JobStatus.unknown("1")


def test_gpu_hours() -> None:
    status = JobStatus(job_id="16082076", state=SlurmState.TIMEOUT, gpus=8, elapsed_s=3 * 86400)
    assert status.gpu_hours() == pytest.approx(576.0), "8 GCDs for 3 days on LUMI"
    assert status.gpu_hours(billing_factor=0.5) == pytest.approx(288.0)
    recent = {r.job_id: JobStatus.from_squeue(r) for r in squeue("squeue_recent")}
    assert recent[JOBS["COMPLETED_ID"]].gpu_hours() == pytest.approx(3 / 3600)
    assert JobStatus.unknown("1").gpu_hours() == 0.0


def test_summary_has_reason_exit_code_and_log() -> None:
    rows = {r.job_id: r for r in squeue("squeue_live")}
    failed = JobStatus.from_squeue(rows[JOBS["FAILED_ID"]])
    text = failed.summary()
    assert f"job {JOBS['FAILED_ID']} (gc-failed) FAILED" in text
    assert "exit code 3" in text and "reason NonZeroExitCode" in text
    assert f"log {JOBS['WORK']}/logs/gc-failed_{JOBS['FAILED_ID']}.out" in text
