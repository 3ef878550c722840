"""A stage that starts from its predecessor's answer never hands on something worse than that.

Stage 2's zero-initialised refiner returns stage 1's draft before training. Trained here with a
learning rate far too high for one epoch, it gets worse on validation; ``best.pt`` must then be
the untrained refiner (epoch 0), which predicts exactly the draft.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import default_collate

from vcloud.checkpoint import load_checkpoint
from vcloud.config import config_from_dict, load_config
from vcloud.data.dataset import SeriesDataset
from vcloud.stages import BuildContext, get_stage, load_stage_model
from vcloud.training.distributed import init_distributed
from vcloud.training.loop import StageRun, train_stage
from vcloud.training.signals import StopRequest

TINY = Path(__file__).resolve().parents[2] / "trainer" / "configs" / "model_tiny.yaml"


def test_best_checkpoint_is_the_start_when_training_makes_it_worse(tiny_prepared: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    raw = load_config(TINY).to_dict()
    raw["train"]["stage2"] = {**raw["train"]["stage2"], "lr": 0.9, "epochs": 1}
    raw["train"]["grad_clip_norm"] = 0.0
    cfg = config_from_dict(raw)
    ctx = init_distributed(env={})
    for stage, epochs in ((0, 2), (1, 1), (2, 1)):
        run = StageRun(stage=stage, config=cfg, data_root=tiny_prepared, run_dir=tmp_path, max_epochs=epochs)
        assert train_stage(run, ctx, StopRequest()) == 0

    best = load_checkpoint(tmp_path / "stage2" / "best.pt")
    latest = load_checkpoint(tmp_path / "stage2" / "latest.pt")
    assert best["epoch"] == 0 and best["best_metric"]["epoch"] == 0, best["best_metric"]
    assert latest["epoch"] == 1
    trained_psnr = latest["metrics"]["psnr"]
    assert trained_psnr < best["best_metric"]["value"], (trained_psnr, best["best_metric"])

    build = BuildContext(config=cfg, run_dir=tmp_path, device=torch.device("cpu"))
    refiner, _ = load_stage_model(2, tmp_path / "stage2" / "best.pt", build)
    draft, _ = load_stage_model(1, tmp_path / "stage1" / "best.pt", build)
    val = SeriesDataset(tiny_prepared, "val")
    batch = default_collate([val[i] for i in range(min(2, len(val)))])
    with torch.no_grad():
        refined = get_stage(2).predict(refiner.eval(), batch)
        drafted = get_stage(1).predict(draft.eval(), batch)
    assert torch.allclose(refined, drafted, atol=1e-5)
