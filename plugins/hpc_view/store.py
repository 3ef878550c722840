"""Read the Slurm operators' XComs from Airflow's metadata database (inside the API server).

One query: the ``return_value``, ``slurm_job_id``, ``slurm_watch`` (the trigger's note of the watch) and
``slurm_followed`` (the files the watch follows, such as a training curve) XComs of every task instance that pushed a ``slurm_job_id``, with the task instance's state and dates and the DAG run's ``conf``, limited
to the DAGs the signed-in user may read.
"""

from __future__ import annotations

from collections.abc import Collection
from types import SimpleNamespace
from typing import Any

from sqlalchemy import and_, exists, select
from sqlalchemy.orm import Session, aliased

from hpc_view.records import RETURN_VALUE_KEY, XComRow
from slurm_provider import FOLLOW_XCOM_KEY, JOB_HANDLES_XCOM_KEY, JOB_ID_XCOM_KEY, LEFT_OUT_XCOM_KEY, WATCH_XCOM_KEY

MAX_ROWS = 5000
"""Newest XComs read per page view; older runs drop out of the view, not out of the database."""


def _value(raw: Any) -> Any:
    from airflow.models.xcom import XComModel

    return XComModel.deserialize_value(SimpleNamespace(value=raw))


def load_xcom_rows(session: Session, dag_ids: Collection[str] | None, *, dag_id: str | None = None,
                   run_id: str | None = None, limit: int = MAX_ROWS) -> list[XComRow]:
    """The Slurm tasks' XComs; ``dag_ids`` are the readable DAGs (None: no restriction)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.xcom import XComModel

    if dag_ids is not None and not dag_ids:
        return []
    job_xcom = aliased(XComModel)
    stmt = (
        select(XComModel.dag_id, XComModel.run_id, XComModel.task_id, XComModel.map_index, XComModel.key,
               XComModel.value, TI.state, TI.start_date, TI.end_date, DagRun.conf)
        .join(TI, and_(TI.dag_id == XComModel.dag_id, TI.run_id == XComModel.run_id,
                       TI.task_id == XComModel.task_id, TI.map_index == XComModel.map_index))
        .join(DagRun, DagRun.id == XComModel.dag_run_id)
        .where(XComModel.key.in_((RETURN_VALUE_KEY, JOB_ID_XCOM_KEY, WATCH_XCOM_KEY, FOLLOW_XCOM_KEY,
                                    LEFT_OUT_XCOM_KEY, JOB_HANDLES_XCOM_KEY)))
        .where(exists().where(job_xcom.dag_run_id == XComModel.dag_run_id,
                              job_xcom.task_id == XComModel.task_id,
                              job_xcom.map_index == XComModel.map_index,
                              job_xcom.key == JOB_ID_XCOM_KEY))
        .order_by(XComModel.timestamp.desc())
        .limit(limit)
    )
    if dag_ids is not None:
        stmt = stmt.where(XComModel.dag_id.in_(list(dag_ids)))
    if dag_id:
        stmt = stmt.where(XComModel.dag_id == dag_id)
    if run_id:
        stmt = stmt.where(XComModel.run_id == run_id)
    rows = []
    for dag, run, task, map_index, key, value, state, start, end, conf in session.execute(stmt):
        rows.append(XComRow(dag_id=dag, run_id=run, task_id=task, map_index=map_index, key=key,
                            value=_value(value), task_state=None if state is None else str(getattr(state, "value", state)),
                            start_date=start, end_date=end, run_conf=conf if isinstance(conf, dict) else None))
    return rows
