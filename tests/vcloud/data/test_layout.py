"""Raw layout naming, scaling and the pure selection rules of prepare."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from vcloud.data.bands import dequantize, quantize, scale_s1, scale_s2
from vcloud.data.layout import group_series, parse_filename, patch_relpath
from vcloud.data.selection import (
    SplitFractions, assign_splits, clearest_index, nearest_dates, reference_index,
)


def test_filename_round_trip() -> None:
    rel = patch_relpath("S2", "1158", "106", 3, dt.date(2018, 1, 3), 7)
    assert rel.as_posix() == "ROIs1158/106/S2/3/s2_ROIs1158_106_ImgNo_3_2018-01-03_patch_7.tif"
    f = parse_filename(rel.name)
    assert (f.modality, f.collection, f.roi, f.index, f.date, f.patch) == ("S2", "1158", "106", 3,
                                                                           dt.date(2018, 1, 3), 7)
    assert f.region == "ROIs1158_106" and f.series_id == "ROIs1158_106_patch_7"
    with pytest.raises(ValueError, match="SEN12MS-CR-TS pattern"):
        parse_filename("s2_106_patch_7.tif")


def test_grouping_attaches_modalities_by_acquisition_index() -> None:
    d0, d1 = dt.date(2018, 1, 3), dt.date(2018, 2, 3)
    rels = [patch_relpath(m, "1158", "1", i, d, 0).as_posix()
            for m in ("S2", "S1") for i, d in ((0, d0), (1, d1))]
    rels.append(patch_relpath("S1", "1158", "1", 0, d0 - dt.timedelta(days=1), 1).as_posix())
    with pytest.raises(ValueError, match="no S2 file"):
        group_series(rels)
    (series,) = group_series(rels[:4])
    assert [o.date for o in series.observations] == [d0, d1]
    assert all(o.s1 and o.cloud_mask is None and o.clear is None for o in series.observations)
    assert not series.has_ground_truth


def test_scaling_clips_and_zeroes_nan() -> None:
    s2 = scale_s2(np.array([0, 5000, 10000, 12000], np.uint16))
    assert s2.tolist() == [0.0, 0.5, 1.0, 1.0]
    s1 = scale_s1(np.array([-30.0, -25.0, -12.5, 0.0, 3.0, np.nan], np.float32))
    assert s1.tolist() == [0.0, 0.0, 0.5, 1.0, 1.0, 0.0]
    dn = np.arange(0, 10001, 7, dtype=np.uint16)
    assert np.array_equal(quantize(scale_s2(dn)), dn)  # S2 survives the prepared format exactly
    assert np.array_equal(dequantize(quantize(scale_s2(dn))), scale_s2(dn))


def test_nearest_dates_and_reference() -> None:
    dates = [dt.date(2018, 1, d) for d in (1, 5, 9, 20, 28)]
    target = dt.date(2018, 1, 10)
    assert nearest_dates(dates, target, 3) == [0, 1, 2]  # |1-10|=9 < |20-10|=10
    assert reference_index([dates[i] for i in (0, 1, 2)], target) == 2
    assert clearest_index([0.4, 0.0, 0.0, 0.2]) == 1
    with pytest.raises(ValueError, match="only 5 available"):
        nearest_dates(dates, target, 6)


def test_split_assignment_is_by_region_and_stable() -> None:
    regions = [f"ROIs1158_{i}" for i in range(1000)]
    splits = assign_splits(regions + regions[:10])  # repeated patches of a region change nothing
    counts = {s: sum(v == s for v in splits.values()) for s in ("train", "val", "test")}
    assert counts == {"train": 800, "val": 100, "test": 100}
    grown = assign_splits(regions + [f"ROIs2017_{i}" for i in range(50)])
    moved = sum(grown[r] != splits[r] for r in regions)
    assert moved < 60  # adding locations reshuffles only what the new counts require
    assert assign_splits(regions, seed=1) != splits


def test_split_needs_three_locations_and_valid_fractions() -> None:
    with pytest.raises(ValueError, match="at least 3 locations"):
        assign_splits(["a", "b", "a"])
    with pytest.raises(ValueError, match="must sum to 1"):
        SplitFractions(0.8, 0.3, 0.1)
    assert set(assign_splits(["a", "b", "c"]).values()) == {"train", "val", "test"}
