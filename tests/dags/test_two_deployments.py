"""Two Airflow deployments train the same run on the same cluster at the same moment.

Each is its own Airflow home and database (`airflow dags test` in a subprocess), both with the same
profile, project directory and run name, started together. Whatever their timing, every directory a
job writes (the synthetic dataset, each stage's outputs, the viewer export) gets exactly one job
between them: the second submitter finds the first one's live job and watches it, or finds the
stage complete and skips it. Both runs end successfully, and accounting shows one job per stage.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from localcluster import LocalCluster, poll_until
from ports import free_port
from standalone import airflow, airflow_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.usefixtures("cluster_connection")]
RUN = "shared"


def _dags_test(env: dict[str, str], log: Path, results: dict[str, int], key: str) -> None:
    conf = {"profile": "local", "config": "tiny", "run_name": RUN, "max_epochs": 1}
    with log.open("w") as out:
        proc = subprocess.run([sys.executable, "-m", "airflow", "dags", "test", "vcloud_training",
                               "--conf", json.dumps(conf)], env=env, stdout=out, stderr=subprocess.STDOUT,
                              timeout=1500)
    results[key] = proc.returncode


def test_two_deployments_with_one_run_name_get_one_job_per_stage(local_cluster: LocalCluster,
                                                                tmp_path: Path) -> None:
    project_dir = local_cluster.test_dir()
    envs = {}
    for name in ("a", "b"):
        home = tmp_path / f"home-{name}"
        home.mkdir()
        env = airflow_env(home, free_port(), project_dir)
        env.update(local_cluster.connection_env())
        airflow("db", "migrate", env=env)
        envs[name] = env
    results: dict[str, int] = {}
    threads = [threading.Thread(target=_dags_test, args=(envs[n], tmp_path / f"{n}.log", results, n)) for n in envs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    logs = {n: (tmp_path / f"{n}.log").read_text(errors="replace") for n in envs}
    for name, code in results.items():
        assert code == 0, f"deployment {name} exited {code}:\n{logs[name][-5000:]}"

    outputs = f"{project_dir}/outputs/{RUN}"
    directories = {"data": f"{project_dir}/data/synthetic-tiny", "export": f"{project_dir}/viewer_data/{RUN}",
                   **{f"stage{n}": f"{outputs}/stage{n}" for n in range(4)}}
    def every_directory_has_its_job() -> dict[str, list[str]] | None:
        found = {k: local_cluster.jobs_writing(d) for k, d in directories.items()}
        return found if all(found.values()) else None

    jobs = poll_until(every_directory_has_its_job, timeout=120, what="every directory's job in sacct")
    assert all(len(ids) == 1 for ids in jobs.values()), jobs
    for stage in range(4):
        local_cluster.ssh(f"test -f {outputs}/stage{stage}/COMPLETE")
    # Every shared job was watched by both deployments or skipped by the later one: never submitted twice.
    watched = sum("watching it instead of submitting a second job" in text for text in logs.values())
    assert watched >= 1, "the race was never run: one deployment finished before the other started"
