"""One SlurmSubmitOperator task whose script and options come from the run's conf.

The Slurm provider's lifecycle tests run this DAG with `dag.test()` against the local cluster;
polling is fast here because `dag.test()` runs the trigger inline (no scheduler race).
`SLURM_LIFECYCLE_KEEP_JOB=1` sets `keep_job_on_give_up`, `SLURM_LIFECYCLE_SHORT_JOB_WAIT` the seconds
the task watches its job itself before deferring (both read when a test loads the DAG).
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG

from slurm_provider.operators import SlurmSubmitOperator

with DAG(
    dag_id="slurm_lifecycle",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    render_template_as_native_obj=True,
    params={"script": "#!/bin/bash\ntrue\n", "log_dir": "/tmp", "time_limit": "2", "sbatch_options": [],
            "progress_path": None, "pending_policy": "fail", "account": None},
) as dag:
    SlurmSubmitOperator(
        task_id="job",
        conn_id=os.environ.get("SLURM_LIFECYCLE_CONN_ID", "vcloud_local_cluster"),
        script="{{ params.script }}",
        log_dir="{{ params.log_dir }}",
        time_limit="{{ params.time_limit }}",
        sbatch_options="{{ params.sbatch_options }}",
        progress_path="{{ params.progress_path }}",
        account="{{ params.account }}",
        stage="lifecycle",
        poll_interval=2.0,
        max_poll_interval=4.0,
        first_poll_delay=0.0,
        resubmit_budgets={"TIMEOUT": 2, "NODE_FAIL": 2, "PREEMPTED": 2, "BOOT_FAIL": 1, "KILLED": 1},
        # A script that writes no exit record and dies of a signal would pass for killed from outside:
        # the lifecycle scripts that are killed that way write one (end_records.end_record_shell).
        writes_end_record=True,
        keep_job_on_give_up=os.environ.get("SLURM_LIFECYCLE_KEEP_JOB") == "1",
        short_job_wait=float(os.environ.get("SLURM_LIFECYCLE_SHORT_JOB_WAIT", "0")),
    )
