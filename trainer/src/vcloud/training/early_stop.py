"""When a stage stops: at its epoch count, or earlier when its validation has stopped improving.

A stage whose ``best_metric`` has not improved for ``train.stage{N}.patience`` validations in a row
stops, hands on its ``best.pt`` and writes ``COMPLETE`` with the reason; its job then ends and
releases its GPUs. "Improved" is the best-checkpoint rule's (:mod:`vcloud.training.best`): the
validation replaced ``best.pt``. Stages 1-3 score their start as epoch 0, so a stage that never
beats its start by ``train.start_min_gain`` stops after ``patience`` validations.

A cloud-type curriculum (stage 1: ``thin_only`` -> ``mixed`` -> ``all``) makes the task harder at
each phase change; a plateau on thin clouds says nothing about thick ones. Only validations after
the first epoch of the phase the next epoch belongs to count, so every phase gets at least
``patience`` validations, and no stage stops on the eve of a new phase.

A pure function of the epoch history, so a resumed stage decides as an uninterrupted one would,
and one resumed with a larger ``patience`` or epoch count trains on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vcloud.contract import STOP_EPOCHS, STOP_PATIENCE
from vcloud.stage_records import StopRecord


@dataclass(frozen=True)
class StageStop:
    """Why a stage stops training now."""

    reason: str
    """:data:`~vcloud.contract.STOP_EPOCHS` or :data:`~vcloud.contract.STOP_PATIENCE`."""
    detail: str
    """The sentence for the log and ``COMPLETE``."""
    epochs_planned: int

    def to_record(self) -> StopRecord:
        return StopRecord(self.reason, self.detail, self.epochs_planned)


def validations_without_gain(validated: Sequence[int], best_epoch: int, phase_start: int) -> int:
    """How many validations count against patience: those after the best epoch and after the first
    epoch of the current curriculum phase.

    ``validated``: the (1-based) epochs that ended with a validation; ``best_epoch``: the epoch of
    ``best.pt`` (0: the start); ``phase_start``: the 0-based index of the current phase's first epoch
    (0 without a curriculum). The validation after epoch ``e`` trained 0-based epoch ``e - 1``."""
    since = max(best_epoch, phase_start)
    return sum(1 for epoch in validated if epoch > since)


def stage_stop(*, epochs_done: int, epochs: int, patience: int, validated: Sequence[int],
               best_epoch: int | None, phase_start: int, metric: str) -> StageStop | None:
    """Whether a stage that has trained ``epochs_done`` of its ``epochs`` stops now, and why.

    ``patience`` 0 never stops early; ``phase_start``: the first epoch (0-based) of the phase the
    next epoch, ``epochs_done``, belongs to."""
    if epochs_done >= epochs:
        return StageStop(STOP_EPOCHS, f"trained its {epochs} epochs", epochs)
    if patience <= 0:
        return None
    best = best_epoch or 0
    waited = validations_without_gain(validated, best, phase_start)
    if waited < patience:
        return None
    where = "its start (epoch 0)" if best == 0 else f"epoch {best}"
    detail = (f"stopped early after {epochs_done} of {epochs} epochs: validation {metric} has not improved "
              f"for {waited} validations (patience {patience}); best.pt is {where}")
    return StageStop(STOP_PATIENCE, detail, epochs)
