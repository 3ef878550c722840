"""Stage 0: the tiny autoencoder trains on CPU in seconds and its validation PSNR rises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vcloud.config import load_config
from vcloud.stage_registry import build_context, get_stage, least_cloudy_input, load_stage_model
from vcloud.training.distributed import init_distributed
from vcloud.training.loop import StageRun, evaluate, train_stage
from vcloud.training.precision import resolve_precision
from vcloud.training.signals import StopRequest

TINY = Path(__file__).resolve().parents[2] / "trainer" / "configs" / "model_tiny.yaml"


@pytest.fixture(scope="module")
def stage0_run(tiny_prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stage0")
    run = StageRun(stage=0, config=load_config(TINY), data_root=tiny_prepared, run_dir=out)
    assert train_stage(run, init_distributed(env={}), StopRequest()) == 0
    return out


def test_tiny_stage0_validation_psnr_rises(stage0_run: Path) -> None:
    progress = json.loads((stage0_run / "stage0" / "progress.json").read_text())
    psnr = [h["val_psnr"] for h in progress["history"]]
    assert len(psnr) == load_config(TINY).train.stage0.epochs
    assert psnr[-1] > psnr[0] + 5.0, psnr
    assert progress["status"] == "complete"
    assert progress["best_metric"]["value"] == max(psnr)


def test_complete_marker_carries_final_metrics(stage0_run: Path) -> None:
    complete = json.loads((stage0_run / "stage0" / "COMPLETE").read_text())
    progress = json.loads((stage0_run / "stage0" / "progress.json").read_text())
    assert complete["epochs"] == progress["epochs_total"]
    assert complete["final_metrics"]["psnr"] == progress["history"][-1]["val_psnr"]
    assert set(complete["final_metrics"]) == {"psnr", "ssim", "sam", "mae", "rmse"}
    best = complete["best_metric"]
    scored = {k[4:]: v for k, v in progress["history"][best["epoch"] - 1].items() if k.startswith("val_")}
    assert best["metrics"] == scored and best["value"] == scored["psnr"]


def test_best_checkpoint_rebuilds_the_model_and_reproduces_its_score(stage0_run: Path, tiny_prepared: Path) -> None:
    from torch.utils.data import DataLoader

    from vcloud.data.dataset import SeriesDataset

    ctx = init_distributed(env={})
    config = load_config(TINY)
    model, state = load_stage_model(0, stage0_run / "stage0" / "best.pt",
                                    build_context(config, stage0_run, ctx.device))
    assert "optimizer" not in state, "best.pt is an inference checkpoint"
    loader = DataLoader(SeriesDataset(tiny_prepared, "val"), batch_size=2)
    scores = evaluate(get_stage(0), model, loader, resolve_precision("cpu", True), ctx)
    assert scores["psnr"] == pytest.approx(state["best_metric"]["value"], abs=1e-6)
    assert scores == pytest.approx(state["best_metric"]["metrics"], abs=1e-6)


def test_least_cloudy_input_picks_the_clearest_date_per_series() -> None:
    inputs = torch.arange(2 * 3, dtype=torch.float32).reshape(2, 3, 1, 1, 1).expand(2, 3, 13, 4, 4)
    masks = torch.ones(2, 3, 1, 4, 4)
    masks[0, 2] = 0.0  # series 0: date 2 is clear
    masks[1, 1, :, :2] = 0.0  # series 1: date 1 is half clear
    chosen = least_cloudy_input({"inputs": inputs, "masks": masks})
    assert chosen.shape == (2, 13, 4, 4)
    assert chosen[0, 0, 0, 0] == inputs[0, 2, 0, 0, 0]
    assert chosen[1, 0, 0, 0] == inputs[1, 1, 0, 0, 0]
