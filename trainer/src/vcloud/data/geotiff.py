"""Thin rasterio I/O for the raw layout. Every call opens and closes its file.

Dataset handles from rasterio cannot be pickled, so nothing here is kept open between calls: a
``Dataset`` that reads raw files can be sent to DataLoader workers (fork or spawn) safely.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rasterio
from rasterio.transform import Affine

from vcloud.data.bands import N_S1, N_S2, scale_s1, scale_s2


@dataclass(frozen=True)
class GeoRef:
    """Coordinate reference system and pixel-to-map affine transform of a patch."""

    crs: str
    """Authority string such as ``EPSG:32632`` (WKT when the CRS has no EPSG code)."""
    transform: tuple[float, float, float, float, float, float]
    """Affine coefficients ``(a, b, c, d, e, f)`` in rasterio order: x = a*col + b*row + c."""

    @property
    def affine(self) -> Affine:
        return Affine(*self.transform)


def write_geotiff(path: Path, array: np.ndarray, georef: GeoRef, nodata: float | None = None) -> None:
    """Write a [bands, H, W] array as a tiled-free, uncompressed GeoTIFF (the SEN12MS-CR-TS form)."""
    if array.ndim != 3:
        raise ValueError(f"expected a [bands, H, W] array for {path}, got shape {array.shape}")
    path.parent.mkdir(parents=True, exist_ok=True)
    count, height, width = array.shape
    with rasterio.open(
        path, "w", driver="GTiff", width=width, height=height, count=count, dtype=array.dtype.name,
        crs=georef.crs, transform=georef.affine, nodata=nodata,
    ) as dst:
        dst.write(array)


def read_georef(path: Path) -> GeoRef:
    with rasterio.open(path) as src:
        if src.crs is None:
            raise ValueError(f"{path} has no CRS; SEN12MS-CR-TS patches are georeferenced GeoTIFFs")
        crs = src.crs.to_string()
        t = src.transform
    return GeoRef(crs=crs, transform=(t.a, t.b, t.c, t.d, t.e, t.f))


def read_bands(path: Path, expected: int | None = None) -> np.ndarray:
    """All bands of a GeoTIFF as stored ([bands, H, W])."""
    with rasterio.open(path) as src:
        data = src.read()
    if expected is not None and data.shape[0] != expected:
        raise ValueError(f"{path} has {data.shape[0]} bands, expected {expected}")
    return data


def read_s2(path: Path) -> np.ndarray:
    """Sentinel-2 L1C patch -> float32 [13, H, W] reflectance in [0, 1]."""
    return scale_s2(read_bands(path, N_S2))


def read_s1(path: Path) -> np.ndarray:
    """Sentinel-1 patch in dB -> float32 [2, H, W] in [0, 1] (NaN -> 0)."""
    return scale_s1(read_bands(path, N_S1))


def read_cloud_codes(path: Path) -> np.ndarray:
    """Per-pixel cloud class codes (uint8 [H, W])."""
    return read_bands(path, 1)[0].astype(np.uint8, copy=False)
