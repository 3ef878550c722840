"""Noise schedules, the noise-prediction objective and deterministic DDIM sampling.

Pure tensor functions with no model state, so the schedule maths is tested on its own and the
refiner and self-training share one implementation.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from vcloud.models.dtypes import at_least_float32

SCHEDULES = ("cosine", "linear")
PREDICTIONS = ("x0", "eps")
"""What the denoiser outputs: the clean sample (``x0``) or the noise that was added (``eps``)."""


def make_alphas_cumprod(schedule: str, timesteps: int) -> torch.Tensor:
    """Cumulative signal fraction alpha_bar_t for t = 0..timesteps-1 (float64, decreasing)."""
    if schedule == "linear":
        betas = torch.linspace(1e-4, 0.02, timesteps, dtype=torch.float64)
    elif schedule == "cosine":  # Nichol & Dhariwal (2021): gentler noising of low-noise steps
        s = 0.008
        steps = torch.arange(timesteps + 1, dtype=torch.float64) / timesteps
        f = torch.cos((steps + s) / (1 + s) * math.pi / 2) ** 2
        betas = (1 - f[1:] / f[:-1]).clamp(max=0.999)
    else:
        raise ValueError(f"unknown noise schedule {schedule!r} (allowed: {', '.join(SCHEDULES)})")
    return torch.cumprod(1.0 - betas, dim=0)


def q_sample(x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor, alphas_cumprod: torch.Tensor) -> torch.Tensor:
    """Noise a clean sample to step ``t``: sqrt(a) x0 + sqrt(1 - a) noise."""
    a = alphas_cumprod.to(x0.device)[t].to(x0.dtype).view(-1, *([1] * (x0.ndim - 1)))
    return a.sqrt() * x0 + (1 - a).sqrt() * noise


def ddim_timesteps(train_timesteps: int, steps: int) -> list[int]:
    """``steps`` evenly spaced training steps, from the noisiest down to 0.

    One step starts from the noisiest step (the denoiser's clean estimate from pure noise), not
    from step 0, where the denoiser expects an almost clean input."""
    if not 1 <= steps <= train_timesteps:
        raise ValueError(f"DDIM steps={steps} must be in 1..{train_timesteps}")
    if steps == 1:
        return [train_timesteps - 1]
    return sorted({round(x) for x in torch.linspace(0, train_timesteps - 1, steps).tolist()}, reverse=True)


def ddim_sample(
    predict: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    shape: tuple[int, ...],
    alphas_cumprod: torch.Tensor,
    steps: int,
    generator: torch.Generator | None,
    device: torch.device,
    clip_x0: float = 0.0,
    prediction: str = "eps",
) -> torch.Tensor:
    """Deterministic DDIM (eta = 0): the only randomness is the starting noise, so the same
    ``generator`` seed gives the same sample and different seeds give independent samples.

    ``predict(x, t)`` returns the noise (``prediction="eps"``) or the clean sample (``"x0"``).
    With ``x0`` a network that outputs zeros samples exactly zero, whatever the starting noise;
    with ``eps`` the same network returns the starting noise divided by sqrt(alpha_bar).

    ``clip_x0`` > 0 clamps each clean-sample estimate to [-clip_x0, clip_x0]: at the noisiest
    step x0 = (x - sqrt(1 - a) eps) / sqrt(a) divides by sqrt(a) ~ 0.003 (cosine schedule), so a
    small error in the predicted noise would otherwise become a huge one in the image."""
    if prediction not in PREDICTIONS:
        raise ValueError(f"unknown prediction {prediction!r} (allowed: {', '.join(PREDICTIONS)})")
    x = torch.randn(shape, generator=generator, device="cpu" if generator is None else generator.device)
    x = x.to(device)
    ac = alphas_cumprod.to(device=device, dtype=x.dtype)  # the default dtype: float32, or a float64 reference
    times = ddim_timesteps(len(alphas_cumprod), steps)
    x0 = x
    for i, t in enumerate(times):
        a_t = ac[t]
        a_prev = ac[times[i + 1]] if i + 1 < len(times) else torch.tensor(1.0, device=device)
        out = at_least_float32(predict(x, torch.full((shape[0],), t, device=device, dtype=torch.long)))
        if prediction == "eps":
            eps = out
            x0 = (x - (1 - a_t).sqrt() * eps) / a_t.sqrt()
            if clip_x0 > 0:
                x0 = x0.clamp(-clip_x0, clip_x0)
                eps = (x - a_t.sqrt() * x0) / (1 - a_t).sqrt()
        else:
            x0 = out.clamp(-clip_x0, clip_x0) if clip_x0 > 0 else out
            eps = (x - a_t.sqrt() * x0) / (1 - a_t).sqrt()
        x = a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps
    return x0


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of integer timesteps [B] -> [B, dim]."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=1)
    return torch.nn.functional.pad(emb, (0, dim % 2))
