"""A stage task's own steps before it submits (the stage decision's file reads, the budget check)
meet a login node that does not answer: the task waits for it in the triggerer, then decides again
and submits once. The Python tasks that talk to the cluster retry only when it could not be reached. The cluster is the fake Slurm of tests/support under the real ``SlurmHook``; the whole run through a
ten-minute outage on the local cluster is tests/dags/test_login_outage.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from airflow.exceptions import TaskDeferred
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from support.fake_slurm import FakeSlurm, install
from slurm_provider.login_wait import REACHABLE, SlurmLoginTrigger
from slurm_provider.transport import TransportUnavailable
from slurm_provider.triggers import SlurmJobTrigger
from vcloud_pipeline.dag.job_operator import PipelineJobOperator
from vcloud_pipeline.budget.preflight import PreflightError
from vcloud_pipeline.plan.run_plan import RunPlan, SyncedCode
from vcloud_pipeline.dag.tasks import PLAN_TASK, SYNC_TASK, final_unless_unreachable, plan_run

CODE_HASH = "c0de" * 16
DOWN = TransportUnavailable("cannot reach vcloud@127.0.0.1:2222 (connection 'vcloud_local_cluster'): "
                            "ConnectionRefusedError")


def down_cluster(monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """The fake Slurm under the stage task's hooks, down (every command fails) until ``down`` is cleared;
    it records every command and accepts the submit."""
    cluster = install(monkeypatch, FakeSlurm(first_id=901))
    cluster.down = DOWN
    return cluster


class StateStore(dict):
    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        self[key] = value


class TaskTry:
    dag_id, task_id, run_id, map_index, try_number = "vcloud_training", "stage0", "manual__outage", -1, 1

    def __init__(self, xcoms: dict[str, Any]) -> None:
        self.xcoms = xcoms

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        return self.xcoms[task_ids] if key == "return_value" else None  # no earlier task submitted a job

    def xcom_push(self, key: str, value: Any) -> None:
        pass


@pytest.fixture
def context() -> dict[str, Any]:
    planned = plan_run({"profile": "local", "config": "tiny", "stages": [0], "run_name": "outage"})
    scripts = {label: job.outer for label, job in RunPlan.from_xcom(planned).render(CODE_HASH).items()}
    synced = SyncedCode.recording(CODE_HASH, scripts).model_dump(mode="json")
    return {"ti": TaskTry({PLAN_TASK: planned, SYNC_TASK: synced}), "task_state_store": StateStore()}


def test_the_stage_decision_waits_for_the_login_node_then_submits_once(context: dict[str, Any],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = down_cluster(monkeypatch)
    monkeypatch.setenv("VCLOUD_SHORT_JOB_WAIT", "0")  # defer right after the submit, without watching first
    with pytest.raises(TaskDeferred) as waiting:
        PipelineJobOperator(task_id="stage0", job="stage0").execute(context)
    wait = waiting.value.trigger
    assert isinstance(wait, SlurmLoginTrigger) and waiting.value.method_name == "execute_after_outage"
    assert wait.conn_id == "vcloud_local_cluster" and cluster.verbs == ["file_sizes"]

    cluster.down = None
    event = {"kind": REACHABLE, "since": wait.since, "tries": 2, "message": "reachable again after 3 h"}
    with pytest.raises(TaskDeferred) as watching:
        PipelineJobOperator(task_id="stage0", job="stage0").execute_after_outage(context, event)
    assert isinstance(watching.value.trigger, SlurmJobTrigger) and watching.value.trigger.job_id == "901"
    assert cluster.submitted == ["901"]
    find_jobs = ["squeue", "sacct"]  # by name: squeue --me, then sacct
    assert cluster.verbs[1:] == ["file_sizes", *find_jobs, "sshare", "touch", *find_jobs, "sbatch"], \
        "decided, checked the budget, refreshed the code marker, looked for its own job, submitted"
    assert "/.runs/" in cluster.asked[5].line, "the code marker of the DAG run"


@pytest.mark.parametrize(("raised", "final"), [
    (DOWN, False),  # the login node did not answer: the task's retries ride it out
    (PreflightError("sbatch --test-only refused vcloud-outage-stage0: invalid partition"), True),
    (ValueError("a bug"), True),
    (AirflowSkipException("nothing to do"), False),
])
def test_a_cluster_step_fails_for_good_unless_the_login_node_was_unreachable(raised: BaseException,
                                                                            final: bool) -> None:
    with pytest.raises((type(raised), AirflowException)) as caught:
        with final_unless_unreachable():
            raise raised
    assert isinstance(caught.value, AirflowFailException) == final
    assert str(raised) in str(caught.value)
