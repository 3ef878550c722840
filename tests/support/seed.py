"""Rows in Airflow's metadata database shaped like the ones the Slurm operators leave behind.

Inserted directly (a DAG run, its task instances and their XComs), so the HPC view's API can be
tested in seconds without a cluster; the browser test (tests/deploy/test_hpc_view_browser.py) uses
a real run.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import insert

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)


def summary(job_ids: list[str], *, state: str = "COMPLETED", gpu_hours: float, elapsed_s: int,
            restarts: int = 0, gpus: int = 1, job: str | None = None, run: str | None = None,
            profile: str | None = None, causes: list[str] | None = None,
            curve: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``SlurmSubmitOperator`` return value (``PipelineJobOperator`` adds job, run, profile)."""
    causes = causes or ["initial"] + ["TIMEOUT"] * (len(job_ids) - 1)
    value: dict[str, Any] = {
        "job_id": job_ids[-1], "job_ids": job_ids, "state": state, "exit_code": 0 if state == "COMPLETED" else 1,
        "elapsed_s": elapsed_s, "restarts": restarts, "node_list": "vcnode1", "gpus": gpus,
        "gpu_hours": gpu_hours,
        "submissions": [{"job_id": j, "number": i + 1, "cause": c, "try_number": 1, "progress": None}
                        for i, (j, c) in enumerate(zip(job_ids, causes))],
    }
    if job is not None:
        value.update({"job": job, "run": run, "profile": profile, "code_hash": "abc", "states": {},
                      "metrics": None, "epochs": None, "curve": curve})
    return value


def seed_run(session: Any, *, dag_id: str, run_id: str, conf: dict[str, Any] | None,
             tasks: dict[str, tuple[str, str | None, Any]], start: datetime = T0,
             watch: dict[str, dict[str, Any]] | None = None) -> None:
    """One DAG run; ``tasks`` maps task id to (task state, slurm_job_id or None, return value or None),
    ``watch`` task id to the trigger's note of its watch (``slurm_watch``)."""
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.xcom import XComModel

    if session.get(DagBundleModel, "seeded") is None:
        session.add(DagBundleModel(name="seeded"))
        session.flush()
    if session.get(DagModel, dag_id) is None:  # the auth manager lists readable DAGs from this table
        session.execute(insert(DagModel.__table__).values(
            dag_id=dag_id, bundle_name="seeded", max_active_tasks=16, max_consecutive_failed_dag_runs=0,
            has_task_concurrency_limits=False, is_paused=False))
    result = session.execute(insert(DagRun.__table__).values(
        dag_id=dag_id, run_id=run_id, run_type="manual", state="success", conf=conf or {},
        logical_date=start, start_date=start, run_after=start))
    dag_run_id = result.inserted_primary_key[0]
    for i, (task_id, (state, job_id, value)) in enumerate(tasks.items()):
        end = start + timedelta(minutes=10 * (i + 1))
        session.execute(insert(TI.__table__).values(
            dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=-1, pool="default_pool", state=state,
            start_date=start, end_date=end if state not in ("deferred", "running") else None, try_number=1))
        for key, xcom in (("slurm_job_id", job_id), ("return_value", value), ("slurm_watch", (watch or {}).get(task_id))):
            if xcom is None:
                continue
            session.execute(insert(XComModel.__table__).values(
                dag_run_id=dag_run_id, task_id=task_id, map_index=-1, key=key, dag_id=dag_id, run_id=run_id,
                value=xcom, timestamp=end))
    session.commit()
