"""Viewer export: quicklook PNGs, georeferenced GeoTIFFs, metrics.json and training curves."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import rasterio
import torch

from vcloud.config import load_config
from vcloud.data.dataset import SeriesDataset
from vcloud.contract import (
    EXPORTED_FILE,
    TrainingCurve,
    curve_png_name,
    export_inputs_digest,
    exported_done_name,
    exported_inputs,
    training_curve,
)
from vcloud.export import (
    curve_title,
    input_stamps,
    latest_trained_stage,
    main,
    plot_training_curve,
    rgb_quicklook,
    stage_curve,
)
from vcloud.metrics import psnr
from vcloud.training.distributed import init_distributed
from vcloud.training.loop import StageRun, train_stage
from vcloud.training.signals import StopRequest

TINY = Path(__file__).resolve().parents[2] / "trainer" / "configs" / "model_tiny.yaml"


@pytest.fixture(scope="module")
def exported(tiny_prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    run_dir = tmp_path_factory.mktemp("export_run")
    run = StageRun(stage=0, config=load_config(TINY), data_root=tiny_prepared, run_dir=run_dir, max_epochs=3)
    assert train_stage(run, init_distributed(env={}), StopRequest()) == 0
    dest = tmp_path_factory.mktemp("viewer")
    code = main(["--config", str(TINY), "--data", str(tiny_prepared), "--out", str(run_dir), "--dest", str(dest)])
    assert code == 0
    return run_dir, dest


def test_geotiffs_keep_the_input_georeferencing(exported, tiny_prepared: Path) -> None:
    _, dest = exported
    test = SeriesDataset(tiny_prepared, "test")
    summary = json.loads((dest / "metrics.json").read_text())
    assert summary["series"] == len(test) > 0
    for i, entry in enumerate(summary["per_series"]):
        meta = test.meta(i)
        with rasterio.open(dest / entry["geotiff"]) as tif:
            assert tif.count == 13 and tif.dtypes[0] == "uint16"
            assert tif.crs.to_string() == meta.crs
            assert tuple(tif.transform)[:6] == pytest.approx(meta.transform)
            prediction = torch.from_numpy(tif.read().astype(np.float32) / 10000.0)[None]
        # the GeoTIFF holds the prediction the metrics were computed from (up to uint16 rounding)
        target = test[i]["target"][None]
        assert float(psnr(prediction, target)) == pytest.approx(entry["psnr"], abs=0.05)


def test_quicklooks_show_three_panels(exported, tiny_prepared: Path) -> None:
    _, dest = exported
    summary = json.loads((dest / "metrics.json").read_text())
    assert summary["panels"] == ["cloudy_input", "prediction", "target"]
    image = matplotlib.image.imread(dest / summary["per_series"][0]["quicklook"])
    height = SeriesDataset(tiny_prepared, "test").meta(0).height
    assert image.shape[0] == height and image.shape[1] == 3 * height + 4


def test_metrics_and_curves(exported) -> None:
    run_dir, dest = exported
    summary = json.loads((dest / "metrics.json").read_text())
    assert summary["stage"] == 0 and summary["stage_name"] == "autoencoder"
    assert summary["lineage"] == {}, "stage 0 is built from no earlier stage's best.pt"
    assert summary["mean"]["psnr"] == pytest.approx(np.mean([s["psnr"] for s in summary["per_series"]]))
    assert summary["curves"] == ["curves/stage0.png"] == [curve_png_name(0)]
    curve = matplotlib.image.imread(dest / "curves" / "stage0.png")
    assert curve.ndim == 3 and curve.shape[0] > 100
    assert curve.std() > 0.01, "the plot is not blank"


def test_the_export_is_marked_done_naming_the_stage_outputs_it_read(exported, tiny_prepared: Path,
                                                                     tmp_path: Path) -> None:
    run_dir, dest = exported
    record = json.loads((dest / EXPORTED_FILE).read_text())
    stamps = input_stamps(run_dir)
    assert set(stamps) == {"stage0/best.pt", "stage0/COMPLETE", "stage0/metrics.jsonl"}
    assert record["inputs"] == export_inputs_digest(stamps) == exported_inputs((dest / EXPORTED_FILE).read_text())
    assert record["stage"] == 0 and record["checkpoint"] == str(run_dir / "stage0" / "best.pt")
    assert record["stamps"]["stage0/best.pt"] == list(stamps["stage0/best.pt"])
    assert sorted(p.name for p in dest.glob("EXPORTED*")) == ["EXPORTED", exported_done_name(record["inputs"])]
    # a partial export (one series) is no export of the run: it leaves no marker, and removes an old one
    partial = tmp_path / "viewer"
    partial.mkdir()
    (partial / EXPORTED_FILE).write_text(json.dumps(record))
    assert main(["--config", str(TINY), "--data", str(tiny_prepared), "--out", str(run_dir), "--dest", str(partial),
                 "--limit", "1"]) == 0
    assert not (partial / EXPORTED_FILE).exists()
    (partial / exported_done_name(record["inputs"])).touch()
    assert main(["--config", str(TINY), "--data", str(tiny_prepared), "--out", str(run_dir), "--dest", str(partial),
                 "--limit", "1"]) == 0
    assert not list(partial.glob("EXPORTED*")), "an export under way is no export of any inputs"


def test_the_inputs_digest_changes_with_any_input_file_and_only_then() -> None:
    stamps = {"stage0/best.pt": (4096, 1767225600), "stage0/COMPLETE": (300, 1767225600)}
    same = export_inputs_digest(dict(reversed(list(stamps.items()))))
    assert export_inputs_digest(stamps) == same and len(same) == 16
    assert export_inputs_digest({**stamps, "stage0/best.pt": (4096, 1767225700)}) != same  # rewritten
    assert export_inputs_digest({**stamps, "stage1/best.pt": (4096, 1767225700)}) != same  # a stage more
    assert export_inputs_digest({"stage0/best.pt": (4096, 1767225600)}) != same
    assert exported_inputs(None) is None and exported_inputs("{half") is None
    assert exported_inputs('{"inputs": "not a digest"}') is None


def test_the_curve_png_is_plotted_from_metrics_jsonl(exported, tmp_path: Path) -> None:
    run_dir, dest = exported
    from_file = training_curve((run_dir / "stage0" / "metrics.jsonl").read_text())
    assert len(from_file.loss) >= 3 and len(from_file.val_psnr) >= 3  # a line per log step, per validation
    curve, x_label = stage_curve(run_dir, 0)
    assert (curve, x_label) == (from_file, "step")
    # what the axes hold, read back from the plotted lines, is the file's curve
    assert plot_training_curve(curve, "stage 0", tmp_path / "again.png") == from_file
    png = dest / curve_png_name(0)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(data) < 500_000
    image = matplotlib.image.imread(png)
    assert image.shape[:2] == (400, 1000)  # 10 x 4 inches at 100 dpi: loss and PSNR side by side
    assert image.std() > 0.01, "the plot is not blank"


def test_a_stage_trained_before_metrics_jsonl_existed_is_plotted_per_epoch(tmp_path: Path) -> None:
    stage = tmp_path / "stage1"
    stage.mkdir()
    history = [{"epoch": 1, "train_loss": 0.5, "val_psnr": 20.0}, {"epoch": 2, "train_loss": 0.4}]
    (stage / "progress.json").write_text(json.dumps({"stage": 1, "history": history}))
    assert stage_curve(tmp_path, 1) == (TrainingCurve(loss=((1, 0.5), (2, 0.4)), val_psnr=((1, 20.0),)), "epoch")
    (stage / "metrics.jsonl").write_text('{"kind": "train", "global_step": 7, "loss": 0.3}\n')
    assert stage_curve(tmp_path, 1) == (TrainingCurve(loss=((7, 0.3),)), "step")
    assert stage_curve(tmp_path, 2) == (TrainingCurve(), "epoch")  # nothing trained: nothing to plot


def test_latest_trained_stage_prefers_the_most_advanced(tmp_path: Path) -> None:
    for stage in (0, 2):
        (tmp_path / f"stage{stage}").mkdir()
        (tmp_path / f"stage{stage}" / "best.pt").write_bytes(b"")
    (tmp_path / "stage3").mkdir()  # started, no best.pt yet
    assert latest_trained_stage(tmp_path) == 2


def test_export_without_any_trained_stage_fails_clearly(tmp_path: Path, tiny_prepared: Path) -> None:
    code = main(["--config", str(TINY), "--data", str(tiny_prepared), "--out", str(tmp_path), "--dest",
                 str(tmp_path / "viewer")])
    assert code == 1


def test_rgb_quicklook_uses_bands_4_3_2_with_a_shared_stretch() -> None:
    image = np.zeros((13, 4, 4), dtype=np.float32)
    image[3], image[2], image[1] = 0.2, 0.1, 0.05  # B4 red, B3 green, B2 blue
    mosaic = rgb_quicklook(image * 0.5, image, image)
    assert mosaic.shape == (4, 3 * 4 + 4, 3) and mosaic.dtype == np.uint8
    target_pixel, cloudy_pixel = mosaic[0, -1], mosaic[0, 0]
    assert tuple(target_pixel) == (255, 128, 64)  # red is the brightest band, stretched to white
    assert abs(int(cloudy_pixel[0]) - 128) <= 1  # half as bright, same stretch


def test_the_curve_title_says_when_a_stage_stopped_early() -> None:
    best = {"name": "psnr", "value": 31.5, "epoch": 0}
    stopped = {"epoch": 3, "epochs_total": 50, "best_metric": best,
               "stop": {"reason": "patience", "detail": "...", "epochs_planned": 50}}
    assert curve_title(2, stopped) == "stage 2: 3/50 epochs, stopped early, best psnr 31.50 (epoch 0)"
    assert curve_title(2, {**stopped, "stop": None, "epoch": 50}) == "stage 2: 50/50 epochs, best psnr 31.50 (epoch 0)"
