"""A stage spends GPU-hours only while it earns them: through the training DAG on the local cluster.

One run of the tiny config, three epochs per stage, with the DAG's defaults otherwise:

- stage 3 is not submitted: the config names no unlabeled domain (``model.stage3.unlabeled_data``),
  and the run does not force it; the reason is in the plan's XCom and the run summary;
- stage 2 stops after its first epoch: its code tree trains it at a learning rate far too high
  (0.9), so it never beats the draft it starts from, and the tiny config's ``patience: 1`` ends it.
  Its ``COMPLETE`` says why, its job ends ``COMPLETED`` after 1 of 3 epochs, it hands on its start;
- the summary, and ``python -m vcloud_pipeline.dag.report`` for the DAG run, put each stage's validation
  gain against its GPU-hours.

A second run turns stage 2 off by default (``train.stage2.run_by_default: false``, as the small
and full configs ship) and forces stage 3: stage 2 is not submitted, and stage 3 starts from stage
1's draft on the cluster.

Jobs run for real, as the cluster user, in the local profile's image.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from support.localcluster import LocalCluster
from tests.dags.test_dag_on_cluster import job_logs_tail, run_dag

pytestmark = [pytest.mark.usefixtures("cluster_connection", "airflow_home"), pytest.mark.timeout(1500)]
REPO = Path(__file__).resolve().parents[2]
RUN = "spending"
STAGE2_BUDGET = "  stage2: {epochs: 2, batch_size: 2, lr: 1.0e-3, patience: 1}"


def tree_with_stage2(root: Path, settings: str) -> Path:
    """A copy of the project's ``trainer/`` whose tiny config trains stage 2 with ``settings``
    (``lr: 0.9``) instead of its learning rate."""
    shutil.copytree(REPO / "trainer", root / "trainer",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    config = root / "trainer" / "configs" / "model_tiny.yaml"
    text = config.read_text()
    assert text.count(STAGE2_BUDGET) == 1, f"model_tiny.yaml no longer has {STAGE2_BUDGET!r}: update this test"
    config.write_text(text.replace(STAGE2_BUDGET, STAGE2_BUDGET.replace("lr: 1.0e-3", settings)))
    return root


@pytest.mark.slow
def test_a_stage_that_stops_learning_stops_and_stage3_without_a_domain_is_not_submitted(
        local_cluster: LocalCluster, project_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_provider.hooks import SlurmHook
    from vcloud.contract import STOP_EPOCHS, STOP_PATIENCE
    from vcloud_pipeline.dag import tasks
    from vcloud_pipeline.dag.report import render_report
    from vcloud_pipeline.plan.run_plan import RunPlan

    tree = tree_with_stage2(tmp_path / "tree", "lr: 0.9")
    monkeypatch.setitem(tasks.sync_code.__kwdefaults__, "project_root", tree)
    monkeypatch.setitem(tasks.plan_run.__kwdefaults__, "project_root", tree)

    run_id, states, values = run_dag(profile="local", config="tiny", run_name=RUN, max_epochs=3, export=False)
    assert states["<run>"] == "success", (states, job_logs_tail(local_cluster, project_dir, RUN, "stage2"))

    # Stage 3: decided at plan, never submitted.
    reason = values["plan"]["without_work"]["3"]
    assert "model.stage3.unlabeled_data is empty in trainer/configs/model_tiny.yaml" in reason
    assert states["stage3"] == "skipped" and "stage3" not in values
    assert values["summary"]["not_submitted"] == {"stage3": reason}
    assert "stage3" not in values["preflight_checks"]["test_only"], "nothing checked for a job never submitted"
    assert local_cluster.jobs_writing(f"{project_dir}/outputs/{RUN}/stage3") == []

    # Stage 2: stopped after its first epoch, job COMPLETED, its start handed on.
    stage2 = values["stage2"]
    assert stage2["state"] == "COMPLETED" and stage2["states"] == {stage2["job_id"]: "COMPLETED"}, stage2
    assert local_cluster.wait_for_state(int(stage2["job_id"]), {"COMPLETED"}) == "COMPLETED"
    assert (stage2["epochs"], stage2["stop_reason"], stage2["best_epoch"]) == (1, STOP_PATIENCE, 0), stage2
    assert "stopped early after 1 of 3 epochs" in stage2["stop_detail"]
    assert stage2["validation_gain"] == 0.0 and stage2["gain_metric"] == "psnr"
    complete = json.loads(local_cluster.ssh(
        f"cat {shlex.quote(f'{project_dir}/outputs/{RUN}/stage2/COMPLETE')}").stdout)
    assert complete["stop"] == {"reason": STOP_PATIENCE, "detail": stage2["stop_detail"], "epochs_planned": 3}
    assert complete["final_metrics"]["psnr"] < complete["best_metric"]["value"], "training made it worse"
    log = job_logs_tail(local_cluster, project_dir, RUN, "stage2", chars=20000)
    assert "stage 2 | epoch 1/3" in log and "stage 2 | epoch 2/3" not in log, log[-3000:]

    # Stages 0 and 1 trained their three epochs; stage 1 measured a gain over its start.
    for label in ("stage0", "stage1"):
        assert (values[label]["epochs"], values[label]["stop_reason"]) == (3, STOP_EPOCHS), values[label]
    assert values["stage0"]["validation_gain"] is None, "stage 0 scores no start"
    assert isinstance(values["stage1"]["validation_gain"], float)

    yields = values["summary"]["stage_yields"]
    assert set(yields) == {"stage0", "stage1", "stage2"}
    assert yields["stage2"]["gpu_hours"] == round(stage2["gpu_hours"], 4) > 0
    assert (yields["stage2"]["gain"], yields["stage2"]["gain_per_gpu_hour"]) == (0.0, 0.0)
    assert yields["stage1"]["gain_per_gpu_hour"] == pytest.approx(
        yields["stage1"]["gain"] / yields["stage1"]["gpu_hours"], rel=1e-3)

    plan = RunPlan.from_xcom(values["plan"])
    with SlurmHook(plan.conn_id) as hook:
        report = render_report(plan, hook, dag_run_id=run_id)
    section = report.split(f"what each stage bought on validation (GPU-hours of DAG run {run_id}):\n")[1]
    stage2_line = next(line for line in section.splitlines() if line.startswith("  stage2: "))
    assert "validation psnr +0.000 dB over its start, 0.000 dB per GPU-hour; stopped early after 1 of 3" \
        in stage2_line, report
    assert f"  stage3: not complete ({reason})" in report

    # Each stage's summary names the earlier stages' best.pt it was built from, as the cluster holds them:
    # none for stages 0 and 1 (stage 1's draft model is trained from scratch), stages 0 and 1 for stage 2.
    outputs = shlex.quote(f"{project_dir}/outputs/{RUN}")
    digests = dict(line.split("  ")[::-1] for line in local_cluster.ssh(
        f"cd {outputs} && sha256sum stage0/best.pt stage1/best.pt").stdout.splitlines())
    built_from = {"0": digests["stage0/best.pt"], "1": digests["stage1/best.pt"]}
    assert (values["stage0"]["lineage"], values["stage1"]["lineage"], stage2["lineage"]) == (
        {}, {}, built_from), values["stage2"]
    assert complete["lineage"] == built_from
    assert (f"; built from stage 0 best.pt {built_from['0'][:12]}, stage 1 best.pt {built_from['1'][:12]}"
            in next(line for line in report.splitlines() if line.startswith("  stage2: 1 epochs"))), report


@pytest.mark.slow
def test_stage2_off_by_default_is_not_submitted_and_stage3_starts_from_stage1s_draft(
        local_cluster: LocalCluster, project_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vcloud_pipeline.dag import tasks

    run = "stage2-off"
    tree = tree_with_stage2(tmp_path / "tree", "lr: 1.0e-3, run_by_default: false")
    monkeypatch.setitem(tasks.sync_code.__kwdefaults__, "project_root", tree)
    monkeypatch.setitem(tasks.plan_run.__kwdefaults__, "project_root", tree)

    run_id, states, values = run_dag(profile="local", config="tiny", run_name=run, max_epochs=1, export=False,
                                     force_stages=[3])
    assert states["<run>"] == "success", (states, job_logs_tail(local_cluster, project_dir, run, "stage3"))

    reason = values["plan"]["without_work"]["2"]
    assert "train.stage2.run_by_default is false in trainer/configs/model_tiny.yaml" in reason
    assert list(values["plan"]["without_work"]) == ["2"], "stage 3 is forced"
    assert states["stage2"] == "skipped" and "stage2" not in values
    assert values["summary"]["not_submitted"] == {"stage2": reason}
    outputs = f"{project_dir}/outputs/{run}"
    assert local_cluster.ssh(f"test -e {shlex.quote(outputs)}/stage2/best.pt", check=False).returncode != 0

    stage3 = values["stage3"]
    assert stage3["state"] == "COMPLETED" and stage3["epochs"] == 1, stage3
    log = job_logs_tail(local_cluster, project_dir, run, "stage3", chars=20000)
    assert "starting from stage 2's untrained start, stage 1's draft" in log, log[-3000:]
    stage1 = json.loads(local_cluster.ssh(f"cat {shlex.quote(outputs)}/stage1/COMPLETE").stdout)
    complete = json.loads(local_cluster.ssh(f"cat {shlex.quote(outputs)}/stage3/COMPLETE").stdout)
    assert complete["best_metric"]["start_value"] == pytest.approx(stage1["best_metric"]["value"], abs=1e-4), \
        "stage 3's start is stage 1's draft"
