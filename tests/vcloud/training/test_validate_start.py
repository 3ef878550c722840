"""A stage that starts from its predecessor's answer never hands on something worse than that.

Stage 2's zero-initialised refiner returns stage 1's draft before training. Trained here with a
learning rate far too high for one epoch, it gets worse on validation; ``best.pt`` must then be
the untrained refiner (epoch 0), which predicts exactly the draft.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils.data import default_collate

from vcloud.checkpoint import file_digest, load_checkpoint
from vcloud.config import VCloudConfig, config_from_dict, load_config
from vcloud.contract import parse_metrics_lines
from vcloud.data.dataset import SeriesDataset
from vcloud.metrics import METRIC_NAMES
from vcloud.contract import describe_lineage
from vcloud.stage_registry import StageError, build_context, get_stage, load_stage_model
from vcloud.training import loop
from vcloud.training.distributed import init_distributed
from vcloud.training.loop import StageRun, train_stage
from vcloud.training.signals import StopRequest

TINY = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "model_tiny.yaml"


def _tiny_config(**train: object) -> VCloudConfig:
    """The tiny config with top-level ``train`` keys replaced."""
    raw = load_config(TINY).to_dict()
    raw["train"].update(train)
    return config_from_dict(raw)


def _train(stage: int, cfg: VCloudConfig, prepared: Path, run_dir: Path, epochs: int) -> None:
    run = StageRun(stage=stage, config=cfg, data_root=prepared, run_dir=run_dir, max_epochs=epochs)
    assert train_stage(run, init_distributed(env={}), StopRequest()) == 0


def _script_validation(monkeypatch: pytest.MonkeyPatch, psnr: Iterator[float]) -> list[int]:
    """Validation returns the next of ``psnr`` (0.5 for the other metrics); the returned list
    records the epoch of every best.pt the loop writes."""
    monkeypatch.setattr(loop, "evaluate", lambda *args, **kwargs: {name: next(psnr) if name == "psnr" else 0.5
                                                                    for name in METRIC_NAMES})
    replaced_at: list[int] = []
    save_best = loop._save_best
    monkeypatch.setattr(loop, "_save_best", lambda session, state, epoch=None: (
        replaced_at.append(state.best["epoch"]), save_best(session, state, epoch))[1])
    return replaced_at


def test_best_checkpoint_is_the_start_when_training_makes_it_worse(tiny_prepared: Path, tmp_path: Path) -> None:
    stage2 = load_config(TINY).to_dict()["train"]["stage2"]
    cfg = _tiny_config(stage2={**stage2, "lr": 0.9, "epochs": 1}, grad_clip_norm=0.0)
    for stage, epochs in ((0, 2), (1, 1), (2, 1)):
        _train(stage, cfg, tiny_prepared, tmp_path, epochs)

    best = load_checkpoint(tmp_path / "stage2" / "best.pt")
    latest = load_checkpoint(tmp_path / "stage2" / "latest.pt")
    assert best["epoch"] == 0 and best["best_metric"]["epoch"] == 0, best["best_metric"]
    assert latest["epoch"] == 1
    trained_psnr = latest["metrics"]["psnr"]
    assert trained_psnr < best["best_metric"]["value"], (trained_psnr, best["best_metric"])
    complete = json.loads((tmp_path / "stage2" / "COMPLETE").read_text())
    assert complete["final_metrics"]["psnr"] == trained_psnr, "the last epoch's metrics"
    assert complete["best_metric"]["epoch"] == 0 and complete["best_metric"]["metrics"] == best["metrics"], \
        "COMPLETE reports what best.pt (the untrained refiner) scored"
    curve = parse_metrics_lines((tmp_path / "stage2" / "metrics.jsonl").read_text())
    assert [(r["kind"], r["epoch"], r["global_step"]) for r in curve if r["kind"] == "val"] == [
        ("val", 0, 0), ("val", 1, latest["global_step"])], "the start's validation is the curve's first point"
    assert curve[0]["psnr"] == best["best_metric"]["value"]

    build = build_context(cfg, tmp_path, torch.device("cpu"))
    refiner, _ = load_stage_model(2, tmp_path / "stage2" / "best.pt", build)
    draft, _ = load_stage_model(1, tmp_path / "stage1" / "best.pt", build)
    val = SeriesDataset(tiny_prepared, "val")
    batch = default_collate([val[i] for i in range(min(2, len(val)))])
    with torch.no_grad():
        refined = get_stage(2).predict(refiner.eval(), batch)
        drafted = get_stage(1).predict(draft.eval(), batch)
    # The untrained refiner's head is zero-initialised: its correction is exactly 0 and the refined
    # image is the draft, computed by the same operations on the same weights, bit for bit.
    assert torch.equal(refined, drafted)



@pytest.mark.parametrize(("margin", "best_epoch"), [(0.0, 2), (0.05, 2), (0.25, 0)])
def test_trained_weights_replace_the_start_only_by_beating_it_by_the_margin(
        tiny_prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, margin: float, best_epoch: int) -> None:
    """Real stage-1 training for 3 epochs; validation PSNR is scripted (start 30.0, then 30.04,
    30.2, 30.1) so that the first epoch's gain is inside a 0.05 dB margin and the second's is not."""
    _train(0, _tiny_config(), tiny_prepared, tmp_path, 2)
    scripted = iter([30.0, 30.04, 30.2, 30.1])
    replaced_at = _script_validation(monkeypatch, scripted)

    _train(1, _tiny_config(start_min_gain=margin), tiny_prepared, tmp_path, 3)

    best = load_checkpoint(tmp_path / "stage1" / "best.pt")
    assert next(scripted, None) is None, "validation ran before training and after each of the 3 epochs"
    assert best["epoch"] == best_epoch and best["best_metric"]["epoch"] == best_epoch, best["best_metric"]
    assert replaced_at == {0.0: [0, 1, 2], 0.05: [0, 2], 0.25: [0]}[margin]


@pytest.mark.parametrize(("other_domain", "replaced", "best_epoch"), [(True, [0, 1, 2], 2), (False, [0], 0)])
def test_stage3_toward_another_domain_keeps_training_that_costs_at_most_max_val_loss(
        tiny_prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other_domain: bool,
        replaced: list[int], best_epoch: int) -> None:
    """Real stages 0-3; stage 3's validation PSNR is scripted: start 30.0, then 29.95, 30.02, 29.85.
    Adapting to an unlabeled domain (``model.stage3.unlabeled_data``), the labeled validation split
    only guards: each epoch within 0.1 dB of the start replaces the best, the one that loses 0.15 dB
    does not. Without another domain, stage 3 must beat its start by the tiny config's
    ``start_min_gain`` (0.05 dB), as every stage does, and none of its epochs does."""
    cfg = _tiny_config()
    for stage, epochs in ((0, 1), (1, 1), (2, 1)):
        _train(stage, cfg, tiny_prepared, tmp_path, epochs)
    raw = cfg.to_dict()
    raw["train"]["stage3"]["patience"] = 0  # all three epochs, whatever they gain (early stopping: test_early_stop)
    if other_domain:
        raw["model"]["stage3"].update(unlabeled_data=str(tiny_prepared), unlabeled_split="val", max_val_loss=0.1)
    scripted = iter([30.0, 29.95, 30.02, 29.85])
    replaced_at = _script_validation(monkeypatch, scripted)

    _train(3, config_from_dict(raw), tiny_prepared, tmp_path, 3)

    assert next(scripted, None) is None
    assert replaced_at == replaced
    best = load_checkpoint(tmp_path / "stage3" / "best.pt")
    assert best["best_metric"]["epoch"] == best_epoch
    assert best["best_metric"]["value"] == (30.02 if other_domain else 30.0)
    if other_domain:
        summary = json.loads((tmp_path / "stage3" / "pseudo_labels.json").read_text())
        assert summary["pseudo_labels_considered"] == len(SeriesDataset(tiny_prepared, "val"))


def test_stage3_without_stage2_starts_from_stage1s_draft_when_stage2_is_off_by_default(
        tiny_prepared: Path, tmp_path: Path) -> None:
    """``train.stage2.run_by_default: false`` and no ``stage2/best.pt``: stage 3 builds stage 2's
    untrained start from stages 0 and 1 (the draft, handed on unchanged), pseudo-labels with it and
    scores it as its start, so its start is stage 1's ``best.pt`` on validation. With stage 2 on by
    default its missing ``best.pt`` is an error that says which stage to train."""
    cfg = _tiny_config()
    for stage in (0, 1):
        _train(stage, cfg, tiny_prepared, tmp_path, 1)
    raw = cfg.to_dict()
    raw["train"]["stage3"]["patience"] = 0

    with pytest.raises(Exception, match=r"stage 2 checkpoint .*stage2/best.pt not found: train stage 2 first"):
        _train(3, config_from_dict(raw), tiny_prepared, tmp_path, 1)

    raw["train"]["stage2"]["run_by_default"] = False
    _train(3, config_from_dict(raw), tiny_prepared, tmp_path, 1)

    assert not (tmp_path / "stage2" / "best.pt").exists()
    stage1 = load_checkpoint(tmp_path / "stage1" / "best.pt")["best_metric"]
    complete = json.loads((tmp_path / "stage3" / "COMPLETE").read_text())
    assert complete["best_metric"]["start_value"] == pytest.approx(stage1["value"], abs=1e-4)
    cache = torch.load(tmp_path / "stage3" / "pseudo_labels.pt", map_location="cpu", weights_only=True)
    assert cache["teacher"].startswith("stage2-start:"), cache["teacher"]


def test_a_stage_refuses_a_predecessor_of_an_earlier_lineage_and_says_what_to_do(
        tiny_prepared: Path, tmp_path: Path) -> None:
    """Stage 2 trained once (forced), then stage 1 trained again: stage 2's ``best.pt`` and
    ``latest.pt`` belong to the stage 1 that was replaced. Stage 3 refuses that ``best.pt`` even with
    stage 2 off by default, naming both digests; stage 2 refuses to resume on the new stage 1. With
    the stale stage 2 moved aside, stage 3 starts from stage 2's untrained start and its ``COMPLETE``
    and ``best.pt`` name the stage 0 and 1 checkpoints it was built from."""
    cfg = _tiny_config()
    for stage in (0, 1, 2):
        _train(stage, cfg, tiny_prepared, tmp_path, 1)
    stage1_before = file_digest(tmp_path / "stage1" / "best.pt")
    assert json.loads((tmp_path / "stage2" / "COMPLETE").read_text())["lineage"] == {
        "0": file_digest(tmp_path / "stage0" / "best.pt"), "1": stage1_before}
    run = StageRun(stage=1, config=cfg, data_root=tiny_prepared, run_dir=tmp_path, max_epochs=2, restart=True)
    assert train_stage(run, init_distributed(env={}), StopRequest()) == 0
    stage0, stage1 = (file_digest(tmp_path / f"stage{k}" / "best.pt") for k in (0, 1))
    assert stage1 != stage1_before

    raw = cfg.to_dict()
    raw["train"]["stage2"]["run_by_default"] = False
    raw["train"]["stage3"]["patience"] = 0
    off = config_from_dict(raw)
    with pytest.raises(StageError) as refused:
        _train(3, off, tiny_prepared, tmp_path, 1)
    assert str(refused.value) == (
        f"{tmp_path / 'stage2' / 'best.pt'} (stage 2) was built from stage 1's best.pt {stage1_before[:12]}, "
        f"which is now {stage1[:12]}: stage(s) 1 were trained again after stage 2, so its weights belong to an "
        "earlier lineage of this run. Train stage 2 again from the current checkpoints (mode restart, with "
        f"stage 2 selected), or move {tmp_path / 'stage2'} aside: stage 2 is off by default, and without its "
        "best.pt the next stage starts from stage 2's untrained start")
    assert not (tmp_path / "stage3").exists()

    with pytest.raises(StageError, match=r"latest.pt holds weights built from stage 0 best.pt \w{12}, stage 1 best.pt "
                                         rf"{stage1_before[:12]}, but stage 2 would now be built from .*stage 1 "
                                         rf"best.pt {stage1[:12]}: .*Train stage 2 again \(mode restart\)"):
        on = cfg.to_dict()
        on["train"]["stage2"]["patience"] = 0  # a second epoch to train: it resumes from latest.pt
        _train(2, config_from_dict(on), tiny_prepared, tmp_path, 2)

    (tmp_path / "stage2").rename(tmp_path / "stage2.earlier")
    _train(3, off, tiny_prepared, tmp_path, 1)
    complete = json.loads((tmp_path / "stage3" / "COMPLETE").read_text())
    assert complete["lineage"] == {"0": stage0, "1": stage1}
    assert load_checkpoint(tmp_path / "stage3" / "best.pt")["lineage"] == {"0": stage0, "1": stage1}
    assert describe_lineage(complete) == f"built from stage 0 best.pt {stage0[:12]}, stage 1 best.pt {stage1[:12]}"
