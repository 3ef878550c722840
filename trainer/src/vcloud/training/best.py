"""Which validation result becomes ``best.pt``: one rule for the trainer and the benchmarks."""

from __future__ import annotations

from vcloud.contract import HIGHER_IS_BETTER


def improves(metric: str, value: float, reference: float, margin: float = 0.0) -> bool:
    """Does ``value`` beat ``reference`` by more than ``margin`` (in the metric's units)?

    ``margin`` guards a proven model against a replacement whose gain is within the noise of the
    validation split: a stage that starts from its predecessor's answer keeps it unless training
    clearly beats it (``train.start_min_gain``)."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if HIGHER_IS_BETTER[metric]:
        return value > reference + margin
    return value < reference - margin


def keeps_trained(metric: str, trained: float, start: float, *, min_gain: float = 0.0,
                  tolerance: float | None = None) -> bool:
    """Do trained weights replace the model a stage started from?

    Normally they must beat it by ``min_gain`` (``train.start_min_gain``). A stage whose purpose
    the validation split cannot measure passes ``tolerance`` instead: stage 3 adapting to an
    unlabeled domain is validated on the labeled one, where it can only be checked not to lose
    more than ``tolerance`` (``model.stage3.max_val_loss``)."""
    if tolerance is None:
        return improves(metric, trained, start, min_gain)
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    if HIGHER_IS_BETTER[metric]:
        return trained >= start - tolerance
    return trained <= start + tolerance
