"""An extra haze veil over a series' input dates: the noise of stage 3's noisy student.

Self-training on a new region or season learns nothing from pseudo-labels alone when the student
sees what the teacher saw: it is asked to reproduce its own output. So the student sees the
pseudo-labelled series through more air than the teacher did, and learns to reach the teacher's
answer from hazier inputs, which is what a hazier domain asks of it.

The veil follows the atmospheric scattering model used in dehazing, ``I = J t + A (1 - t)``:
transmission ``t = exp(-tau (lambda / 490 nm) ** -angstrom * s(x, y))`` with a smooth spatial
factor ``s`` in [0.5, 1.5], and an airlight ``A`` that follows the same Angstrom law (aerosol
scatters the blue most). Cloud masks are unchanged: haze is what cloud masks miss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vcloud.data.bands import S2_WAVELENGTH_NM

REFERENCE_NM = 490.0
"""Wavelength at which the veil's optical depth and airlight are given (Sentinel-2 B2)."""
ANGSTROM = 1.3
"""Angstrom exponent of continental aerosol: how much harder haze hits the visible than the SWIR."""
AIRLIGHT_AT_REFERENCE = 0.18
"""Path reflectance of a thick veil at 490 nm; other bands scale with the Angstrom law."""
SPATIAL_CELLS = 4
"""The veil's thickness varies smoothly across the patch: a 4 x 4 grid of factors, interpolated."""


@dataclass(frozen=True)
class HazeVeil:
    """How thick an extra veil may be and how often a date gets one."""

    max_depth: float = 0.3
    """Largest optical depth at 490 nm (drawn uniformly from [0, max_depth] per date); 0 = no veil."""
    probability: float = 0.9
    """Chance that a given date gets a veil."""

    def __post_init__(self) -> None:
        if not 0 <= self.max_depth <= 3:
            raise ValueError(f"max_depth must be in [0, 3] (optical depth at 490 nm), got {self.max_depth}")
        if not 0 <= self.probability <= 1:
            raise ValueError(f"probability must be in [0, 1], got {self.probability}")

    @property
    def enabled(self) -> bool:
        return self.max_depth > 0 and self.probability > 0

    def apply(self, inputs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """``inputs`` [T, 13, H, W] (reflectance) seen through a veil per date; a new tensor."""
        if inputs.ndim != 4 or inputs.shape[1] != len(S2_WAVELENGTH_NM):
            raise ValueError(f"need inputs [T, 13, H, W], got {list(inputs.shape)}")
        if not self.enabled:
            return inputs.clone()
        dates, bands, height, width = inputs.shape
        depth = torch.rand(dates, 1, 1, 1, generator=generator) * self.max_depth
        depth = depth * (torch.rand(dates, 1, 1, 1, generator=generator) < self.probability)
        cells = torch.rand(dates, 1, SPATIAL_CELLS, SPATIAL_CELLS, generator=generator) + 0.5
        spatial = F.interpolate(cells, size=(height, width), mode="bilinear", align_corners=False)
        transmission = torch.exp(-depth * spectral_scale().view(1, bands, 1, 1) * spatial)
        return veil(inputs.float(), transmission).to(inputs.dtype)


def spectral_scale() -> torch.Tensor:
    """[13] optical depth (and airlight) of each band relative to 490 nm."""
    return (torch.tensor(S2_WAVELENGTH_NM, dtype=torch.float32) / REFERENCE_NM) ** (-ANGSTROM)


def veil(scene: torch.Tensor, transmission: torch.Tensor) -> torch.Tensor:
    """``scene`` [..., 13, H, W] through ``transmission`` (broadcastable): ``J t + A (1 - t)``."""
    airlight = (AIRLIGHT_AT_REFERENCE * spectral_scale()).view(len(S2_WAVELENGTH_NM), 1, 1)
    return scene * transmission + airlight * (1 - transmission)
