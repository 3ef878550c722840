"""Several Airflow deployments that run the training DAG at the same moment against the local cluster.

Each is its own Airflow home and database and its own process (:mod:`support.dag_runner`, which runs
the DAG as ``airflow dags test`` does); their runs are started together, so their tasks race for
the same directories on the cluster as two teams' (or two members') deployments would. A test that
races many times keeps the processes and their parsed DAG between races.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from support.localcluster import LocalCluster
from support.ports import free_port
from support import migrated_db
from support.deployment import airflow_env

RUN_TIMEOUT = 1500.0
"""Seconds one DAG run of a tiny config may take on a busy host before the race counts as hung."""


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
        migrated_db.migrate(env)
        envs[name] = env
    return envs


def _read_answer(stream: IO[str], deadline: float, what: str) -> dict[str, Any]:
    """The next answer line of a runner, or an assertion naming ``what`` when it never comes."""
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"{what}: no answer within {RUN_TIMEOUT:.0f} s"
        ready, _, _ = select.select([stream], [], [], left)
        if ready:
            line = stream.readline()
            assert line, f"{what}: the runner exited"
            return json.loads(line)


class RacingDeployments:
    """The deployments of ``envs``, each with a DAG runner process; :meth:`run_together` starts a run in
    every one of them at once. Runner output outside runs goes to ``<logs_dir>/runner-<name>.log``."""

    def __init__(self, envs: dict[str, dict[str, str]], logs_dir: Path, dag_id: str = "vcloud_training") -> None:
        self.envs, self.logs_dir, self.dag_id = envs, logs_dir, dag_id
        self.runners: dict[str, subprocess.Popen[str]] = {}

    def __enter__(self) -> RacingDeployments:
        try:
            for name, env in self.envs.items():
                with open(self.logs_dir / f"runner-{name}.log", "w") as log:
                    self.runners[name] = subprocess.Popen(
                        [sys.executable, "-m", "tests.support.dag_runner", self.dag_id], env=env, text=True,
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
            deadline = time.monotonic() + 300
            for name, runner in self.runners.items():
                assert runner.stdout is not None
                assert _read_answer(runner.stdout, deadline, self._what(name)) == {"ready": True}
        except BaseException:
            self.__exit__()
            raise
        return self

    def _what(self, name: str) -> str:
        return f"deployment {name} (see {self.logs_dir / f'runner-{name}.log'})"

    def run_together(self, **conf: Any) -> tuple[dict[str, str], dict[str, str]]:
        """A run of ``{"profile": "local", "config": "tiny", "max_epochs": 1, **conf}`` in every
        deployment, started at the same moment; the runs' states and logs by deployment name."""
        full = {"profile": "local", "config": "tiny", "max_epochs": 1, **conf}
        paths = {name: self.logs_dir / f"{full.get('run_name', 'run')}-{name}.log" for name in self.runners}
        for name, runner in self.runners.items():
            assert runner.stdin is not None
            runner.stdin.write(json.dumps({"conf": full, "log": str(paths[name])}) + "\n")
        for runner in self.runners.values():
            assert runner.stdin is not None
            runner.stdin.flush()
        deadline = time.monotonic() + RUN_TIMEOUT
        states = {}
        for name, runner in self.runners.items():
            assert runner.stdout is not None
            states[name] = _read_answer(runner.stdout, deadline, self._what(name))["state"]
        return states, {name: path.read_text(errors="replace") for name, path in paths.items()}

    def __exit__(self, *exc: object) -> None:
        for runner in self.runners.values():
            if runner.stdin is not None and not runner.stdin.closed:
                runner.stdin.close()
        for runner in self.runners.values():
            try:
                runner.wait(timeout=60)
            except subprocess.TimeoutExpired:
                runner.kill()
                runner.wait(timeout=30)
            if runner.stdout is not None:
                runner.stdout.close()


def dags_test_together(envs: dict[str, dict[str, str]], logs_dir: Path, **conf: Any
                       ) -> tuple[dict[str, str], dict[str, str]]:
    """One run in every deployment at once (see :meth:`RacingDeployments.run_together`)."""
    with RacingDeployments(envs, logs_dir) as racing:
        return racing.run_together(**conf)
