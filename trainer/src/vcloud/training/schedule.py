"""Learning-rate and validation schedules as pure functions of the position in training.

No scheduler object carries state between steps: the rate of any step follows from (epoch, batch
within epoch, global step), all of which the checkpoint stores, so a resumed run continues on
exactly the same curve and a changed epoch count reshapes it predictably.
"""

from __future__ import annotations

import math

from vcloud.config import StageTrainConfig, TrainConfig


def lr_at(train: TrainConfig, stage: StageTrainConfig, *, epoch: int, batch: int, batches_per_epoch: int,
          global_step: int) -> float:
    """Learning rate for the optimizer step that trains batch ``batch`` of epoch ``epoch``."""
    factor = 1.0
    if train.lr_schedule == "cosine":
        progress = (epoch + batch / max(batches_per_epoch, 1)) / stage.epochs
        progress = min(max(progress, 0.0), 1.0)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        factor = train.min_lr_ratio + (1.0 - train.min_lr_ratio) * cosine
    if train.warmup_steps and global_step < train.warmup_steps:
        factor *= (global_step + 1) / train.warmup_steps
    return stage.lr * factor


def validates_after_epoch(train: TrainConfig, epochs: int, epoch: int) -> bool:
    """Whether epoch ``epoch`` (0-based) of ``epochs`` ends with a validation: every
    ``eval_every_epochs``-th epoch and always the last."""
    return epoch + 1 == epochs or (epoch + 1) % train.eval_every_epochs == 0
