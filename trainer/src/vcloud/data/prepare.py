"""Prepare: turn the raw SEN12MS-CR-TS layout into one uint16 stack per series plus ``index.json``.

Reading a series from the raw layout costs 3-4 GeoTIFF opens per date; a prepared series is one
contiguous TIFF read (see ``benchmarks/loader_throughput.py``). Per series prepare decides:

* the target: the clean ``S2CLEAR`` scene for synthetic data; for real data the least cloudy date,
  which is then **excluded from the inputs** (the model never sees its ground truth);
* the inputs: the ``n_inputs`` cloudy observations closest in time to the target date;
* the cloud masks: ``CLD`` files when present, otherwise a brightness test (:func:`detect_clouds`);
* the split, by location (region), never by patch.

CLI: ``python -m vcloud.data.prepare --raw RAW --out PREPARED``
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from vcloud.data.bands import N_S1, cloud_fraction, observation_type, quantize, scale_s2
from vcloud.data.geotiff import read_bands, read_cloud_codes, read_georef, read_s1, read_s2
from vcloud.data.index import (
    INDEX_NAME, PreparedIndex, RawSources, SeriesRecord, StackLayout, load_index, write_index,
)
from vcloud.data.layout import RawSeries, scan_raw
from vcloud.data.selection import (
    SPLITS, SplitFractions, assign_splits, clearest_index, detect_clouds, nearest_dates, reference_index,
)
from vcloud.data.stackio import write_stack


@dataclass(frozen=True)
class PrepareSettings:
    """How series are turned into training samples."""

    n_inputs: int | None = None
    """Input dates per sample (T); default: the most every series can provide."""
    max_target_cloud_cover: float = 0.01
    """Real data only: series whose clearest date has more cloud than this are skipped."""
    fractions: SplitFractions = SplitFractions()
    split_seed: int = 0

    def __post_init__(self) -> None:
        if self.n_inputs is not None and self.n_inputs < 1:
            raise ValueError(f"n_inputs must be >= 1 (or None for all available dates), got {self.n_inputs}")
        if not 0.0 <= self.max_target_cloud_cover <= 1.0:
            raise ValueError(f"max_target_cloud_cover must lie in [0, 1], got {self.max_target_cloud_cover}")


class SkipSeries(Exception):
    """A series that cannot become a training sample; the reason is recorded in the index."""


def prepare_dataset(raw_root: Path, out_root: Path, settings: PrepareSettings | None = None, *,
                    workers: int = 0, overwrite: bool = False) -> Path:
    """Prepare every series under ``raw_root`` into ``out_root/{train,val,test}/`` and write the index."""
    settings = settings or PrepareSettings()
    raw_root, out_root = Path(raw_root).resolve(), Path(out_root)
    if (out_root / INDEX_NAME).exists() and not overwrite:
        raise FileExistsError(
            f"{out_root} already holds a prepared dataset; pass overwrite=True (--overwrite)"
        )
    series = scan_raw(raw_root)
    n_inputs = settings.n_inputs or min(_candidate_count(s) for s in series)
    regions = assign_splits([s.region for s in series], settings.fractions, settings.split_seed)
    for split in SPLITS:
        if overwrite:
            shutil.rmtree(out_root / split, ignore_errors=True)
        (out_root / split).mkdir(parents=True, exist_ok=True)
    max_cover = settings.max_target_cloud_cover
    jobs = [(raw_root, out_root, s, regions[s.region], n_inputs, max_cover) for s in series]
    if workers > 0:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_prepare_job, jobs, chunksize=8))
    else:
        results = [_prepare_job(job) for job in jobs]
    records = tuple(r for r in results if isinstance(r, SeriesRecord))
    skipped = tuple(r for r in results if isinstance(r, dict))
    if not records:
        reasons = "; ".join(f"{s['series_id']}: {s['reason']}" for s in skipped[:5])
        raise ValueError(f"no series of {raw_root} could be prepared ({reasons})")
    index = PreparedIndex(
        n_inputs=n_inputs, series=records, regions=regions, skipped=skipped,
        source={
            "raw_root": str(raw_root), "settings": _settings_dict(settings), "manifest": _manifest(raw_root),
        },
    )
    write_index(out_root, index)
    return out_root


def _settings_dict(settings: PrepareSettings) -> dict:
    d = asdict(settings)
    d["fractions"] = asdict(settings.fractions)
    return d


def _manifest(raw_root: Path) -> dict | None:
    path = raw_root / "manifest.json"
    if not path.is_file():
        return None
    body = json.loads(path.read_text())
    return {k: v for k, v in body.items() if k != "series"}


def _candidate_count(series: RawSeries) -> int:
    n = len(series.observations)
    return n if series.has_ground_truth else n - 1


def _prepare_job(job: tuple) -> SeriesRecord | dict:
    raw_root, out_root, series, split, n_inputs, max_cover = job
    try:
        record, stack = build_series(raw_root, series, split, n_inputs, max_cover)
    except SkipSeries as exc:
        return {"series_id": series.series_id, "reason": str(exc)}
    write_stack(out_root / record.file, stack)
    return record


def build_series(raw_root: Path, series: RawSeries, split: str, n_inputs: int,
                 max_target_cloud_cover: float) -> tuple[SeriesRecord, np.ndarray]:
    """Read one raw series and return its index record and uint16 stack (see :class:`StackLayout`)."""
    obs = list(series.observations)
    s2: dict[int, np.ndarray] = {}
    codes: dict[int, np.ndarray] = {}

    def load(i: int) -> None:
        if i not in s2:
            s2[i] = read_s2(raw_root / obs[i].s2)
            mask = obs[i].cloud_mask
            codes[i] = read_cloud_codes(raw_root / mask) if mask else detect_clouds(s2[i])

    if series.has_ground_truth:
        clear = [(o, o.clear) for o in obs if o.clear is not None]
        if len(clear) != 1:
            raise SkipSeries(f"{len(clear)} S2CLEAR files; a synthetic series needs exactly one")
        target_obs, target_path = clear[0]
        target = scale_s2(read_bands(raw_root / target_path))
        candidates = list(range(len(obs)))
    else:
        for i in range(len(obs)):
            load(i)
        cover = [cloud_fraction(codes[i]) for i in range(len(obs))]
        t = clearest_index(cover)
        if cover[t] > max_target_cloud_cover:
            raise SkipSeries(f"clearest date {obs[t].date} is {cover[t]:.1%} cloudy "
                             f"(limit {max_target_cloud_cover:.1%})")
        target_obs, target_path = obs[t], obs[t].s2
        target = s2[t]
        candidates = [i for i in range(len(obs)) if i != t]

    if len(candidates) < n_inputs:
        raise SkipSeries(f"{len(candidates)} input dates available, {n_inputs} needed")
    nearest = nearest_dates([obs[i].date for i in candidates], target_obs.date, n_inputs)
    chosen = [candidates[k] for k in nearest]
    s1_paths: list[str] = []
    s1_layers = []
    for i in chosen:
        load(i)
        s1_path = obs[i].s1
        if s1_path is None:
            raise SkipSeries(f"no S1 file for acquisition index {obs[i].index} ({obs[i].date})")
        s1_paths.append(s1_path)
        s1_layers.append(read_s1(raw_root / s1_path))

    shape = target.shape[1:]
    for i in chosen:
        if s2[i].shape[1:] != shape or codes[i].shape != shape:
            raise SkipSeries(f"acquisition index {obs[i].index} is {s2[i].shape[1:]}, target is {shape}")
    for layer, i in zip(s1_layers, chosen):
        if layer.shape != (N_S1,) + shape:
            raise SkipSeries(f"S1 of acquisition index {obs[i].index} has shape {layer.shape}")

    layout = StackLayout(n_inputs)
    stack = np.empty((layout.planes,) + shape, np.uint16)
    stack[layout.inputs] = quantize(np.concatenate([s2[i] for i in chosen]))
    stack[layout.target] = quantize(target)
    stack[layout.s1] = quantize(np.concatenate(s1_layers))
    stack[layout.masks] = np.stack([codes[i] for i in chosen])

    input_dates = [obs[i].date for i in chosen]
    georef = read_georef(raw_root / target_path)
    record = SeriesRecord(
        series_id=series.series_id,
        region=series.region,
        split=split,
        file=f"{split}/{series.series_id}.tif",
        height=int(shape[0]),
        width=int(shape[1]),
        input_dates=tuple(d.isoformat() for d in input_dates),
        target_date=target_obs.date.isoformat(),
        target_index=reference_index(input_dates, target_obs.date),
        cloud_types=tuple(observation_type(codes[i]) for i in chosen),
        cloud_cover=tuple(round(cloud_fraction(codes[i]), 6) for i in chosen),
        crs=georef.crs,
        transform=georef.transform,
        has_ground_truth=series.has_ground_truth,
        raw=RawSources(
            s2=tuple(obs[i].s2 for i in chosen),
            s1=tuple(s1_paths),
            cloud_masks=tuple(obs[i].cloud_mask for i in chosen),
            target=target_path,
        ),
    )
    return record, stack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vcloud.data.prepare", description=__doc__.split("\n")[0])
    parser.add_argument("--raw", type=Path, required=True, help="raw SEN12MS-CR-TS-layout root")
    parser.add_argument("--out", type=Path, required=True, help="prepared root to write")
    parser.add_argument("--n-inputs", type=int, default=None, help="input dates per sample (default: all)")
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--test-fraction", type=float, default=0.1)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--max-target-cloud-cover", type=float, default=0.01)
    parser.add_argument("--workers", type=int, default=0, help="processes reading raw GeoTIFFs")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    try:
        settings = PrepareSettings(
            n_inputs=args.n_inputs,
            max_target_cloud_cover=args.max_target_cloud_cover,
            fractions=SplitFractions(1.0 - args.val_fraction - args.test_fraction, args.val_fraction,
                                     args.test_fraction),
            split_seed=args.split_seed,
        )
        out = prepare_dataset(args.raw, args.out, settings, workers=args.workers, overwrite=args.overwrite)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"prepare failed: {exc}", file=sys.stderr)
        return 2
    index = load_index(out)
    for split in SPLITS:
        records = index.split(split)
        print(f"{split:5s}: {len(records):6d} series from {len({r.region for r in records}):4d} locations")
    print(f"T={index.n_inputs}, skipped {len(index.skipped)} series; index: {out / INDEX_NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
