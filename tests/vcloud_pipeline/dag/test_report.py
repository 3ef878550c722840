"""The run summary on the local cluster: the ``summary`` task's XCom and ``python -m
vcloud_pipeline.dag.report`` point at each stage's training-curve PNG where the export wrote it."""

from __future__ import annotations

import json
import shlex

import pytest

from support.localcluster import LocalCluster
from vcloud.contract import curve_png_name
from vcloud_pipeline.plan.request import parse_request
from vcloud_pipeline.dag.report import render_report
from vcloud_pipeline.dag.tasks import build_plan, curve_pngs, summarize

def test_the_summary_points_at_the_curve_pngs_the_export_wrote(local_cluster: LocalCluster, cluster_connection: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_provider.hooks import SlurmHook

    base = local_cluster.test_dir()
    monkeypatch.setenv("VCLOUD_PROFILE_OVERRIDES", json.dumps({"local": {"paths.base": base}}))
    ctx = build_plan(parse_request({"profile": "local", "config": "tiny", "run_name": "summary-run"}))
    plotted = {0: ctx.paths.curve_png(0), 2: ctx.paths.curve_png(2)}
    assert str(plotted[2]) == f"{base}/viewer_data/summary-run/{curve_png_name(2)}"
    local_cluster.ssh(f"mkdir -p {shlex.quote(str(plotted[0].parent))}")
    for path in plotted.values():  # where the export job leaves them, owned by the cluster user
        local_cluster.ssh(f"cat > {shlex.quote(str(path))}", input="a plot")
    local_cluster.ssh(f"touch {shlex.quote(str(ctx.paths.curve_png(3)))}")  # empty: not a plot
    scores = {"stage": 2, "series": 4, "split": "test", "samples": 4, "mean": {"psnr": 30.0, "ssim": 0.9, "sam": 4.0},
              "uncertainty": {"uncertainty": 0.02, "uncertainty_error_corr": 0.5, "spread_skill": 1.1}}
    local_cluster.ssh(f"cat > {shlex.quote(str(ctx.paths.export_metrics))}", input=json.dumps(scores))
    try:
        with SlurmHook(ctx.profile.connection.conn_id) as hook:
            pngs = curve_pngs(ctx, hook)
            summary = summarize(ctx, hook, {})
            report = render_report(ctx, hook)
    finally:
        local_cluster.ssh(f"rm -rf {shlex.quote(base)}")
    assert pngs == {"stage0": str(plotted[0]), "stage2": str(plotted[2])}
    assert summary["curves"] == pngs
    assert summary["export"] == ("export of stage 2 on 4 test series: PSNR 30.00 dB, SSIM 0.900, SAM 4.00 deg; the "
                                 "mean of 4 samples, mean uncertainty 0.0200 (reflectance), its correlation with "
                                 "the error 0.50, spread-skill ratio 1.10")
    section = report.split("training curves (PNG, loss and validation PSNR over the steps of each stage):\n")[1]
    assert section.splitlines()[:2] == [f"  stage0: {plotted[0]}", f"  stage2: {plotted[2]}"]
    assert section.splitlines()[2] == ""  # then the ledger


def test_a_run_without_an_export_says_where_the_curves_will_be(local_cluster: LocalCluster, cluster_connection: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_provider.hooks import SlurmHook

    base = local_cluster.test_dir()
    monkeypatch.setenv("VCLOUD_PROFILE_OVERRIDES", json.dumps({"local": {"paths.base": base}}))
    ctx = build_plan(parse_request({"profile": "local", "config": "tiny", "run_name": "nothing"}))
    try:
        with SlurmHook(ctx.profile.connection.conn_id) as hook:
            assert curve_pngs(ctx, hook) == {}
            report = render_report(ctx, hook)
    finally:
        local_cluster.ssh(f"rm -rf {shlex.quote(base)}")
    assert "training curves (PNG, loss and validation PSNR over the steps of each stage):\n" \
           "  none yet: the export job plots them\n" in report


def test_stage_yields_put_each_stages_gain_against_its_gpu_hours() -> None:
    from vcloud.stage_records import CompleteRecord
    from vcloud_pipeline.dag.tasks import stage_yields, yield_line
    from vcloud_pipeline.plan.labels import JobLabel

    records = {
        "stage0": {"epochs": 8, "best_metric": {"name": "psnr", "value": 30.0, "epoch": 8}},
        "stage1": {"epochs": 3, "best_metric": {"name": "psnr", "value": 31.5, "epoch": 3, "start_value": 30.25},
                   "stop": {"reason": "epochs", "detail": "trained its 3 epochs", "epochs_planned": 3}},
        "stage2": {"epochs": 1, "best_metric": {"name": "psnr", "value": 31.5, "epoch": 0, "start_value": 31.5},
                   "stop": {"reason": "patience", "detail": "stopped early after 1 of 3 epochs", "epochs_planned": 3}},
    }
    yields = stage_yields({JobLabel(label): CompleteRecord.from_json(record) for label, record in records.items()},
                          {"stage0": 0.5, "stage1": 0.25, "stage2": 0.125})
    assert yields["stage1"]["gain"] == 1.25 and yields["stage1"]["gain_per_gpu_hour"] == 5.0
    assert yields["stage2"]["gain"] == 0.0 and yields["stage2"]["stop_reason"] == "patience"
    assert yields["stage0"]["gain"] is None and yields["stage0"]["stop_reason"] == "epochs"
    assert "stage3" not in yields
    assert yield_line("stage1", yields["stage1"]) == (
        "stage1: 0.2500 GPU-hours, validation psnr +1.250 dB over its start, 5.000 dB per GPU-hour; "
        "trained its 3 epochs")
    assert yield_line("stage0", yields["stage0"]) == "stage0: 0.5000 GPU-hours, no start scored, no gain measured"
