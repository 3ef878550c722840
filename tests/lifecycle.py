"""Run the `slurm_lifecycle` test DAG with dag.test() and read back what happened."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parent / "dag_fixtures" / "slurm_lifecycle.py"


@dataclass(frozen=True)
class LifecycleOutcome:
    run_id: str
    state: str
    result: Any
    output: str
    """Everything the run printed (task logs, the streamed job output, failure messages)."""


def _dag():
    spec = importlib.util.spec_from_file_location("slurm_lifecycle_fixture", FIXTURE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag if hasattr(module, "dag") else next(
        v for v in vars(module).values() if type(v).__name__ == "DAG")


def run_lifecycle(capfd: Any, **conf: Any) -> LifecycleOutcome:
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    dag_run = _dag().test(run_conf=conf)
    captured = capfd.readouterr()
    with create_session() as session:
        ti = session.query(TaskInstance).filter_by(dag_id="slurm_lifecycle", run_id=dag_run.run_id,
                                                   task_id="job").one()
        row = session.query(XComModel).filter_by(dag_id="slurm_lifecycle", run_id=dag_run.run_id,
                                                 task_id="job", key="return_value").one_or_none()
        state = str(ti.state)
        result = None
        if row is not None:
            result = json.loads(row.value) if isinstance(row.value, (str, bytes)) else row.value
    return LifecycleOutcome(dag_run.run_id, state, result, captured.out + captured.err)
