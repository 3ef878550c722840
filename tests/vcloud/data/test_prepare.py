"""Prepare: target/input selection without leakage, splits by location, georeference, CLI."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import rasterio
import tifffile

from vcloud.data.dataset import SeriesDataset
from vcloud.data.index import StackLayout, load_index
from vcloud.data.layout import scan_raw
from vcloud.data.prepare import PrepareSettings, main as prepare_main, prepare_dataset
from vcloud.data.raw_dataset import RawSeriesDataset
from vcloud.data.selection import SPLITS


def _input_planes(stack: np.ndarray, n_inputs: int) -> list[bytes]:
    layout = StackLayout(n_inputs)
    inputs = stack[layout.inputs].reshape(n_inputs, 13, *stack.shape[1:])
    return [x.tobytes() for x in inputs]


def test_synthetic_clean_target_is_never_an_input(tiny_raw: Path, tiny_prepared: Path) -> None:
    index = load_index(tiny_prepared)
    assert len(index.series) == 12
    for record in index.series:
        stack = tifffile.imread(tiny_prepared / record.file)
        target = stack[index.layout.target]
        with rasterio.open(tiny_raw / record.raw.target) as src:
            assert "S2CLEAR" in record.raw.target
            assert np.array_equal(target, src.read())
        assert target.tobytes() not in _input_planes(stack, index.n_inputs)
        # the target date is present only as its cloudy observation
        t = record.target_index
        assert record.input_dates[t] == record.target_date
        assert record.cloud_types[t] != "clear"
        with rasterio.open(tiny_raw / record.raw.s2[t]) as src:
            assert _input_planes(stack, index.n_inputs)[t] == src.read().tobytes()


def test_real_layout_excludes_the_cloud_free_date(tiny_raw_real_layout: Path,
                                                  tiny_prepared_real_layout: Path) -> None:
    manifest = json.loads((tiny_raw_real_layout / "manifest.json").read_text())
    index = load_index(tiny_prepared_real_layout)
    assert index.n_inputs == 4 and len(index.series) == 12
    for record in index.series:
        plan = manifest["series"][record.series_id]
        clear_date = plan["dates"][plan["target_index"]]
        assert record.target_date == clear_date
        assert clear_date not in record.input_dates
        assert not record.has_ground_truth and "/S2/" in record.raw.target
        assert record.raw.target not in record.raw.s2
        stack = tifffile.imread(tiny_prepared_real_layout / record.file)
        target = stack[index.layout.target]
        with rasterio.open(tiny_raw_real_layout / record.raw.target) as src:
            assert np.array_equal(target, src.read())
        assert target.tobytes() not in _input_planes(stack, index.n_inputs)
        # masks came from the brightness test: it finds every thick or opaque deck; a faint thin
        # one it may miss, as cloud detectors do on the real series
        types = dict(zip(plan["dates"], plan["cloud_types"]))
        assert all(c > 0 for c, d in zip(record.cloud_cover, record.input_dates) if types[d] in ("thick", "opaque"))
        assert any(c > 0 for c in record.cloud_cover)
        # reference input is the one nearest in time to the target date
        gaps = [abs(np.datetime64(d) - np.datetime64(record.target_date)) for d in record.input_dates]
        assert record.target_index == int(np.argmin(gaps))


def test_splits_are_by_location_without_leakage(tiny_prepared: Path) -> None:
    index = load_index(tiny_prepared)
    regions_by_split = {split: {r.region for r in index.split(split)} for split in SPLITS}
    assert all(regions_by_split.values()), regions_by_split
    for a in SPLITS:
        for b in SPLITS:
            if a != b:
                assert not regions_by_split[a] & regions_by_split[b]
    for record in index.series:
        assert index.regions[record.region] == record.split
        assert record.file.startswith(f"{record.split}/") and (tiny_prepared / record.file).is_file()
    ids = {}
    for split in SPLITS:
        ds = SeriesDataset(tiny_prepared, split)
        ids[split] = {ds[i]["series_id"] for i in range(len(ds))}
    assert sum(len(v) for v in ids.values()) == len(index.series) == len(set().union(*ids.values()))


def test_georeference_round_trip_raw_to_meta(tiny_raw: Path, tiny_prepared: Path) -> None:
    manifest = json.loads((tiny_raw / "manifest.json").read_text())
    ds = SeriesDataset(tiny_prepared, "test")
    assert len(ds) > 0
    for i in range(len(ds)):
        meta = ds.meta(i)
        with rasterio.open(tiny_raw / ds.records[i].raw.s2[0]) as src:
            assert rasterio.crs.CRS.from_string(meta.crs) == src.crs
            assert meta.affine == src.transform
        assert meta.crs == manifest["series"][meta.series_id]["crs"]
        assert list(meta.transform) == manifest["series"][meta.series_id]["transform"]
        assert (meta.height, meta.width) == (64, 64)


def test_prepared_samples_equal_raw_reads(tiny_raw: Path, tiny_prepared: Path) -> None:
    prepared = SeriesDataset(tiny_prepared, "train")
    raw = RawSeriesDataset(tiny_raw, tiny_prepared, "train")
    assert len(prepared) == len(raw) == 6
    for i in range(len(prepared)):
        a, b = prepared[i], raw[i]
        assert a["series_id"] == b["series_id"]
        for key in ("inputs", "masks", "target", "target_index", "s1"):
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key].numpy(), b[key].numpy()), key


def test_fewer_inputs_keeps_dates_nearest_the_target(tiny_raw: Path, tmp_path: Path) -> None:
    out = prepare_dataset(tiny_raw, tmp_path / "p2", PrepareSettings(n_inputs=2))
    index = load_index(out)
    assert index.n_inputs == 2
    full = {r.series_id: r for r in load_index(prepare_dataset(tiny_raw, tmp_path / "p4")).series}
    for r in index.series:
        assert r.target_date in r.input_dates  # its cloudy observation is always the nearest
        others = [d for d in full[r.series_id].input_dates if d not in r.input_dates]
        gap = lambda d: abs(np.datetime64(d) - np.datetime64(r.target_date))  # noqa: E731
        assert max(gap(d) for d in r.input_dates) <= min(gap(d) for d in others)
        assert tifffile.imread(out / r.file).shape == (StackLayout(2).planes, 64, 64)


def test_series_without_enough_dates_are_skipped_with_reason(tiny_raw: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    shutil.copytree(tiny_raw, raw)
    victim = scan_raw(raw)[0]
    for obs in victim.observations[:2]:
        if obs.clear is None:
            for rel in (obs.s2, obs.s1, obs.cloud_mask):
                (raw / rel).unlink()
    index = load_index(prepare_dataset(raw, tmp_path / "out", PrepareSettings(n_inputs=4)))
    assert victim.series_id not in {r.series_id for r in index.series}
    assert [s["series_id"] for s in index.skipped] == [victim.series_id]
    assert "input dates available" in index.skipped[0]["reason"]


def test_refuses_to_overwrite_without_flag(tiny_prepared: Path, tiny_raw: Path) -> None:
    with pytest.raises(FileExistsError, match="overwrite"):
        prepare_dataset(tiny_raw, tiny_prepared)


def test_cli_prepares_and_reports(tiny_raw: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert prepare_main(["--raw", str(tiny_raw), "--out", str(tmp_path / "p"), "--n-inputs", "3"]) == 0
    out = capsys.readouterr().out
    assert "train:" in out and "T=3" in out
    assert prepare_main(["--raw", str(tmp_path / "missing"), "--out", str(tmp_path / "q")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_every_prepared_file_follows_the_umask_so_the_project_group_reads_it(tiny_raw: Path, tmp_path: Path) -> None:
    """Members of a project share the prepared dataset: under umask 002 the index and every stack are
    group-readable and -writable (a 0600 index made another member's training see no dataset)."""
    previous = os.umask(0o002)
    try:
        prepare_dataset(tiny_raw, tmp_path / "p")
    finally:
        os.umask(previous)
    files = [f for f in (tmp_path / "p").rglob("*") if f.is_file()]
    assert any(f.name == "index.json" for f in files) and len(files) > 1
    modes = {f.relative_to(tmp_path).as_posix(): oct(f.stat().st_mode & 0o777) for f in files}
    assert set(modes.values()) == {oct(0o664)}, modes


def test_stack_layout_planes_are_contiguous() -> None:
    layout = StackLayout(4)
    assert (layout.inputs, layout.target, layout.s1, layout.masks) == (
        slice(0, 52), slice(52, 65), slice(65, 73), slice(73, 77))
    assert layout.planes == 77


def test_worker_processes_write_the_same_dataset(tiny_raw: Path, tiny_prepared: Path, tmp_path: Path) -> None:
    out = prepare_dataset(tiny_raw, tmp_path / "parallel", workers=2)
    serial, parallel = load_index(tiny_prepared), load_index(out)
    assert serial.series == parallel.series and serial.regions == parallel.regions
    for record in serial.series:
        assert (tiny_prepared / record.file).read_bytes() == (out / record.file).read_bytes()
