"""The cluster connections as docker-compose.yaml gives them: only to task and trigger code.

The compose file sets Airflow's local filesystem secrets backend as the *workers'* backend
(``[workers] secrets_backend``) on the Celery workers and the triggerer only, and no backend on the
API server, scheduler or DAG processor. Here a real ``airflow dags test`` runs a Slurm job through a
connection that exists only in such a connections.json: the submit (task code) and the watch
(trigger code) both reach the local cluster, while the server side of the same Airflow
(``airflow connections get``) does not know the connection. ``dags test`` runs the trigger inline;
a triggerer's trigger runner looks connections up the same way (it sets ``SUPERVISOR_COMMS``, so
the Task SDK searches the workers' backend first), as does a Celery worker's task runner.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.localcluster import LocalCluster

REPO = Path(__file__).resolve().parents[2]
CONN_ID = "slurm_from_workers_backend"
pytestmark = pytest.mark.cluster


def _env(connections_file: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__SECRETS__", "AIRFLOW__WORKERS__"))}
    pythonpath = [str(REPO / "providers" / "slurm" / "src"), str(REPO / "plugins"), str(REPO / "trainer" / "src"),
                  str(REPO)]
    env.update({
        "PYTHONPATH": os.pathsep.join(pythonpath),
        "AIRFLOW__WORKERS__SECRETS_BACKEND": "airflow.secrets.local_filesystem.LocalFilesystemBackend",
        "AIRFLOW__WORKERS__SECRETS_BACKEND_KWARGS": json.dumps({"connections_file_path": str(connections_file)}),
        "SLURM_LIFECYCLE_CONN_ID": CONN_ID,
    })
    return env


def test_task_and_trigger_code_read_the_workers_backend_and_the_server_side_does_not(
        local_cluster: LocalCluster, airflow_home: Path, tmp_path: Path) -> None:
    connections_file = tmp_path / "connections.json"
    connections_file.write_text(json.dumps({CONN_ID: local_cluster.connection()}))
    env = _env(connections_file)
    log_dir = local_cluster.test_dir()
    conf = {"script": "#!/bin/bash\necho from the workers backend\n", "log_dir": log_dir}

    run = subprocess.run([sys.executable, "-m", "airflow", "dags", "test", "slurm_lifecycle", "-c", json.dumps(conf)],
                         env=env, capture_output=True, text=True, timeout=600, check=False)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    listing = local_cluster.ssh(f"ls {log_dir}").stdout.split()
    (out_file,) = [name for name in listing if name.endswith(".out")]
    job_id = int(re.fullmatch(r".+\.(\d+)\.out", out_file).group(1))
    assert [r["State"] for r in local_cluster.sacct_runs(job_id)] == ["COMPLETED"]
    assert f"[job {job_id}] from the workers backend" in output, "the trigger did not stream the job's log"
    assert re.search(r"DagRun Finished: dag_id=slurm_lifecycle, .*state=success", output), output[-3000:]

    # The API server's side (env variables, then the database; no [secrets] backend) has no such connection.
    server_side = subprocess.run([sys.executable, "-m", "airflow", "connections", "get", CONN_ID, "-o", "json"],
                                 env=env, capture_output=True, text=True, timeout=300, check=False)
    assert server_side.returncode != 0 and "Connection not found" in server_side.stderr
