"""A refiner's export: the mean of K samples, their spread as a band and a panel, and whether the
spread tracks the error."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import rasterio
import torch

from vcloud.config import config_from_dict, load_config
from vcloud.data.dataset import SeriesDataset
from vcloud.export import main
from vcloud.export_uncertainty import mean_scores, pearson, summarize_samples
from vcloud.metrics import METRIC_NAMES
from vcloud.models.draft_and_refiner import EVAL_SEED
from vcloud.stage_registry import build_context, load_stage_model
from vcloud.training import loop
from vcloud.training.distributed import init_distributed
from vcloud.training.loop import StageRun, train_stage
from vcloud.training.signals import StopRequest

TINY = Path(__file__).resolve().parents[2] / "trainer" / "configs" / "model_tiny.yaml"
SAMPLES = 3
LR, EPOCHS = 0.02, 2


def test_the_mean_and_spread_of_samples_with_a_known_answer() -> None:
    target = torch.zeros(13, 2, 2)
    # Pixel (0, 0): samples 0.2 +- 0.1 (error 0.2, spread 0.1); pixel (1, 1): 0.4 +- 0.2; others exact.
    low, high = torch.zeros(13, 2, 2), torch.zeros(13, 2, 2)
    low[:, 0, 0], high[:, 0, 0] = 0.1, 0.3
    low[:, 1, 1], high[:, 1, 1] = 0.2, 0.6
    summary = summarize_samples(torch.stack([low, high]), target)
    assert torch.allclose(summary.mean[:, 0, 0], torch.full((13,), 0.2))
    assert torch.allclose(summary.spread, torch.tensor([[0.1, 0.0], [0.0, 0.2]]))
    assert summary.error_correlation == pytest.approx(1.0), "the spread is largest where the error is"
    # sqrt((K+1)/K) * sqrt(mean unbiased variance) / RMSE = sqrt(1.5) * sqrt((0.02 + 0.08) / 4) / sqrt(0.2 / 4)
    assert summary.spread_skill == pytest.approx(math.sqrt(1.5) * math.sqrt(0.025) / math.sqrt(0.05))
    assert summary.scores()["uncertainty"] == pytest.approx(0.075)
    with pytest.raises(ValueError, match="K >= 2"):
        summarize_samples(low[None], target)


def test_a_constant_spread_has_no_correlation_and_the_means_leave_it_out() -> None:
    assert math.isnan(pearson(torch.ones(3, 3), torch.rand(3, 3)))
    assert pearson(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([3.0, 2.0, 1.0])) == pytest.approx(-1.0)
    means = mean_scores([{"uncertainty": 0.1, "uncertainty_error_corr": math.nan, "spread_skill": 1.0},
                         {"uncertainty": 0.3, "uncertainty_error_corr": 0.5, "spread_skill": 0.8}])
    assert means == pytest.approx({"uncertainty": 0.2, "uncertainty_error_corr": 0.5, "spread_skill": 0.9})


@pytest.fixture(scope="module")
def refiner_export(tiny_prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Stages 0-2 trained for an epoch each; stage 2's validation is scripted to improve, so its trained
    weights (which spread their samples, unlike the zero-initialised start) become best.pt."""
    run_dir = tmp_path_factory.mktemp("refiner_run")
    raw = load_config(TINY).to_dict()
    raw["train"]["stage2"] = {**raw["train"]["stage2"], "lr": LR}  # a refiner that learned to spread its samples
    config = config_from_dict(raw)
    for stage in (0, 1, 2):
        with pytest.MonkeyPatch.context() as patch:
            if stage == 2:
                rising = itertools.count(30.0)
                patch.setattr(loop, "evaluate", lambda *args, **kwargs: {
                    name: next(rising) if name == "psnr" else 0.5 for name in METRIC_NAMES})
            run = StageRun(stage=stage, config=config, data_root=tiny_prepared, run_dir=run_dir,
                           max_epochs=EPOCHS if stage == 2 else 1)
            assert train_stage(run, init_distributed(env={}), StopRequest()) == 0
    dest = tmp_path_factory.mktemp("refiner_viewer")
    assert main(["--config", str(TINY), "--data", str(tiny_prepared), "--out", str(run_dir), "--dest", str(dest),
                 "--stage", "2", "--limit", "2", "--samples", str(SAMPLES)]) == 0
    return run_dir, dest


def test_a_refiners_geotiff_holds_the_mean_of_its_samples_and_their_spread(
        refiner_export: tuple[Path, Path], tiny_prepared: Path) -> None:
    run_dir, dest = refiner_export
    summary = json.loads((dest / "metrics.json").read_text())
    assert summary["samples"] == SAMPLES and summary["geotiff_bands"][-1] == "uncertainty"
    assert len(summary["geotiff_bands"]) == 14 and summary["geotiff_bands"][8] == "B8A"
    # The same samples drawn again, independently of the export: same seeds, same weights.
    model, _ = load_stage_model(2, run_dir / "stage2" / "best.pt",
                                build_context(load_config(TINY), run_dir, torch.device("cpu")))
    model.eval()
    item = SeriesDataset(tiny_prepared, "test")[0]
    batch = {k: v.unsqueeze(0) if isinstance(v, torch.Tensor) else [v] for k, v in item.items()}
    with torch.no_grad():
        draft = model.draft(batch)
        drawn = torch.cat([model.refine(batch, generator=torch.Generator().manual_seed(EVAL_SEED + k), draft=draft)
                           for k in range(SAMPLES)]).clamp(0, 1)
    with rasterio.open(dest / summary["per_series"][0]["geotiff"]) as tif:
        assert tif.count == 14
        bands = tif.read().astype(np.float64) / 10000.0
    assert np.abs(bands[:13] - drawn.mean(0).numpy()).max() <= 1.5e-4, "bands 1-13: the mean of the samples"
    spread = drawn.std(0, correction=0).mean(0).numpy()
    assert spread.max() > 1e-3, "the trained refiner's samples differ"
    assert np.abs(bands[13] - spread).max() <= 1.5e-4, "band 14: their spread"
    first = summary["per_series"][0]
    assert first["uncertainty"] == pytest.approx(float(spread.mean()), abs=1e-6)
    assert -1.0 <= first["uncertainty_error_corr"] <= 1.0 and first["spread_skill"] > 0
    assert set(summary["uncertainty"]) == {"uncertainty", "uncertainty_error_corr", "spread_skill"}


def test_a_refiners_quicklook_has_an_uncertainty_panel(refiner_export: tuple[Path, Path]) -> None:
    _, dest = refiner_export
    summary = json.loads((dest / "metrics.json").read_text())
    assert summary["panels"] == ["cloudy_input", "prediction", "target", "uncertainty"]
    image = matplotlib.image.imread(dest / summary["per_series"][0]["quicklook"])
    height = image.shape[0]
    assert image.shape[1] == 4 * height + 3 * 2, "four square panels, three gaps"
    panel = image[:, 3 * (height + 2):, :3]
    assert np.allclose(panel[..., 0], panel[..., 1]) and np.allclose(panel[..., 1], panel[..., 2]), "grey"
    assert panel.max() > 0.9, "the largest spread is white"
