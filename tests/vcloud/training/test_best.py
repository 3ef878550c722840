"""The best-checkpoint rule: direction per metric, and the margin a replacement must clear."""

from __future__ import annotations

import pytest

from vcloud.training.best import improves


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
