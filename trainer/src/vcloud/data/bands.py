"""Band vocabulary and radiometric scaling shared by the raw reader, the prepared format and the metrics.

Scaling lives in one place so that the raw path and the prepared path produce identical tensors.
"""

from __future__ import annotations

import numpy as np

S2_BANDS: tuple[str, ...] = (
    "B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B8A", "B9", "B10", "B11", "B12",
)
"""Sentinel-2 L1C bands in SEN12MS-CR-TS order (13 bands)."""

S2_WAVELENGTH_NM: tuple[int, ...] = (443, 490, 560, 665, 705, 740, 783, 842, 865, 945, 1375, 1610, 2190)
"""Central wavelength of each band of :data:`S2_BANDS`, in nm."""

S1_BANDS: tuple[str, ...] = ("VV", "VH")
"""Sentinel-1 GRD polarisations in SEN12MS-CR-TS order, backscatter in dB."""

N_S2 = len(S2_BANDS)
N_S1 = len(S1_BANDS)

S2_DN_MAX = 10000
"""L1C digital numbers are reflectance x 10000; brighter values (saturated clouds) are clipped here."""

S1_DB_MIN = -25.0
S1_DB_MAX = 0.0
"""Sentinel-1 backscatter range kept; everything outside is clipped before scaling to [0, 1]."""

QUANT = 10000
"""Prepared stacks store every channel as uint16 in units of 1/QUANT of the [0, 1] range."""

CLOUD_CODES: dict[str, int] = {"clear": 0, "thin": 1, "thick": 2, "opaque": 3, "shadow": 4}
"""Per-pixel class codes of cloud masks (raw ``CLD`` files and prepared stacks)."""

CLOUD_TYPES: tuple[str, ...] = ("thin", "thick", "opaque")
"""Cloud types an observation can carry, from least to most severe; ``clear`` means none."""

OBSERVATION_TYPES: tuple[str, ...] = ("clear",) + CLOUD_TYPES


def scale_s2(dn: np.ndarray) -> np.ndarray:
    """L1C digital numbers -> float32 reflectance in [0, 1] (clip to 0..10000, divide, NaN -> 0)."""
    x = np.asarray(dn, dtype=np.float32)
    x = np.clip(x, 0.0, float(S2_DN_MAX)) / float(S2_DN_MAX)
    return np.nan_to_num(x, nan=0.0, posinf=1.0, neginf=0.0).astype(np.float32, copy=False)


def scale_s1(db: np.ndarray) -> np.ndarray:
    """Backscatter in dB -> float32 in [0, 1] (clip to [-25, 0], shift and divide, NaN -> 0)."""
    x = np.asarray(db, dtype=np.float32)
    x = (np.clip(x, S1_DB_MIN, S1_DB_MAX) - S1_DB_MIN) / (S1_DB_MAX - S1_DB_MIN)
    return np.nan_to_num(x, nan=0.0, posinf=1.0, neginf=0.0).astype(np.float32, copy=False)


def quantize(unit: np.ndarray) -> np.ndarray:
    """Values in [0, 1] -> uint16 in units of 1/QUANT (exact for S2 digital numbers)."""
    x = np.clip(np.nan_to_num(np.asarray(unit, dtype=np.float64), nan=0.0), 0.0, 1.0)
    return np.rint(x * QUANT).astype(np.uint16)


def dequantize(q: np.ndarray) -> np.ndarray:
    """uint16 in units of 1/QUANT -> float32 in [0, 1]."""
    return np.asarray(q, dtype=np.float32) / np.float32(QUANT)


def observation_type(codes: np.ndarray, min_fraction: float = 0.005) -> str:
    """The most severe cloud type covering at least ``min_fraction`` of a per-pixel class mask.

    Shadows do not make a type of their own: they come with thick or opaque clouds.
    """
    n = max(codes.size, 1)
    for name in reversed(CLOUD_TYPES):
        if np.count_nonzero(codes == CLOUD_CODES[name]) / n >= min_fraction:
            return name
    return "clear"


def cloud_fraction(codes: np.ndarray) -> float:
    """Fraction of pixels marked cloud or shadow in a per-pixel class mask."""
    return float(np.count_nonzero(codes) / max(codes.size, 1))
