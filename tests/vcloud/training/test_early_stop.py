"""A stage whose validation stops improving stops spending: early stopping with ``patience``.

The rule is pure (:mod:`vcloud.training.early_stop`) and tested as such first; then real tiny
stages train on the CPU, with validation scripted where the test needs a given curve (as in
``test_validate_start``), and once unscripted: stage 2 with a learning rate far too high never
beats its start and stops after one of its three epochs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from vcloud.checkpoint import load_checkpoint
from vcloud.config import ConfigError, VCloudConfig, config_from_dict, load_config
from vcloud.contract import STOP_EPOCHS, STOP_PATIENCE, gain_per_gpu_hour
from vcloud.stage_records import CompleteRecord
from vcloud.metrics import METRIC_NAMES
from vcloud.training import loop
from vcloud.training.distributed import init_distributed
from vcloud.training.early_stop import stage_stop, validations_without_gain
from vcloud.training.loop import StageRun, train_stage
from vcloud.training.signals import StopRequest

TINY = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "model_tiny.yaml"


# ---- the rule ---------------------------------------------------------------------------------

def test_validations_count_after_the_best_epoch_and_the_phase_start() -> None:
    assert validations_without_gain([1, 2, 3, 4], best_epoch=1, phase_start=0) == 3
    assert validations_without_gain([1, 2, 3, 4], best_epoch=1, phase_start=3) == 1, "epoch 4 trained phase epoch 3"
    assert validations_without_gain([2, 4, 6], best_epoch=0, phase_start=0) == 3, "every 2nd epoch validated"
    assert validations_without_gain([], best_epoch=0, phase_start=0) == 0


@pytest.mark.parametrize(("done", "patience", "validated", "best", "phase_start", "reason"), [
    (8, 3, [1, 2, 3, 4, 5, 6, 7, 8], 8, 0, STOP_EPOCHS),  # the epoch count, whatever the curve
    (8, 0, list(range(1, 9)), 1, 0, STOP_EPOCHS),
    (5, 0, list(range(1, 6)), 1, 0, None),  # patience 0: never early
    (3, 2, [1, 2, 3], 1, 0, STOP_PATIENCE),
    (3, 2, [1, 2, 3], 2, 0, None),
    (2, 2, [1, 2], None, 0, STOP_PATIENCE),  # stage 0 whose validations were all NaN
    (3, 2, [1, 2, 3], 1, 3, None),  # the next epoch starts a new phase: no stop on its eve
    (5, 2, [1, 2, 3, 4, 5], 1, 3, STOP_PATIENCE),
    (4, 2, [2, 4], 0, 0, STOP_PATIENCE),  # validated every second epoch
])
def test_stage_stop(done: int, patience: int, validated: list[int], best: int | None, phase_start: int,
                    reason: str | None) -> None:
    stop = stage_stop(epochs_done=done, epochs=8, patience=patience, validated=validated, best_epoch=best,
                      phase_start=phase_start, metric="psnr")
    assert (stop.reason if stop else None) == reason
    if stop is not None:
        assert stop.to_record().epochs_planned == 8
        assert stop.reason == STOP_EPOCHS or f"patience {patience}" in stop.detail


def test_patience_is_validated_with_the_field_named() -> None:
    raw = load_config(TINY).to_dict()
    raw["train"]["stage2"]["patience"] = -1
    with pytest.raises(ConfigError, match=r"train.stage2.patience=-1 is invalid"):
        config_from_dict(raw)


def test_gain_from_a_complete_record() -> None:
    def gain(best: dict) -> float | None:
        return CompleteRecord.from_json({"stage": 1, "epochs": 4, "best_metric": best}).validation_gain

    assert gain({"name": "psnr", "value": 31.5, "epoch": 4, "start_value": 30.25}) == 1.25
    assert gain_per_gpu_hour(1.25, 0.5) == 2.5
    assert gain({"name": "mae", "value": 0.02, "epoch": 2, "start_value": 0.03}) == \
        pytest.approx(0.01), "lower is better: a gain is positive"
    assert gain({"name": "psnr", "value": 31.5, "epoch": 4}) is None, "no start scored"
    assert gain_per_gpu_hour(None, 1.0) is None and gain_per_gpu_hour(1.0, 0.0) is None
    older = CompleteRecord.from_json({"epochs": 3})
    assert older.stop_reason == STOP_EPOCHS, "a record written before early stopping existed"
    assert older.stop_detail is None and older.validation_gain is None


# ---- real training ----------------------------------------------------------------------------

def _config(stage: int, curriculum: dict[str, int] | None = None, train: dict[str, object] | None = None,
            **budget: object) -> VCloudConfig:
    """The tiny config with ``train.stage{stage}`` keys, ``train`` keys and curriculum keys replaced."""
    raw = load_config(TINY).to_dict()
    raw["train"][f"stage{stage}"].update(budget)
    raw["train"].update(train or {})
    if curriculum:
        raw["data"]["curriculum"].update(curriculum)
    return config_from_dict(raw)


def _train(stage: int, cfg: VCloudConfig, prepared: Path, run_dir: Path, epochs: int | None = None) -> int:
    run = StageRun(stage=stage, config=cfg, data_root=prepared, run_dir=run_dir, max_epochs=epochs)
    return train_stage(run, init_distributed(env={}), StopRequest())


def _script_validation(monkeypatch: pytest.MonkeyPatch, psnr: Iterator[float]) -> list[float]:
    """Validation returns the next of ``psnr``; the returned list records each value handed out."""
    given: list[float] = []

    def scripted(*args: object, **kwargs: object) -> dict[str, float]:
        given.append(next(psnr))
        return {name: given[-1] if name == "psnr" else 0.5 for name in METRIC_NAMES}

    monkeypatch.setattr(loop, "evaluate", scripted)
    return given


def _complete(run_dir: Path, stage: int) -> dict:
    return json.loads((run_dir / f"stage{stage}" / "COMPLETE").read_text())


def test_stage0_stops_after_patience_validations_and_a_rerun_decides_alike(
        tiny_prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """8 epochs, patience 2: best at epoch 1, then two validations without a gain stop it after
    epoch 3. Run again, it is complete without a step; with patience 3 it trains on to epoch 4."""
    given = _script_validation(monkeypatch, iter([30.0, 29.0, 29.5, 29.9, 29.8]))
    assert _train(0, _config(0, epochs=8, patience=2), tiny_prepared, tmp_path) == 0

    complete = _complete(tmp_path, 0)
    assert complete["epochs"] == 3 and CompleteRecord.from_json(complete).stop_reason == STOP_PATIENCE, complete
    assert complete["stop"]["epochs_planned"] == 8
    assert "after 3 of 8 epochs" in CompleteRecord.from_json(complete).stop_detail and "best.pt is epoch 1" in CompleteRecord.from_json(complete).stop_detail
    assert load_checkpoint(tmp_path / "stage0" / "best.pt")["epoch"] == 1
    latest = load_checkpoint(tmp_path / "stage0" / "latest.pt")
    assert latest["epoch"] == 3 and latest["batch_in_epoch"] == 0, "the stopping epoch is checkpointed"
    progress = json.loads((tmp_path / "stage0" / "progress.json").read_text())
    assert progress["status"] == "complete" and progress["stop"]["reason"] == STOP_PATIENCE
    assert CompleteRecord.from_json(complete).validation_gain is None, "stage 0 scores no start"

    assert _train(0, _config(0, epochs=8, patience=2), tiny_prepared, tmp_path) == 0
    assert given == [30.0, 29.0, 29.5], "complete: no step, no validation"

    assert _train(0, _config(0, epochs=8, patience=3), tiny_prepared, tmp_path) == 0
    assert given == [30.0, 29.0, 29.5, 29.9], "one more epoch, then 3 validations without a gain"
    complete = _complete(tmp_path, 0)
    assert complete["epochs"] == 4 and CompleteRecord.from_json(complete).stop_reason == STOP_PATIENCE


def test_stage1_gets_patience_validations_in_every_curriculum_phase(
        tiny_prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Phases thin_only (epochs 0-1), mixed (2-3), all (4-7), patience 2, best at epoch 1: without
    the phases it would stop after epoch 3; it stops after epoch 6, the second validation of the
    last phase without a gain. Its gain is best minus start."""
    assert _train(0, _config(0), tiny_prepared, tmp_path, epochs=1) == 0
    given = _script_validation(monkeypatch, iter([30.0, 30.5, 30.4, 30.3, 30.2, 30.1, 30.0, 29.0]))
    cfg = _config(1, curriculum={"mixed_from_epoch": 2, "all_from_epoch": 4}, epochs=8, patience=2)
    assert _train(1, cfg, tiny_prepared, tmp_path) == 0

    complete = _complete(tmp_path, 1)
    assert complete["epochs"] == 6 and CompleteRecord.from_json(complete).stop_reason == STOP_PATIENCE, complete
    assert len(given) == 7, "the start and six epochs"
    assert complete["best_metric"]["epoch"] == 1
    assert CompleteRecord.from_json(complete).validation_gain == pytest.approx(0.5)
    phases = [record["phase"] for record in json.loads((tmp_path / "stage1" / "progress.json").read_text())["history"]]
    assert phases == ["thin_only", "thin_only", "mixed", "mixed", "all", "all"]


def test_stage2_that_never_beats_its_start_stops_after_patience_and_hands_on_the_start(
        tiny_prepared: Path, tmp_path: Path) -> None:
    """Unscripted: a learning rate far too high makes the refiner worse than the draft it starts
    from; with the tiny config's patience 1 it stops after the first of 3 epochs."""
    cfg = _config(2, train={"grad_clip_norm": 0.0}, lr=0.9)
    assert cfg.train.stage2.patience == 1, "the tiny config's"
    for stage, epochs in ((0, 1), (1, 1)):
        assert _train(stage, cfg, tiny_prepared, tmp_path, epochs) == 0
    assert _train(2, cfg, tiny_prepared, tmp_path, epochs=3) == 0

    complete = _complete(tmp_path, 2)
    assert complete["epochs"] == 1 and CompleteRecord.from_json(complete).stop_reason == STOP_PATIENCE, complete
    assert complete["stop"]["epochs_planned"] == 3
    assert complete["best_metric"]["epoch"] == 0 and CompleteRecord.from_json(complete).validation_gain == 0.0
    assert complete["final_metrics"]["psnr"] < complete["best_metric"]["value"]
    assert load_checkpoint(tmp_path / "stage2" / "best.pt")["epoch"] == 0
