"""Pure parts of the HPC view's training curves: the SVG chart, which stages are shown and where their
files are, and the curves the stages recorded (the browser test compares them with the files)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from hpc_view.charts import CURVE_HEIGHT, CURVE_PAD, CURVE_WIDTH, curve_svg, thin, training_curve_charts
from hpc_view.curves import curve_targets, stage_curves
from hpc_view.records import JobRecord
from vcloud.contract import TrainingCurve

LEFT, RIGHT, TOP, BOTTOM = CURVE_PAD


def _polyline(svg: str) -> list[tuple[float, float]]:
    [points] = re.findall(r'<polyline points="([^"]*)"', svg)
    return [tuple(map(float, pair.split(","))) for pair in points.split()]


def test_curve_chart_scales_the_points_to_the_plot_area() -> None:
    svg = curve_svg("training loss", [(0, 1.0), (50, 0.5), (100, 0.25)], y_label="loss")
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg" class="curve"') and svg.endswith("</svg>")
    points = _polyline(svg)
    assert len(points) == 3
    # first step at the left edge, last at the right; highest value at the top, lowest at the bottom,
    # 0.5 a third of the way up from 0.25 to 1
    assert points[0] == (LEFT, TOP)
    middle = (LEFT + (CURVE_WIDTH - LEFT - RIGHT) / 2, TOP + (CURVE_HEIGHT - TOP - BOTTOM) * 2 / 3)
    assert points[1] == pytest.approx(middle, abs=0.05)
    assert points[2] == (CURVE_WIDTH - RIGHT, CURVE_HEIGHT - BOTTOM)
    assert "training loss: 0.25 at step 100" in svg  # the last point in the title
    for label in (">loss<", ">step<", ">0.25<", ">1<", ">0<", ">100<"):
        assert label in svg, label


def test_curve_chart_of_one_point_and_of_none() -> None:
    one = curve_svg("validation PSNR", [(0, 21.5)], y_label="PSNR (dB)")
    [(x, y)] = _polyline(one)
    assert x == pytest.approx(LEFT + (CURVE_WIDTH - LEFT - RIGHT) / 2)  # centred in a small range around it
    assert y == pytest.approx(TOP + (CURVE_HEIGHT - TOP - BOTTOM) / 2)
    assert f'<circle cx="{x:.1f}" cy="{y:.1f}"' in one and "21.5 at step 0" in one
    none = curve_svg("validation PSNR", [], y_label="PSNR (dB)")
    assert "<polyline" not in none and "no point yet" in none and none.endswith("</svg>")


def test_curve_chart_escapes_its_labels() -> None:
    svg = curve_svg("<b>&", [(1, 2.0), (2, 3.0)], y_label="a<b")
    assert "<b>" not in svg and "&lt;b&gt;&amp;" in svg and "a&lt;b" in svg


def test_a_stage_has_a_loss_chart_and_a_psnr_chart() -> None:
    charts = training_curve_charts(TrainingCurve(loss=((1, 0.5), (2, 0.4)), val_psnr=((0, 20.0),)))
    assert len(_polyline(charts["loss"])) == 2 and len(_polyline(charts["val_psnr"])) == 1
    assert "training loss" in charts["loss"] and "PSNR (dB)" in charts["val_psnr"]


def test_thinning_keeps_the_first_and_last_point() -> None:
    points = tuple((s, float(s)) for s in range(1001))
    thinned = thin(points, 101)
    assert len(thinned) == 101 and thinned[0] == points[0] and thinned[-1] == points[-1]
    assert [s for s, _ in thinned[:3]] == [0, 10, 20]
    assert thin(points[:5], 101) == points[:5]


def _record(task_id: str, *, run: str = "tiny", final: bool = True, dag_run: str = "r1",
            profile: str = "local", job_id: str = "1") -> JobRecord:
    return JobRecord(dag_id="vcloud_training", run_id=dag_run, task_id=task_id, map_index=-1,
                     task_state="success" if final else "deferred", profile=profile, run_name=run, stage=task_id,
                     job_id=job_id, job_ids=(job_id,), state="COMPLETED" if final else None, final=final)


def _locate(profile: str, run: str, stage: int) -> tuple[str, str]:
    return f"conn_{profile}", f"/out/{run}/stage{stage}/metrics.jsonl"


def test_targets_are_the_training_stages_with_their_run_and_files() -> None:
    records = [_record("prepare_data"), _record("stage0"), _record("stage1", run="", final=False, job_id="5"),
               _record("export")]
    targets = curve_targets(records, _locate)
    assert [(t.stage, t.run_name, t.live, t.path) for t in targets] == [
        (0, "tiny", False, "/out/tiny/stage0/metrics.jsonl"),
        # still waiting, its DAG run's conf names no run: the run name of the finished stage
        (1, "tiny", True, "/out/tiny/stage1/metrics.jsonl"),
    ]
    alone = curve_targets([_record("stage0", run="", final=False)], _locate)
    assert alone[0].path is None and "no run name recorded yet" in alone[0].problem


def test_targets_are_the_newest_stages_once_each() -> None:
    old = [_record(f"stage{s}", run="old", dag_run="r0") for s in range(4)]
    again = [_record("stage0", run="new", dag_run="r1"), _record("stage0", run="new", dag_run="r2", final=False)]
    targets = curve_targets(old + again, _locate, limit=3)
    assert [(t.run_name, t.stage, t.live) for t in targets] == [("new", 0, True), ("old", 2, False), ("old", 3, False)]


def test_curves_are_the_ones_the_stages_recorded_and_a_training_stage_says_where_its_file_is() -> None:
    curve = {"loss": [[1, 0.5], [2, 0.25]], "val_psnr": [[0, 20.5]]}
    records = [replace(_record("stage0"), curve=curve), _record("stage1", final=False, job_id="2")]
    done, training = stage_curves(records, _locate)
    assert done["points"] == curve and done["problem"] is None and not done["live"]
    assert training["live"] and training["points"] == {"loss": [], "val_psnr": []}
    assert training["problem"].startswith("the stage is training: its curve is drawn from "
                                          "/out/tiny/stage1/metrics.jsonl on cluster connection conn_local when")
    assert "the API server does not read the cluster" in training["problem"]


def test_a_stage_trained_again_shows_its_last_recorded_curve_while_it_trains() -> None:
    old = replace(_record("stage0", dag_run="r1"), curve={"loss": [[1, 0.5]], "val_psnr": []})
    again = _record("stage0", dag_run="r2", final=False, job_id="9")
    [curve] = stage_curves([old, again], _locate)
    assert curve["live"] and curve["job_id"] == "9" and curve["points"]["loss"] == [[1, 0.5]]


def test_a_stage_that_recorded_no_curve_says_so() -> None:
    [curve] = stage_curves([_record("stage0")], _locate)  # a record from before stages carried curves
    assert curve["problem"] == ("no curve recorded by the stage's task (it ended without a completed job): see "
                                "/out/tiny/stage0/metrics.jsonl on cluster connection conn_local")
    [empty] = stage_curves([replace(_record("stage0"), curve={"loss": [], "val_psnr": []})], _locate)
    assert "recorded no training curve" in empty["problem"]


def test_a_recorded_curve_is_thinned_and_malformed_points_are_left_out() -> None:
    curve = TrainingCurve.from_json({"loss": [[s, 1.0 / (s + 1)] for s in range(5000)] + [["x", 1], [1, True]],
                                     "val_psnr": None})
    assert len(curve.loss) == 5000 and curve.val_psnr == ()
    thinned = curve.thinned(600)
    assert len(thinned.loss) == 600 and thinned.loss[0] == curve.loss[0] and thinned.loss[-1] == curve.loss[-1]
    assert TrainingCurve.from_json(thinned.to_json()) == thinned
