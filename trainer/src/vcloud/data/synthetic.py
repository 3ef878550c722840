"""Synthetic SEN12MS-CR-TS: land-cover scenes with seasons, change, haze, residual atmosphere and known clouds.

How hard the series are is set by the preset's :class:`~vcloud.data.realism.Realism` (heavy cloud
cover, never-clear pixels, unmasked haze, per-date radiometry, harvests, co-registration jitter,
sensor noise); ``tiny-easy`` keeps the easy series for comparisons and ``small-hazier`` is a
shifted domain (another atmosphere, :data:`~vcloud.data.realism.HAZIER`).

Writes the raw layout of :mod:`vcloud.data.layout` with real georeferencing (UTM CRS and a 10 m affine
transform), plus ``CLD`` masks and the ``S2CLEAR`` ground truth of each series' target date, and a
``manifest.json`` with what was generated (dates, target index, cloud type per observation).

Every array comes from generators seeded by ``(seed, region, patch)``: the same seed gives identical
pixel bytes, independent of generation order.

CLI: ``python -m vcloud.data.synthetic --out DIR --preset tiny --seed 0``
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from vcloud.data.bands import CLOUD_TYPES, S1_DB_MAX, S2_DN_MAX, observation_type
from vcloud.data.clouds import CloudLayer, apply_clouds, cloud_layer, fractal_noise, layers_for_type
from vcloud.data.realism import (
    EASY,
    HAZIER,
    REALISTIC,
    Realism,
    apply_haze,
    band_noise_sigma,
    harvest,
    haze_transmission,
    jitter_shift,
    radiometry,
    shift_bilinear,
    sun_shadow_offset,
)
from vcloud.data.geotiff import GeoRef, write_geotiff
from vcloud.data.layout import patch_relpath, region_id, series_id


@dataclass(frozen=True)
class SyntheticPreset:
    """Size of a synthetic dataset."""

    name: str
    n_regions: int
    """Locations (ROIs); splits are made by location, so at least 3 are needed for train/val/test."""
    patches_per_region: int
    size: int
    """Patch height and width in pixels (10 m)."""
    n_dates: int
    """Acquisitions per series (T)."""
    realism: Realism = REALISTIC
    """How hard the series are (:mod:`vcloud.data.realism`)."""


PRESETS: dict[str, SyntheticPreset] = {
    "tiny": SyntheticPreset("tiny", n_regions=4, patches_per_region=3, size=64, n_dates=4),
    "small": SyntheticPreset("small", n_regions=40, patches_per_region=8, size=128, n_dates=6),
    "tiny-easy": SyntheticPreset("tiny-easy", n_regions=4, patches_per_region=3, size=64, n_dates=4, realism=EASY),
    # tiny's size, with 24 training series: enough for the 8 ranks of a two-node run (batch 2 each).
    "tiny-wide": SyntheticPreset("tiny-wide", n_regions=8, patches_per_region=4, size=64, n_dates=4),
    # small's series through a hazier, worse-corrected atmosphere: the unlabeled shifted domain that
    # self-training (stage 3) adapts to. Generate it with another seed than the labeled set, so its
    # locations are new as well.
    "small-hazier": SyntheticPreset("small-hazier", n_regions=10, patches_per_region=8, size=128, n_dates=6,
                                    realism=HAZIER),
}

COLLECTIONS: tuple[str, ...] = ("1158", "1868", "1970", "2017")
"""SEN12MS-CR-TS ROI collections (the real dataset's top-level folders)."""

BASE_DATE = dt.date(2018, 1, 1)

LAND_COVER: tuple[str, ...] = ("water", "forest", "crop", "grass", "soil", "urban")

# Surface reflectance per class, bands B1..B12. Visible bands stay below 0.15 like real land surfaces.
_SIGNATURES: dict[str, list[float]] = {
    "water": [0.080, 0.060, 0.050, 0.030, 0.020, 0.015, 0.012, 0.010, 0.010, 0.005, 0.002, 0.005, 0.003],
    "forest": [0.085, 0.065, 0.060, 0.035, 0.080, 0.200, 0.250, 0.280, 0.290, 0.100, 0.004, 0.150, 0.070],
    "forest_leafoff": [0.090, 0.070, 0.065, 0.060, 0.090, 0.130, 0.150, 0.160, 0.170, 0.070, 0.004, 0.200,
                       0.120],
    "crop": [0.085, 0.065, 0.080, 0.045, 0.120, 0.300, 0.380, 0.420, 0.440, 0.140, 0.005, 0.220, 0.110],
    "grass": [0.090, 0.070, 0.080, 0.065, 0.120, 0.220, 0.260, 0.290, 0.300, 0.110, 0.005, 0.250, 0.150],
    "grass_dry": [0.100, 0.085, 0.095, 0.105, 0.140, 0.180, 0.200, 0.220, 0.230, 0.095, 0.006, 0.300, 0.210],
    "soil": [0.105, 0.095, 0.115, 0.135, 0.160, 0.180, 0.190, 0.200, 0.210, 0.100, 0.007, 0.300, 0.240],
    "urban": [0.115, 0.105, 0.110, 0.120, 0.130, 0.140, 0.150, 0.160, 0.160, 0.080, 0.007, 0.200, 0.170],
}
SIGNATURES = {k: np.asarray(v, np.float32) for k, v in _SIGNATURES.items()}

# Sentinel-1 backscatter per class in dB (VV, VH); crops brighten with biomass.
_S1_DB = {
    "water": (-22.0, -28.0), "forest": (-7.5, -13.0), "crop": (-12.0, -19.0),
    "grass": (-12.0, -19.0), "soil": (-13.0, -21.0), "urban": (-4.0, -11.0),
}


@dataclass(frozen=True)
class SeriesPlan:
    """What one generated series holds, recorded in the manifest."""

    series_id: str
    region: str
    collection: str
    roi: str
    patch: int
    crs: str
    transform: tuple[float, float, float, float, float, float]
    dates: tuple[str, ...]
    target_index: int
    cloud_types: tuple[str, ...]
    land_cover_change: bool
    harvest_index: int | None = None
    """First date at which the series' crop fields are bare soil (None: not harvested)."""
    persistent_cloud: bool = False
    """An opaque bank covers the same pixels on every date: they are never seen clear."""


def generate_raw(root: Path, preset: str = "tiny", seed: int = 0, *, with_ground_truth: bool = True) -> Path:
    """Write a synthetic dataset in the SEN12MS-CR-TS layout under ``root`` and return ``root``.

    ``with_ground_truth=False`` mimics the real dataset instead: no ``CLD`` masks and no ``S2CLEAR``
    scene, but T+1 acquisitions of which exactly one is cloud-free (the date prepare must pick as
    target and keep out of the inputs).
    """
    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r} unknown (known: {', '.join(PRESETS)})")
    spec = PRESETS[preset]
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    plans = []
    for region_index in range(spec.n_regions):
        for patch in range(spec.patches_per_region):
            plans.append(_write_series(root, spec, seed, region_index, patch, with_ground_truth))
    manifest = {
        "generator": "vcloud.data.synthetic",
        "preset": asdict(spec),
        "seed": seed,
        "with_ground_truth": with_ground_truth,
        "series": {p.series_id: {k: v for k, v in asdict(p).items() if k != "series_id"} for p in plans},
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return root


def _region_georef(region_index: int, patch: int, size: int, rng: np.random.Generator) -> GeoRef:
    zone = 31 + region_index % 6
    x0 = 300_000.0 + 10_000.0 * float(rng.integers(0, 40))
    y0 = 4_500_000.0 + 10_000.0 * float(rng.integers(0, 200))
    col, row = patch % 4, patch // 4
    return GeoRef(
        crs=f"EPSG:{32600 + zone}",
        transform=(10.0, 0.0, x0 + col * size * 10.0, 0.0, -10.0, y0 - row * size * 10.0),
    )


def _write_series(root: Path, spec: SyntheticPreset, seed: int, region_index: int, patch: int,
                  with_ground_truth: bool) -> SeriesPlan:
    region_rng = np.random.default_rng([seed, region_index])
    rng = np.random.default_rng([seed, region_index, patch, 1])
    collection = COLLECTIONS[region_index % len(COLLECTIONS)]
    roi = str(region_index)
    shape = (spec.size, spec.size)
    georef = _region_georef(region_index, patch, spec.size, region_rng)
    class_bias = region_rng.normal(0.0, 0.6, len(LAND_COVER))
    crop_peak = float(region_rng.uniform(150, 220))

    n_obs = spec.n_dates if with_ground_truth else spec.n_dates + 1
    # Acquisition dates belong to the region (one satellite pass covers all its patches).
    days = np.sort(region_rng.choice(np.arange(0, 365, 4), size=n_obs, replace=False))
    s1_lag = region_rng.integers(0, 4, size=n_obs)
    dates = tuple(BASE_DATE + dt.timedelta(days=int(d)) for d in days)
    weights = _land_cover_weights(rng, shape, class_bias)
    texture = 1.0 + 0.06 * (fractal_noise(rng, shape, base_cells=8, octaves=3) - 0.5)
    change = _land_cover_change(rng, shape, n_obs)

    target_index = int(rng.integers(0, n_obs))
    if with_ground_truth:
        max_type = _series_max_type(rng, spec, region_index, patch)
        obs_types = _observation_types(rng, n_obs, target_index, max_type)
    else:  # the real-layout target is the one cloud-free acquisition
        obs_types = ["thin" if rng.random() < 0.5 else "thick" for _ in range(n_obs)]
        obs_types[target_index] = "clear"

    realism = spec.realism
    sun_azimuth = float(region_rng.uniform(0.0, 360.0))  # one sun for the region's passes
    noise_sigma = band_noise_sigma(rng, realism)
    harvested_from = harvest(rng, realism, n_obs)
    bank = _persistent_bank(rng, realism, shape, sun_azimuth) if "opaque" in obs_types else None

    for t, date in enumerate(dates):
        w = weights
        if change is not None and t >= change[0]:
            w = weights * (1.0 - change[1][None]) + change[1][None] * _one_hot(change[2], shape)
        if harvested_from is not None and t >= harvested_from:
            w = _harvested(w)
        scene = _scene(w, date, crop_peak) * texture[None]
        gain, offset = radiometry(rng, realism)
        scene = np.clip(scene * gain[:, None, None] + offset[:, None, None], 0.0, None).astype(np.float32)
        scene = shift_bilinear(scene, *jitter_shift(rng, realism))
        clear_target = obs_types[t] == "clear" and not with_ground_truth and t == target_index
        layers = [] if clear_target else _date_layers(rng, realism, obs_types[t], shape, sun_azimuth, bank,
                                                       min_cover=0.05 if with_ground_truth else 0.3)
        hazy = scene if clear_target else apply_haze(scene, haze_transmission(rng, realism, shape))
        cloudy, codes = apply_clouds(hazy, layers)
        cloudy = cloudy + rng.normal(0.0, 1.0, cloudy.shape).astype(np.float32) * noise_sigma[:, None, None]
        obs_types[t] = observation_type(codes)  # what the mask shows (a cloud bank can add "opaque")
        s1 = _sentinel1(rng, w, date, crop_peak)
        s1_date = date - dt.timedelta(days=int(s1_lag[t]))
        write_geotiff(root / patch_relpath("S2", collection, roi, t, date, patch), _to_dn(cloudy), georef)
        write_geotiff(root / patch_relpath("S1", collection, roi, t, s1_date, patch), s1, georef)
        if with_ground_truth:
            write_geotiff(root / patch_relpath("CLD", collection, roi, t, date, patch), codes[None], georef)
            if t == target_index:
                clear_path = root / patch_relpath("S2CLEAR", collection, roi, t, date, patch)
                write_geotiff(clear_path, _to_dn(scene), georef)

    return SeriesPlan(
        series_id=series_id(collection, roi, patch), region=region_id(collection, roi), collection=collection,
        roi=roi, patch=patch, crs=georef.crs, transform=georef.transform,
        dates=tuple(d.isoformat() for d in dates), target_index=target_index, cloud_types=tuple(obs_types),
        land_cover_change=change is not None, harvest_index=harvested_from, persistent_cloud=bank is not None,
    )


def _date_layers(rng: np.random.Generator, realism: Realism, obs_type: str, shape: tuple[int, int],
                 sun_azimuth: float, bank: CloudLayer | None, *, min_cover: float) -> list[CloudLayer]:
    """The date's cloud decks: cover drawn from the heavy ``cover_beta`` (at least ``min_cover``: the
    real layout's cloudy dates must read as cloudier than its one clear date), shadows away from the
    sun, and the series' persistent bank (if any) on every date."""
    if obs_type == "clear":
        return [bank] if bank is not None else []
    if not realism.enabled:
        return layers_for_type(rng, obs_type, shape)
    a, b = realism.cover_beta
    coverage = float(np.clip(rng.beta(a, b), min_cover, 0.95))
    offset = sun_shadow_offset(rng, sun_azimuth, shape[0]) if realism.shadow_from_sun else None
    layers = layers_for_type(rng, obs_type, shape, coverage=coverage, shadow_offset=offset)
    return layers + ([bank] if bank is not None else [])


def _persistent_bank(rng: np.random.Generator, realism: Realism, shape: tuple[int, int],
                     sun_azimuth: float) -> CloudLayer | None:
    """An opaque bank over the same pixels on every cloudy date: pixels no date sees clear."""
    if realism.persistent_cloud <= 0 or rng.random() >= realism.persistent_cloud:
        return None
    offset = sun_shadow_offset(rng, sun_azimuth, shape[0]) if realism.shadow_from_sun else None
    return cloud_layer(rng, "opaque", shape, coverage=float(rng.uniform(0.05, 0.2)), shadow_offset=offset)


def _harvested(weights: np.ndarray) -> np.ndarray:
    """Crop fields ploughed or harvested: their membership moves to bare soil."""
    out = weights.copy()
    crop, soil = LAND_COVER.index("crop"), LAND_COVER.index("soil")
    out[soil] += out[crop]
    out[crop] = 0.0
    return out


def _series_max_type(rng: np.random.Generator, spec: SyntheticPreset, region_index: int, patch: int) -> str:
    """The most severe cloud type in a series. With at most three patches per region the types rotate,
    so every location (and therefore every split) holds thin, thick and opaque series."""
    if spec.patches_per_region <= len(CLOUD_TYPES):
        return CLOUD_TYPES[(region_index + patch) % len(CLOUD_TYPES)]
    return str(rng.choice(CLOUD_TYPES, p=[0.4, 0.35, 0.25]))


def _observation_types(rng: np.random.Generator, n_obs: int, target_index: int, max_type: str) -> list[str]:
    """Cloud type of each acquisition: one carries ``max_type``, the target date is never clear."""
    allowed = ("clear",) + CLOUD_TYPES[: CLOUD_TYPES.index(max_type) + 1]
    types = [str(rng.choice(allowed)) for _ in range(n_obs)]
    types[int(rng.integers(0, n_obs))] = max_type
    if types[target_index] == "clear":
        types[target_index] = "thin"
    return types


def _land_cover_weights(rng: np.random.Generator, shape: tuple[int, int], bias: np.ndarray) -> np.ndarray:
    """Soft class memberships [K, H, W] summing to 1: smooth fields with sharp-ish boundaries."""
    fields = np.stack([fractal_noise(rng, shape, base_cells=2, octaves=4) for _ in LAND_COVER])
    logits = 12.0 * (fields + 0.15 * bias[:, None, None].astype(np.float32))
    logits -= logits.max(axis=0, keepdims=True)
    e = np.exp(logits)
    return (e / e.sum(axis=0, keepdims=True)).astype(np.float32)


def _land_cover_change(rng: np.random.Generator, shape: tuple[int, int],
                       n_obs: int) -> tuple[int, np.ndarray, str] | None:
    """Half of the series get a blob that turns into bare soil or urban from some date on."""
    if n_obs < 2 or rng.random() < 0.5:
        return None
    start = int(rng.integers(1, n_obs))
    blob = fractal_noise(rng, shape, base_cells=2, octaves=3)
    mask = np.clip((blob - np.quantile(blob, 0.85)) / 0.05, 0.0, 1.0).astype(np.float32)
    return start, mask, str(rng.choice(["soil", "urban"]))


def _one_hot(name: str, shape: tuple[int, int]) -> np.ndarray:
    out = np.zeros((len(LAND_COVER),) + shape, np.float32)
    out[LAND_COVER.index(name)] = 1.0
    return out


def _phenology(date: dt.date, peak_doy: float, width: float = 45.0) -> float:
    doy = date.timetuple().tm_yday
    return float(np.exp(-0.5 * ((doy - peak_doy) / width) ** 2))


def _greenness(date: dt.date) -> float:
    doy = date.timetuple().tm_yday
    return float(0.5 + 0.5 * np.sin(2 * np.pi * (doy - 105) / 365.0))


def _scene(weights: np.ndarray, date: dt.date, crop_peak: float) -> np.ndarray:
    """Clean surface reflectance [13, H, W] for land-cover weights at a date (seasonal signatures)."""
    g, c = _greenness(date), _phenology(date, crop_peak)
    sig = {
        "water": SIGNATURES["water"],
        "forest": g * SIGNATURES["forest"] + (1 - g) * SIGNATURES["forest_leafoff"],
        "crop": c * SIGNATURES["crop"] + (1 - c) * SIGNATURES["soil"],
        "grass": g * SIGNATURES["grass"] + (1 - g) * SIGNATURES["grass_dry"],
        "soil": SIGNATURES["soil"],
        "urban": SIGNATURES["urban"],
    }
    table = np.stack([sig[name] for name in LAND_COVER])
    return np.einsum("kb,khw->bhw", table, weights).astype(np.float32)


def _sentinel1(rng: np.random.Generator, weights: np.ndarray, date: dt.date, crop_peak: float) -> np.ndarray:
    """VV/VH backscatter in dB [2, H, W] with speckle and, now and then, a no-data (NaN) edge."""
    c = _phenology(date, crop_peak)
    table = np.array([_S1_DB[name] for name in LAND_COVER], np.float32)
    table[LAND_COVER.index("crop")] += 4.0 * c
    db = np.einsum("kp,khw->phw", table, weights)
    speckle = rng.gamma(shape=4.0, scale=0.25, size=db.shape)
    db = (db + 10.0 * np.log10(speckle)).astype(np.float32)
    db = np.minimum(db, S1_DB_MAX + 5.0)
    if rng.random() < 0.25:
        db[:, :, : int(rng.integers(1, 4))] = np.nan
    return db


def _to_dn(reflectance: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(reflectance * S2_DN_MAX), 0, np.iinfo(np.uint16).max).astype(np.uint16)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vcloud.data.synthetic",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="raw root to write")
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--real-layout", action="store_true",
                        help="omit masks and ground truth, add one cloud-free date per series "
                             "(like SEN12MS-CR-TS)")
    args = parser.parse_args(argv)
    root = generate_raw(args.out, args.preset, args.seed, with_ground_truth=not args.real_layout)
    spec = PRESETS[args.preset]
    print(f"wrote {spec.n_regions * spec.patches_per_region} series ({spec.n_regions} regions, "
          f"{spec.size}x{spec.size}, T={spec.n_dates}) to {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
