"""The best-checkpoint rule: direction per metric, and the margin a replacement must clear."""

from __future__ import annotations

import pytest

from vcloud.training.best import improves, keeps_trained


@pytest.mark.parametrize(("metric", "value", "reference", "margin", "expected"), [
    ("psnr", 30.1, 30.0, 0.0, True),
    ("psnr", 30.0, 30.0, 0.0, False),      # a tie keeps what is there
    ("psnr", 30.04, 30.0, 0.05, False),    # within the margin
    ("psnr", 30.06, 30.0, 0.05, True),
    ("ssim", 0.95, 0.96, 0.0, False),
    ("sam", 1.9, 2.0, 0.0, True),          # lower is better
    ("sam", 1.98, 2.0, 0.05, False),
    ("rmse", 0.01, 0.02, 0.005, True),
])
def test_improves(metric: str, value: float, reference: float, margin: float, expected: bool) -> None:
    assert improves(metric, value, reference, margin) is expected


def test_negative_margin_is_refused() -> None:
    with pytest.raises(ValueError, match="margin must be >= 0"):
        improves("psnr", 31.0, 30.0, -0.1)


@pytest.mark.parametrize(("metric", "trained", "start", "expected"), [
    ("psnr", 29.95, 30.0, True),    # loses 0.05 dB: within a 0.1 dB tolerance
    ("psnr", 29.89, 30.0, False),   # loses more
    ("psnr", 30.0, 30.0, True),     # a tie: what the stage adapted to elsewhere is kept
    ("sam", 2.05, 2.0, True),       # lower is better
    ("sam", 2.2, 2.0, False),
])
def test_a_guarded_stage_keeps_its_training_unless_it_loses_more_than_the_tolerance(metric, trained, start,
                                                                                     expected) -> None:
    assert keeps_trained(metric, trained, start, tolerance=0.1) is expected


def test_without_a_tolerance_the_trained_weights_must_beat_the_start_by_the_margin() -> None:
    assert keeps_trained("psnr", 30.04, 30.0, min_gain=0.05) is False
    assert keeps_trained("psnr", 30.06, 30.0, min_gain=0.05) is True
    with pytest.raises(ValueError, match="tolerance must be >= 0"):
        keeps_trained("psnr", 30.0, 30.0, tolerance=-0.1)
