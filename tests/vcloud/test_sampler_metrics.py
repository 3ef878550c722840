"""Sampler metrics against inputs whose answer is known in closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vcloud.metrics import mae
from vcloud.sampler_metrics import (
    NIR_BAND,
    RED_BAND,
    band_mean,
    clearest_cover,
    crps_ensemble,
    crps_map,
    ensemble_scores,
    ensemble_spread,
    gradient_wasserstein,
    HIGH_FREQUENCY_MIN_SHARE,
    high_frequency_power,
    high_frequency_power_ratio,
    high_frequency_share,
    ndvi,
    ndvi_error,
    quantile,
    radial_power_spectrum,
    rank_histogram,
    refiner_change,
    sampler_report,
    spread_skill_ratio,
    stratified_report,
)


def _image(seed: int = 0, shape: tuple[int, ...] = (2, 13, 32, 32)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=torch.float64) * 0.5 + 0.25


def _signs(k: int) -> torch.Tensor:
    """[1, K, 1, 1, 1] of alternating +1 / -1 (K even: mean 0)."""
    return torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(k)], dtype=torch.float64).view(1, k, 1, 1, 1)


# ---- one sample and the ensemble mean ---------------------------------------------------------

def test_identical_samples_score_as_the_target_itself() -> None:
    target = _image()
    samples = target.unsqueeze(1).repeat(1, 4, 1, 1, 1)
    scores = ensemble_scores(samples, target)
    assert scores["psnr_sample"] == scores["psnr_mean"] == 100.0
    assert scores["ssim_sample"] == pytest.approx(1.0, abs=1e-9)
    assert scores["sam_sample"] == pytest.approx(0.0, abs=1e-5)
    assert scores["sam_mean"] == pytest.approx(0.0, abs=1e-5)


@pytest.mark.parametrize("k", [4, 6])
def test_symmetric_offsets_cancel_in_the_mean_but_not_in_one_sample(k: int) -> None:
    """Samples target +- 0.1: each alone is 20 dB; their mean is the target (capped 100 dB)."""
    target = torch.full((2, 13, 16, 16), 0.4, dtype=torch.float64)
    samples = target.unsqueeze(1) + 0.1 * _signs(k)
    scores = ensemble_scores(samples, target)
    assert scores["psnr_sample"] == pytest.approx(20.0, abs=1e-9)
    assert scores["psnr_mean"] == 100.0
    assert scores["ssim_mean"] == pytest.approx(1.0, abs=1e-9)


def test_scaled_samples_have_zero_spectral_angle() -> None:
    target = _image(1)
    samples = torch.stack([target * s for s in (0.5, 0.8, 1.1, 1.5)], dim=1)
    scores = ensemble_scores(samples, target, clip=False)
    assert scores["sam_sample"] == pytest.approx(0.0, abs=1e-5)
    assert scores["sam_mean"] == pytest.approx(0.0, abs=1e-5)


# ---- refiner collapse -------------------------------------------------------------------------

def test_refiner_change_of_a_constant_offset_is_that_offset() -> None:
    draft = _image(2)
    offsets = torch.arange(13, dtype=torch.float64).view(1, 1, 13, 1, 1) * 0.01
    samples = draft.unsqueeze(1) + offsets * _signs(4)
    change = refiner_change(samples, draft)
    assert change["mean"].tolist() == pytest.approx([0.01 * b for b in range(13)], abs=1e-12)
    assert change["p95"].tolist() == pytest.approx([0.01 * b for b in range(13)], abs=1e-12)
    unchanged = refiner_change(draft.unsqueeze(1).repeat(1, 4, 1, 1, 1), draft)
    assert unchanged["mean"].abs().max() == 0.0 and unchanged["p95"].abs().max() == 0.0


def test_refiner_change_percentile_of_a_ramp() -> None:
    """|sample - draft| takes the values 0..99 once each: p95 = 94.05 (linear interpolation)."""
    draft = torch.zeros(1, 1, 10, 10, dtype=torch.float64)
    samples = torch.arange(100, dtype=torch.float64).view(1, 1, 1, 10, 10)
    change = refiner_change(samples, draft)
    assert float(change["mean"][0]) == pytest.approx(49.5)
    assert float(change["p95"][0]) == pytest.approx(float(np.quantile(np.arange(100), 0.95)))
    assert float(change["p95"][0]) == pytest.approx(94.05)


def test_quantile_matches_numpy() -> None:
    values = torch.rand(3, 1001, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    for q in (0.0, 0.5, 0.95, 1.0):
        assert quantile(values, q).tolist() == pytest.approx(np.quantile(values.numpy(), q, axis=1).tolist())


def test_refiner_change_restricted_to_the_clouds() -> None:
    draft = torch.zeros(1, 13, 8, 8, dtype=torch.float64)
    mask = torch.zeros(1, 1, 8, 8)
    mask[..., :4] = 1.0
    samples = (0.2 * mask.double().expand(1, 13, 8, 8)).unsqueeze(1).repeat(1, 4, 1, 1, 1)
    assert refiner_change(samples, draft, mask)["mean"].tolist() == pytest.approx([0.2] * 13)
    assert refiner_change(samples, draft, 1 - mask)["mean"].tolist() == pytest.approx([0.0] * 13)
    assert refiner_change(samples, draft)["mean"].tolist() == pytest.approx([0.1] * 13)


def test_spread_of_plus_minus_a_is_the_unbiased_std() -> None:
    """K = 4 samples at +-a: mean 0, sum of squares 4 a^2, unbiased std a sqrt(4/3)."""
    base = _image(3)
    samples = base.unsqueeze(1) + 0.05 * _signs(4)
    assert ensemble_spread(samples).tolist() == pytest.approx([0.05 * math.sqrt(4 / 3)] * 13, rel=1e-9)
    assert ensemble_spread(base.unsqueeze(1).repeat(1, 4, 1, 1, 1)).abs().max() == 0.0  # collapsed
    with pytest.raises(ValueError, match="at least 2 samples"):
        ensemble_spread(base.unsqueeze(1))


# ---- texture ----------------------------------------------------------------------------------

def _sine(size: int, cycles: int, amplitude: float = 0.2, height: int | None = None) -> torch.Tensor:
    """[1, 13, height, size]: a wave along x with ``cycles`` periods per 16 pixels."""
    x = torch.arange(size, dtype=torch.float64)
    wave = 0.5 + amplitude * torch.sin(2 * math.pi * cycles * x / 16)
    return wave.expand(1, 13, height or size, size).clone()


def test_a_sine_puts_its_power_in_its_radial_bin() -> None:
    for cycles in (2, 5, 6):
        spectrum, windows = radial_power_spectrum(_sine(32, cycles))
        assert windows == 4
        assert spectrum.argmax(dim=1).tolist() == [cycles] * 13
    flat, _ = radial_power_spectrum(torch.full((1, 13, 32, 32), 0.3, dtype=torch.float64))
    assert flat.abs().max() < 1e-25  # the window mean is removed: no DC, only rounding


def test_high_frequency_power_ratio_of_a_scaled_texture_is_the_squared_scale() -> None:
    target = _sine(32, 6)
    pred = 0.5 + 0.5 * (target - 0.5)  # half the amplitude: a quarter of the power
    assert high_frequency_power_ratio(pred, target).tolist() == pytest.approx([0.25] * 13, rel=1e-9)
    assert high_frequency_power_ratio(target, target).tolist() == pytest.approx([1.0] * 13)
    smooth = torch.full_like(target, 0.5)
    assert high_frequency_power_ratio(smooth, target).tolist() == pytest.approx([0.0] * 13, abs=1e-12)


def test_spectrum_under_the_mask_sees_only_the_masked_texture() -> None:
    """Left half (cloudy) holds a 2-cycle wave, right half (clear) a 6-cycle wave."""
    image = torch.cat([_sine(16, 2, height=32), _sine(16, 6, height=32)], dim=-1)
    mask = torch.zeros(1, 1, 32, 32)
    mask[..., :16] = 1.0
    cloudy, n_cloudy = radial_power_spectrum(image, mask)
    clear, n_clear = radial_power_spectrum(image, 1 - mask)
    assert (n_cloudy, n_clear) == (2, 2)
    assert cloudy.argmax(dim=1).tolist() == [2] * 13 and clear.argmax(dim=1).tolist() == [6] * 13
    # the high-frequency ratio of a blurred right half is 0 in the clear windows only
    pred = torch.cat([_sine(16, 2, height=32), torch.full((1, 13, 32, 16), 0.5, dtype=torch.float64)], dim=-1)
    assert high_frequency_power_ratio(pred, image, 1 - mask).tolist() == pytest.approx([0.0] * 13, abs=1e-12)
    assert high_frequency_power_ratio(pred, image, mask).tolist() == pytest.approx([1.0] * 13)  # same wave
    _, none = radial_power_spectrum(image, torch.zeros(1, 1, 32, 32))
    assert none == 0


def test_white_noise_has_half_its_power_above_the_cutoff() -> None:
    """Unit-variance white noise: about 1 per radial bin, bins 5-8 above 0.25 cycles per pixel."""
    noise = torch.randn(64, 13, 32, 32, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert high_frequency_power(noise).tolist() == pytest.approx([4.0] * 13, rel=0.05)
    assert high_frequency_share(noise) == pytest.approx(0.5, abs=0.02)
    assert math.isnan(high_frequency_share(noise[:1], torch.zeros(1, 1, 32, 32)))  # no window in the region


def test_the_report_pools_the_bands_before_dividing() -> None:
    """Twelve bands share the target's 6-cycle wave; B10's target is nearly flat (amplitude 1e-3 of
    it) and the prediction carries the full wave there: B10's own ratio is 1e6, the pooled one
    (13 a^2) / (12 a^2 + (1e-3 a)^2) = 13 / 12."""
    target = _sine(32, 6)
    pred = target.clone()
    target[:, 10] = 0.5 + 1e-3 * (pred[:, 10] - 0.5)
    report = sampler_report(pred.unsqueeze(1), target, torch.ones(1, 1, 32, 32))
    assert report["hf_power_ratio_cloudy_band"][10] == pytest.approx(1e6, rel=1e-6)
    assert report["hf_power_ratio_cloudy"] == pytest.approx(13 / (12 + 1e-6), rel=1e-9)
    assert report["hf_power_cloudy"] == pytest.approx(float(high_frequency_power(pred).mean()))
    assert report["hf_share_target_cloudy"] > 0.9 and report["hf_power_ratio_cloudy_conditioned"] is True
    assert math.isnan(report["hf_power_ratio_clear"])  # no clear window


def _blur(images: torch.Tensor, sigma: float = 1.0) -> torch.Tensor:
    radius = 3
    kernel = torch.exp(-0.5 * (torch.arange(-radius, radius + 1, dtype=torch.float64) / sigma) ** 2)
    kernel = (kernel / kernel.sum()).view(1, 1, 1, -1).repeat(images.shape[1], 1, 1, 1)
    padded = torch.nn.functional.pad(images, (radius,) * 4, mode="reflect")
    rows = torch.nn.functional.conv2d(padded, kernel, groups=images.shape[1])
    return torch.nn.functional.conv2d(rows, kernel.transpose(-1, -2), groups=images.shape[1])


def test_synthetic_targets_have_too_little_high_frequency_power_for_a_ratio(tiny_prepared) -> None:
    """The tiny preset's test split, under the target date's clouds: the clean scene itself scores 1,
    its Gaussian blur below 1; the scene is so smooth (well under 1% of its power at high frequency)
    that the least cloudy input, sensor noise and all, scores hundreds of times the target's power,
    and the report says the ratio is ill-conditioned instead of averaging per-band ratios of
    thousands (B10's target is nearly flat)."""
    from torch.utils.data import default_collate

    from vcloud.data.dataset import SeriesDataset
    from vcloud.models.draft_and_refiner import target_observation
    from vcloud.models.stage_specs import least_cloudy_input

    split = SeriesDataset(tiny_prepared, "test")
    batch = default_collate([split[i] for i in range(len(split))])
    target = batch["target"].double()
    cloudy = target_observation(batch)[1]
    assert high_frequency_power_ratio(target, target, cloudy).tolist() == pytest.approx([1.0] * 13)
    assert (high_frequency_power_ratio(_blur(target), target, cloudy) < 1.0).all()
    blurred = sampler_report(_blur(target).unsqueeze(1), target, cloudy)
    assert blurred["hf_power_ratio_cloudy"] < 0.2
    assert sampler_report(target.unsqueeze(1), target, cloudy)["hf_power_ratio_cloudy"] == pytest.approx(1.0)

    draft = sampler_report(least_cloudy_input(batch).double().clamp(0.0, 1.0).unsqueeze(1), target, cloudy)
    assert draft["hf_share_target_cloudy"] < HIGH_FREQUENCY_MIN_SHARE
    assert draft["hf_power_ratio_cloudy_conditioned"] is False
    assert draft["hf_power_ratio_cloudy"] > 10.0  # noise over a near-flat target
    pooled = draft["hf_power_cloudy"] / draft["hf_power_target_cloudy"]
    assert draft["hf_power_ratio_cloudy"] == pytest.approx(pooled)
    assert draft["hf_power_target_cloudy"] == pytest.approx(blurred["hf_power_target_cloudy"])


def test_gradient_distance_of_two_ramps_is_their_slope_difference() -> None:
    x = torch.arange(16, dtype=torch.float64)
    target = (0.01 * x).expand(1, 13, 16, 16)
    pred = (0.03 * x).expand(1, 13, 16, 16)
    assert gradient_wasserstein(pred, target).tolist() == pytest.approx([0.02] * 13, abs=1e-12)
    assert gradient_wasserstein(target + 0.2, target).tolist() == pytest.approx([0.0] * 13, abs=1e-15)


def test_gradient_distance_of_a_doubled_texture_is_the_mean_gradient() -> None:
    target = _image(6)
    doubled = 2.0 * target
    dx = target[..., :-1, 1:] - target[..., :-1, :-1]
    dy = target[..., 1:, :-1] - target[..., :-1, :-1]
    mean_gradient = torch.sqrt(dx**2 + dy**2).mean(dim=(0, 2, 3))
    assert gradient_wasserstein(doubled, target).tolist() == pytest.approx(mean_gradient.tolist(), rel=1e-12)


# ---- probabilistic skill ----------------------------------------------------------------------

def test_crps_of_a_point_forecast_is_the_absolute_error() -> None:
    target, pred = _image(7), _image(8)
    per_band = crps_ensemble(pred.unsqueeze(1), target)
    expected = (pred - target).abs().mean(dim=(0, 2, 3))
    assert per_band.tolist() == pytest.approx(expected.tolist(), rel=1e-12)
    assert float(per_band.mean()) == pytest.approx(float(mae(pred, target)), rel=1e-12)


def test_crps_of_a_two_member_ensemble_by_hand() -> None:
    """Members {0, 1}, truth 0: 1/2 (0 + 1) - 1/(2*2*1) (|0-1| + |1-0|) = 0; truth 2: 1.5 - 0.5 = 1."""
    samples = torch.tensor([0.0, 1.0], dtype=torch.float64).view(1, 2, 1, 1, 1)
    assert float(crps_map(samples, torch.zeros(1, 1, 1, 1))) == pytest.approx(0.0, abs=1e-15)
    assert float(crps_map(samples, torch.full((1, 1, 1, 1), 2.0))) == pytest.approx(1.0)


def test_crps_pair_sum_matches_the_brute_force_definition() -> None:
    samples = torch.rand(2, 5, 3, 4, 4, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    target = torch.rand(2, 3, 4, 4, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    skill = (samples - target.unsqueeze(1)).abs().mean(dim=1)
    pairs = (samples.unsqueeze(1) - samples.unsqueeze(2)).abs().sum(dim=(1, 2))
    assert torch.allclose(crps_map(samples, target), skill - pairs / (2 * 5 * 4), atol=1e-14)


def _gaussian_crps(mu: float, sigma: float, y: float) -> float:
    """Closed form for a normal forecast: sigma [z (2 Phi(z) - 1) + 2 phi(z) - 1 / sqrt(pi)]."""
    z = (y - mu) / sigma
    cdf = 0.5 * (1 + math.erf(z / math.sqrt(2)))
    pdf = math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return sigma * (z * (2 * cdf - 1) + 2 * pdf - 1 / math.sqrt(math.pi))


@pytest.mark.parametrize("y", [0.0, 0.5, 1.5])
def test_fair_crps_of_a_gaussian_ensemble_matches_the_closed_form(y: float) -> None:
    """K = 4 members drawn from N(0, 1) at 13 x 4 x 64 x 64 pixels: the fair estimator's mean is the
    normal CRPS; the plain 1/(2K^2) estimator is off by sigma / (K sqrt(pi)) = 0.141."""
    g = torch.Generator().manual_seed(11)
    samples = torch.randn(4, 4, 13, 64, 64, generator=g, dtype=torch.float64)
    target = torch.full((4, 13, 64, 64), y, dtype=torch.float64)
    fair = crps_ensemble(samples, target)
    expected = _gaussian_crps(0.0, 1.0, y)
    assert fair.tolist() == pytest.approx([expected] * 13, abs=0.015)
    assert float(fair.mean()) == pytest.approx(expected, abs=0.005)
    plain = fair + (samples.unsqueeze(1) - samples.unsqueeze(2)).abs().sum(dim=(1, 2)).mean(dim=(0, 2, 3)) * (
        1 / (2 * 4 * 3) - 1 / (2 * 16))
    assert float(plain.mean()) - expected == pytest.approx(1 / (4 * math.sqrt(math.pi)), abs=0.01)


def test_spread_skill_ratio_of_a_biased_ensemble_by_hand() -> None:
    """Samples target + b +- a (K = 4): variance 4 a^2 / 3, ensemble-mean error b, so
    SSR = sqrt(5/4) sqrt(4/3) a / b."""
    target = _image(12)
    a, b = 0.03, 0.06
    samples = target.unsqueeze(1) + b + a * _signs(4)
    expected = math.sqrt(5 / 4) * math.sqrt(4 / 3) * a / b
    assert spread_skill_ratio(samples, target).tolist() == pytest.approx([expected] * 13, rel=1e-9)
    collapsed = target.unsqueeze(1) + b + 0 * _signs(4)
    assert spread_skill_ratio(collapsed, target).abs().max() == 0.0


@pytest.mark.parametrize("k", [4, 8])
def test_exchangeable_ensemble_is_calibrated(k: int) -> None:
    """Target and K samples drawn from one distribution: SSR 1 (with the (K+1)/K factor) and a
    flat rank histogram."""
    g = torch.Generator().manual_seed(13)
    draws = torch.randn(4, k + 1, 13, 32, 32, generator=g, dtype=torch.float64)
    samples, target = draws[:, :k], draws[:, k]
    assert spread_skill_ratio(samples, target).tolist() == pytest.approx([1.0] * 13, abs=0.06)
    assert float(spread_skill_ratio(samples, target).mean()) == pytest.approx(1.0, abs=0.02)
    counts = rank_histogram(samples, target).sum(dim=0).double()
    assert counts.numel() == k + 1 and int(counts.sum()) == 4 * 13 * 32 * 32
    assert (counts / counts.mean() - 1).abs().max() < 0.05


def test_rank_histogram_of_a_target_outside_the_samples() -> None:
    samples = torch.rand(1, 4, 13, 8, 8, generator=torch.Generator().manual_seed(14), dtype=torch.float64)
    below = rank_histogram(samples, torch.full((1, 13, 8, 8), -1.0))
    above = rank_histogram(samples, torch.full((1, 13, 8, 8), 2.0))
    assert below[:, 0].tolist() == [64] * 13 and int(below[:, 1:].sum()) == 0
    assert above[:, 4].tolist() == [64] * 13 and int(above[:, :4].sum()) == 0
    mask = torch.zeros(1, 1, 8, 8)
    mask[..., :2, :] = 1.0
    assert rank_histogram(samples, torch.full((1, 13, 8, 8), 2.0), mask)[:, 4].tolist() == [16] * 13


def test_rank_histogram_spreads_ties_over_the_bins() -> None:
    """A collapsed ensemble equal to the target: every rank 0..K is equally likely."""
    target = torch.full((4, 13, 32, 32), 0.5, dtype=torch.float64)
    counts = rank_histogram(target.unsqueeze(1).repeat(1, 4, 1, 1, 1), target).sum(dim=0).double()
    assert (counts / counts.mean() - 1).abs().max() < 0.05


# ---- downstream index -------------------------------------------------------------------------

def test_ndvi_bands_are_b4_and_b8() -> None:
    assert (RED_BAND, NIR_BAND) == (3, 7)
    image = torch.zeros(1, 13, 2, 2, dtype=torch.float64)
    image[:, RED_BAND], image[:, NIR_BAND] = 0.1, 0.3
    assert ndvi(image).flatten().tolist() == pytest.approx([0.5] * 4)
    assert ndvi(torch.zeros(1, 13, 2, 2)).abs().max() == 0.0  # dark: 0, not NaN


def test_ndvi_error_is_blind_to_a_gain_and_counts_only_cloudy_pixels() -> None:
    target = torch.zeros(1, 13, 4, 4, dtype=torch.float64)
    target[:, RED_BAND], target[:, NIR_BAND] = 0.1, 0.3  # NDVI 0.5
    assert ndvi_error(1.7 * target, target) == pytest.approx(0.0, abs=1e-12)
    pred = target.clone()
    pred[:, NIR_BAND] = 0.1  # NDVI 0: error 0.5
    mask = torch.zeros(1, 1, 4, 4)
    mask[..., :2, :] = 1.0
    pred_wrong_in_clear = torch.where(mask.bool(), target, pred)
    assert ndvi_error(pred, target, mask) == pytest.approx(0.5)
    assert ndvi_error(pred_wrong_in_clear, target, mask) == pytest.approx(0.0)
    assert math.isnan(ndvi_error(pred, target, torch.zeros(1, 1, 4, 4)))


# ---- reports ----------------------------------------------------------------------------------

def test_band_mean_pools_over_the_region() -> None:
    values = torch.arange(2 * 13 * 2 * 2, dtype=torch.float64).view(2, 13, 2, 2)
    where = torch.zeros(2, 1, 2, 2)
    where[0, 0, 0, 0] = 1.0
    assert band_mean(values, where).tolist() == values[0, :, 0, 0].tolist()
    assert torch.isnan(band_mean(values, torch.zeros(2, 1, 2, 2))).all()


def test_clearest_cover_is_the_least_cloudy_date() -> None:
    masks = torch.zeros(2, 3, 1, 4, 4)
    masks[0, 0] = 1.0
    masks[0, 1, ..., :2, :] = 1.0  # 50%
    masks[0, 2, ..., :1, :] = 1.0  # 25%: the clearest
    masks[1] = 1.0
    assert clearest_cover(masks).tolist() == [0.25, 1.0]


def _series(b: int = 3, k: int = 4) -> tuple[torch.Tensor, ...]:
    target = _image(15, (b, 13, 32, 32))
    noise = torch.randn(b, k, 13, 32, 32, generator=torch.Generator().manual_seed(16), dtype=torch.float64)
    samples = target.unsqueeze(1) + 0.02 * noise
    draft = target + 0.01
    mask = torch.zeros(b, 1, 32, 32)
    mask[..., :16] = 1.0
    return samples, target, mask, draft


def test_report_of_an_ensemble_has_every_metric_finite() -> None:
    samples, target, mask, draft = _series()
    report = sampler_report(samples, target, mask, draft)
    for key in ("psnr_sample", "psnr_mean", "ssim_sample", "ssim_mean", "sam_sample", "sam_mean", "change_mean",
                "change_p95", "change_mean_cloudy", "spread", "spread_cloudy", "hf_power_ratio_cloudy",
                "hf_power_ratio_clear", "hf_power_cloudy", "hf_power_target_cloudy", "hf_share_target_cloudy",
                "gradient_w1_cloudy", "gradient_w1_clear", "crps", "crps_cloudy",
                "spread_skill_cloudy", "ndvi_error_cloudy_sample", "ndvi_error_cloudy_mean"):
        assert math.isfinite(report[key]), key
    assert len(report["crps_band"]) == 13 and len(report["rank_histogram_cloudy"]) == 5
    assert sum(report["rank_histogram_cloudy"]) == pytest.approx(1.0)
    assert report["series"] == 3 and report["samples"] == 4 and report["cloudy_fraction"] == 0.5


def test_report_of_a_point_forecast_leaves_out_the_ensemble_metrics() -> None:
    samples, target, mask, _ = _series(k=1)
    report = sampler_report(samples, target, mask)
    assert report["crps"] == pytest.approx(float(mae(samples[:, 0], target)), rel=1e-12)
    assert report["psnr_sample"] == report["psnr_mean"]
    assert not {"spread", "spread_skill_cloudy", "rank_histogram_cloudy", "change_mean"} & set(report)


def test_stratified_report_bins_series_by_the_clearest_cover() -> None:
    samples, target, mask, draft = _series(b=3)
    cover = torch.tensor([0.0, 0.3, 1.0], dtype=torch.float64)
    reports = stratified_report(samples, target, mask, cover, draft)
    assert list(reports) == ["all", "clearest 0-5%", "clearest 25-50%", "clearest 50-100%"]
    assert [r["series"] for r in reports.values()] == [3, 1, 1, 1]
    single = sampler_report(samples[1:2], target[1:2], mask[1:2], draft[1:2])
    assert reports["clearest 25-50%"]["crps"] == pytest.approx(single["crps"])


def test_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match=r"\[B, K, C, H, W\]"):
        crps_ensemble(torch.zeros(1, 13, 4, 4), torch.zeros(1, 13, 4, 4))
    with pytest.raises(ValueError, match="does not fit ensemble shape"):
        crps_ensemble(torch.zeros(1, 4, 13, 4, 4), torch.zeros(1, 13, 4, 5))
