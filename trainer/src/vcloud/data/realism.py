"""What makes SEN12MS-CR-TS hard, as seeded knobs of the synthetic generator.

On the real series the no-training baselines score about 25-32 dB PSNR, because the dates that look
clear are not copies of the target date: clouds cover most of many dates (some pixels are never seen
clear), haze the cloud masks miss dims the visible bands more than the SWIR ones, every date has its
own residual atmosphere and illumination, fields are ploughed and harvested between dates, the
dates are co-registered to a fraction of a pixel and the sensor adds noise per band. Each of these is
one field of :class:`Realism`; :data:`REALISTIC` is the default of every preset and :data:`EASY`
switches them all off (the generator's earlier, much easier series).

Pure numpy, seeded by the caller's generator, so the same seed gives the same bytes everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vcloud.data.bands import S2_WAVELENGTH_NM
from vcloud.data.clouds import fractal_noise

WAVELENGTH_NM = np.asarray(S2_WAVELENGTH_NM, np.float32)

HAZE_REFLECTANCE = np.asarray([0.20, 0.18, 0.15, 0.12, 0.11, 0.10, 0.10, 0.09, 0.09, 0.07, 0.02, 0.05, 0.03],
                              np.float32)
"""Path reflectance a haze veil adds where it hides the surface (brighter in the blue)."""


@dataclass(frozen=True)
class Realism:
    """Knobs of the synthetic series' difficulty. Every draw uses the series' seeded generator."""

    cover_beta: tuple[float, float] = (0.9, 0.6)
    """Cloud cover of a cloudy date ~ Beta(a, b) (mean 0.6): many dates mostly cloudy, a few nearly clear."""
    persistent_cloud: float = 0.35
    """Share of series with an opaque cloud bank over the same pixels on every date (never seen clear)."""
    haze_probability: float = 0.7
    """Share of dates under a haze veil the cloud mask does not flag (sub-visible cirrus, aerosol)."""
    haze_optical_depth: tuple[float, float] = (0.05, 0.4)
    """Optical depth of a haze veil at 490 nm; other bands scale with (wavelength / 490 nm) ** -angstrom."""
    angstrom: float = 1.3
    """Angstrom exponent: how much harder haze hits the visible bands than the SWIR ones."""
    gain_sigma: float = 0.06
    """Per-date, per-band multiplicative residual of atmospheric correction and illumination."""
    offset_sigma: float = 0.01
    """Per-date, per-band additive residual (reflectance)."""
    noise_sigma: tuple[float, float] = (0.003, 0.012)
    """Sensor noise per band (reflectance), drawn once per series from this range for each band."""
    jitter_px: float = 0.6
    """Standard deviation of each date's co-registration shift, in pixels (subpixel, bilinear)."""
    harvest_probability: float = 0.6
    """Share of series whose crop fields are ploughed or harvested (crop to bare soil) at some date."""
    shadow_from_sun: bool = True
    """Shadows fall away from the sun: one azimuth per region, a length from the sun's elevation."""

    @property
    def enabled(self) -> bool:
        return self != EASY


EASY = Realism(cover_beta=(0.0, 0.0), persistent_cloud=0.0, haze_probability=0.0, haze_optical_depth=(0.0, 0.0),
               angstrom=0.0, gain_sigma=0.0, offset_sigma=0.0, noise_sigma=(0.002, 0.002), jitter_px=0.0,
               harvest_probability=0.0, shadow_from_sun=False)
"""The generator before these knobs: exact co-registration, no haze, one radiometry for every date."""

REALISTIC = Realism()


def haze_transmission(rng: np.random.Generator, realism: Realism, shape: tuple[int, int]) -> np.ndarray | None:
    """Per-band transmission [13, H, W] of a haze veil over the date, or None for a date without haze.

    The veil's optical depth varies smoothly over the patch; its spectral shape follows Angstrom's law.
    """
    if realism.haze_probability <= 0 or rng.random() >= realism.haze_probability:
        return None
    tau = rng.uniform(*realism.haze_optical_depth)
    spatial = 0.5 + fractal_noise(rng, shape, base_cells=2, octaves=3)  # 0.5..1.5
    spectral = (WAVELENGTH_NM / 490.0) ** (-realism.angstrom)
    return np.exp(-tau * spectral[:, None, None] * spatial[None]).astype(np.float32)


def apply_haze(scene: np.ndarray, transmission: np.ndarray | None) -> np.ndarray:
    """The surface seen through the veil plus the light the veil scatters back."""
    if transmission is None:
        return scene
    return (scene * transmission + HAZE_REFLECTANCE[:, None, None] * (1.0 - transmission)).astype(np.float32)


def radiometry(rng: np.random.Generator, realism: Realism) -> tuple[np.ndarray, np.ndarray]:
    """One date's per-band gain and offset (atmosphere and illumination the correction left)."""
    gain = 1.0 + rng.normal(0.0, realism.gain_sigma, 13) if realism.gain_sigma > 0 else np.ones(13)
    offset = rng.normal(0.0, realism.offset_sigma, 13) if realism.offset_sigma > 0 else np.zeros(13)
    return gain.astype(np.float32), offset.astype(np.float32)


def band_noise_sigma(rng: np.random.Generator, realism: Realism) -> np.ndarray:
    """The series' sensor noise per band."""
    lo, hi = realism.noise_sigma
    return rng.uniform(lo, hi, 13).astype(np.float32) if hi > lo else np.full(13, lo, np.float32)


def jitter_shift(rng: np.random.Generator, realism: Realism) -> tuple[float, float]:
    """One date's co-registration error (dy, dx) in pixels."""
    if realism.jitter_px <= 0:
        return 0.0, 0.0
    dy, dx = rng.normal(0.0, realism.jitter_px, 2)
    return float(dy), float(dx)


def shift_bilinear(image: np.ndarray, dy: float, dx: float) -> np.ndarray:
    """``image`` [..., H, W] moved by a subpixel (dy, dx), edges repeated (a resampled acquisition)."""
    if dy == 0.0 and dx == 0.0:
        return image
    h, w = image.shape[-2:]
    y = np.clip(np.arange(h, dtype=np.float32) - dy, 0, h - 1)
    x = np.clip(np.arange(w, dtype=np.float32) - dx, 0, w - 1)
    y0, x0 = np.floor(y).astype(int), np.floor(x).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (y - y0)[:, None], (x - x0)[None, :]
    top = image[..., y0, :][..., :, x0] * (1 - fx) + image[..., y0, :][..., :, x1] * fx
    bottom = image[..., y1, :][..., :, x0] * (1 - fx) + image[..., y1, :][..., :, x1] * fx
    return (top * (1 - fy) + bottom * fy).astype(image.dtype)


def sun_shadow_offset(rng: np.random.Generator, azimuth_deg: float, size: int) -> tuple[int, int]:
    """Where a cloud's shadow falls relative to it (dy, dx) in pixels: away from the sun's azimuth,
    longer when the sun is low (cloud base 1-3 km, elevation 25-65 degrees, 10 m pixels)."""
    elevation = np.radians(rng.uniform(25.0, 65.0))
    height_m = rng.uniform(1000.0, 3000.0)
    length = min(height_m / np.tan(elevation) / 10.0, float(size // 3))
    azimuth = np.radians(azimuth_deg + rng.normal(0.0, 5.0))
    return int(round(length * np.cos(azimuth))), int(round(-length * np.sin(azimuth)))


def harvest(rng: np.random.Generator, realism: Realism, n_obs: int) -> int | None:
    """The date from which the series' crop fields are bare soil (ploughed or harvested), or None."""
    if realism.harvest_probability <= 0 or n_obs < 2 or rng.random() >= realism.harvest_probability:
        return None
    return int(rng.integers(1, n_obs))

HAZIER = Realism(haze_probability=0.9, haze_optical_depth=(0.2, 0.6), gain_sigma=0.1, offset_sigma=0.02)
"""Another atmosphere: haze on nearly every date and thicker, and a worse atmospheric correction.
Series with these knobs are a shifted domain for a model trained on :data:`REALISTIC` ones (as a
new region or season is for a model trained on SEN12MS-CR-TS): the same land covers and clouds,
seen through air the labeled series never showed."""
