"""Metrics against closed-form values."""

from __future__ import annotations

import math

import pytest
import torch

from vcloud.metrics import MetricTotals, evaluate, mae, psnr, rmse, sam_degrees, ssim



def _image(seed: int = 0, shape: tuple[int, ...] = (2, 13, 32, 32)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) * 0.5 + 0.2


def test_identical_images_are_perfect() -> None:
    x = _image()
    scores = evaluate(x, x.clone())
    assert scores["psnr"] == 100.0  # infinite PSNR is capped
    assert scores["ssim"] == pytest.approx(1.0, abs=1e-9)
    assert scores["sam"] == pytest.approx(0.0, abs=1e-5)
    assert scores["mae"] == 0.0 and scores["rmse"] == 0.0


@pytest.mark.parametrize("offset, expected_db", [(0.1, 20.0), (0.01, 40.0), (0.5, 10 * math.log10(4))])
def test_constant_offset_has_closed_form_psnr(offset: float, expected_db: float) -> None:
    target = torch.full((1, 13, 16, 16), 0.25, dtype=torch.float64)
    pred = target + offset
    assert float(psnr(pred, target)) == pytest.approx(expected_db, abs=1e-9)
    assert float(mae(pred, target)) == pytest.approx(offset, rel=1e-6)
    assert float(rmse(pred, target)) == pytest.approx(offset, rel=1e-6)


def test_psnr_is_averaged_per_sample_not_pooled() -> None:
    target = torch.full((2, 13, 8, 8), 0.3, dtype=torch.float64)
    pred = target.clone()
    pred[0] += 0.1
    pred[1] += 0.01
    assert float(psnr(pred, target)) == pytest.approx(30.0, abs=1e-9)  # mean of 20 and 40 dB
    assert psnr(pred, target, reduction="none").tolist() == pytest.approx([20.0, 40.0])


def test_psnr_cap_applies_per_sample() -> None:
    target = torch.full((2, 13, 8, 8), 0.3, dtype=torch.float64)
    pred = target.clone()
    pred[1] += 0.1
    assert psnr(pred, target, reduction="none").tolist() == pytest.approx([100.0, 20.0])


def test_orthogonal_spectra_are_90_degrees_and_scaling_is_0() -> None:
    target = torch.zeros(1, 13, 4, 4)
    target[:, 0] = 1.0
    pred = torch.zeros(1, 13, 4, 4)
    pred[:, 1] = 1.0
    assert float(sam_degrees(pred, target)) == pytest.approx(90.0, abs=1e-9)
    x = _image(1)
    assert float(sam_degrees(0.5 * x, x)) == pytest.approx(0.0, abs=1e-5)
    # 45 degrees: [1, 1, 0...] against [1, 0, 0...]
    pred45 = target.clone()
    pred45[:, 1] = 1.0
    assert float(sam_degrees(pred45, target)) == pytest.approx(45.0, abs=1e-9)


def test_ssim_of_constant_images_has_closed_form() -> None:
    a, b = 0.2, 0.5
    c1 = 0.01**2
    expected = (2 * a * b + c1) / (a * a + b * b + c1)  # variances vanish, the structure term is 1
    pred, target = (torch.full((1, 13, 24, 24), v, dtype=torch.float64) for v in (b, a))
    # float64 blurs: the variances come out as differences of ~1e-16-accurate moments, so the
    # closed form holds to 1e-12. (The default float32 blurs leave variances of up to ~1e-7 where
    # they should vanish; against c2 = 9e-4 that bounds the error only at ~4e-4 relative.)
    assert float(ssim(pred, target, blur_dtype=torch.float64)) == pytest.approx(expected, rel=1e-12)
    assert float(ssim(pred, target)) == pytest.approx(expected, rel=5e-4)


def test_ssim_drops_with_noise_and_is_symmetric() -> None:
    x = _image(2)
    noisy = x + 0.05 * torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    very_noisy = x + 0.2 * torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    s1, s2 = float(ssim(noisy, x)), float(ssim(very_noisy, x))
    assert 1.0 > s1 > s2
    assert float(ssim(x, noisy)) == pytest.approx(s1, abs=1e-12)
    assert float(ssim(_image(4, (1, 13, 7, 7)), _image(5, (1, 13, 7, 7)))) < 1.0  # window shrinks to fit


def test_evaluate_clips_predictions_to_valid_range() -> None:
    target = torch.ones(1, 13, 8, 8)
    pred = torch.full((1, 13, 8, 8), 1.5)
    assert evaluate(pred, target)["psnr"] == 100.0
    assert evaluate(pred, target, clip=False)["psnr"] == pytest.approx(10 * math.log10(4), abs=1e-9)


def test_totals_average_over_samples_across_batches() -> None:
    target = torch.full((3, 13, 8, 8), 0.3, dtype=torch.float64)
    pred = target.clone()
    pred[0] += 0.1
    pred[1] += 0.01
    pred[2] += 0.001
    totals = MetricTotals()
    totals.update(pred[:1], target[:1])
    totals.update(pred[1:], target[1:])
    assert totals.count == 3
    assert totals.means()["psnr"] == pytest.approx((20 + 40 + 60) / 3, abs=1e-6)
    assert totals.means() == pytest.approx(evaluate(pred, target))
    assert math.isnan(MetricTotals().means()["psnr"])


def test_shape_errors_are_explained() -> None:
    with pytest.raises(ValueError, match="differs from target shape"):
        psnr(torch.zeros(1, 13, 8, 8), torch.zeros(1, 13, 8, 9))
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        ssim(torch.zeros(13, 8, 8), torch.zeros(13, 8, 8))
    with pytest.raises(ValueError, match="known: mean, none"):
        mae(torch.zeros(1, 13, 8, 8), torch.zeros(1, 13, 8, 8), reduction="sum")


def test_bfloat16_predictions_are_scored_in_float64() -> None:
    target = torch.full((1, 13, 8, 8), 0.25)
    pred = (target + 0.125).to(torch.bfloat16)  # exactly representable
    assert float(psnr(pred, target)) == pytest.approx(20 * math.log10(8), abs=1e-9)
