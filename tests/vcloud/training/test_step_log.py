"""The step line: cadence, ETA arithmetic and the exact text a person reads in the task log."""

from __future__ import annotations

import pytest

from vcloud.training.step_log import (
    LogCadence,
    StageSteps,
    StepLine,
    eta_seconds,
    format_duration,
    format_step_line,
)


def test_step_line_says_stage_epoch_step_loss_lr_throughput_and_both_etas() -> None:
    line = StepLine(stage=1, epoch=3, epochs=100, batch=1200, batches=4800, loss=0.041234, lr=1.8e-4,
                    samples_per_s=8.44, eta_epoch_s=750.0, eta_stage_s=2 * 86400 + 3 * 3600 + 14 * 60)
    assert format_step_line(line) == ("stage 1 | step 1200/4800 of epoch 3/100 | loss 0.0412 | lr 1.8e-04 | "
                                      "8.4 samples/s | ETA epoch 00:12:30, stage 2-03:14:00")


def test_unknown_eta_reads_as_a_dash() -> None:
    line = StepLine(stage=0, epoch=1, epochs=1, batch=1, batches=3, loss=1.0, lr=1e-3, samples_per_s=0.0,
                    eta_epoch_s=None, eta_stage_s=float("nan"))
    assert format_step_line(line).endswith("ETA epoch -, stage -")


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "00:00:00"), (59.6, "00:01:00"), (3599, "00:59:59"), (86399, "23:59:59"), (86400, "1-00:00:00"),
    (3 * 86400 + 5, "3-00:00:05"), (-2, "00:00:00"),
])
def test_durations_read_like_slurm_times(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_fixed_cadence_logs_the_same_steps_whatever_the_time() -> None:
    cadence = LogCadence(every_steps=3, every_seconds=60.0)
    assert [s for s in range(1, 10) if cadence.due(s, seconds_since_line=0.0)] == [3, 6, 9]
    assert not cadence.due(4, seconds_since_line=1e6)


def test_time_cadence_logs_the_first_step_after_the_interval() -> None:
    cadence = LogCadence(every_steps=0, every_seconds=60.0)
    assert not cadence.due(7, seconds_since_line=59.9)
    assert cadence.due(8, seconds_since_line=60.0)


def test_steps_and_validations_left_follow_each_epochs_size() -> None:
    """Curriculum phases have datasets of different sizes: each epoch counts its own steps."""
    steps = StageSteps(batches=(4, 4, 6), validates=(False, True, True))
    assert steps.steps_left(0, 1) == (3, 3 + 4 + 6)
    assert steps.steps_left(2, 6) == (0, 0)
    assert steps.validations_left(0) == (0, 2)
    assert steps.validations_left(1) == (1, 2)


def test_eta_counts_validations_once_one_was_timed() -> None:
    assert eta_seconds(10, 2.0, 1, None) == 20.0
    assert eta_seconds(10, 2.0, 2, 30.0) == 80.0
    assert eta_seconds(10, None, 2, 30.0) is None
