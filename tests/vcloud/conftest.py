"""Shared fixtures for trainer tests: tiny synthetic datasets written once per test session.

``tiny_raw`` is a raw SEN12MS-CR-TS-layout root (4 locations x 3 patches, 64x64, T=4) and
``tiny_prepared`` the prepared root built from it (train/val/test by location). Treat both as
read-only; copy them into ``tmp_path`` before changing anything.

Every trainer test runs PyTorch on one thread (and its training subprocesses get
``OMP_NUM_THREADS=1``): how a CPU kernel splits a reduction over threads changes its rounding, so
the suite must not depend on the machine's core count.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vcloud.data.prepare import prepare_dataset
from vcloud.data.synthetic import generate_raw


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """Session-wide, so module-scoped training fixtures run on one thread too (small convolutions
    are also faster on one thread than on two contended ones)."""
    torch.set_num_threads(1)


@pytest.fixture
def float64_default():
    """Build tensors and models in float64 for the test (reference computations whose rounding is
    ~1e-16 relative, so a tolerance holds on any CPU)."""
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(dtype)


@pytest.fixture(scope="session")
def tiny_raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_raw(tmp_path_factory.mktemp("tiny_raw"), preset="tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_prepared(tiny_raw: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare_dataset(tiny_raw, tmp_path_factory.mktemp("tiny_prepared"))


@pytest.fixture(scope="session")
def tiny_raw_real_layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Like the real SEN12MS-CR-TS: no masks, no clean scene; T+1 dates, one of them cloud-free."""
    root = tmp_path_factory.mktemp("tiny_raw_real")
    return generate_raw(root, preset="tiny", seed=1, with_ground_truth=False)


@pytest.fixture(scope="session")
def tiny_prepared_real_layout(tiny_raw_real_layout: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare_dataset(tiny_raw_real_layout, tmp_path_factory.mktemp("tiny_prepared_real"))
