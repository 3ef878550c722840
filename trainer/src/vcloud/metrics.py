"""Image-quality metrics for 13-band reconstructions in [0, 1], used by training, baselines and export.

Every metric is computed **per sample** (over all bands and pixels) and then averaged over the batch, so a
batch score does not depend on how samples were grouped. Computation runs in float64 without gradients
(SSIM's blurs in float32, see :func:`ssim`).

* PSNR in dB with a data range of 1; identical images give ``inf``, capped at ``max_db`` (100 dB).
* SSIM with an 11x11 Gaussian window (sigma 1.5) per band, valid region only, K1=0.01, K2=0.03.
* SAM: the spectral angle between predicted and true 13-band vectors per pixel, in degrees.
* MAE and RMSE over all bands and pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from vcloud.contract import METRIC_NAMES

MAX_PSNR_DB = 100.0


def _prepare(pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if pred.shape != target.shape:
        raise ValueError(
            f"prediction shape {tuple(pred.shape)} differs from target shape {tuple(target.shape)}"
        )
    if pred.ndim != 4:
        raise ValueError(f"metrics expect [B, C, H, W] tensors, got shape {tuple(pred.shape)}")
    return pred.detach().to(torch.float64), target.detach().to(torch.float64)


def _reduce(per_sample: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return per_sample.mean()
    if reduction == "none":
        return per_sample
    raise ValueError(f"reduction {reduction!r} unknown (known: mean, none)")


@torch.no_grad()
def mse_per_sample(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    p, t = _prepare(pred, target)
    return ((p - t) ** 2).flatten(1).mean(dim=1)


@torch.no_grad()
def psnr(pred: torch.Tensor, target: torch.Tensor, *, data_range: float = 1.0, max_db: float = MAX_PSNR_DB,
         reduction: str = "mean") -> torch.Tensor:
    """Peak signal-to-noise ratio in dB over all bands, per sample, capped at ``max_db``."""
    mse = mse_per_sample(pred, target)
    value = 10.0 * torch.log10(data_range**2 / mse)  # inf where mse == 0
    return _reduce(torch.clamp(value, max=max_db), reduction)


def _gaussian_window(size: int, sigma: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    coords = torch.arange(size, dtype=dtype, device=device) - (size - 1) / 2.0
    g = torch.exp(-(coords**2) / (2.0 * sigma**2))
    return g / g.sum()


@torch.no_grad()
def ssim(pred: torch.Tensor, target: torch.Tensor, *, data_range: float = 1.0, window_size: int = 11,
         sigma: float = 1.5, reduction: str = "mean", blur_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Structural similarity with a Gaussian window, per band, averaged over bands and valid pixels.

    The Gaussian blurs run in float32 (depthwise float64 convolutions are several times slower on CPU)
    on values centred per sample and band; the SSIM formula itself is evaluated in float64. Scores agree
    with an all-float64 computation to about 1e-5 (relative); ``blur_dtype=torch.float64`` is that
    computation (for references and tests). Patches smaller than the window use the largest odd window
    that fits.
    """
    p, t = _prepare(pred, target)
    _, channels, height, width = p.shape
    size = min(window_size, height, width)
    size = size if size % 2 == 1 else size - 1
    g = _gaussian_window(size, sigma, blur_dtype, p.device)
    groups = 5 * channels  # the five local moments are blurred in one separable pass
    kh = g.view(1, 1, size, 1).repeat(groups, 1, 1, 1)
    kw = g.view(1, 1, 1, size).repeat(groups, 1, 1, 1)
    centre = 0.5 * (p.mean(dim=(2, 3), keepdim=True) + t.mean(dim=(2, 3), keepdim=True))
    pc, tc = (p - centre).to(blur_dtype), (t - centre).to(blur_dtype)
    moments = torch.cat([pc, tc, pc * pc, tc * tc, pc * tc], dim=1)
    blurred = F.conv2d(F.conv2d(moments, kh, groups=groups), kw, groups=groups).double()
    mu_pc, mu_tc, e_pp, e_tt, e_pt = blurred.split(channels, dim=1)
    var_p = e_pp - mu_pc**2
    var_t = e_tt - mu_tc**2
    cov = e_pt - mu_pc * mu_tc
    mu_p, mu_t = mu_pc + centre, mu_tc + centre

    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    ssim_map = ((2 * mu_p * mu_t + c1) * (2 * cov + c2)) / ((mu_p**2 + mu_t**2 + c1) * (var_p + var_t + c2))
    return _reduce(ssim_map.flatten(1).mean(dim=1), reduction)


@torch.no_grad()
def sam_degrees(pred: torch.Tensor, target: torch.Tensor, *, eps: float = 1e-12,
                reduction: str = "mean") -> torch.Tensor:
    """Mean spectral angle in degrees between predicted and true band vectors, per sample.

    Pixels where both spectra are zero count as 0 degrees; where only one is zero, as 90 degrees.
    """
    p, t = _prepare(pred, target)
    dot = (p * t).sum(dim=1)
    norm_p, norm_t = p.norm(dim=1), t.norm(dim=1)
    cos = dot / (norm_p * norm_t).clamp_min(eps)
    both_zero = (norm_p <= eps) & (norm_t <= eps)
    cos = torch.where(both_zero, torch.ones_like(cos), cos).clamp(-1.0, 1.0)
    angle = torch.rad2deg(torch.acos(cos))
    return _reduce(angle.flatten(1).mean(dim=1), reduction)


@torch.no_grad()
def mae(pred: torch.Tensor, target: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    p, t = _prepare(pred, target)
    return _reduce((p - t).abs().flatten(1).mean(dim=1), reduction)


@torch.no_grad()
def rmse(pred: torch.Tensor, target: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    return _reduce(torch.sqrt(mse_per_sample(pred, target)), reduction)


def per_sample(pred: torch.Tensor, target: torch.Tensor, *, clip: bool = True) -> dict[str, torch.Tensor]:
    """All metrics per sample ([B] float64 tensors). ``clip`` limits predictions to [0, 1] first, as an
    exported image would be."""
    if clip:
        pred = pred.detach().clamp(0.0, 1.0)
    return {
        "psnr": psnr(pred, target, reduction="none"),
        "ssim": ssim(pred, target, reduction="none"),
        "sam": sam_degrees(pred, target, reduction="none"),
        "mae": mae(pred, target, reduction="none"),
        "rmse": rmse(pred, target, reduction="none"),
    }


def evaluate(pred: torch.Tensor, target: torch.Tensor, *, clip: bool = True) -> dict[str, float]:
    """Batch means of every metric: ``{"psnr", "ssim", "sam", "mae", "rmse"}``."""
    return {name: float(v.mean()) for name, v in per_sample(pred, target, clip=clip).items()}


@dataclass
class MetricTotals:
    """Running per-sample means over many batches (a dataset's score is the mean over its samples)."""

    sums: dict[str, float] = field(default_factory=lambda: {name: 0.0 for name in METRIC_NAMES})
    count: int = 0

    def update(self, pred: torch.Tensor, target: torch.Tensor, *, clip: bool = True) -> dict[str, float]:
        """Add a batch; returns the batch's own means."""
        values = per_sample(pred, target, clip=clip)
        for name, v in values.items():
            self.sums[name] += float(v.sum())
        self.count += int(pred.shape[0])
        return {name: float(v.mean()) for name, v in values.items()}

    def means(self) -> dict[str, float]:
        if self.count == 0:
            return {name: math.nan for name in METRIC_NAMES}
        return {name: total / self.count for name, total in self.sums.items()}
