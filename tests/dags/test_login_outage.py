"""The training DAG through a ten-minute outage of its login node while stage 0 trains.

The run logs in through a private login sshd of the local cluster (the shared one on port 2222
serves everyone else's tests); once stage 0's job runs and the task's watch has seen it run, that
sshd and every session it serves are stopped, as a maintenance break does. The job trains on, ends
and is forgotten by slurmctld while nobody can look; after ten minutes (and not before the job has
ended and left squeue) the sshd comes back. The run must succeed with one job for stage 0 in accounting, read from sacct, and the
task log must say once that the login node was unreachable.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.localcluster import LocalCluster, poll_until
from support.ports import free_port
from support.private_login import PrivateLogin
from support.standalone import airflow, airflow_env, dag_run_records, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2700), pytest.mark.usefixtures("cluster_connection")]
RUN = "outage"
OUTAGE_S = 600
MAX_EPOCHS = 100
"""Epochs of the tiny stage 0: a few minutes of training on the loaded local cluster (about 3 s an
epoch there), so that the job runs when the node goes away and ends during the ten minutes it is away."""


def _job_writing(cluster: LocalCluster, directory: str) -> tuple[str, str] | None:
    """(job id, state) of the live job whose comment names ``directory`` as the one it writes."""
    from slurm_provider.cli.sbatch import exclusive_dir_marker

    marker = f'"xdir":"{exclusive_dir_marker(directory)}"'
    out = cluster.root("squeue", "-h", "-a", "-t", "all", "-o", "%i|%T|%k", check=False).stdout
    rows = [line.split("|", 2) for line in out.splitlines() if marker in line]
    return (rows[-1][0], rows[-1][1]) if rows else None


TRY_NUMBERS = """\
import json
from airflow.models.taskinstance import TaskInstance
from airflow.utils.session import create_session
with create_session() as s:
    print(json.dumps({ti.task_id: ti.try_number for ti in s.query(TaskInstance).filter_by(dag_id="vcloud_training")}))
"""


def _try_numbers(env: dict[str, str]) -> dict[str, int]:
    """Each task's try number in the deployment's database (the run has one DAG run)."""
    return json.loads(run_cli([sys.executable, "-c", TRY_NUMBERS], env, 120).stdout.strip().splitlines()[-1])


def test_a_login_node_down_for_ten_minutes_under_a_training_stage_is_waited_out(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    login_dir = tmp_path / "login"
    login_dir.mkdir()
    login = PrivateLogin(local_cluster, login_dir)
    project_dir = local_cluster.test_dir()
    stage_dir = f"{project_dir}/outputs/{RUN}/stage0"
    home = tmp_path / "home"
    home.mkdir()
    env = airflow_env(home, free_port(), project_dir)
    env.update(local_cluster.connection_env())
    env.update(login.connection_env())
    env["VCLOUD_PROFILE_OVERRIDES"] = json.dumps(
        {"local": {"paths.base": project_dir, "connection.conn_id": login.conn_id}})
    airflow("db", "migrate", env=env)
    conf = {"profile": "local", "config": "tiny", "run_name": RUN, "stages": [0], "export": False,
            "max_epochs": MAX_EPOCHS}
    log = tmp_path / "dags-test.log"
    login.start()
    job_id = None
    with log.open("w") as out:
        run = subprocess.Popen([sys.executable, "-m", "airflow", "dags", "test", "vcloud_training", "--conf",
                                json.dumps(conf)], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        def stage_job_running() -> str | None:
            """Stage 0's job, once it runs and the task's watch has seen it run."""
            assert run.poll() is None, f"the run ended before stage 0 ran:\n{log.read_text()[-5000:]}"
            found = _job_writing(local_cluster, stage_dir)
            if found is None or found[1] != "RUNNING":
                return None
            return found[0] if f"Job {found[0]} RUNNING" in log.read_text(errors="replace") else None

        job_id = poll_until(stage_job_running, timeout=1200, what="stage 0's job to run", interval=2)
        login.stop()
        down_at = time.monotonic()
        time.sleep(OUTAGE_S)  # the outage itself
        # ... and until the job has ended and slurmctld forgot it: only sacct can tell how it ended
        poll_until(lambda: _job_writing(local_cluster, stage_dir) is None, timeout=900,
                   what=f"job {job_id} to end and leave squeue", interval=5)
        down_for = time.monotonic() - down_at
        assert run.poll() is None, f"the run ended while its login node was down:\n{log.read_text()[-5000:]}"
        login.start()
        returncode = run.wait(timeout=900)
    finally:
        if run.poll() is None:  # the test failed: stop the run and its job
            run.kill()
            run.wait(timeout=60)
            if job_id is not None:
                local_cluster.root("scancel", job_id, check=False)
        login.stop()

    text = log.read_text(errors="replace")
    assert returncode == 0, f"airflow dags test exited {returncode}:\n{text[-5000:]}"
    [record] = dag_run_records("vcloud_training", env)
    assert record["state"] == "success", record["task_states"]
    assert record["task_states"]["stage0"] == "success"
    stage0 = record["values"]["stage0"]
    assert stage0["job_ids"] == [job_id] and stage0["states"] == {job_id: "COMPLETED"}
    assert _try_numbers(env)["stage0"] == 1, "no task retry was spent on the outage"

    jobs = poll_until(lambda: local_cluster.jobs_writing(stage_dir), timeout=120, what="stage 0's job in sacct")
    assert jobs == [job_id], "exactly one job for stage 0"
    assert local_cluster.sacct_runs(int(job_id))[-1]["State"] == "COMPLETED"
    told = [line for line in text.splitlines() if "unreachable since" in line]
    assert len(told) == 1, told
    assert f"login node of {login.conn_id} unreachable since " in told[0]
    assert f"; job {job_id} last seen RUNNING; waiting up to 24 h" in told[0]
    assert any(f"login node of {login.conn_id} reachable again after " in line for line in text.splitlines())
    print(f"login node down for {down_for:.0f} s; job {job_id} ended meanwhile and was read from sacct")
