"""Run the `slurm_lifecycle` test DAG with dag.test() and read back what happened; inject faults from
outside while it runs; count the task's jobs in accounting."""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.background import BackgroundStep
from support.localcluster import LocalCluster, poll_until
from slurm_provider.operators import job_name_for

FIXTURE = Path(__file__).resolve().parents[1] / "dag_fixtures" / "slurm_lifecycle.py"


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


# --- faults from outside and what accounting then holds ----------------------------------------------


def job_in(cluster: LocalCluster, log_dir: str) -> int | None:
    """The id of the job currently in squeue whose output goes to ``log_dir`` (one per test)."""
    out = cluster.root("squeue", "-h", "-t", "all", "-O", "JobID:20,STDOUT:400", check=False).stdout
    for line in out.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].strip().startswith(log_dir + "/"):
            return int(parts[0])
    return None


class Injector(BackgroundStep):
    """Waits until the test's job runs (or is in any of ``states``), then does something to it from the outside."""

    def __init__(self, cluster: LocalCluster, log_dir: str, action: Callable[[int], None],
                 states: frozenset[str] = frozenset({"RUNNING"})) -> None:
        super().__init__()
        self.cluster, self.log_dir, self.action, self.states = cluster, log_dir, action, states
        self.job_id: int | None = None

    def step(self) -> None:
        self.job_id = poll_until(lambda: job_in(self.cluster, self.log_dir), timeout=120,
                                 what=f"a job logging to {self.log_dir}")
        self.cluster.wait_for_state(self.job_id, self.states, timeout=120)
        time.sleep(1)
        self.action(self.job_id)


def jobs_of(cluster: LocalCluster, outcome: LifecycleOutcome, expect: int = 1) -> list[str]:
    """Every job id accounting knows under this task's deterministic name in this run.

    Accounting reaches slurmdbd with a lag, so wait until at least ``expect`` jobs are visible and
    then read once more: a duplicate submitted earlier would be there by then too.
    """
    name = job_name_for("slurm_lifecycle", "job", outcome.run_id)

    def read() -> list[str]:
        out = cluster.root("sacct", "-X", "-n", "-P", "-S", "now-1days", f"--name={name}",
                           "--format=JobIDRaw").stdout
        return sorted({line for line in out.splitlines() if line}, key=int)  # as numbers: 999 before 1000

    poll_until(lambda: len(read()) >= expect, timeout=60, what=f"{expect} job(s) named {name} in sacct")
    cluster.accounting_caught_up()
    return read()


def batch_script(body: str) -> str:
    return f"#!/bin/bash\n{body}\n"
