"""The summary's last look: jobs of ended tasks that Slurm still runs are cancelled, adopted ones left."""

from __future__ import annotations

from typing import Any

import pytest

from slurm_provider.cli.sbatch import JobComment
from slurm_provider.hooks import SlurmHook
from slurm_provider.links import JOB_ID_XCOM_KEY
from support.fake_slurm import install
from vcloud_pipeline.dag.left_running import left_running, settle_left_jobs

DAG, RUN = "vcloud_training", "manual__2026-11-29"


def comment(task: str, run: str = RUN) -> str:
    return JobComment(dag=DAG, task=task, run=run, attempt=1, stage=task, project="vcloud").to_json()


class TaskTry:
    def __init__(self, job_ids: dict[str, str]) -> None:
        self.job_ids = job_ids

    def xcom_pull(self, task_ids: str, key: str) -> Any:
        assert key == JOB_ID_XCOM_KEY
        return self.job_ids.get(task_ids)


def test_the_live_jobs_of_ended_tasks_are_cancelled_and_an_adopted_one_is_left_running(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    fake = install(monkeypatch)
    fake.add("11", "d", state="COMPLETED", comment=comment("prepare_data"))
    fake.add("12", "s0", state="COMPLETED", comment=comment("stage0"))
    fake.add("13", "s1", state="RUNNING", comment=comment("stage1"))           # marked failed before its watch
    fake.add("14", "s2", state="PENDING", comment=comment("stage2", run="manual__other"))  # adopted from another run
    ti = TaskTry({"prepare_data": "11", "stage0": "12", "stage1": "13", "stage2": "14"})
    with SlurmHook(ssh_conn_id="c") as hook:
        # stage1's task starting looks only at the tasks before it, which have ended
        assert settle_left_jobs(hook, ti, DAG, RUN, task_ids=["prepare_data", "stage0"]) == []
        statuses = hook.statuses(["11", "12", "13", "14"])
        assert [(j.task_id, j.status.job_id, j.adopted) for j in left_running(ti.job_ids, statuses, DAG, RUN)] == [
            ("stage1", "13", False), ("stage2", "14", True)]
        lines = settle_left_jobs(hook, ti, DAG, RUN)
    assert [a.line.split()[-1] for a in fake.asked if a.verb == "scancel"] == ["13"]
    assert lines[0].startswith("Job 13 of stage1 was still RUNNING though its task had ended") and "cancelled" in lines[0]
    assert lines[1].startswith("Job 14 (PENDING), watched by stage2") and lines[1].endswith("left running")
    assert settle_left_jobs(hook, TaskTry({}), DAG, RUN) == []


def test_a_job_task_looks_at_the_job_tasks_before_it_in_the_run() -> None:
    from vcloud_pipeline.dag.job_operator import PipelineJobOperator

    assert PipelineJobOperator(task_id="stage1", job="stage1")._earlier_job_tasks() == [
        "prepare_data", "preflight_imports", "stage0"]
    assert PipelineJobOperator(task_id="prepare_data", job="data")._earlier_job_tasks() == []

