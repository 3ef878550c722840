"""DataLoader kwargs: multiprocessing-only options appear only with worker processes (seed 002 issue 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from vcloud.data.dataset import SeriesDataset
from vcloud.data.loader import dataloader_kwargs

MP_ONLY = {"prefetch_factor", "persistent_workers", "multiprocessing_context"}


def test_no_multiprocessing_options_without_workers() -> None:
    kwargs = dataloader_kwargs(2, 0, shuffle=True, seed=0, drop_last=True, prefetch_factor=4)
    assert not MP_ONLY & kwargs.keys()
    assert kwargs["num_workers"] == 0 and kwargs["batch_size"] == 2 and kwargs["drop_last"] is True


def test_multiprocessing_options_with_workers() -> None:
    kwargs = dataloader_kwargs(2, 3, shuffle=False, seed=0, drop_last=False, prefetch_factor=4,
                               persistent_workers=False)
    assert kwargs["prefetch_factor"] == 4 and kwargs["persistent_workers"] is False
    assert kwargs["multiprocessing_context"] == "spawn"


def test_plain_pytorch_rejects_prefetch_without_workers(tiny_prepared: Path) -> None:
    """The failure the kwargs builder exists to prevent."""
    with pytest.raises(ValueError, match="prefetch_factor"):
        DataLoader(SeriesDataset(tiny_prepared, "val"), num_workers=0, prefetch_factor=2)


def _ids(loader: DataLoader) -> list[str]:
    ids: list[str] = []
    for batch in loader:
        assert batch["inputs"].shape[1:] == (4, 13, 64, 64)
        assert batch["target_index"].dtype == torch.int64
        ids += batch["series_id"]
    return ids


def test_iterates_in_process(tiny_prepared: Path) -> None:
    ds = SeriesDataset(tiny_prepared, "train")
    ids_a = _ids(DataLoader(ds, **dataloader_kwargs(4, 0, shuffle=True, seed=5, drop_last=True)))
    ids_b = _ids(DataLoader(ds, **dataloader_kwargs(4, 0, shuffle=True, seed=5, drop_last=True)))
    assert len(ids_a) == 4 and ids_a == ids_b  # drop_last drops the partial batch; order is seeded


@pytest.mark.timeout(120)
def test_iterates_with_spawned_workers(tiny_prepared: Path) -> None:
    ds = SeriesDataset(tiny_prepared, "train")
    kwargs = dataloader_kwargs(2, 2, shuffle=True, seed=5, drop_last=False, prefetch_factor=2)
    loader = DataLoader(ds, **kwargs)
    first = _ids(loader)
    second = _ids(loader)  # persistent workers serve a second epoch
    assert sorted(first) == sorted(second) == sorted(r.series_id for r in ds.records)
    in_process = _ids(DataLoader(ds, **dataloader_kwargs(2, 0, shuffle=True, seed=5, drop_last=False)))
    assert first == in_process  # the first epoch's order depends on the seed only


@pytest.mark.parametrize("field, kwargs, message", [
    ("batch_size", {"batch_size": 0, "num_workers": 0}, "batch_size must be >= 1"),
    ("num_workers", {"batch_size": 1, "num_workers": -1}, "num_workers must be >= 0"),
    ("prefetch_factor", {"batch_size": 1, "num_workers": 1, "prefetch_factor": 0},
     "prefetch_factor must be >= 1"),
    ("context", {"batch_size": 1, "num_workers": 1, "multiprocessing_context": "thread"}, "known: spawn"),
])
def test_invalid_values_are_named(field: str, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataloader_kwargs(shuffle=False, seed=0, drop_last=False, **kwargs)
