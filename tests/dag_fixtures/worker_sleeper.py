"""One task that runs on a worker (never deferred) until a file appears: tests/deploy/test_hpc_view_outage.py.

While it runs, its task runner heartbeats through the API server's Execution API; the test reads the
task instance's ``last_heartbeat_at`` while the login node hangs. ``release`` (a path on the Airflow
host) ends the task; ``started`` is written (the task's pid) once it runs.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, task

MAX_WAIT_S = 1200

with DAG(dag_id="worker_sleeper", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         params={"release": "", "started": ""}) as dag:

    @task(retries=0)
    def sleep_until_released(params: dict | None = None) -> int:
        """Sleep in one-second steps until ``release`` exists (at most ``MAX_WAIT_S``); the seconds slept."""
        assert params and params["release"], "the run's conf must name a release file"
        Path(params["started"]).write_text(str(os.getpid()))
        waited = 0
        while not Path(params["release"]).exists():
            if waited >= MAX_WAIT_S:
                raise RuntimeError(f"{params['release']} did not appear within {MAX_WAIT_S} s")
            time.sleep(1)
            waited += 1
        return waited

    sleep_until_released()
