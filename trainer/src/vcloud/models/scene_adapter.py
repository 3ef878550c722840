"""Stage 3's scene adapter: a per-band radiometric correction of the draft, conditioned on the
scene's own statistics and zero for a scene typical of the labeled domain.

Another region or season differs first in its atmosphere: haze, path radiance and an imperfect
atmospheric correction lift or tilt every band of a whole scene. The draft model sees pixels and
local windows, not scenes, so fine-tuning it on another domain's pseudo-labels learned one
per-band offset for every series instead (measured with ``benchmarks/quality.py``: a fixed offset
of the bands, the same on every split, gave 92% of the fine-tuning's change). That offset helped
the hazier domain (+0.36 dB) and cost labeled locations whose bands were off the other way up to
0.4 dB, so the labeled validation split refused it.

The adapter maps the scene's statistics (the clear-pixel mean of each band over all dates, and
over the target date) to one offset per band: ``scale * W (s - center) / spread``, where
``center``/``spread`` are the statistics' mean and standard deviation over the labeled training
split and ``W`` starts at zero. There is no constant term: a scene whose statistics equal the
labeled domain's mean gets no correction, whatever the adapter learned, and the correction grows
with how far a scene's radiometry lies from the labeled domain's. ``center``/``spread`` are buffers,
so a checkpoint carries the reference it was trained against.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from vcloud.data.bands import N_S2
from vcloud.data.dataset import dataset_len

FEATURES = 2 * N_S2
"""Clear-pixel mean of each band over all dates, then over the target date."""
REFERENCE_SERIES = 256
"""Largest number of labeled series the reference statistics are computed from."""


class SceneAdapterError(RuntimeError):
    """The adapter was used before it had its labeled reference."""


def scene_statistics(inputs: torch.Tensor, masks: torch.Tensor, target_index: torch.Tensor) -> torch.Tensor:
    """[B, T, 13, H, W] bands and [B, T, 1, H, W] masks (1 = cloud or shadow) -> [B, 26].

    A target date with no clear pixel takes the all-dates mean, so an opaque target date does not
    read as a dark scene."""
    x = inputs.float()
    clear = 1.0 - masks.float()
    over_dates = (x * clear).sum(dim=(1, 3, 4)) / clear.sum(dim=(1, 3, 4)).clamp_min(1.0)
    rows = torch.arange(x.shape[0], device=x.device)
    index = target_index.long()
    target_clear = clear[rows, index]
    count = target_clear.sum(dim=(2, 3))
    target = (x[rows, index] * target_clear).sum(dim=(2, 3)) / count.clamp_min(1.0)
    target = torch.where(count > 0, target, over_dates)
    return torch.cat([over_dates, target], dim=1)


def reference_statistics(dataset: Dataset, limit: int = REFERENCE_SERIES,
                         batch_size: int = 16) -> torch.Tensor:
    """Scene statistics [N, 26] of up to ``limit`` series of ``dataset``, evenly spaced over it
    (the same series on every rank and every run)."""
    count = dataset_len(dataset)
    if count == 0:
        raise SceneAdapterError("the labeled training split is empty: no reference for the scene adapter")
    step = max(1, count // limit)
    chosen: Sequence[int] = range(0, count, step)[:limit]
    rows = []
    for start in range(0, len(chosen), batch_size):
        batch = default_collate([dataset[i] for i in chosen[start:start + batch_size]])
        rows.append(scene_statistics(batch["inputs"], batch["masks"], batch["target_index"]))
    return torch.cat(rows)


class SceneAdapter(nn.Module):
    """Per-band offset [B, 13, 1, 1] of the draft from the scene's statistics (module docstring)."""

    center: torch.Tensor
    spread: torch.Tensor
    fitted: torch.Tensor

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = float(scale)
        self.linear = nn.Linear(FEATURES, N_S2, bias=False)
        nn.init.zeros_(self.linear.weight)
        self.register_buffer("center", torch.zeros(FEATURES))
        self.register_buffer("spread", torch.ones(FEATURES))
        self.register_buffer("fitted", torch.zeros(()))  # 1 once fit_reference ran (float: DDP broadcasts it)

    def fit_reference(self, statistics: torch.Tensor) -> None:
        """Take ``center``/``spread`` from the labeled series' statistics [N, 26]."""
        if statistics.ndim != 2 or statistics.shape[1] != FEATURES or statistics.shape[0] < 2:
            raise SceneAdapterError(f"need [N >= 2, {FEATURES}] reference statistics, "
                                    f"got {list(statistics.shape)}")
        self.center.copy_(statistics.mean(dim=0))
        self.spread.copy_(statistics.std(dim=0).clamp_min(1e-4))
        self.fitted.fill_(1.0)

    def forward(self, inputs: torch.Tensor, masks: torch.Tensor, target_index: torch.Tensor) -> torch.Tensor:
        if float(self.fitted) != 1.0:
            raise SceneAdapterError("the scene adapter has no labeled reference: build stage 3 with the "
                                    "prepared dataset (BuildContext.data_root) or load a stage-3 checkpoint")
        z = (scene_statistics(inputs, masks, target_index) - self.center) / self.spread
        return (self.scale * self.linear(z.to(self.linear.weight.dtype)))[:, :, None, None]
