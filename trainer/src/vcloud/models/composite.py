"""Parameter-free steps of the draft's starting composite: local harmonisation and gap filling.

Both are differentiable and cheap (window sums from integral images, O(1) per pixel whatever the
window), and run in at least float32 also under bf16 autocast (window sums subtract large running
sums).

* :func:`harmonize` shifts another date's pixels by the local mean difference to the target,
  measured where both are clear and unchanged, so a date from another season brings its
  structure but the target's brightness (the idea of the local histogram matching used to fill
  Landsat 7's SLC-off gaps).
* :func:`fill_gaps` fills pixels no date sees clear by normalised convolution at growing radii,
  instead of copying a cloud from the least cloudy date.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vcloud.models.dtypes import at_least_float32


def window_sum(x: torch.Tensor, radius: int) -> torch.Tensor:
    """Sum over the ``(2r+1) x (2r+1)`` window around every pixel of ``x`` [..., H, W], clipped at
    the borders."""
    h, w = x.shape[-2:]
    padded = torch.nn.functional.pad(x, (1, 0, 1, 0))
    table = padded.cumsum(-2).cumsum(-1)  # table[..., i, j] = sum of x[..., :i, :j]
    ys = torch.arange(h, device=x.device)
    xs = torch.arange(w, device=x.device)
    top, bottom = (ys - radius).clamp(min=0), (ys + radius + 1).clamp(max=h)
    left, right = (xs - radius).clamp(min=0), (xs + radius + 1).clamp(max=w)
    rows = table[..., bottom, :] - table[..., top, :]
    return rows[..., right] - rows[..., left]


def harmonize(others: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, radius: int,
              min_support: float = 0.05) -> torch.Tensor:
    """``others`` [B, D, C, H, W] shifted towards ``target`` [B, C, H, W] by local mean differences.

    ``weight`` [B, D, H, W] says where a date and the target may be compared (both clear, land cover
    unchanged). Where less than ``min_support`` of the window can be compared, the shift fades out
    and the date keeps its own values.
    """
    with torch.autocast(device_type=others.device.type, enabled=False):
        others, target, weight = (at_least_float32(t) for t in (others, target, weight))
        w = weight[:, :, None]
        support = window_sum(w, radius)
        denom = support.clamp_min(1e-6)
        shift = (window_sum(w * target[:, None], radius) - window_sum(w * others, radius)) / denom
        area = float((2 * radius + 1) ** 2)
        trust = (support / (min_support * area)).clamp(max=1.0)
        return others + trust * shift


def fill_gaps(image: torch.Tensor, known: torch.Tensor, radii: Sequence[int]) -> torch.Tensor:
    """``image`` [B, C, H, W] with pixels of low ``known`` [B, 1, H, W] (0..1) replaced by the
    known-weighted mean of their neighbourhood, trying each radius in turn (small first)."""
    with torch.autocast(device_type=image.device.type, enabled=False):
        out, have = at_least_float32(image), at_least_float32(known).clamp(0.0, 1.0)
        for radius in radii:
            mass = window_sum(have, radius)
            estimate = window_sum(have * out, radius) / mass.clamp_min(1e-6)
            found = mass.clamp(max=1.0)  # at least one known pixel's worth in the window
            out = have * out + (1.0 - have) * (found * estimate + (1.0 - found) * out)
            have = have + (1.0 - have) * found
        return out
