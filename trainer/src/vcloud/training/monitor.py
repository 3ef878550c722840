"""Training you can watch: the step line, ``metrics.jsonl`` and the TensorBoard files of one stage.

The loop calls :meth:`StageMonitor.step` after every optimizer step and :meth:`StageMonitor.validation`
after every validation. The monitor decides when a line is due (:class:`~vcloud.training.step_log.LogCadence`),
prints it through the trainer's logging (stdout, which streams into the Airflow task log) on global
rank 0 and writes the same numbers to both files. Other ranks keep the loss window and write nothing.

Resuming is exact: the loss summed since the last line is part of the train state (so it is in every
checkpoint), and opening the monitor cuts both files back to the checkpoint's step. An interrupted and
resumed stage therefore logs the same steps with the same losses as an uninterrupted one; only the
wall-clock fields (time, samples/s) differ.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from vcloud.contract import metrics_train_record, metrics_val_record
from vcloud.training.metrics_file import MetricsFile
from vcloud.training.step_log import LogCadence, StageSteps, StepLine, eta_seconds, format_step_line
from vcloud.training.tensorboard_log import TensorBoardLog

log = logging.getLogger("vcloud.train")


class WatchedState(Protocol):
    """The part of the loop's ``TrainState`` the monitor reads, and the loss window it keeps there."""

    epoch: int
    batch_in_epoch: int
    global_step: int
    log_loss_sum: float
    log_samples: int


class StageMonitor:
    """Step lines and training-curve files of the stage being trained (one per process)."""

    def __init__(self, *, stage: int, steps: StageSteps, cadence: LogCadence, world_size: int,
                 metrics: MetricsFile | None = None, tensorboard: TensorBoardLog | None = None,
                 print_lines: bool = True, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.stage = stage
        self.steps = steps
        self.cadence = cadence
        self.world_size = world_size
        self.metrics = metrics
        self.tensorboard = tensorboard
        self.print_lines = print_lines
        self._clock = clock
        self._wall = wall_clock
        now = clock()
        self._last_line = now
        self._last_event = now
        self._timed_seconds = 0.0
        self._timed_steps = 0
        self._timed_samples = 0
        self._validation_seconds: float | None = None

    @classmethod
    def open(cls, *, stage: int, stage_dir: Path, metrics_path: Path, tensorboard_dir: Path, steps: StageSteps,
             cadence: LogCadence, world_size: int, is_main: bool, resumed_step: int | None) -> StageMonitor:
        """On global rank 0, cut ``metrics.jsonl`` back to ``resumed_step`` (the checkpoint's global
        step; None for a fresh start) and open both files; elsewhere a monitor that writes nothing."""
        if not is_main:
            return cls(stage=stage, steps=steps, cadence=cadence, world_size=world_size, print_lines=False)
        stage_dir.mkdir(parents=True, exist_ok=True)
        return cls(stage=stage, steps=steps, cadence=cadence, world_size=world_size,
                   metrics=MetricsFile.open(metrics_path, resumed_step=resumed_step),
                   tensorboard=TensorBoardLog.open(tensorboard_dir,
                                                   purge_step=0 if resumed_step is None else resumed_step + 1))

    def step(self, state: WatchedState, loss: float, lr: float, batch_size: int) -> StepLine | None:
        """Count the step just trained (``state`` already counts it); write a line when one is due."""
        now = self._clock()
        state.log_loss_sum += loss * batch_size
        state.log_samples += batch_size
        self._timed_seconds += now - self._last_event
        self._timed_steps += 1
        self._timed_samples += batch_size
        self._last_event = now
        if not self.cadence.due(state.global_step, now - self._last_line) or state.log_samples == 0:
            return None
        line = self._line(state, lr)
        state.log_loss_sum, state.log_samples = 0.0, 0
        self._last_line = now
        self._timed_seconds, self._timed_steps, self._timed_samples = 0.0, 0, 0
        if self.print_lines:
            log.info("%s", format_step_line(line))
        self._write(metrics_train_record(global_step=state.global_step, epoch=line.epoch, loss=line.loss, lr=lr,
                                         samples_per_s=line.samples_per_s, time=round(self._wall(), 3)),
                    "train", {"loss": line.loss, "lr": lr, "samples_per_s": line.samples_per_s}, state.global_step)
        return line

    def validation(self, global_step: int, epoch: int, metrics: Mapping[str, float]) -> None:
        """Record a validation after ``epoch`` epochs (0: the starting model). Its duration, for the
        ETAs, is the time since the last step (or since the monitor opened), which is the validation's."""
        now = self._clock()
        self._validation_seconds = now - self._last_event
        self._last_event = now  # samples/s counts training only
        self._write(metrics_val_record(global_step=global_step, epoch=epoch, metrics=metrics,
                                       time=round(self._wall(), 3)), "val", metrics, global_step)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None

    def _line(self, state: WatchedState, lr: float) -> StepLine:
        per_step = self._timed_seconds / self._timed_steps if self._timed_steps else None
        steps_epoch, steps_stage = self.steps.steps_left(state.epoch, state.batch_in_epoch)
        vals_epoch, vals_stage = self.steps.validations_left(state.epoch)
        seconds = self._timed_seconds
        return StepLine(
            stage=self.stage, epoch=state.epoch + 1, epochs=len(self.steps.batches), batch=state.batch_in_epoch,
            batches=self.steps.batches[min(state.epoch, len(self.steps.batches) - 1)],
            loss=state.log_loss_sum / state.log_samples, lr=lr,
            samples_per_s=self._timed_samples * self.world_size / seconds if seconds > 0 else 0.0,
            eta_epoch_s=eta_seconds(steps_epoch, per_step, vals_epoch, self._validation_seconds),
            eta_stage_s=eta_seconds(steps_stage, per_step, vals_stage, self._validation_seconds),
        )

    def _write(self, record: dict, group: str, scalars: Mapping[str, float | None], step: int) -> None:
        if self.metrics is not None:
            self.metrics.append(record)
        if self.tensorboard is not None:
            self.tensorboard.scalars(group, scalars, step, walltime=record["time"])
