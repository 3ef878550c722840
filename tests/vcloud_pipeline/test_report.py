"""The run summary on the local cluster: the ``summary`` task's XCom and ``python -m
vcloud_pipeline.dag.report`` point at each stage's training-curve PNG where the export wrote it."""

from __future__ import annotations

import json
import shlex

import pytest

from localcluster import LocalCluster
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
    try:
        with SlurmHook(ctx.profile.connection.conn_id) as hook:
            pngs = curve_pngs(ctx, hook)
            summary = summarize(ctx, hook, {})
            report = render_report(ctx, hook)
    finally:
        local_cluster.ssh(f"rm -rf {shlex.quote(base)}")
    assert pngs == {"stage0": str(plotted[0]), "stage2": str(plotted[2])}
    assert summary["curves"] == pngs
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
