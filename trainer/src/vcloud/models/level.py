"""Stage 2's level correction: the target date's radiometric level under its clouds, read from its
own clear pixels.

Most of the draft's error lies under the target date's clouds (81% of its squared error on the
``small`` test split), where the draft is made of the other dates. Each date carries its own
residual atmosphere and illumination (a per-band gain and offset) and its own season, and the
draft's local harmonisation reaches only a few pixels into a cloud; one per-band offset per series,
were it known, would lift the draft by 1.9 dB. The refiner sees neither the other dates nor any
scene-level statistic, so it cannot know that offset.

The target date's clear pixels show how its level differs from the other dates' where both are
seen. :func:`level_statistics` measures, per band, the draft minus the mean of the other dates'
clear observations on the target's clear pixels and under its clouds, the observation minus the
draft where it is clear, and the draft under the clouds minus the draft where clear; the
correction is a linear map of those differences to one offset per band, added to the draft under
the target date's cloud mask. Its weights start at zero, so an untrained correction returns the
draft bit for bit, and the validated start of stage 2 is stage 1's answer. They train at
:data:`LR_SCALE` times the stage's learning rate (:mod:`vcloud.optim`): offsets of a few
hundredths from features of a few tenths need weights of about 0.1, which the refiner's rate would
take a thousand steps to reach.
"""

from __future__ import annotations

import torch
from torch import nn

from vcloud.data.bands import N_S2
from vcloud.optim import scale_learning_rate

FEATURES = 4 * N_S2 + 3
"""Per band: the draft minus the other dates' clear mean on the target's clear pixels and under its
clouds, the observation minus the draft where clear, the draft under the clouds minus where clear;
then the cloud fraction and the shares of clear and cloudy target pixels another date sees clear."""
LR_SCALE = 10.0
"""The correction's learning rate as a multiple of the stage's (module docstring)."""
FEATURE_SCALE = 10.0
"""Reflectance differences of a few hundredths become features of a few tenths."""
MIN_PIXELS = 16
"""Fewer clear (or cloudy) target pixels than this: the statistics of that part are not trusted (0)."""


def _mean(values: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Weighted spatial mean [B, C] of [B, C, H, W] values under a [B, 1, H, W] weight; 0 where the
    weight holds fewer than :data:`MIN_PIXELS`."""
    mass = weight.sum(dim=(2, 3))
    mean = (values * weight).sum(dim=(2, 3)) / mass.clamp_min(1.0)
    return torch.where(mass >= MIN_PIXELS, mean, torch.zeros_like(mean))


def target_cloud(masks: torch.Tensor, target_index: torch.Tensor) -> torch.Tensor:
    """The target date's cloud mask [B, 1, H, W] (1 = cloud or shadow) of masks [B, T, 1, H, W]."""
    rows = torch.arange(masks.shape[0], device=masks.device)
    return masks[rows, target_index.long()].float()


def level_statistics(inputs: torch.Tensor, masks: torch.Tensor, target_index: torch.Tensor,
                     draft: torch.Tensor) -> torch.Tensor:
    """[B, T, 13, H, W] bands, [B, T, 1, H, W] masks, the draft [B, 13, H, W] -> [B, FEATURES]."""
    x, m = inputs.float(), masks.float()
    rows = torch.arange(x.shape[0], device=x.device)
    index = target_index.long()
    cloud = m[rows, index]
    clear = 1.0 - cloud
    observation = x[rows, index]
    others = torch.ones_like(m)
    others[rows, index] = 0.0
    seen = (1.0 - m) * others
    support = seen.sum(dim=1)
    other_mean = (seen * x).sum(dim=1) / support.clamp_min(1e-6)
    has_other = (support > 0).float()
    draft = draft.float()
    stats = [
        _mean(draft - other_mean, clear * has_other), _mean(draft - other_mean, cloud * has_other),
        _mean(observation - draft, clear), _mean(draft, cloud) - _mean(draft, clear),
    ]
    shares = torch.stack([cloud.mean(dim=(1, 2, 3)), (clear * has_other).mean(dim=(1, 2, 3)),
                          (cloud * has_other).mean(dim=(1, 2, 3))], dim=1)
    return torch.cat([FEATURE_SCALE * s for s in stats] + [shares], dim=1)


class LevelCorrection(nn.Module):
    """One offset per band [B, 13, 1, 1] from :func:`level_statistics`, applied under the target
    date's clouds (module docstring). Zero-initialised: the untrained correction is 0."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, N_S2)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        for parameter in self.linear.parameters():
            scale_learning_rate(parameter, LR_SCALE)

    def offsets(self, inputs: torch.Tensor, masks: torch.Tensor, target_index: torch.Tensor,
                draft: torch.Tensor) -> torch.Tensor:
        stats = level_statistics(inputs, masks, target_index, draft.detach())
        return self.linear(stats.to(self.linear.weight.dtype))[:, :, None, None]

    def forward(self, inputs: torch.Tensor, masks: torch.Tensor, target_index: torch.Tensor,
                draft: torch.Tensor) -> torch.Tensor:
        """The draft [B, 13, H, W] with the offsets added under the target date's clouds (unclamped)."""
        offsets = self.offsets(inputs, masks, target_index, draft)
        return draft + offsets.to(draft.dtype) * target_cloud(masks, target_index).to(draft.dtype)
