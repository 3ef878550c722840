"""A task that watches a short job itself (``short_job_wait``) on the real local cluster.

The jobs' scripts leave exit records (``end_record_shell``). A job that ends within the wait is
concluded by the task without deferring: the task log says so, carries the job's output once, and
accounting holds one job; a job that outlives the wait, or requeues itself, is handed to the trigger
as before. Proof is the task log and ``sacct``, never a timing.
"""

from __future__ import annotations

import pytest

from support.lifecycle import jobs_of, run_lifecycle
from support.localcluster import LocalCluster
from slurm_provider.watch.end_records import end_record_shell

pytestmark = pytest.mark.usefixtures("cluster_connection", "airflow_home")

ENDED_HERE = "ended within 30 s of its submit"


def _recording_script(log_dir: str, body: str) -> str:
    return f"#!/bin/bash\n{end_record_shell(f'{log_dir}/%x.%j.out')}\n{body}\n"


@pytest.fixture
def short_job_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_LIFECYCLE_SHORT_JOB_WAIT", "30")


@pytest.mark.usefixtures("short_job_wait")
def test_a_job_that_ends_within_the_wait_completes_the_task_without_a_trigger(
        local_cluster: LocalCluster, capfd: pytest.CaptureFixture) -> None:
    log_dir = local_cluster.test_dir()
    outcome = run_lifecycle(capfd, script=_recording_script(log_dir, "echo working; sleep 2"), log_dir=log_dir)
    assert outcome.state == "success", outcome.output[-3000:]
    job_id = outcome.result["job_id"]
    assert outcome.result["state"] == "COMPLETED" and outcome.result["exit_code"] == 0
    assert f"Job {job_id} {ENDED_HERE}: COMPLETED" in outcome.output
    assert outcome.output.count(f"[job {job_id}] working") == 1
    assert "deferr" not in outcome.output.lower(), outcome.output[-3000:]
    assert "a shell beside job" not in outcome.output  # it ended: nothing to reach by hand
    assert jobs_of(local_cluster, outcome) == [job_id]


@pytest.mark.usefixtures("short_job_wait")
def test_a_short_job_that_fails_fails_the_task_with_its_exit_code_and_output(
        local_cluster: LocalCluster, capfd: pytest.CaptureFixture) -> None:
    log_dir = local_cluster.test_dir()
    body = "echo 'about to fail'; echo 'it broke' >&2; exit 3"
    outcome = run_lifecycle(capfd, script=_recording_script(log_dir, body), log_dir=log_dir)
    assert outcome.state == "failed"
    (job_id,) = jobs_of(local_cluster, outcome)
    assert f"Job {job_id} {ENDED_HERE}: FAILED" in outcome.output
    assert f"Slurm job {job_id} ended FAILED" in outcome.output and "Exit code 3." in outcome.output
    assert f"[job {job_id}] about to fail" in outcome.output
    assert f"[job {job_id} stderr] it broke" in outcome.output


@pytest.mark.usefixtures("short_job_wait")
def test_a_job_that_outlives_the_wait_is_watched_by_the_trigger(local_cluster: LocalCluster,
                                                                capfd: pytest.CaptureFixture,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_LIFECYCLE_SHORT_JOB_WAIT", "2")
    log_dir = local_cluster.test_dir()
    outcome = run_lifecycle(capfd, script=_recording_script(log_dir, "echo started; sleep 12; echo finished"),
                            log_dir=log_dir)
    assert outcome.state == "success", outcome.output[-3000:]
    job_id = outcome.result["job_id"]
    assert "ended within" not in outcome.output
    # Handed to the trigger, the job's handles are said once, with the connection's login.
    shell = f"a shell beside job {job_id} (in its allocation): ssh -t -p 2222 -i "
    assert outcome.output.count(shell) == 1, outcome.output[-3000:]
    assert f"vcloud@127.0.0.1 'srun --jobid={job_id} --overlap --pty bash -l'" in outcome.output
    assert f"its output as it grows: ssh -p 2222 -i " in outcome.output
    assert f"vcloud@127.0.0.1 'scancel {job_id}'" in outcome.output
    assert outcome.output.count(f"[job {job_id}] started") == 1
    assert outcome.output.count(f"[job {job_id}] finished") == 1
    assert jobs_of(local_cluster, outcome) == [job_id]


@pytest.mark.usefixtures("short_job_wait")
def test_a_job_that_requeues_itself_and_runs_on_is_handed_to_the_trigger_and_completes_once(
        local_cluster: LocalCluster, capfd: pytest.CaptureFixture) -> None:
    log_dir = local_cluster.test_dir()
    body = """echo "run ${SLURM_RESTART_COUNT:-0}"
if [ "${SLURM_RESTART_COUNT:-0}" -eq 0 ]; then requeued=1; scontrol requeue "$SLURM_JOB_ID"; sleep 60; fi
sleep 40
echo done"""
    outcome = run_lifecycle(capfd, script=_recording_script(log_dir, body), log_dir=log_dir, time_limit="5",
                            sbatch_options=["--requeue"])
    assert outcome.state == "success", outcome.output[-3000:]
    job_id = outcome.result["job_id"]
    assert "ended within" not in outcome.output
    assert outcome.result["restarts"] >= 1
    assert jobs_of(local_cluster, outcome) == [job_id]
