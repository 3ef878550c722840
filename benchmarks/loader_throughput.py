"""Patches per second: prepared stacks (SeriesDataset) vs the per-date raw GeoTIFFs (RawSeriesDataset).

Both readers produce identical samples for the same series (see tests/vcloud/data/test_prepare.py); they
are timed on the same series, in the same process, without DataLoader workers, one after the other.
The page cache is warm for both (the data were just written or read once before timing).

    .venv/bin/python benchmarks/loader_throughput.py [--preset small] [--samples 64] [--workdir DIR]

Prints the figures, then one JSON line: {"prepared_per_s": ..., "raw_per_s": ..., "ratio": ...}.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from vcloud.data.dataset import SeriesDataset
from vcloud.data.index import INDEX_NAME
from vcloud.data.prepare import prepare_dataset
from vcloud.data.raw_dataset import RawSeriesDataset
from vcloud.data.synthetic import generate_raw


def _read_all(dataset, indices: list[int]) -> tuple[float, float]:
    """Seconds to read the samples, and a checksum so the reads cannot be skipped."""
    start = time.perf_counter()
    checksum = 0.0
    for i in indices:
        sample = dataset[i]
        checksum += float(sample["inputs"][0, 0, 0, 0]) + float(sample["target"][0, 0, 0])
    return time.perf_counter() - start, checksum


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small", choices=["tiny", "small"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--workdir", type=Path, default=None, help="reuse raw/ and prepared/ here if present")
    args = parser.parse_args()
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory(prefix="vcloud_bench_") as tmp:
        work = args.workdir or Path(tmp)
        raw, prepared = work / "raw", work / "prepared"
        if not (raw / "manifest.json").is_file():
            t0 = time.perf_counter()
            generate_raw(raw, args.preset, args.seed)
            print(f"generated {args.preset} raw data in {time.perf_counter() - t0:.1f} s")
        if not (prepared / INDEX_NAME).is_file():
            t0 = time.perf_counter()
            prepare_dataset(raw, prepared)
            print(f"prepared in {time.perf_counter() - t0:.1f} s")

        fast = SeriesDataset(prepared, "train")
        slow = RawSeriesDataset(raw, prepared, "train")
        indices = list(range(min(args.samples, len(fast))))
        # warm both paths once (imports, page cache), then time one pass each
        _read_all(fast, indices)
        _read_all(slow, indices)
        fast_s, fast_sum = _read_all(fast, indices)
        slow_s, slow_sum = _read_all(slow, indices)
        if abs(fast_sum - slow_sum) > 1e-3:
            raise SystemExit(f"prepared and raw samples differ (checksums {fast_sum} vs {slow_sum})")

        record = fast.records[0]
        n = len(indices)
        print(f"series: {n} x T={fast.n_inputs}, {record.height}x{record.width} px, 13+2 bands; "
              f"raw files per sample: {len(record.raw.s2) * 3 + 1}")
        print(f"prepared: {fast_s:.3f} s -> {n / fast_s:.1f} patches/s")
        print(f"raw:      {slow_s:.3f} s -> {n / slow_s:.1f} patches/s")
        result = {"prepared_per_s": round(n / fast_s, 2), "raw_per_s": round(n / slow_s, 2),
                  "ratio": round(slow_s / fast_s, 2)}
        print(json.dumps(result))


if __name__ == "__main__":
    main()
