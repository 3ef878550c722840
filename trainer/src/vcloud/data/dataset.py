"""``SeriesDataset``: prepared series as tensors, read lazily (one TIFF per sample, opened per call).

Construction only reads ``index.json``; no file handle is held, so the dataset pickles cleanly into
DataLoader workers started with fork or spawn. Needs numpy, torch and tifffile, not rasterio.
"""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch.utils.data import Dataset

from vcloud.data.bands import N_S1, N_S2, OBSERVATION_TYPES
from vcloud.data.index import PreparedIndex, SeriesRecord, StackLayout, load_index
from vcloud.data.selection import SPLITS
from vcloud.data.stackio import read_stack


@dataclass(frozen=True)
class SeriesMeta:
    """Where a sample lies on Earth and in time: enough to export predictions as GeoTIFFs."""

    series_id: str
    region: str
    crs: str
    """e.g. ``EPSG:32632``"""
    transform: tuple[float, float, float, float, float, float]
    """rasterio affine coefficients (a, b, c, d, e, f)."""
    height: int
    width: int
    input_dates: tuple[str, ...]
    target_date: str
    target_index: int
    cloud_types: tuple[str, ...]

    @property
    def affine(self):  # -> affine.Affine; imported here so that training does not need rasterio
        from rasterio.transform import Affine

        return Affine(*self.transform)


def filter_by_cloud_types(records: list[SeriesRecord],
                          cloud_types: frozenset[str] | None) -> list[SeriesRecord]:
    """Series whose every input is clear or of an allowed cloud type (``None``: all series)."""
    if cloud_types is None:
        return list(records)
    unknown = set(cloud_types) - set(OBSERVATION_TYPES)
    if unknown:
        raise ValueError(f"unknown cloud types {sorted(unknown)} (known: {', '.join(OBSERVATION_TYPES)})")
    allowed = set(cloud_types) | {"clear"}
    return [r for r in records if set(r.cloud_types) <= allowed]


def dataset_len(dataset: Dataset) -> int:
    """``len(dataset)``. torch's ``Dataset`` declares no ``__len__``, but the map-style datasets training
    reads all have one (``SeriesDataset`` and the ``Subset`` and ``ConcatDataset`` stage 3 makes of it)."""
    return len(cast(Sized, dataset))


class SeriesDataset(Dataset):
    """One split of a prepared dataset. ``ds[i]`` is a dict of tensors, see :meth:`__getitem__`."""

    def __init__(self, root: Path, split: str, cloud_types: frozenset[str] | None = None) -> None:
        if split not in SPLITS:
            raise ValueError(f"split {split!r} unknown (known: {', '.join(SPLITS)})")
        self.root = Path(root)
        self.split = split
        self.cloud_types = cloud_types
        self.index: PreparedIndex = load_index(self.root)
        self.layout = StackLayout(self.index.n_inputs)
        self.records = filter_by_cloud_types(self.index.split(split), cloud_types)

    @property
    def n_inputs(self) -> int:
        return self.index.n_inputs

    def __len__(self) -> int:
        return len(self.records)

    def read_stack(self, i: int) -> np.ndarray:
        """The raw uint16 stack of sample ``i`` ([planes, H, W], see :class:`StackLayout`)."""
        record = self.records[i]
        stack = read_stack(self.root / record.file)
        if stack.shape != (self.layout.planes, record.height, record.width):
            raise ValueError(
                f"{self.root / record.file} has shape {stack.shape}, index expects "
                f"{(self.layout.planes, record.height, record.width)}; re-run prepare"
            )
        return stack

    def __getitem__(self, i: int) -> dict:
        """``inputs`` [T,13,H,W], ``masks`` [T,1,H,W] (1 = cloud or shadow), ``target`` [13,H,W],
        ``target_index`` (int64), ``s1`` [T,2,H,W], all float32 in [0, 1]; ``series_id`` (str)."""
        record = self.records[i]
        stack = self.read_stack(i)
        return sample_from_stack(stack, self.layout, record, float(self.index.quant))

    def meta(self, i: int) -> SeriesMeta:
        r = self.records[i]
        return SeriesMeta(
            series_id=r.series_id, region=r.region, crs=r.crs, transform=r.transform, height=r.height,
            width=r.width, input_dates=r.input_dates, target_date=r.target_date, target_index=r.target_index,
            cloud_types=r.cloud_types,
        )


def sample_from_stack(stack: np.ndarray, layout: StackLayout, record: SeriesRecord, quant: float) -> dict:
    """Split a prepared uint16 stack into the sample dict (shared with the raw-reading dataset)."""
    t, (h, w) = layout.n_inputs, stack.shape[1:]
    values = torch.from_numpy(stack[: layout.masks.start].astype(np.float32)) / quant
    masks = torch.from_numpy(stack[layout.masks] > 0).to(torch.float32)
    return {
        "inputs": values[layout.inputs].reshape(t, N_S2, h, w),
        "masks": masks.reshape(t, 1, h, w),
        "target": values[layout.target].clone(),
        "target_index": torch.tensor(record.target_index, dtype=torch.int64),
        "s1": values[layout.s1].reshape(t, N_S1, h, w),
        "series_id": record.series_id,
    }
