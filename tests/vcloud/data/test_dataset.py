"""SeriesDataset: the sample contract, curriculum filtering, lazy and picklable file access."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vcloud.data.dataset import SeriesDataset
from vcloud.data.index import load_index


def test_sample_contract(tiny_prepared: Path) -> None:
    ds = SeriesDataset(tiny_prepared, "train")
    sample = ds[0]
    assert set(sample) == {"inputs", "masks", "target", "target_index", "s1", "series_id"}
    shapes = {
        "inputs": (4, 13, 64, 64), "masks": (4, 1, 64, 64), "target": (13, 64, 64), "s1": (4, 2, 64, 64),
    }
    for key, shape in shapes.items():
        x = sample[key]
        assert x.shape == shape and x.dtype == torch.float32, key
        assert torch.isfinite(x).all() and x.min() >= 0.0 and x.max() <= 1.0, key
    assert set(sample["masks"].unique().tolist()) <= {0.0, 1.0} and sample["masks"].sum() > 0
    assert sample["target_index"].dtype == torch.int64 and sample["target_index"].ndim == 0
    assert 0 <= int(sample["target_index"]) < 4
    assert sample["series_id"] == ds.meta(0).series_id
    # cloudy pixels of the target date's observation are brighter than the clean target there
    t = int(sample["target_index"])
    cloud = sample["masks"][t, 0] > 0
    assert (sample["inputs"][t][1:4, cloud] - sample["target"][1:4, cloud]).mean() > 0.02


def test_s1_nan_is_zero_and_in_range(tiny_prepared: Path) -> None:
    ds = SeriesDataset(tiny_prepared, "train")
    s1 = torch.cat([ds[i]["s1"] for i in range(len(ds))])
    assert torch.isfinite(s1).all() and 0.0 <= s1.min() and s1.max() <= 1.0
    # the synthetic generator writes NaN no-data edges into some S1 dates; they must read as 0
    assert (s1[:, :, :, 0] == 0).any()


@pytest.mark.parametrize("types, expected_max", [
    (frozenset({"thin"}), {"clear", "thin"}),
    (frozenset({"thin", "thick"}), {"clear", "thin", "thick"}),
])
def test_cloud_type_filter(tiny_prepared: Path, types: frozenset[str], expected_max: set[str]) -> None:
    full = SeriesDataset(tiny_prepared, "train")
    filtered = SeriesDataset(tiny_prepared, "train", cloud_types=types)
    assert 0 < len(filtered) < len(full)
    for i in range(len(filtered)):
        assert set(filtered.meta(i).cloud_types) <= expected_max
    kept = {r.series_id for r in filtered.records}
    for r in full.records:
        assert (r.series_id in kept) == (set(r.cloud_types) <= expected_max)


def test_unknown_split_or_cloud_type_is_rejected(tiny_prepared: Path) -> None:
    with pytest.raises(ValueError, match="known: train, val, test"):
        SeriesDataset(tiny_prepared, "training")
    with pytest.raises(ValueError, match="unknown cloud types"):
        SeriesDataset(tiny_prepared, "train", cloud_types=frozenset({"cirrus"}))


def test_missing_index_explains_how_to_prepare(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="vcloud.data.prepare"):
        SeriesDataset(tmp_path, "train")


def test_dataset_pickles_after_reading(tiny_prepared: Path) -> None:
    ds = SeriesDataset(tiny_prepared, "val")
    before = ds[0]
    clone = pickle.loads(pickle.dumps(ds))
    after = clone[0]
    assert torch.equal(before["inputs"], after["inputs"]) and before["series_id"] == after["series_id"]


def test_truncated_stack_names_the_file(tiny_prepared: Path, tmp_path: Path) -> None:
    import shutil

    import tifffile

    root = tmp_path / "p"
    shutil.copytree(tiny_prepared, root)
    record = load_index(root).split("test")[0]
    stack = tifffile.imread(root / record.file)
    tifffile.imwrite(root / record.file, stack[:10])
    ds = SeriesDataset(root, "test")
    i = [r.series_id for r in ds.records].index(record.series_id)
    with pytest.raises(ValueError, match=record.series_id):
        ds[i]


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def test_training_reads_prepared_data_without_rasterio(tiny_prepared: Path) -> None:
    """Cluster containers may lack GDAL/rasterio: only prepare needs it."""
    proc = _run_python(
        "import sys; sys.modules['rasterio'] = None\n"
        "from vcloud.data.dataset import SeriesDataset\n"
        "import vcloud.data.loader, vcloud.data.curriculum, vcloud.metrics\n"
        f"ds = SeriesDataset({str(tiny_prepared)!r}, 'train')\n"
        "print(ds[0]['inputs'].shape, ds.meta(0).crs)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "torch.Size([4, 13, 64, 64]) EPSG:" in proc.stdout


def test_missing_tifffile_says_how_to_install_it() -> None:
    proc = _run_python("import sys; sys.modules['tifffile'] = None\nimport vcloud.data.dataset\n")
    assert proc.returncode != 0
    assert "pip install --target=/projappl/<project>/pylibs tifffile" in proc.stderr
