"""Metrics against closed-form values and against scikit-image, the reference implementation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from skimage.metrics import mean_squared_error as sk_mse
from skimage.metrics import peak_signal_noise_ratio as sk_psnr
from skimage.metrics import structural_similarity as sk_ssim

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


# ---- against scikit-image ---------------------------------------------------------------------
#
# Conventions, and how the reference is called to share them:
# * data range: our reflectances live in [0, 1], and PSNR/SSIM use a data range of 1 (skimage would
#   otherwise take it from the dtype, or demand it for floats): data_range=1.0.
# * PSNR: ours is per sample over all bands and pixels, like skimage on one [C, H, W] sample; ours
#   caps identical images at 100 dB where skimage returns inf (not compared here).
# * SSIM: ours is Wang et al.'s: an 11x11 Gaussian window (sigma 1.5), population moments, the mean
#   over the valid region of each band, then over bands. skimage's default is a 7x7 uniform window
#   with the sample-covariance correction N/(N-1), which differs by 1e-3 to 1e-2 here; with
#   gaussian_weights=True, sigma=1.5 (truncate 3.5 -> radius 5 -> the same 11 taps),
#   use_sample_covariance=False it filters the whole image with reflected borders and then crops the
#   5-pixel border, which leaves exactly our valid region; channel_axis=0 averages over bands as we do.
# * SAM has no skimage function: the reference is the textbook arccos of the normalised dot product
#   per pixel in numpy.
# Measured: PSNR agrees to 0 dB (bit for bit), SSIM to ~1e-8 with our default float32 blurs and to
# ~3e-16 with float64 blurs; the tolerances below leave two orders of magnitude of margin.

PSNR_TOL_DB = 1e-9
SSIM_TOL = 1e-6          # float32 Gaussian blurs (the training default)
SSIM_TOL_FLOAT64 = 1e-12  # blur_dtype=float64


def _random_pair(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    target = rng.random((2, 13, 48, 40))
    return np.clip(target + 0.1 * rng.standard_normal(target.shape), 0.0, 1.0), target


def _structured_pair(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Smooth band-dependent waves, a checkerboard and a dark field with small noise: the edges and
    flat areas where SSIM's local statistics matter."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:48, 0:40] / 48.0
    bands = []
    for b in range(13):
        band = 0.35 + 0.25 * np.sin(2 * np.pi * (x * (1 + b % 3) + y * (b % 5) / 2)) * np.cos(2 * np.pi * y)
        band += 0.2 * (((x * 8).astype(int) + (y * 8).astype(int)) % 2)
        band[30:, :12] = 0.02 + 0.01 * b / 13  # a shadow-like dark field
        bands.append(band)
    target = np.clip(np.stack([np.stack(bands), 0.8 * np.stack(bands)[::-1]]), 0.0, 1.0)
    pred = target + 0.03 * rng.standard_normal(target.shape)
    pred[1, :, 10:20, 10:20] += 0.2  # a local artefact
    return np.clip(pred, 0.0, 1.0), target


PAIRS = {"random": _random_pair, "structured": _structured_pair}


def _sam_reference(pred: np.ndarray, target: np.ndarray) -> np.ndarray:
    dot = np.einsum("bchw,bchw->bhw", pred, target)
    cos = dot / (np.linalg.norm(pred, axis=1) * np.linalg.norm(target, axis=1))
    return np.degrees(np.arccos(np.clip(cos, -1.0, 1.0))).mean(axis=(1, 2))


@pytest.mark.parametrize("kind", sorted(PAIRS))
@pytest.mark.parametrize("seed", [0, 1])
def test_psnr_ssim_sam_rmse_agree_with_the_reference(kind: str, seed: int) -> None:
    pred, target = PAIRS[kind](seed)
    p, t = torch.from_numpy(pred), torch.from_numpy(target)
    ref_psnr = [sk_psnr(target[i], pred[i], data_range=1.0) for i in range(len(target))]
    ref_ssim = [sk_ssim(target[i], pred[i], data_range=1.0, channel_axis=0, gaussian_weights=True, sigma=1.5,
                        use_sample_covariance=False) for i in range(len(target))]
    ref_rmse = [math.sqrt(sk_mse(target[i], pred[i])) for i in range(len(target))]

    assert psnr(p, t, reduction="none").tolist() == pytest.approx(ref_psnr, abs=PSNR_TOL_DB)
    assert ssim(p, t, reduction="none").tolist() == pytest.approx(ref_ssim, abs=SSIM_TOL)
    assert ssim(p, t, reduction="none", blur_dtype=torch.float64).tolist() == pytest.approx(
        ref_ssim, abs=SSIM_TOL_FLOAT64)
    assert sam_degrees(p, t, reduction="none").tolist() == pytest.approx(_sam_reference(pred, target).tolist(),
                                                                         abs=1e-9)
    assert rmse(p, t, reduction="none").tolist() == pytest.approx(ref_rmse, rel=1e-12)
    assert 0.0 < min(ref_ssim) < max(ref_ssim) < 1.0  # neither trivial nor saturated


def test_skimage_default_ssim_is_a_different_convention() -> None:
    """Why the reference call above needs its options: skimage's defaults (7x7 uniform window, sample
    covariance) score the same pair measurably differently."""
    pred, target = _structured_pair(0)
    ours = float(ssim(torch.from_numpy(pred[1:]), torch.from_numpy(target[1:]), blur_dtype=torch.float64))
    default = sk_ssim(target[1], pred[1], data_range=1.0, channel_axis=0)
    assert abs(ours - default) > 5e-3  # measured: 0.8748 against 0.8866
