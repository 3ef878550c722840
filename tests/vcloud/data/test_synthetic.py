"""Synthetic generator: layout, georeference, reproducibility, known cloud masks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio

from vcloud.data.bands import CLOUD_CODES, observation_type
from vcloud.data.clouds import apply_clouds, cloud_layer, fractal_noise
from vcloud.data.layout import parse_filename, scan_raw
from vcloud.data.synthetic import PRESETS, generate_raw


def _pixels(root: Path) -> dict[str, np.ndarray]:
    out = {}
    for path in sorted(root.rglob("*.tif")):
        with rasterio.open(path) as src:
            out[path.relative_to(root).as_posix()] = src.read()
    return out


def test_tiny_layout_matches_preset(tiny_raw: Path) -> None:
    spec = PRESETS["tiny"]
    series = scan_raw(tiny_raw)
    assert len(series) == spec.n_regions * spec.patches_per_region
    assert len({s.region for s in series}) == spec.n_regions
    for s in series:
        assert len(s.observations) == spec.n_dates
        assert all(o.s1 and o.cloud_mask for o in s.observations)
        assert sum(o.clear is not None for o in s.observations) == 1
    one = series[0].observations[0]
    with rasterio.open(tiny_raw / one.s2) as src:
        assert (src.count, src.height, src.width, src.dtypes[0]) == (13, 64, 64, "uint16")
    with rasterio.open(tiny_raw / one.s1) as src:
        assert (src.count, src.dtypes[0]) == (2, "float32")
    # real SEN12MS-CR-TS naming: S2/<index>/s2_ROIs<c>_<roi>_ImgNo_<index>_<date>_patch_<n>.tif
    parsed = parse_filename(Path(one.s2).name)
    assert Path(one.s2).parts[2:4] == ("S2", str(parsed.index))


def test_patches_are_georeferenced_in_utm(tiny_raw: Path) -> None:
    manifest = json.loads((tiny_raw / "manifest.json").read_text())
    for s in scan_raw(tiny_raw):
        plan = manifest["series"][s.series_id]
        for obs in s.observations:
            with rasterio.open(tiny_raw / obs.s2) as src:
                assert src.crs.to_epsg() == int(plan["crs"].split(":")[1])
                assert 32631 <= src.crs.to_epsg() <= 32660
                assert tuple(src.transform)[:6] == tuple(plan["transform"])
                assert src.transform.a == 10.0 and src.transform.e == -10.0


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path) -> None:
    a = _pixels(generate_raw(tmp_path / "a", "tiny", seed=3))
    b = _pixels(generate_raw(tmp_path / "b", "tiny", seed=3))
    c = _pixels(generate_raw(tmp_path / "c", "tiny", seed=4))
    assert a.keys() == b.keys()
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    s2 = [k for k in a if "/S2/" in k]
    assert not all(k in c and a[k].tobytes() == c[k].tobytes() for k in s2)


def test_masks_record_cloud_types_and_target_is_clean(tiny_raw: Path) -> None:
    manifest = json.loads((tiny_raw / "manifest.json").read_text())
    seen = set()
    for s in scan_raw(tiny_raw):
        plan = manifest["series"][s.series_id]
        for t, obs in enumerate(s.observations):
            with rasterio.open(tiny_raw / obs.cloud_mask) as src:
                codes = src.read(1)
            assert observation_type(codes) == plan["cloud_types"][t]
            seen.add(plan["cloud_types"][t])
            if obs.clear is not None:
                assert t == plan["target_index"]
                assert plan["cloud_types"][t] != "clear"  # the target date is observed under clouds
                with rasterio.open(tiny_raw / obs.clear) as src:
                    clean = src.read().astype(np.int32)
                with rasterio.open(tiny_raw / obs.s2) as src:
                    cloudy = src.read().astype(np.int32)
                cloud = (codes > 0) & (codes != CLOUD_CODES["shadow"])
                # clouds brighten the visible bands where the mask says so; outside the mask only
                # the unmasked haze (at most optical depth 0.4 at 490 nm) and sensor noise differ
                assert (cloudy[1:4, cloud] - clean[1:4, cloud]).mean() > 200
                assert np.abs(cloudy[:, codes == 0] - clean[:, codes == 0]).mean() < 400
    assert seen == {"clear", "thin", "thick", "opaque"}


def test_series_change_with_season(tiny_raw: Path) -> None:
    manifest = json.loads((tiny_raw / "manifest.json").read_text())
    assert any(p["land_cover_change"] for p in manifest["series"].values())
    s = scan_raw(tiny_raw)[0]
    dates = [o.date for o in s.observations]
    assert dates == sorted(dates) and len(set(dates)) == len(dates)


def test_fractal_noise_is_smooth_and_seeded() -> None:
    a = fractal_noise(np.random.default_rng(7), (64, 64))
    b = fractal_noise(np.random.default_rng(7), (64, 64))
    assert np.array_equal(a, b)
    assert a.min() == 0.0 and a.max() == 1.0
    # neighbouring pixels are far more alike than random pairs: spatially correlated noise
    assert np.abs(np.diff(a, axis=1)).mean() < 0.25 * np.abs(a - a[::-1, ::-1]).mean()


@pytest.mark.parametrize("kind", ["thin", "thick", "opaque"])
def test_cloud_layers_have_expected_opacity(kind: str) -> None:
    rng = np.random.default_rng(0)
    scene = np.full((13, 48, 48), 0.05, np.float32)
    layer = cloud_layer(rng, kind, (48, 48))
    cloudy, codes = apply_clouds(scene, [layer])
    peak = layer.alpha.max()
    assert {"thin": 0.3 <= peak <= 0.5, "thick": 0.65 <= peak <= 0.85, "opaque": peak >= 0.97}[kind]
    assert np.any(codes == CLOUD_CODES[kind])
    if kind == "thin":
        assert not np.any(codes == CLOUD_CODES["shadow"])
    else:
        assert layer.shadow.max() > 0.4
        shadowed = codes == CLOUD_CODES["shadow"]
        assert shadowed.any() and np.all(cloudy[:, shadowed] < scene[:, shadowed] + 1e-6)


def test_unknown_preset_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="known: tiny, small, tiny-easy"):
        generate_raw(tmp_path, "huge")
