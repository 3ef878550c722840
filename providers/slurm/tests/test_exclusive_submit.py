"""At most one live job per directory: the guarded submit command, run by bash with stand-ins for
squeue and sbatch (two submitters racing), and the operator on the real cluster (a cleared task, a
live job of another version, a restart)."""

from __future__ import annotations

import getpass
import os
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from airflow.exceptions import TaskDeferred
from airflow.sdk.exceptions import AirflowFailException

from support.localcluster import LocalCluster, poll_until
from slurm_provider import hooks
from slurm_provider.cli.sbatch import JobComment, parse_job_comment, script_account
from slurm_provider.cli.exclusive_submit import (
    DONE_MARKER,
    LIVE_MARKER,
    MOVED_MARKER,
    build_exclusive_sbatch_submit,
    exclusive_dir_marker,
)
from slurm_provider.operators import HISTORY_KEY, SlurmSubmitOperator, job_name_for
from slurm_provider.validation import ValidationError
from support.task_context import StateStore, task_context

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
    user_line, _, rows = rows.partition("\n")
    assert head == "" and user_line.strip() == getpass.getuser(), "the login user comes with the live rows"
    assert rows.strip().startswith("100|"), second.stdout
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


def _hold_lock(directory: Path, owner: str, minutes_ago: int = 0) -> Path:
    lock = directory / ".slurm-submit.lock"
    lock.mkdir(parents=True)
    (lock / "owner").write_text(owner + "\n")
    if minutes_ago:
        for path in (lock / "owner", lock):
            subprocess.run(["touch", "-d", f"{minutes_ago} minutes ago", str(path)], check=True)
    return lock


def test_a_lock_whose_holder_died_on_this_host_is_taken_over_at_once(tmp_path: Path, stubs: dict[str, str]) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock = _hold_lock(tmp_path / "stage1", f"{os.uname().nodename} {dead.pid}")
    result = _run(_command(str(tmp_path / "stage1"), "r1"), stubs)
    assert result.returncode == 0 and result.stdout.strip() == "100", result.stderr
    assert not lock.exists() and not list((tmp_path / "stage1").glob(".slurm-submit.lock*")), "taken over, cleaned up"


def test_a_lock_of_a_live_holder_is_never_taken_over_however_old(tmp_path: Path, stubs: dict[str, str]) -> None:
    holder = subprocess.Popen(["sleep", "60"])
    try:
        lock = _hold_lock(tmp_path / "stage1", f"{os.uname().nodename} {holder.pid}", minutes_ago=30)
        command = _command(str(tmp_path / "stage1"), "r1").replace("-gt 1200 ]", "-gt 20 ]")  # wait 2 s, not 120
        result = _run(command, stubs)
        assert result.returncode == 75, (result.stdout, result.stderr)
        assert "another submit holds" in result.stderr and str(holder.pid) in result.stderr
        assert (lock / "owner").read_text().split() == [os.uname().nodename, str(holder.pid)], "left as it was"
        assert not (Path(stubs["CALLS"]) / "sbatch-100").exists()
    finally:
        holder.kill()


def test_a_lock_held_on_another_login_node_is_live_while_refreshed_and_stale_after(tmp_path: Path,
                                                                                 stubs: dict[str, str]) -> None:
    fresh = _hold_lock(tmp_path / "a", "uan09.other 4242")
    command = _command(str(tmp_path / "a"), "r1").replace("-gt 1200 ]", "-gt 20 ]")
    assert _run(command, stubs).returncode == 75, "a refreshed owner on another node holds the lock"
    assert fresh.exists()
    _hold_lock(tmp_path / "b", "uan09.other 4242", minutes_ago=5)
    result = _run(_command(str(tmp_path / "b"), "r1"), stubs)
    assert result.returncode == 0 and result.stdout.strip() == "100", result.stderr


def test_a_lock_dir_without_owner_is_stale_only_when_old(tmp_path: Path, stubs: dict[str, str]) -> None:
    lock = tmp_path / "stage1" / ".slurm-submit.lock"
    lock.mkdir(parents=True)
    subprocess.run(["touch", "-d", "10 minutes ago", str(lock)], check=True)
    result = _run(_command(str(tmp_path / "stage1"), "r1"), stubs)
    assert result.returncode == 0 and result.stdout.strip() == "100", result.stderr


def test_the_holder_refreshes_its_owner_file_while_it_holds_the_lock(tmp_path: Path, stubs: dict[str, str]) -> None:
    (Path(stubs["PATH"].split(":")[0]) / "sbatch").write_text("#!/bin/bash\ncat >/dev/null; sleep 7; echo 555\n")
    directory = tmp_path / "stage1"
    proc = subprocess.Popen(["bash", "-c", _command(str(directory), "r1")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=stubs)
    proc.stdin.write("#!/bin/bash\n")
    proc.stdin.close()
    owner = directory / ".slurm-submit.lock" / "owner"
    first = poll_until(lambda: owner.exists() and owner.stat().st_mtime, timeout=10, interval=0.05,
                       what="the owner file")
    refreshed = poll_until(lambda: owner.exists() and owner.stat().st_mtime > first and owner.stat().st_mtime,
                           timeout=10, interval=0.2, what="the owner file to be touched again")
    assert refreshed > first
    assert proc.wait(timeout=30) == 0 and proc.stdout.read().strip() == "555"
    assert not (directory / ".slurm-submit.lock").exists(), "released, keeper gone"


def test_done_markers_under_the_lock_mean_nothing_is_submitted(tmp_path: Path, stubs: dict[str, str]) -> None:
    directory = tmp_path / "stage1"
    directory.mkdir()
    command = build_exclusive_sbatch_submit(exclusive_dir=str(directory), done_markers=["COMPLETE", "best.pt"],
                                            job_name="j", output=f"{directory}/%j.out",
                                            comment=_comment(str(directory)))
    (directory / "COMPLETE").write_text("{}")
    assert _run(command, stubs).stdout.strip() == "100", "one marker of two is not done"
    Path(stubs["QUEUE"]).write_text("")  # the job ended: no live writer any more
    (directory / "best.pt").write_bytes(b"x")
    result = _run(command, stubs)
    assert result.returncode == 0 and result.stdout.strip() == DONE_MARKER, result.stdout
    assert not (Path(stubs["CALLS"]) / "sbatch-101").exists()


def test_a_replacing_submit_moves_the_outputs_and_the_later_ones_aside_then_submits(
        tmp_path: Path, stubs: dict[str, str]) -> None:
    stage1, stage2, stage3 = (tmp_path / "out dir" / f"stage{n}" for n in (1, 2, 3))
    for directory in (stage1, stage2):
        directory.mkdir(parents=True)
        (directory / "COMPLETE").write_text("{}")
        (directory / "latest.pt").write_bytes(b"x")
    command = build_exclusive_sbatch_submit(exclusive_dir=str(stage1), done_markers=["COMPLETE"],
                                            replace="20260312T101500Z", supersede=[str(stage2), str(stage3)],
                                            job_name="j", output=f"{stage1}/%j.out", comment=_comment(str(stage1)))
    result = _run(command, stubs)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines == [f"{MOVED_MARKER} {stage1}.replaced-20260312T101500Z",
                     f"{MOVED_MARKER} {stage2}.superseded-20260312T101500Z", "100"], lines
    assert sorted(p.name for p in stage1.iterdir()) == [] and sorted(p.name for p in stage2.iterdir()) == []
    assert sorted(p.name for p in Path(f"{stage1}.replaced-20260312T101500Z").iterdir()) == ["COMPLETE", "latest.pt"]
    assert not Path(f"{stage3}.superseded-20260312T101500Z").exists(), "nothing to move, nothing created"


def test_a_live_writer_of_a_later_directory_stops_a_replacing_submit(tmp_path: Path, stubs: dict[str, str]) -> None:
    stage1, stage2 = str(tmp_path / "stage1"), str(tmp_path / "stage2")
    assert _run(_command(stage2, "r9"), stubs).stdout.strip() == "100"
    command = build_exclusive_sbatch_submit(exclusive_dir=stage1, replace="s1", supersede=[stage2], job_name="j",
                                            output=f"{stage1}/%j.out", comment=_comment(stage1))
    result = _run(command, stubs)
    assert LIVE_MARKER in result.stdout and "100|" in result.stdout
    assert not Path(f"{stage1}.replaced-s1").exists() and not (Path(stubs["CALLS"]) / "sbatch-101").exists()


def test_the_live_lookup_asks_every_user_of_the_account() -> None:
    command = build_exclusive_sbatch_submit(exclusive_dir="/p/stage1", job_name="j", output="/p/%j.out",
                                            comment=_comment("/p/stage1"), live_account="project_465000001")
    assert "--me" not in command and "--account=project_465000001" in command and " --all " in command
    everyone = build_exclusive_sbatch_submit(exclusive_dir="/p/stage1", job_name="j", output="/p/%j.out",
                                             comment=_comment("/p/stage1"))
    assert "--me" not in everyone and "--account" not in everyone.split("sbatch --parsable")[0]


def test_the_script_names_the_account_in_its_directives_only() -> None:
    assert script_account("#!/bin/bash\n#SBATCH --job-name=x\n#SBATCH --account=project_1\nsrun x\n") == "project_1"
    assert script_account("#!/bin/bash\n# a comment\n#SBATCH -A proj2\n") == "proj2"
    assert script_account("#!/bin/bash\n#SBATCH --account proj3\n") == "proj3"
    assert script_account("#!/bin/bash\necho hi\n#SBATCH --account=late\n") is None, "after a command: not read"
    assert script_account("#!/bin/bash\n#SBATCH --time=1\n") is None


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
        assert again.job.expected_job_name == job_name_for("exclusive", "stage1", run_id)
        assert [(s["job_id"], s["cause"], s["clear_number"]) for s in store.data[HISTORY_KEY]][-1] == \
            (first.job_id, "watched-again", 1), "its own job from before the clear"
        assert again.job.adopted_from is None, "the task submitted it: stopping the task may cancel it"
        # the same directory from another DAG (another deployment, same run name) adopts it too
        other = _deferred(_operator(cluster_connection, log_dir, writes, "c0ffee" * 8),
                          _context(f"manual__{uuid.uuid4().hex}", StateStore(), dag_id="elsewhere"))
        assert other.job_id == first.job_id
        assert other.job.expected_job_name == job_name_for("exclusive", "stage1", run_id), "watches the job's real name"
        assert other.job.adopted_from == f"user {local_cluster.user}, DAG exclusive, run {run_id}, task stage1", \
            "another task's job: never cancelled by this one"
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
