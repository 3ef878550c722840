"""A refiner's export: the mean of K samples and how unsure they are, per pixel.

A refiner (stages 2 and 3) samples the posterior: one sample trades PSNR for texture, the mean of K
samples returns to the draft's accuracy, and their spread says where the model is unsure (under
thick clouds, on field edges). The export writes the mean and the spread, and states whether the
spread tracks the error: a spread that is large where the error is large is worth showing a user.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from vcloud.sampler_metrics import spread_skill_ratio

EXPORT_SAMPLES = 4
"""Samples a refiner's export draws per series (DDIM seeds ``EVAL_SEED`` .. ``EVAL_SEED + K - 1``)."""


@dataclass(frozen=True)
class SampleSummary:
    """K samples of one series reduced to what the export writes and states."""

    mean: torch.Tensor
    """[13, H, W] the mean of the samples: the exported prediction."""
    spread: torch.Tensor
    """[H, W] per-pixel standard deviation across the samples, averaged over the bands (reflectance)."""
    error_correlation: float
    """Pearson correlation over the pixels between ``spread`` and the mean's absolute error (averaged
    over the bands); NaN where either is constant."""
    spread_skill: float
    """:func:`vcloud.sampler_metrics.spread_skill_ratio` averaged over the bands (1: calibrated)."""

    def scores(self) -> dict[str, float]:
        return {"uncertainty": float(self.spread.mean()), "uncertainty_error_corr": self.error_correlation,
                "spread_skill": self.spread_skill}


def summarize_samples(samples: torch.Tensor, target: torch.Tensor) -> SampleSummary:
    """``samples`` [K, 13, H, W] (K >= 2) of one series against its ``target`` [13, H, W]."""
    if samples.dim() != 4 or samples.shape[0] < 2:
        raise ValueError(f"expected K >= 2 samples shaped [K, 13, H, W], got {tuple(samples.shape)}")
    samples = samples.float()
    mean = samples.mean(dim=0)
    spread = samples.std(dim=0, correction=0).mean(dim=0)
    error = (mean - target.float()).abs().mean(dim=0)
    ratio = spread_skill_ratio(samples.unsqueeze(0), target.float().unsqueeze(0))
    finite = ratio[torch.isfinite(ratio)]
    return SampleSummary(mean=mean, spread=spread, error_correlation=pearson(spread, error),
                         spread_skill=float(finite.mean()) if finite.numel() else math.inf)


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson correlation of two equally shaped tensors over all elements; NaN if either is constant."""
    x, y = a.flatten().double(), b.flatten().double()
    x, y = x - x.mean(), y - y.mean()
    norm = float(torch.sqrt((x * x).sum() * (y * y).sum()))
    return float((x * y).sum()) / norm if norm > 0 else math.nan


def mean_scores(per_series: list[dict[str, Any]]) -> dict[str, float]:
    """The mean of the uncertainty scores over the series that have them (NaN correlations left out)."""
    out = {}
    for name in ("uncertainty", "uncertainty_error_corr", "spread_skill"):
        values = [s[name] for s in per_series if name in s and math.isfinite(s[name])]
        out[name] = sum(values) / len(values) if values else math.nan
    return out
