"""The step line: what a person watching a days-long job reads about once a minute.

``stage 1 | step 1200/4800 of epoch 3/100 | loss 0.0412 | lr 1.8e-04 | 8.4 samples/s | ETA epoch 00:12:30, stage 2-03:14:00``

One line at the end of a 25-minute epoch says nothing for 25 minutes; this line comes every
``train.log_every_steps`` steps or, by default, at the first step ``train.log_every_seconds`` (60 s)
after the previous line. When a line is due, what it says and the ETA arithmetic are pure functions
here, so tests pin them without training anything. The line starts ``stage N | step``, never
``stage N | epoch`` as the end-of-epoch line does, so whoever reads epoch lines from a log (the
cluster tests time epochs that way) still finds one per epoch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LogCadence:
    """When a step line is due: every ``every_steps`` global steps (a fixed, reproducible set of
    steps), or with ``every_steps`` 0 at the first step ending ``every_seconds`` after the last line
    (about one line a minute whatever the step time; at least one step per line)."""

    every_steps: int
    every_seconds: float

    def due(self, global_step: int, seconds_since_line: float) -> bool:
        if self.every_steps > 0:
            return global_step % self.every_steps == 0
        return seconds_since_line >= self.every_seconds


@dataclass(frozen=True)
class StageSteps:
    """The shape of a stage's remaining work: optimizer steps of each epoch (curriculum phases have
    datasets of different sizes) and whether a validation follows each epoch."""

    batches: tuple[int, ...]
    """Steps of epoch ``e`` (0-based) on this rank."""
    validates: tuple[bool, ...]
    """Whether epoch ``e`` ends with a validation."""

    def steps_left(self, epoch: int, batch: int) -> tuple[int, int]:
        """(steps left in ``epoch``, steps left in the stage) after ``batch`` steps of ``epoch``."""
        in_epoch = max(self.batches[epoch] - batch, 0) if epoch < len(self.batches) else 0
        return in_epoch, in_epoch + sum(self.batches[epoch + 1:])

    def validations_left(self, epoch: int) -> tuple[int, int]:
        """(validations left in ``epoch``: 0 or 1, validations left in the stage), ``epoch`` unfinished."""
        in_epoch = int(epoch < len(self.validates) and self.validates[epoch])
        return in_epoch, in_epoch + sum(self.validates[epoch + 1:])


def eta_seconds(steps: int, seconds_per_step: float | None, validations: int,
                seconds_per_validation: float | None) -> float | None:
    """Seconds until ``steps`` more steps and ``validations`` more validations are done; None while
    no step has been timed. A validation not yet timed in this process counts as free."""
    if seconds_per_step is None:
        return None
    return steps * seconds_per_step + validations * (seconds_per_validation or 0.0)


@dataclass(frozen=True)
class StepLine:
    """Everything one step line says."""

    stage: int
    epoch: int
    """The epoch in progress, 1-based (``epoch 3/100`` is the third)."""
    epochs: int
    batch: int
    """Steps done in this epoch."""
    batches: int
    """Steps in this epoch."""
    loss: float
    """Mean training loss per sample since the previous line."""
    lr: float
    samples_per_s: float
    """All ranks together, over the steps since the previous line (validation time excluded)."""
    eta_epoch_s: float | None
    eta_stage_s: float | None


def format_duration(seconds: float | None) -> str:
    """``HH:MM:SS``, ``D-HH:MM:SS`` from a day on: how Slurm prints times, so an ETA reads against
    the job's walltime. ``-`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    days, rest = divmod(max(round(seconds), 0), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def format_step_line(line: StepLine) -> str:
    """``stage 1 | step 1200/4800 of epoch 3/100 | loss 0.0412 | lr 1.8e-04 | 8.4 samples/s |
    ETA epoch 00:12:30, stage 2-03:14:00`` (one line; the ETAs include validations once one was timed)."""
    return " | ".join([
        f"stage {line.stage}",
        f"step {line.batch}/{line.batches} of epoch {line.epoch}/{line.epochs}",
        f"loss {line.loss:.4f}",
        f"lr {line.lr:.1e}",
        f"{line.samples_per_s:.1f} samples/s",
        f"ETA epoch {format_duration(line.eta_epoch_s)}, stage {format_duration(line.eta_stage_s)}",
    ])
