"""Several Airflow deployments that run the training DAG at the same moment against the local cluster.

Each is its own Airflow home and database; ``airflow dags test`` runs their DAG runs in subprocesses
started together, so their tasks race for the same directories on the cluster as two teams' (or
two members') deployments would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from support.localcluster import LocalCluster
from support.ports import free_port
from support.standalone import airflow, airflow_env


def deployments(cluster: LocalCluster, tmp_path: Path, project_dir: str,
                connections: dict[str, str | None]) -> dict[str, dict[str, str]]:
    """One migrated deployment per name, with the project directory and the connection it logs in
    with (None: the local profile's own)."""
    envs = {}
    for name, conn_id in connections.items():
        home = tmp_path / f"home-{name}"
        home.mkdir()
        env = airflow_env(home, free_port(), project_dir)
        env.update(cluster.connection_env())
        if conn_id is not None:
            env["VCLOUD_PROFILE_OVERRIDES"] = json.dumps(
                {"local": {"paths.base": project_dir, "connection.conn_id": conn_id}})
        airflow("db", "migrate", env=env)
        envs[name] = env
    return envs


def dags_test_together(envs: dict[str, dict[str, str]], logs_dir: Path, **conf: object
                       ) -> tuple[dict[str, int], dict[str, str]]:
    """``airflow dags test vcloud_training --conf <conf>`` in every deployment at once; their exit
    codes and logs by name."""
    full = {"profile": "local", "config": "tiny", "max_epochs": 1, **conf}
    results: dict[str, int] = {}
    paths = {name: logs_dir / f"{full.get('run_name', 'run')}-{name}.log" for name in envs}

    def run(name: str) -> None:
        with paths[name].open("w") as out:
            proc = subprocess.run([sys.executable, "-m", "airflow", "dags", "test", "vcloud_training",
                                   "--conf", json.dumps(full)], env=envs[name], stdout=out,
                                  stderr=subprocess.STDOUT, timeout=1500)
        results[name] = proc.returncode

    threads = [threading.Thread(target=run, args=(name,)) for name in envs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, {name: path.read_text(errors="replace") for name, path in paths.items()}
