"""Metrics that judge a posterior sampler (the stage-2 refiner) against the draft it refines.

PSNR and SSIM reward the mean of the posterior: a refiner that returns its draft unchanged, or one
whose samples all agree, can score as well as a useful one. These functions measure what those
scores miss: whether the refiner changes the draft at all, whether its samples differ, whether
their texture matches the target's, and whether their spread is calibrated against the error.

Shapes follow the trainer's: images ``[B, C, H, W]`` (C = 13 bands in [0, 1]), ensembles of K
samples ``[B, K, C, H, W]`` (a point forecast is an ensemble with K = 1), regions ``[B, 1, H, W]``
(true or 1 = in the region, e.g. the target date's cloud mask). Per-band results are ``[C]``
float64 tensors pooled over every series and pixel of the region (not averaged per series: a 95th
percentile or a distribution distance does not average). An empty region gives NaN.

* PSNR / SSIM / SAM of one sample (each of the K samples scored alone, averaged over K: the
  expected score of a single draw) and of the mean of the K samples (:func:`ensemble_scores`).
* Refiner collapse: the size of the change to the draft (:func:`refiner_change`) and the spread of
  the samples (:func:`ensemble_spread`).
* Texture: radially averaged power spectra in tapered windows inside a region
  (:func:`radial_power_spectrum`), the high-frequency power (:func:`high_frequency_power`), its
  share of the target's power (:func:`high_frequency_share`: whether there is texture to compare
  against) and its ratio, prediction over target (:func:`high_frequency_power_ratio`), and the
  Wasserstein distance between gradient-magnitude distributions (:func:`gradient_wasserstein`).
* Probabilistic skill: the fair ensemble CRPS (:func:`crps_ensemble`), the spread-skill ratio
  (:func:`spread_skill_ratio`) and the rank histogram (:func:`rank_histogram`).
* A downstream index: NDVI error (:func:`ndvi_error`).

:func:`sampler_report` puts them together for one set of series and :func:`stratified_report`
splits the series by the cloud cover of their clearest input date (:data:`COVER_EDGES`).
"""

from __future__ import annotations

import math

import torch

from vcloud import metrics
from vcloud.data.bands import S2_BANDS

RED_BAND = S2_BANDS.index("B4")
"""Index of Sentinel-2 B4 (665 nm), the red band of NDVI."""
NIR_BAND = S2_BANDS.index("B8")
"""Index of Sentinel-2 B8 (842 nm), the near-infrared band of NDVI."""

SPECTRUM_WINDOW = 16
"""Side in pixels of the square windows a region's power spectrum is averaged over."""
SPECTRUM_MIN_FRACTION = 0.9
"""A window belongs to a region when at least this fraction of its pixels does."""
HIGH_FREQUENCY_CUTOFF = 0.25
"""Radial frequencies above this (cycles per pixel) are "high": the upper half of the radial range
up to Nyquist (0.5), where blur removes power and noise adds it."""
HIGH_FREQUENCY_MIN_SHARE = 0.01
"""Below this share of the target's power above :data:`HIGH_FREQUENCY_CUTOFF` (pooled over bands,
:func:`high_frequency_share`), the high-frequency ratio is ill-conditioned: it divides the
prediction's noise by almost nothing. A random field whose power falls as 1/f^2 (as natural images'
does) puts about 8% of its power there; the synthetic clean scenes (:mod:`vcloud.data.synthetic`:
smooth fields, no sensor noise) put about 0.1% under the clouds of the tiny preset's test split,
so the inputs' sensor noise, left in a draft, reads as tens to hundreds of times the target's."""
CHANGE_QUANTILE = 0.95
"""The quantile of |sample - draft| reported next to its mean."""

COVER_EDGES: tuple[float, ...] = (0.0, 0.05, 0.25, 0.5, 1.0)
"""Bins of the cloud cover of a series' clearest input date: [0, 5%) nearly clear, [5%, 25%)
partly, [25%, 50%) mostly cloudy, [50%, 100%] no date shows most of the scene. The clearest date
decides how much a draft can copy, so a sampler's behaviour is compared within bins."""


# ---- shapes and pooling -----------------------------------------------------------------------

def _as_ensemble(samples: torch.Tensor) -> torch.Tensor:
    if samples.ndim != 5:
        raise ValueError(f"an ensemble is [B, K, C, H, W], got shape {tuple(samples.shape)}")
    return samples.detach().to(torch.float64)


def _check_target(samples: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if target.ndim != 4 or target.shape != samples.shape[:1] + samples.shape[2:]:
        raise ValueError(f"target shape {tuple(target.shape)} does not fit ensemble shape {tuple(samples.shape)} "
                         "(expected [B, C, H, W] with the ensemble's B, C, H, W)")
    return target.detach().to(torch.float64)


def band_values(values: torch.Tensor, where: torch.Tensor | None = None) -> torch.Tensor:
    """``[C, M]``: the values of each band at every pixel of ``where`` (``values`` [B, C, H, W] or
    [B, K, C, H, W], ``where`` [B, 1, H, W] or None for every pixel)."""
    channels = values.shape[-3]
    if where is None:
        return values.movedim(-3, 0).reshape(channels, -1)
    region = where.to(device=values.device).bool()
    if values.ndim == 5:
        region = region.unsqueeze(1)
    region = region.expand_as(values)
    return values.movedim(-3, 0)[region.movedim(-3, 0)].reshape(channels, -1)


def band_mean(values: torch.Tensor, where: torch.Tensor | None = None) -> torch.Tensor:
    """``[C]``: the mean of each band over the pixels of ``where`` (NaN when it is empty)."""
    pooled = band_values(values.to(torch.float64), where)
    if pooled.shape[1] == 0:
        return torch.full((pooled.shape[0],), math.nan, dtype=torch.float64)
    return pooled.mean(dim=1)


def quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """The ``q`` quantile along the last dimension with linear interpolation (numpy's default),
    for any size (``torch.quantile`` refuses inputs of more than 2**24 values)."""
    if values.shape[-1] == 0:
        return torch.full(values.shape[:-1], math.nan, dtype=torch.float64)
    ordered = values.to(torch.float64).sort(dim=-1).values
    position = q * (values.shape[-1] - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[..., low] + (position - low) * (ordered[..., high] - ordered[..., low])


# ---- scores of one sample and of the ensemble mean --------------------------------------------

def ensemble_scores(samples: torch.Tensor, target: torch.Tensor, *, clip: bool = True) -> dict[str, float]:
    """PSNR, SSIM and SAM (:mod:`vcloud.metrics`) of one sample and of the mean of the K samples.

    ``*_sample``: each sample scored alone, averaged over the K samples and the series (the expected
    score of one draw). ``*_mean``: the per-pixel mean of the K samples scored. The mean of a
    spread-out ensemble scores higher PSNR than its members; a collapsed ensemble scores the same."""
    ensemble = _as_ensemble(samples)
    truth = _check_target(ensemble, target)
    k = ensemble.shape[1]
    single = [metrics.per_sample(ensemble[:, i], truth, clip=clip) for i in range(k)]
    mean = metrics.per_sample(ensemble.mean(dim=1), truth, clip=clip)
    scores: dict[str, float] = {}
    for name in ("psnr", "ssim", "sam"):
        scores[f"{name}_sample"] = float(torch.stack([s[name] for s in single]).mean())
        scores[f"{name}_mean"] = float(mean[name].mean())
    return scores


# ---- refiner collapse -------------------------------------------------------------------------

def refiner_change(samples: torch.Tensor, draft: torch.Tensor,
                   where: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """How far the samples move from the draft they refine: the mean and the 95th percentile of
    |sample - draft| per band, over every sample and pixel of ``where``.

    A refiner that learned to return its draft (a zero residual is a low-loss answer) shows zeros
    here whatever its PSNR."""
    ensemble = _as_ensemble(samples)
    change = (ensemble - _check_target(ensemble, draft).unsqueeze(1)).abs()
    pooled = band_values(change, where)
    if pooled.shape[1] == 0:
        nan = torch.full((pooled.shape[0],), math.nan, dtype=torch.float64)
        return {"mean": nan, "p95": nan.clone()}
    return {"mean": pooled.mean(dim=1), "p95": quantile(pooled, CHANGE_QUANTILE)}


def ensemble_spread(samples: torch.Tensor, where: torch.Tensor | None = None) -> torch.Tensor:
    """``[C]``: the per-pixel standard deviation across the K samples (unbiased, K - 1 in the
    denominator), averaged per band. Zero when every sample is the same image: a sampler that
    collapsed to a point forecast. Needs K >= 2."""
    ensemble = _as_ensemble(samples)
    if ensemble.shape[1] < 2:
        raise ValueError(f"the spread of an ensemble needs at least 2 samples, got K={ensemble.shape[1]}")
    return band_mean(ensemble.std(dim=1, correction=1), where)


# ---- texture ----------------------------------------------------------------------------------

def _window_radius_bins(size: int, device: torch.device) -> torch.Tensor:
    freq = torch.fft.fftfreq(size, device=device, dtype=torch.float64)  # cycles per pixel
    radius = torch.sqrt(freq[:, None] ** 2 + freq[None, :] ** 2)
    return torch.round(radius * size).long()  # radial bin k holds frequencies near k / size


def radial_power_spectrum(images: torch.Tensor, where: torch.Tensor | None = None, *,
                          window: int = SPECTRUM_WINDOW,
                          min_fraction: float = SPECTRUM_MIN_FRACTION) -> tuple[torch.Tensor, int]:
    """The radially averaged power spectrum of each band inside a region: ``([C, window // 2 + 1],
    number of windows)``; bin k holds radial frequencies near k / window cycles per pixel, from 0
    to Nyquist (frequencies beyond Nyquist, the corners of the 2-D spectrum, are left out).

    How a spectrum is restricted to a region: the images are cut into non-overlapping
    ``window`` x ``window`` tiles (rows and columns beyond the last whole tile are left out) and
    only tiles with at least ``min_fraction`` of their pixels in ``where`` count. Each tile has its per-band mean removed and is tapered with a 2-D Hann window
    before the FFT, and the power is averaged over the tiles. Multiplying an image by a binary mask
    instead would add the mask's own edges to the spectrum (broadband power that is neither the
    prediction's nor the target's texture); tiles inside the region, tapered so that their borders
    do not leak, keep the spectrum the region's own. The power is normalised by the taper's energy,
    so a bin's value does not depend on the window size. NaN with no such tile."""
    if images.ndim != 4:
        raise ValueError(f"spectra need [B, C, H, W] images, got shape {tuple(images.shape)}")
    x = images.detach().to(torch.float64)
    channels = x.shape[1]
    tiles = x.unfold(2, window, window).unfold(3, window, window)  # [B, C, nh, nw, w, w]
    if where is None:
        keep = torch.ones(tiles.shape[0], tiles.shape[2], tiles.shape[3], dtype=torch.bool, device=x.device)
    else:
        fraction = where.to(device=x.device, dtype=torch.float64)[:, 0].unfold(1, window, window).unfold(
            2, window, window).mean(dim=(-1, -2))  # [B, nh, nw]
        keep = fraction >= min_fraction - 1e-12
    chosen = tiles.permute(1, 0, 2, 3, 4, 5)[:, keep]  # [C, N, w, w]
    bins = window // 2 + 1
    count = int(chosen.shape[1])
    if count == 0:
        return torch.full((channels, bins), math.nan, dtype=torch.float64), 0
    taper = torch.hann_window(window, periodic=False, dtype=torch.float64, device=x.device)
    taper2d = taper[:, None] * taper[None, :]
    centred = chosen - chosen.mean(dim=(-1, -2), keepdim=True)
    power = torch.fft.fft2(centred * taper2d).abs().pow(2).mean(dim=1) / taper2d.pow(2).sum()  # [C, w, w]
    radius = _window_radius_bins(window, x.device).flatten()
    inside = radius < bins
    sums = torch.zeros(channels, bins, dtype=torch.float64, device=x.device)
    sums.index_add_(1, radius[inside], power.flatten(1)[:, inside])
    counts = torch.bincount(radius[inside], minlength=bins).to(torch.float64)
    return sums / counts, count


def _high_bins(spectrum: torch.Tensor, window: int, cutoff: float) -> torch.Tensor:
    return torch.arange(spectrum.shape[1], device=spectrum.device) / window > cutoff


def high_frequency_power(images: torch.Tensor, where: torch.Tensor | None = None, *,
                         window: int = SPECTRUM_WINDOW, min_fraction: float = SPECTRUM_MIN_FRACTION,
                         cutoff: float = HIGH_FREQUENCY_CUTOFF) -> torch.Tensor:
    """``[C]``: the power at radial frequencies above ``cutoff`` cycles per pixel, averaged over the
    windows of ``where`` (the sum of those bins of :func:`radial_power_spectrum`; a band of white
    noise of variance s^2 gives about 4 s^2). NaN where the region has no window."""
    spectrum, _ = radial_power_spectrum(images, where, window=window, min_fraction=min_fraction)
    return spectrum[:, _high_bins(spectrum, window, cutoff)].sum(dim=1)


def high_frequency_share(images: torch.Tensor, where: torch.Tensor | None = None, *,
                         window: int = SPECTRUM_WINDOW, min_fraction: float = SPECTRUM_MIN_FRACTION,
                         cutoff: float = HIGH_FREQUENCY_CUTOFF) -> float:
    """The fraction of the images' power (every radial bin but 0, pooled over bands and windows)
    that lies above ``cutoff``: how much high-frequency texture there is to compare against
    (:data:`HIGH_FREQUENCY_MIN_SHARE`). NaN where the region has no window or the images no power."""
    spectrum, _ = radial_power_spectrum(images, where, window=window, min_fraction=min_fraction)
    total = float(spectrum[:, 1:].sum())
    if not total > 0:
        return math.nan
    return float(spectrum[:, _high_bins(spectrum, window, cutoff)].sum()) / total


def high_frequency_power_ratio(pred: torch.Tensor, target: torch.Tensor, where: torch.Tensor | None = None, *,
                               window: int = SPECTRUM_WINDOW, min_fraction: float = SPECTRUM_MIN_FRACTION,
                               cutoff: float = HIGH_FREQUENCY_CUTOFF) -> torch.Tensor:
    """``[C]``: the prediction's power over the target's at radial frequencies above ``cutoff``
    cycles per pixel, in the same windows of ``where`` (:func:`high_frequency_power`).

    1 is the target's texture; below 1 the prediction is smoother (a blurred mean, a collapsed
    sampler), above 1 it is noisier. NaN where the region has no window or the target no power.
    A band whose target is nearly flat at high frequency (B10, the cirrus band, is nearly constant
    over land) gives a ratio of thousands for a trace of noise: pool the bands' powers before
    dividing (:func:`sampler_report`) rather than average these ratios."""
    pred_high = high_frequency_power(pred, where, window=window, min_fraction=min_fraction, cutoff=cutoff)
    target_high = high_frequency_power(target, where, window=window, min_fraction=min_fraction, cutoff=cutoff)
    ratio = pred_high / target_high
    return torch.where(target_high > 0, ratio, torch.full_like(ratio, math.nan))


def gradient_magnitude(images: torch.Tensor) -> torch.Tensor:
    """``[B, C, H - 1, W - 1]``: the length of the forward-difference gradient at each pixel."""
    x = images.detach().to(torch.float64)
    dx = x[..., :-1, 1:] - x[..., :-1, :-1]
    dy = x[..., 1:, :-1] - x[..., :-1, :-1]
    return torch.sqrt(dx * dx + dy * dy)


def gradient_wasserstein(pred: torch.Tensor, target: torch.Tensor, where: torch.Tensor | None = None) -> torch.Tensor:
    """``[C]``: the 1-D Wasserstein-1 distance between the distributions of gradient magnitude of
    the prediction and of the target over the pixels of ``where`` (a pixel counts when it is in the
    region; its gradient uses its right and lower neighbours).

    It compares how much edge and texture there is, not where: a sample with the target's texture
    shifted by a pixel scores nearly 0, a blurred one does not. Both distributions have one value per
    pixel, so the distance is the mean absolute difference of the sorted values."""
    if pred.shape != target.shape:
        raise ValueError(f"prediction shape {tuple(pred.shape)} differs from target shape {tuple(target.shape)}")
    region = None if where is None else where[..., :-1, :-1]
    a = band_values(gradient_magnitude(pred), region)
    b = band_values(gradient_magnitude(target), region)
    if a.shape[1] == 0:
        return torch.full((a.shape[0],), math.nan, dtype=torch.float64)
    return (a.sort(dim=1).values - b.sort(dim=1).values).abs().mean(dim=1)


# ---- probabilistic skill ----------------------------------------------------------------------

def crps_map(samples: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``[B, C, H, W]``: the fair (unbiased) ensemble CRPS at every pixel,

        CRPS = 1/K sum_i |x_i - y| - 1/(2 K (K - 1)) sum_i sum_j |x_i - x_j|,

    whose expectation over ensembles drawn from a distribution F is the CRPS of F itself (Ferro
    2014); the plain estimator, 1/(2 K^2) in the second term, favours ensembles that are too narrow.
    For K = 1 the second term is zero and the CRPS is the absolute error. The pair sum uses the
    sorted samples, sum_{i<j} (x_(j) - x_(i)) = sum_i (2 i - K + 1) x_(i), in O(K log K)."""
    ensemble = _as_ensemble(samples)
    truth = _check_target(ensemble, target)
    k = ensemble.shape[1]
    skill = (ensemble - truth.unsqueeze(1)).abs().mean(dim=1)
    if k == 1:
        return skill
    ordered = ensemble.sort(dim=1).values
    weights = (2 * torch.arange(k, dtype=torch.float64, device=ordered.device) - k + 1).view(1, k, 1, 1, 1)
    pairs = 2.0 * (weights * ordered).sum(dim=1)  # sum over ordered pairs i != j of |x_i - x_j|
    return skill - pairs / (2.0 * k * (k - 1))


def crps_ensemble(samples: torch.Tensor, target: torch.Tensor, where: torch.Tensor | None = None) -> torch.Tensor:
    """``[C]``: the fair ensemble CRPS (:func:`crps_map`) averaged per band over ``where``; in the
    units of the reflectance, lower is better, and equal to the MAE for a point forecast."""
    return band_mean(crps_map(samples, target), where)


def spread_skill_ratio(samples: torch.Tensor, target: torch.Tensor, where: torch.Tensor | None = None) -> torch.Tensor:
    """``[C]``: sqrt((K + 1) / K) * spread / RMSE of the ensemble mean, per band over ``where``,
    where spread is the square root of the mean unbiased per-pixel variance of the K samples.

    When the target is one more draw from the distribution the samples come from, the ensemble
    mean's expected squared error is (K + 1) / K times the expected ensemble variance (the mean of
    K draws misses the truth by the truth's own variance plus 1/K of it); the factor makes a
    calibrated sampler score 1 for any K. Below 1 the sampler is overconfident (a collapsed
    sampler: 0), above 1 underconfident; infinite where the ensemble mean is exact. Needs K >= 2."""
    ensemble = _as_ensemble(samples)
    truth = _check_target(ensemble, target)
    k = ensemble.shape[1]
    if k < 2:
        raise ValueError(f"the spread-skill ratio needs at least 2 samples, got K={k}")
    variance = band_mean(ensemble.var(dim=1, correction=1), where)
    mse = band_mean((ensemble.mean(dim=1) - truth) ** 2, where)
    return math.sqrt((k + 1) / k) * torch.sqrt(variance) / torch.sqrt(mse)


def rank_histogram(samples: torch.Tensor, target: torch.Tensor, where: torch.Tensor | None = None, *,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """``[C, K + 1]`` int64: per band, how often the target has rank r among the K samples (r
    samples below it), over the pixels of ``where``.

    A calibrated sampler gives a flat histogram; a U shape is too little spread (the target often
    falls outside the samples), a dome too much, a slope a bias. Ties (clamped values, a collapsed
    ensemble) are broken at random among the tied positions (``generator``, seed 0 by default), so
    a tie spreads over the bins instead of piling into one."""
    ensemble = _as_ensemble(samples)
    truth = _check_target(ensemble, target).unsqueeze(1)
    k = ensemble.shape[1]
    below = (ensemble < truth).sum(dim=1)
    tied = (ensemble == truth).sum(dim=1)
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    uniform = torch.rand(below.shape, generator=generator, dtype=torch.float64).to(below.device)
    rank = below + torch.floor(uniform * (tied + 1)).long()
    pooled = band_values(rank, where)
    return torch.stack([torch.bincount(row, minlength=k + 1) for row in pooled])


# ---- downstream index -------------------------------------------------------------------------

def ndvi(images: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """``[B, 1, H, W]``: (NIR - red) / (NIR + red) from B8 and B4; 0 where both are dark."""
    x = images.detach().to(torch.float64)
    red, nir = x[:, RED_BAND:RED_BAND + 1], x[:, NIR_BAND:NIR_BAND + 1]
    total = nir + red
    return torch.where(total > eps, (nir - red) / total.clamp_min(eps), torch.zeros_like(total))


def ndvi_error(pred: torch.Tensor, target: torch.Tensor, where: torch.Tensor | None = None) -> float:
    """Mean |NDVI(pred) - NDVI(target)| over ``where`` (NaN when empty). NDVI is what a vegetation
    user reads off a reconstruction; a ratio of two bands, it is blind to a common gain and
    sensitive to a band-dependent one, which PSNR weighs the other way round."""
    if pred.shape != target.shape:
        raise ValueError(f"prediction shape {tuple(pred.shape)} differs from target shape {tuple(target.shape)}")
    return float(band_mean((ndvi(pred) - ndvi(target)).abs(), where)[0])


# ---- reports ----------------------------------------------------------------------------------

def _band_and_mean(report: dict[str, object], name: str, values: torch.Tensor) -> None:
    report[f"{name}_band"] = [float(v) for v in values]
    report[name] = float(values.mean())


def _high_frequency_fields(report: dict[str, object], name: str, ensemble: torch.Tensor, truth: torch.Tensor,
                           region: torch.Tensor) -> None:
    """The ``hf_*_{name}`` fields of :func:`sampler_report` for one region."""
    k = ensemble.shape[1]
    target_power = high_frequency_power(truth, region)
    sample_power = torch.stack([high_frequency_power(ensemble[:, i], region) for i in range(k)]).mean(dim=0)
    _band_and_mean(report, f"hf_power_{name}", sample_power)
    _band_and_mean(report, f"hf_power_target_{name}", target_power)
    undefined = torch.full_like(sample_power, math.nan)
    band_ratio = torch.where(target_power > 0, sample_power / target_power, undefined)
    report[f"hf_power_ratio_{name}_band"] = [float(v) for v in band_ratio]
    pooled = float(target_power.sum())
    report[f"hf_power_ratio_{name}"] = float(sample_power.sum()) / pooled if pooled > 0 else math.nan
    share = high_frequency_share(truth, region)
    report[f"hf_share_target_{name}"] = share
    report[f"hf_power_ratio_{name}_conditioned"] = bool(share >= HIGH_FREQUENCY_MIN_SHARE)


def sampler_report(samples: torch.Tensor, target: torch.Tensor, cloud_mask: torch.Tensor,
                   draft: torch.Tensor | None = None) -> dict[str, object]:
    """Every metric of this module for one set of series: ``samples`` [B, K, C, H, W] (K = 1: a
    point forecast), ``target`` [B, C, H, W], ``cloud_mask`` [B, 1, H, W] (the target date's
    clouds and shadows; "cloudy" is under it, "clear" outside it) and, for a refiner, the ``draft``
    [B, C, H, W] it refined.

    Texture (high-frequency power, gradient distance) is measured on each sample and averaged
    over the K samples: the mean of K samples is smoother than any of them by construction, so its
    texture says nothing about the sampler's. NDVI error is given for both (``*_sample``, ``*_mean``).

    High frequency, per region (``cloudy``, ``clear``): ``hf_power_*`` the samples' power above
    :data:`HIGH_FREQUENCY_CUTOFF` and ``hf_power_target_*`` the target's (band means), and
    ``hf_power_ratio_*`` their ratio pooled over bands (the sum of the samples' powers over the sum
    of the target's, so that a band with next to no target power does not dominate; its
    ``*_band`` list holds each band's own ratio). ``hf_share_target_*`` is the share of the
    target's power that lies that high and ``hf_power_ratio_*_conditioned`` whether it reaches
    :data:`HIGH_FREQUENCY_MIN_SHARE`: when it does not, the ratio compares the prediction's noise
    with almost nothing and says little about texture.

    Scalars are band means; ``*_band`` keys hold the per-band lists. The spread, the spread-skill
    ratio and the rank histogram need K >= 2 and the refiner's change a draft: they are left out
    otherwise. The spread-skill ratio and the rank histogram are taken under the clouds, where the
    sampler has to guess (in clear pixels the target date's observation shows the answer)."""
    ensemble = _as_ensemble(samples)
    truth = _check_target(ensemble, target)
    cloudy = cloud_mask.bool()
    clear = ~cloudy
    k = ensemble.shape[1]
    mean = ensemble.mean(dim=1)
    report: dict[str, object] = {"series": int(ensemble.shape[0]), "samples": k,
                                 "cloudy_fraction": float(cloudy.double().mean())}
    report.update(ensemble_scores(ensemble, truth))
    if draft is not None:
        change = refiner_change(ensemble, draft)
        _band_and_mean(report, "change_mean", change["mean"])
        _band_and_mean(report, "change_p95", change["p95"])
        _band_and_mean(report, "change_mean_cloudy", refiner_change(ensemble, draft, cloudy)["mean"])
    if k >= 2:
        _band_and_mean(report, "spread", ensemble_spread(ensemble))
        _band_and_mean(report, "spread_cloudy", ensemble_spread(ensemble, cloudy))
    for name, region in (("cloudy", cloudy), ("clear", clear)):
        _high_frequency_fields(report, name, ensemble, truth, region)
        distance = torch.stack([gradient_wasserstein(ensemble[:, i], truth, region) for i in range(k)])
        _band_and_mean(report, f"gradient_w1_{name}", distance.mean(dim=0))
    _band_and_mean(report, "crps", crps_ensemble(ensemble, truth))
    _band_and_mean(report, "crps_cloudy", crps_ensemble(ensemble, truth, cloudy))
    if k >= 2:
        _band_and_mean(report, "spread_skill_cloudy", spread_skill_ratio(ensemble, truth, cloudy))
        counts = rank_histogram(ensemble, truth, cloudy).sum(dim=0)
        report["rank_histogram_cloudy"] = [float(c) / max(float(counts.sum()), 1.0) for c in counts]
    report["ndvi_error_cloudy_sample"] = float(sum(ndvi_error(ensemble[:, i], truth, cloudy) for i in range(k)) / k)
    report["ndvi_error_cloudy_mean"] = ndvi_error(mean, truth, cloudy)
    return report


def clearest_cover(masks: torch.Tensor) -> torch.Tensor:
    """``[B]``: the cloud cover of each series' clearest input date (``masks`` [B, T, 1, H, W])."""
    return masks.detach().to(torch.float64).flatten(2).mean(dim=2).min(dim=1).values


def cover_label(low: float, high: float) -> str:
    """The name of a cover bin, e.g. ``clearest 5-25%``."""
    return f"clearest {100 * low:g}-{100 * high:g}%"


def stratified_report(samples: torch.Tensor, target: torch.Tensor, cloud_mask: torch.Tensor, cover: torch.Tensor,
                      draft: torch.Tensor | None = None,
                      edges: tuple[float, ...] = COVER_EDGES) -> dict[str, dict[str, object]]:
    """:func:`sampler_report` of all series (``"all"``) and of each bin of ``cover`` (the clearest
    input date's cloud cover, :func:`clearest_cover`) between consecutive ``edges``: [low, high),
    the last bin closed. Empty bins are left out."""
    reports = {"all": sampler_report(samples, target, cloud_mask, draft)}
    for i, (low, high) in enumerate(zip(edges[:-1], edges[1:])):
        last = i == len(edges) - 2
        chosen = (cover >= low) & ((cover <= high) if last else (cover < high))
        index = chosen.nonzero().flatten().to(samples.device)
        if index.numel() == 0:
            continue
        reports[cover_label(low, high)] = sampler_report(
            samples[index], target[index], cloud_mask[index], None if draft is None else draft[index])
    return reports
