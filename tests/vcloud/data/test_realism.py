"""The synthetic series are as hard as the real ones: each difficulty knob does what it says."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio

from vcloud.baselines import score_baselines
from vcloud.data.bands import S2_DN_MAX, S2_WAVELENGTH_NM
from vcloud.data.dataset import SeriesDataset
from vcloud.data.layout import scan_raw
from vcloud.data.prepare import prepare_dataset
from vcloud.data.realism import (
    REALISTIC,
    apply_haze,
    haze_transmission,
    shift_bilinear,
    sun_shadow_offset,
)
from vcloud.data.synthetic import generate_raw

BLUE, SWIR = S2_WAVELENGTH_NM.index(490), S2_WAVELENGTH_NM.index(2190)


def _read(path: Path) -> np.ndarray:
    with rasterio.open(path) as src:
        return src.read()


def test_haze_dims_the_visible_bands_more_than_the_swir_ones() -> None:
    rng = np.random.default_rng(0)
    transmission = None
    while transmission is None:  # a date has haze with probability haze_probability
        transmission = haze_transmission(rng, REALISTIC, (32, 32))
    assert np.all((transmission > 0) & (transmission < 1))
    assert np.all(transmission[BLUE] < transmission[SWIR])
    dark = np.full((13, 32, 32), 0.02, np.float32)  # a dark surface: haze brightens the blue most
    hazy = apply_haze(dark, transmission)
    assert (hazy[BLUE] - dark[BLUE]).mean() > 3 * (hazy[SWIR] - dark[SWIR]).mean() > 0


def test_a_subpixel_shift_moves_an_edge_by_that_fraction() -> None:
    image = np.zeros((1, 8, 8), np.float32)
    image[:, :, 4:] = 1.0
    moved = shift_bilinear(image, 0.0, 0.25)
    assert moved[0, 0, 4] == pytest.approx(0.75) and moved[0, 0, 3] == 0.0 and moved[0, 0, 5] == 1.0
    assert shift_bilinear(image, 0.0, 0.0) is image


def test_shadows_fall_away_from_the_sun() -> None:
    rng = np.random.default_rng(1)
    # sun in the south (azimuth 180): shadows fall to the north, i.e. up the image (dy < 0)
    offsets = [sun_shadow_offset(rng, 180.0, 128) for _ in range(50)]
    assert all(dy < 0 and abs(dx) <= abs(dy) for dy, dx in offsets)
    assert max(-dy for dy, _ in offsets) <= 128 // 3


def test_realistic_series_have_heavy_cover_never_clear_pixels_and_harvests(tmp_path: Path) -> None:
    covers, never_clear, harvested, series = [], 0, 0, 0
    for seed in range(3):
        raw = generate_raw(tmp_path / f"raw{seed}", "tiny", seed=seed)
        manifest = json.loads((raw / "manifest.json").read_text())
        assert manifest["preset"]["realism"]["haze_probability"] == REALISTIC.haze_probability
        for s in scan_raw(raw):
            plan = manifest["series"][s.series_id]
            masks = np.stack([_read(raw / o.cloud_mask)[0] for o in s.observations])
            covers += [float(np.mean(m > 0)) for m in masks]
            never_clear += bool(np.any(np.all(masks > 0, axis=0)))
            if plan["persistent_cloud"]:
                assert np.any(np.all(masks > 0, axis=0)), s.series_id
            harvested += plan["harvest_index"] is not None
            series += 1
    # many dates mostly cloudy (SEN12MS-CR-TS: about half of the dates are over half covered)
    assert np.mean(np.asarray(covers) > 0.5) > 0.3, np.percentile(covers, [25, 50, 75])
    assert never_clear >= 0.1 * series and harvested >= 0.3 * series, (never_clear, harvested, series)


def test_the_target_date_is_never_a_copy_of_another_date(tiny_raw: Path) -> None:
    """Where both are clear, another date differs from the target's truth by far more than the
    quantisation: its own atmosphere, co-registration, season and noise."""
    manifest = json.loads((tiny_raw / "manifest.json").read_text())
    for s in scan_raw(tiny_raw):
        target = manifest["series"][s.series_id]["target_index"]
        truth = _read(tiny_raw / s.observations[target].clear).astype(np.float64) / S2_DN_MAX
        for t, obs in enumerate(s.observations):
            if t == target:
                continue
            clear = _read(tiny_raw / obs.cloud_mask)[0] == 0
            if clear.sum() < 50:
                continue
            other = _read(tiny_raw / obs.s2).astype(np.float64) / S2_DN_MAX
            assert np.abs(other[:, clear] - truth[:, clear]).mean() > 0.003, (s.series_id, t)


def test_no_training_baselines_score_like_on_the_real_series(tiny_raw: Path, tmp_path: Path) -> None:
    """SEN12MS-CR-TS baselines score about 25-32 dB; the easy series let them reach 37-43 dB."""
    easy = prepare_dataset(generate_raw(tmp_path / "easy", "tiny-easy", seed=0), tmp_path / "easy-prepared")
    hard = prepare_dataset(tiny_raw, tmp_path / "hard-prepared")

    def best(root: Path) -> float:
        scores = [score_baselines(SeriesDataset(root, split)) for split in ("train", "val", "test")]
        return max(np.mean([s[name]["psnr"] for s in scores]) for name in scores[0] if name != "cloudy_input")

    hard_db, easy_db = best(hard), best(easy)
    print(f"best no-training baseline on tiny: {hard_db:.2f} dB (easy series: {easy_db:.2f} dB)")
    assert 22.0 < hard_db < 34.0 and easy_db > hard_db + 3.0
