"""At most one live job per directory: the guarded submit command, run by bash with stand-ins for
squeue and sbatch (two submitters racing), and the operator on the real cluster (a cleared task, a
live job of another version, a restart)."""

from __future__ import annotations

import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from airflow.exceptions import TaskDeferred
from airflow.sdk.exceptions import AirflowFailException

from localcluster import LocalCluster, poll_until
from slurm_provider import hooks
from slurm_provider.cli.sbatch import (
    LIVE_MARKER,
    JobComment,
    build_exclusive_sbatch_submit,
    exclusive_dir_marker,
    parse_job_comment,
)
from slurm_provider.operators import HISTORY_KEY, SlurmSubmitOperator, job_name_for
from slurm_provider.validation import ValidationError
from task_context import StateStore, task_context

SQUEUE_STUB = """#!/bin/bash
# prints the "queue": one line per submitted job, its comment last
cat "$QUEUE" 2>/dev/null || true
"""
SBATCH_STUB = """#!/bin/bash
# a slow sbatch: reads the script, waits, then adds the job to the queue (as slurmctld would)
script=$(cat)
comment=""
for arg in "$@"; do case $arg in --comment=*) comment=${arg#--comment=};; esac; done
sleep 0.5
id=$(( $(wc -l < "$QUEUE" 2>/dev/null || echo 0) + 100 ))
echo "$id|$comment" >> "$QUEUE"
echo "$script" > "$CALLS/sbatch-$id"
echo "$id"
"""


def _comment(directory: str, run: str = "r1", code: str | None = "v1") -> JobComment:
    return JobComment(dag="d", task="stage1", run=run, attempt=1, stage="stage1",
                      xdir=exclusive_dir_marker(directory), code=code)


def _command(directory: str, run: str) -> str:
    return build_exclusive_sbatch_submit(exclusive_dir=directory, job_name=f"job-{run}",
                                         output=f"{directory}/%x.%j.out", comment=_comment(directory, run))


@pytest.fixture
def stubs(tmp_path: Path) -> dict[str, str]:
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    calls.mkdir()
    for name, text in (("squeue", SQUEUE_STUB), ("sbatch", SBATCH_STUB)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "QUEUE": str(tmp_path / "queue"), "CALLS": str(calls)}


def _run(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], input="#!/bin/bash\necho train\n", env=env,
                          capture_output=True, text=True, timeout=120)


def test_comments_carry_the_directory_and_version_and_parse_back() -> None:
    comment = _comment("/scratch/p/outputs/full/stage1/")
    assert comment.xdir == exclusive_dir_marker("/scratch/p/outputs/full/stage1") and len(comment.xdir) == 16
    assert parse_job_comment(comment.to_json()) == comment
    assert "xdir" not in JobComment(dag="d", task="t", run="r", attempt=1).to_json(), "left out at the default"


def test_the_command_refuses_a_comment_that_does_not_name_the_directory() -> None:
    with pytest.raises(ValidationError, match="xdir"):
        build_exclusive_sbatch_submit(exclusive_dir="/srv/a", job_name="j", output="/srv/a/%j.out",
                                      comment=_comment("/srv/b"))
    with pytest.raises(ValidationError, match="exclusive_dir"):
        build_exclusive_sbatch_submit(exclusive_dir="relative/dir", job_name="j", output="/srv/a/%j.out",
                                      comment=_comment("relative/dir"))


def test_submits_when_no_live_job_writes_the_directory_and_reports_the_live_one_otherwise(
        tmp_path: Path, stubs: dict[str, str]) -> None:
    directory = str(tmp_path / "out dir" / "stage1")
    first = _run(_command(directory, "r1"), stubs)
    assert first.returncode == 0 and first.stdout.strip() == "100", first.stderr
    assert (Path(stubs["CALLS"]) / "sbatch-100").read_text() == "#!/bin/bash\necho train\n", "script came on stdin"
    second = _run(_command(directory, "r2"), stubs)
    assert second.returncode == 0, second.stderr
    head, _, rows = second.stdout.partition(LIVE_MARKER)
    assert head == "" and rows.strip().startswith("100|"), second.stdout
    assert not (Path(stubs["CALLS"]) / "sbatch-101").exists(), "no second writer"
    assert not (Path(directory) / ".slurm-submit.lock").exists(), "the lock is released"
    other = _run(_command(str(tmp_path / "stage2"), "r1"), stubs)
    assert other.stdout.strip() == "101", "another directory is another job"


def test_two_submitters_racing_for_one_directory_get_one_job(tmp_path: Path, stubs: dict[str, str]) -> None:
    directory = str(tmp_path / "stage1")
    results: dict[str, subprocess.CompletedProcess[str]] = {}
    threads = [threading.Thread(target=lambda r=run: results.__setitem__(r, _run(_command(directory, r), stubs)))
               for run in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    submitted = [r for r, p in results.items() if LIVE_MARKER not in p.stdout]
    assert len(submitted) == 1, {r: p.stdout for r, p in results.items()}
    assert sorted(p.name for p in Path(stubs["CALLS"]).iterdir()) == ["sbatch-100"]


def test_a_stale_lock_left_by_a_dead_submit_is_taken_over(tmp_path: Path, stubs: dict[str, str]) -> None:
    directory = tmp_path / "stage1"
    lock = directory / ".slurm-submit.lock"
    lock.mkdir(parents=True)
    subprocess.run(["touch", "-d", "10 minutes ago", str(lock)], check=True)
    result = _run(_command(str(directory), "r1"), stubs)
    assert result.returncode == 0 and result.stdout.strip() == "100", result.stderr


# --- the operator on the real cluster --------------------------------------------------------------


def _context(run_id: str, store: StateStore, *, clear_number: int = 0, dag_id: str = "exclusive") -> dict[str, Any]:
    return task_context(run_id, store, dag_id=dag_id, task_id="stage1", clear_number=clear_number)


def _operator(conn_id: str, log_dir: str, writes: str, version: str) -> SlurmSubmitOperator:
    return SlurmSubmitOperator(task_id="stage1", conn_id=conn_id, script="#!/bin/bash\nsleep 120\n", log_dir=log_dir,
                               time_limit="3", exclusive_dir=writes, code_version=version, poll_interval=2,
                               first_poll_delay=0)


def _deferred(op: SlurmSubmitOperator, context: dict[str, Any]) -> Any:
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    return deferred.value.trigger


def _jobs_writing(cluster: LocalCluster, writes: str) -> list[str]:
    return poll_until(lambda: cluster.jobs_writing(writes), timeout=60, what=f"jobs writing {writes} in sacct")


@pytest.mark.usefixtures("airflow_home")
def test_a_cleared_task_adopts_the_job_still_writing_its_directory(local_cluster: LocalCluster,
                                                                    cluster_connection: str) -> None:
    log_dir = local_cluster.test_dir()
    writes, run_id = f"{log_dir}/outputs/stage1", f"manual__{uuid.uuid4().hex}"
    store = StateStore()
    first = _deferred(_operator(cluster_connection, log_dir, writes, "c0ffee" * 8), _context(run_id, store))
    try:
        local_cluster.wait_for_state(int(first.job_id), {"RUNNING"}, timeout=120)
        # the user clears the task: the DAG run's clear number goes up, the task starts afresh
        again = _deferred(_operator(cluster_connection, log_dir, writes, "c0ffee" * 8),
                          _context(run_id, store, clear_number=1))
        assert again.job_id == first.job_id
        assert again.expected_job_name == job_name_for("exclusive", "stage1", run_id)
        assert [(s["job_id"], s["cause"], s["clear_number"]) for s in store.data[HISTORY_KEY]][-1] == \
            (first.job_id, "adopted", 1)
        # the same directory from another DAG (another deployment, same run name) adopts it too
        other = _deferred(_operator(cluster_connection, log_dir, writes, "c0ffee" * 8),
                          _context(f"manual__{uuid.uuid4().hex}", StateStore(), dag_id="elsewhere"))
        assert other.job_id == first.job_id
        assert other.expected_job_name == job_name_for("exclusive", "stage1", run_id), "watches the job's real name"
    finally:
        hooks.SlurmHook(cluster_connection).cancel(first.job_id)
    assert _jobs_writing(local_cluster, writes) == [first.job_id]


@pytest.mark.usefixtures("airflow_home")
def test_a_live_job_of_another_version_is_refused_by_id(local_cluster: LocalCluster,
                                                         cluster_connection: str) -> None:
    log_dir = local_cluster.test_dir()
    writes = f"{log_dir}/outputs/stage1"
    first = _deferred(_operator(cluster_connection, log_dir, writes, "a" * 64),
                      _context(f"manual__{uuid.uuid4().hex}", StateStore()))
    try:
        store = StateStore()
        with pytest.raises(AirflowFailException) as refused:
            _operator(cluster_connection, log_dir, writes, "b" * 64).execute(
                _context(f"manual__{uuid.uuid4().hex}", store))
        message = str(refused.value)
        assert f"job {first.job_id} (DAG exclusive, run manual__" in message
        assert f"writes {writes}" in message and f"scancel {first.job_id}" in message
        assert f"runs code {'a' * 64} and this task runs {'b' * 64}" in message
        assert store.data.get(HISTORY_KEY) in (None, []), "nothing adopted, nothing submitted"
        assert [j.job_id for j in hooks.SlurmHook(cluster_connection).live_writers(writes)] == [first.job_id]
    finally:
        hooks.SlurmHook(cluster_connection).cancel(first.job_id)
    assert _jobs_writing(local_cluster, writes) == [first.job_id]
    poll_until(lambda: hooks.SlurmHook(cluster_connection).live_writers(writes) == [], timeout=60,
               what="the cancelled job to leave the live states")
