"""Convolutional building blocks shared by the autoencoder, the draft model and the refiner."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def group_norm(channels: int, groups: int) -> nn.GroupNorm:
    """GroupNorm rather than BatchNorm: batch size is 1-2 per GPU in production."""
    return nn.GroupNorm(num_groups=min(groups, channels), num_channels=channels, eps=1e-6)


class ResBlock(nn.Module):
    """Pre-activation residual block, optionally conditioned on an embedding (diffusion time)."""

    def __init__(self, in_ch: int, out_ch: int, groups: int, emb_dim: int | None = None) -> None:
        super().__init__()
        self.norm1 = group_norm(in_ch, groups)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.emb = nn.Linear(emb_dim, out_ch) if emb_dim else None
        self.norm2 = group_norm(out_ch, groups)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.skip = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else nn.Identity()

    def forward(self, x: torch.Tensor, emb: torch.Tensor | None = None) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        if self.emb is not None and emb is not None:
            h = h + self.emb(F.silu(emb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class Downsample(nn.Module):
    """Strided 3x3 convolution halving the resolution."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Upsample(nn.Module):
    """Nearest-neighbour x2 followed by a 3x3 convolution (no checkerboard artefacts)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor, size: tuple[int, int] | None = None) -> torch.Tensor:
        if size is None:
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        else:
            x = F.interpolate(x, size=size, mode="nearest")
        return self.conv(x)
