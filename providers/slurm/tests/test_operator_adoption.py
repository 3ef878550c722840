"""Idempotent submission: a task try that lost its worker or its SSH connection adopts its job.

These drive `execute()` directly (as a retried task try would) against the real cluster, with a
dict-backed stand-in for Airflow's task state store, and count the jobs in `sacct`.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from airflow.exceptions import TaskDeferred
from airflow.sdk.exceptions import AirflowFailException

from support.fake_slurm import FakeSlurm
from support.localcluster import LocalCluster, poll_until
from slurm_provider import hooks
from slurm_provider.cli.sbatch import parse_job_comment
from slurm_provider.operators import HISTORY_KEY, SUBMITTER_KEY, SlurmSubmitOperator, job_name_for
from slurm_provider.transport import TransportUnavailable
from slurm_provider.validation import ValidationError
from support.task_context import StateStore, task_context


def _context(run_id: str, try_number: int, store: StateStore, clear_number: int = 0) -> dict[str, Any]:
    return task_context(run_id, store, dag_id="adoption", task_id="train", try_number=try_number,
                        clear_number=clear_number)


def _operator(conn_id: str, log_dir: str, script: str = "#!/bin/bash\nsleep 60\n", **kwargs: Any) -> SlurmSubmitOperator:
    return SlurmSubmitOperator(task_id="train", conn_id=conn_id, script=script, log_dir=log_dir, time_limit="2",
                               poll_interval=2, first_poll_delay=0, **kwargs)


def _deferred_job(op: SlurmSubmitOperator, context: dict[str, Any]) -> str:
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    return deferred.value.trigger.job_id


def _jobs_named(cluster: LocalCluster, name: str) -> list[str]:
    def read() -> list[str]:
        out = cluster.root("squeue", "-h", "-t", "all", f"--name={name}", "-o", "%i").stdout
        return sorted(set(out.split()), key=int)  # job ids in submission order, past 999 too
    return poll_until(read, timeout=30, what=f"jobs named {name}")


@pytest.fixture
def run_id() -> str:
    return f"manual__{uuid.uuid4().hex}"


def test_retry_after_worker_died_mid_wait_adopts_the_job(local_cluster: LocalCluster, cluster_connection: str,
                                                         run_id: str) -> None:
    store, log_dir = StateStore(), local_cluster.test_dir()
    first = _deferred_job(_operator(cluster_connection, log_dir), _context(run_id, 1, store))
    assert [s["job_id"] for s in store.data[HISTORY_KEY]] == [first]
    try:
        second = _deferred_job(_operator(cluster_connection, log_dir), _context(run_id, 2, store))
        assert second == first
        assert _jobs_named(local_cluster, job_name_for("adoption", "train", run_id)) == [first]
    finally:
        hooks.SlurmHook(cluster_connection).cancel(first)


def test_retry_that_lost_the_stored_id_finds_the_job_by_name_and_comment(
        local_cluster: LocalCluster, cluster_connection: str, run_id: str) -> None:
    log_dir = local_cluster.test_dir()
    store = StateStore()
    first = _deferred_job(_operator(cluster_connection, log_dir), _context(run_id, 1, store))
    try:
        # the worker died between sbatch and saving the job id: the store holds only the task's
        # submitter token, written before sbatch ran
        empty_store = store.keeping(SUBMITTER_KEY)
        second = _deferred_job(_operator(cluster_connection, log_dir), _context(run_id, 2, empty_store))
        assert second == first
        assert [s["job_id"] for s in empty_store.data[HISTORY_KEY]] == [first]
        assert _jobs_named(local_cluster, job_name_for("adoption", "train", run_id)) == [first]
    finally:
        hooks.SlurmHook(cluster_connection).cancel(first)


def test_ssh_dropped_right_after_sbatch_adopts_instead_of_submitting_again(
        local_cluster: LocalCluster, cluster_connection: str, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real_submit = hooks.SlurmHook.submit
    submitted: list[str] = []

    def submit_then_lose_connection(self: hooks.SlurmHook, *args: Any, **kwargs: Any) -> Any:
        submitted.append(str(real_submit(self, *args, **kwargs).job_id))
        raise TransportUnavailable("connection reset by peer after sbatch")

    monkeypatch.setattr(hooks.SlurmHook, "submit", submit_then_lose_connection)
    log_dir = local_cluster.test_dir()
    job_id = _deferred_job(_operator(cluster_connection, log_dir), _context(run_id, 1, StateStore()))
    try:
        assert submitted == [job_id]
        assert _jobs_named(local_cluster, job_name_for("adoption", "train", run_id)) == [job_id]
    finally:
        hooks.SlurmHook(cluster_connection).cancel(job_id)


def test_new_try_after_the_job_completed_finishes_without_submitting(
        local_cluster: LocalCluster, cluster_connection: str, run_id: str) -> None:
    store, log_dir = StateStore(), local_cluster.test_dir()
    op = _operator(cluster_connection, log_dir, script="#!/bin/bash\necho done\n")
    job_id = _deferred_job(op, _context(run_id, 1, store))
    local_cluster.wait_for_state(int(job_id), {"COMPLETED"}, timeout=60)
    summary = op.execute(_context(run_id, 2, store))
    assert summary["job_id"] == job_id and summary["state"] == "COMPLETED"
    assert _jobs_named(local_cluster, job_name_for("adoption", "train", run_id)) == [job_id]


def test_retry_that_finds_its_job_failed_fails_for_good_without_submitting(
        local_cluster: LocalCluster, cluster_connection: str, run_id: str) -> None:
    # The watch was lost (worker killed) and the job failed meanwhile: the retry must not resubmit it.
    store, log_dir = StateStore(), local_cluster.test_dir()
    op = _operator(cluster_connection, log_dir, script="#!/bin/bash\necho broken\nexit 3\n")
    job_id = _deferred_job(op, _context(run_id, 1, store))
    local_cluster.wait_for_state(int(job_id), {"FAILED"}, timeout=60)
    with pytest.raises(AirflowFailException, match=f"Slurm job {job_id} ended FAILED") as failed:
        op.execute(_context(run_id, 2, store))
    assert "Exit code 3." in str(failed.value) and "broken" in str(failed.value)
    assert _jobs_named(local_cluster, job_name_for("adoption", "train", run_id)) == [job_id]


@pytest.mark.parametrize("store_survives", [True, False])
def test_cleared_task_submits_a_new_job_instead_of_adopting_the_completed_one(
        local_cluster: LocalCluster, cluster_connection: str, run_id: str, store_survives: bool,
        capfd: pytest.CaptureFixture[str]) -> None:
    # Clearing a task (or reprocessing its run in a backfill) asks for the work again: Airflow counts
    # the DAG run's clear_number up, and the earlier job is a record, not this try's job.
    store, log_dir = StateStore(), local_cluster.test_dir()
    op = _operator(cluster_connection, log_dir, script="#!/bin/bash\necho done\n")
    first = _deferred_job(op, _context(run_id, 1, store))
    local_cluster.wait_for_state(int(first), {"COMPLETED"}, timeout=60)
    after_clear = store if store_survives else StateStore()
    capfd.readouterr()
    second = _deferred_job(op, _context(run_id, 2, after_clear, clear_number=1))
    printed = capfd.readouterr()  # the task SDK's logger writes to the console, not to logging
    assert second != first
    said = f"The DAG run was cleared since jobs {first}: this task submits afresh"
    cleared = [line for line in (printed.out + printed.err).splitlines() if "cleared since" in line]
    assert len(cleared) == (1 if store_survives else 0) and all(said in line for line in cleared), cleared
    assert [s["job_id"] for s in after_clear.data[HISTORY_KEY]] == [second]
    assert _jobs_named(local_cluster, job_name_for("adoption", "train", run_id)) == sorted([first, second], key=int)
    local_cluster.wait_for_state(int(second), {"COMPLETED"}, timeout=60)
    # a retry within the same clear still adopts, from the job's name and comment alone
    assert op.execute(_context(run_id, 3, after_clear.keeping(SUBMITTER_KEY), clear_number=1))["job_id"] == second


def test_another_deployment_with_the_same_run_id_never_takes_the_job_for_its_own(
        local_cluster: LocalCluster, cluster_connection: str, run_id: str) -> None:
    # Scheduled runs have the same run id in every deployment: same job name, same comment but for
    # the submitter token each task keeps in its own deployment's state store.
    log_dir = local_cluster.test_dir()
    first = _deferred_job(_operator(cluster_connection, log_dir), _context(run_id, 1, StateStore()))
    try:
        elsewhere = StateStore()
        second = _deferred_job(_operator(cluster_connection, log_dir), _context(run_id, 1, elsewhere))
        assert second != first, "not adopted as its own"
        assert parse_job_comment(local_cluster.root("squeue", "-h", "-j", second, "-O", "Comment:2000")
                                 .stdout.strip()).by == elsewhere.data[SUBMITTER_KEY]
    finally:
        hooks.SlurmHook(cluster_connection).cancel(first)
        hooks.SlurmHook(cluster_connection).cancel(second)


def test_same_run_id_writing_elsewhere_is_another_job(local_cluster: LocalCluster, cluster_connection: str,
                                                      run_id: str) -> None:
    # Two deployments (or project directories) with the same DAG and run id share a cluster account.
    op = _operator(cluster_connection, local_cluster.test_dir(), script="#!/bin/bash\necho done\n")
    first = _deferred_job(op, _context(run_id, 1, StateStore()))
    other = _operator(cluster_connection, local_cluster.test_dir(), script="#!/bin/bash\necho done\n")
    second = _deferred_job(other, _context(run_id, 1, StateStore()))
    assert second != first
    for job in (first, second):
        local_cluster.wait_for_state(int(job), {"COMPLETED"}, timeout=60)


def test_the_job_comment_names_the_code_the_job_runs(local_cluster: LocalCluster, cluster_connection: str,
                                                     run_id: str) -> None:
    """What a cleanup of code directories on the cluster reads to keep the code of live jobs."""
    code = "ab" * 32
    op = _operator(cluster_connection, local_cluster.test_dir(), code_version=code)
    job = _deferred_job(op, _context(run_id, 1, StateStore()))
    try:
        comment = local_cluster.root("squeue", "-h", "-j", job, "-O", "Comment:2000").stdout.strip()
        assert parse_job_comment(comment).code == code, comment
    finally:
        local_cluster.ssh(f"scancel {job}", check=False)


@pytest.mark.parametrize(("field", "value"), [
    ("partition", "small-g; touch /tmp/pwned"),
    ("account", "$(touch /tmp/pwned)"),
    ("time_limit", "1`touch /tmp/pwned`"),
    ("sbatch_options", ["--job-name=stolen"]),
    ("log_dir", "relative/logs"),
    ("code_version", "abc|def"),
])
def test_bad_input_is_refused_before_any_ssh(field: str, value: Any, fake_slurm: FakeSlurm, run_id: str) -> None:
    kwargs = {"log_dir": "/srv/vcloud/scratch/vcloud/logs", field: value}
    op = SlurmSubmitOperator(task_id="train", conn_id="unused", script="#!/bin/bash\ntrue\n", **kwargs)
    with pytest.raises(AirflowFailException) as error:  # bad input stays bad: no retry
        op.execute(_context(run_id, 1, StateStore()))
    assert isinstance(error.value.__cause__, ValidationError) and error.value.__cause__.field == field
    assert str(error.value).startswith(f"{field}: ")
    assert not Path("/tmp/pwned").exists()
    assert (fake_slurm.connects, fake_slurm.asked) == (0, []), "no SSH connection may be opened for invalid input"
