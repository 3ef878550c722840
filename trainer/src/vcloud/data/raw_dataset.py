"""``RawSeriesDataset``: the same samples as :class:`SeriesDataset`, read from the per-date raw GeoTIFFs.

It exists to measure what prepare buys (``benchmarks/loader_throughput.py``) and to check that
prepare changed nothing but the container. Files are opened with rasterio inside ``__getitem__``,
i.e. inside each DataLoader worker; no handle is ever stored on the dataset.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from vcloud.data.bands import quantize
from vcloud.data.dataset import filter_by_cloud_types, sample_from_stack
from vcloud.data.geotiff import read_cloud_codes, read_s1, read_s2
from vcloud.data.index import StackLayout, load_index
from vcloud.data.selection import detect_clouds


class RawSeriesDataset(Dataset):
    """Samples of one split of a prepared index, assembled from the raw layout at ``raw_root``."""

    def __init__(self, raw_root: Path, prepared_root: Path, split: str,
                 cloud_types: frozenset[str] | None = None) -> None:
        self.raw_root = Path(raw_root)
        self.index = load_index(prepared_root)
        self.layout = StackLayout(self.index.n_inputs)
        self.records = filter_by_cloud_types(self.index.split(split), cloud_types)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict:
        r = self.records[i]
        root = self.raw_root
        s2 = [read_s2(root / p) for p in r.raw.s2]
        codes = [read_cloud_codes(root / m) if m else detect_clouds(x) for m, x in zip(r.raw.cloud_masks, s2)]
        s1 = [read_s1(root / p) for p in r.raw.s1]
        target = read_s2(root / r.raw.target)
        stack = np.concatenate([
            quantize(np.concatenate(s2)), quantize(target), quantize(np.concatenate(s1)), np.stack(codes),
        ])
        return sample_from_stack(stack, self.layout, r, float(self.index.quant))
