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
