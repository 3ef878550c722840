"""One job task for a real scheduler, workers and triggerer: the gestures of tests/deploy/test_gestures.py.

The operator is the provider's ``SlurmSubmitOperator`` with its default retries; the DAG's
``default_args`` shorten only the retry delay (showing that a DAG's defaults reach the operator).
``hold_file`` (a path on the Airflow host, empty for none) stops the task between submitting its
job and deferring until that file exists: the window in which a killed worker process leaves a
submitted job that nobody watches, which the test kills on purpose. The task writes
``<hold_file>.holding`` (its pid and job id) when it gets there. ``exclusive_dir`` (empty for none)
is the directory the job writes: a second run naming the same one watches the first run's job.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG

from slurm_provider.operators import SlurmSubmitOperator

HOLD_TIMEOUT_S = 900


class HeldSubmitOperator(SlurmSubmitOperator):
    template_fields = (*SlurmSubmitOperator.template_fields, "hold_file")

    def __init__(self, *, hold_file: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hold_file = hold_file

    def defer(self, **kwargs: Any) -> Any:
        if self.hold_file and not Path(self.hold_file).exists():
            job_id = kwargs["trigger"].job_id
            Path(f"{self.hold_file}.holding").write_text(json.dumps({"pid": os.getpid(), "job_id": job_id}))
            self.log.info("Holding before the deferral of job %s until %s exists", job_id, self.hold_file)
            deadline = time.monotonic() + HOLD_TIMEOUT_S
            while not Path(self.hold_file).exists() and time.monotonic() < deadline:
                time.sleep(0.5)
        return super().defer(**kwargs)


with DAG(
    dag_id="slurm_gestures",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    render_template_as_native_obj=True,
    default_args={"retry_delay": timedelta(seconds=5)},
    params={"script": "#!/bin/bash\ntrue\n", "log_dir": "/tmp", "hold_file": "", "exclusive_dir": ""},
) as dag:
    HeldSubmitOperator(
        task_id="job",
        conn_id=os.environ.get("SLURM_LIFECYCLE_CONN_ID", "vcloud_local_cluster"),
        script="{{ params.script }}",
        log_dir="{{ params.log_dir }}",
        hold_file="{{ params.hold_file }}",
        exclusive_dir="{{ params.exclusive_dir or None }}",
        time_limit="10",
        stage="gestures",
        # A real triggerer: the first poll >= 10 s after the deferral; a steady 30 s interval.
        poll_interval=30.0,
        max_poll_interval=30.0,
        first_poll_delay=10.0,
    )
