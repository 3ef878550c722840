"""StageMonitor on a fake clock: when lines come, what they average, what the files get, and resume."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from vcloud.contract import parse_metrics_lines
from vcloud.training.metrics_file import MetricsFile
from vcloud.training.monitor import StageMonitor
from vcloud.training.step_log import LogCadence, StageSteps
from vcloud.training.tensorboard_log import TensorBoardLog


@dataclass
class _State:
    epoch: int = 0
    batch_in_epoch: int = 0
    global_step: int = 0
    log_loss_sum: float = 0.0
    log_samples: int = 0

    def count_step(self) -> None:
        self.batch_in_epoch += 1
        self.global_step += 1


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


STEPS = StageSteps(batches=(10, 10), validates=(True, True))


def _monitor(tmp_path: Path, clock: _Clock, cadence: LogCadence, *, world_size: int = 1,
             resumed_step: int | None = None) -> StageMonitor:
    return StageMonitor(stage=2, steps=STEPS, cadence=cadence, world_size=world_size,
                        metrics=MetricsFile.open(tmp_path / "metrics.jsonl", resumed_step=resumed_step),
                        clock=clock, wall_clock=lambda: 1.7e9 + clock.now)


def _train(monitor: StageMonitor, state: _State, clock: _Clock, losses: list[float], seconds: float) -> list:
    lines = []
    for loss in losses:
        clock.now += seconds
        state.count_step()
        lines.append(monitor.step(state, loss, lr=1e-3, batch_size=2))
    return lines


def test_time_cadence_averages_the_loss_since_the_last_line(tmp_path: Path, caplog) -> None:
    clock, state = _Clock(), _State()
    monitor = _monitor(tmp_path, clock, LogCadence(every_steps=0, every_seconds=60.0), world_size=2)
    with caplog.at_level(logging.INFO, logger="vcloud.train"):
        lines = _train(monitor, state, clock, [0.4, 0.2, 0.3, 0.1, 0.5], seconds=25.0)
    assert [line is not None for line in lines] == [False, False, True, False, False]
    line = lines[2]
    assert line.loss == pytest.approx(0.3)
    assert line.samples_per_s == pytest.approx(3 * 2 * 2 / 75.0)  # 3 steps x batch 2 x 2 ranks in 75 s
    assert (line.batch, line.batches, line.epoch, line.epochs) == (3, 10, 1, 2)
    assert line.eta_epoch_s == pytest.approx(7 * 25.0)  # no validation timed yet
    assert line.eta_stage_s == pytest.approx(17 * 25.0)
    assert (state.log_loss_sum, state.log_samples) == pytest.approx((1.2, 4))  # steps 4, 5 wait (loss x 2)
    assert "stage 2 | step 3/10 of epoch 1/2 | loss 0.3000 | lr 1.0e-03 | 0.2 samples/s" in caplog.text
    monitor.close()
    assert parse_metrics_lines((tmp_path / "metrics.jsonl").read_text()) == [
        {"kind": "train", "global_step": 3, "epoch": 1, "loss": pytest.approx(0.3), "lr": 1e-3,
         "samples_per_s": pytest.approx(0.16), "time": 1.7e9 + 1075.0}]


def test_validation_is_recorded_timed_and_left_out_of_throughput(tmp_path: Path) -> None:
    clock, state = _Clock(), _State()
    monitor = _monitor(tmp_path, clock, LogCadence(every_steps=2, every_seconds=60.0))
    _train(monitor, state, clock, [0.5] * 10, seconds=1.0)
    clock.now += 30.0  # the validation
    monitor.validation(state.global_step, 1, {"psnr": 31.5, "ssim": 0.9})
    state.epoch, state.batch_in_epoch = 1, 0
    line = _train(monitor, state, clock, [0.5, 0.5], seconds=1.0)[1]
    assert line.samples_per_s == pytest.approx(2.0)  # 4 samples in 2 s: the 30 s of validation excluded
    assert line.eta_epoch_s == pytest.approx(8 * 1.0 + 30.0)
    assert line.eta_stage_s == pytest.approx(8 * 1.0 + 30.0)
    monitor.close()
    records = parse_metrics_lines((tmp_path / "metrics.jsonl").read_text())
    assert [(r["kind"], r["global_step"], r["epoch"]) for r in records] == (
        [("train", s, 1) for s in (2, 4, 6, 8, 10)] + [("val", 10, 1), ("train", 12, 2)])
    assert records[5]["psnr"] == 31.5 and records[5]["ssim"] == 0.9


def test_a_resumed_window_gives_the_same_line_as_an_uninterrupted_run(tmp_path: Path) -> None:
    """The window is part of the train state (the checkpoint): stopping after step 3 of a 4-step
    window and resuming gives step 4's line the loss of all four steps."""
    losses = [0.1, 0.2, 0.3, 0.4]
    clock = _Clock()
    straight = _train(_monitor(tmp_path / "a", clock, LogCadence(4, 60.0)), _State(), clock, losses, 1.0)[3]
    state = _State()
    _train(_monitor(tmp_path / "b", clock, LogCadence(4, 60.0)), state, clock, losses[:3], 1.0)
    resumed = _monitor(tmp_path / "b", clock, LogCadence(4, 60.0), resumed_step=3)
    line = _train(resumed, state, clock, losses[3:], 1.0)[0]
    assert line.loss == straight.loss == pytest.approx(0.25)


def test_other_ranks_write_and_print_nothing(tmp_path: Path, caplog) -> None:
    clock, state = _Clock(), _State()
    monitor = StageMonitor.open(stage=0, stage_dir=tmp_path / "stage0", metrics_path=tmp_path / "stage0" / "m.jsonl",
                                tensorboard_dir=tmp_path / "stage0" / "tb", steps=STEPS, cadence=LogCadence(1, 60.0),
                                world_size=2, is_main=False, resumed_step=None)
    with caplog.at_level(logging.INFO, logger="vcloud.train"):
        _train(monitor, state, clock, [0.5], 1.0)
        monitor.validation(1, 1, {"psnr": 30.0})
    monitor.close()
    assert not (tmp_path / "stage0").exists()
    assert "stage 0 | step" not in caplog.text


def test_without_tensorboard_one_warning_and_metrics_jsonl_still_written(tmp_path: Path, caplog,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails like a missing package
    clock, state = _Clock(), _State()
    with caplog.at_level(logging.WARNING):
        monitor = StageMonitor.open(stage=0, stage_dir=tmp_path, metrics_path=tmp_path / "metrics.jsonl",
                                    tensorboard_dir=tmp_path / "tensorboard", steps=STEPS,
                                    cadence=LogCadence(1, 60.0), world_size=1, is_main=True, resumed_step=None)
        _train(monitor, state, clock, [0.5, 0.4], 1.0)
        monitor.validation(2, 1, {"psnr": 30.0})
    monitor.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no TensorBoard files" in warnings[0].getMessage()
    assert len(parse_metrics_lines((tmp_path / "metrics.jsonl").read_text())) == 3
    assert not (tmp_path / "tensorboard").exists()


def _tensorboard_scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return [(e.step, e.value) for e in accumulator.Scalars(tag)]


def test_tensorboard_purge_hides_what_a_killed_run_wrote_past_the_checkpoint(tmp_path: Path) -> None:
    opened = int(time.time())
    first = TensorBoardLog.open(tmp_path, purge_step=0)
    for step in (1, 2, 3, 4):
        first.scalars("train", {"loss": float(step)}, step, walltime=float(step))
    # killed here without close; the checkpoint was at step 2, so the resumed run writes 3 and 4 again.
    # TensorBoard reads a directory's event files in name order, and a name starts with its file's
    # second: a resumed run opens its file seconds after the killed one (within one second, the order
    # would fall to the rest of the name, a per-process counter that is no clock).
    while int(time.time()) <= opened + 1:
        time.sleep(0.05)
    resumed = TensorBoardLog.open(tmp_path, purge_step=3)
    for step in (3, 4):
        resumed.scalars("train", {"loss": 10.0 * step}, step, walltime=10.0 + step)
    resumed.close()
    first.close()
    assert _tensorboard_scalars(tmp_path, "train/loss") == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
