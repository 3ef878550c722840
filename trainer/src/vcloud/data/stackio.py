"""Reading and writing prepared stacks (uncompressed, contiguous uint16 TIFFs) with tifffile.

Training needs only numpy, torch and tifffile: not rasterio/GDAL, which prepare uses on the raw data.
The CSC PyTorch container on LUMI ships without tifffile; the import error below says how to add it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

try:
    import tifffile
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "tifffile is required to read prepared vcloud stacks but is not installed. In a container without it "
        "(e.g. CSC's PyTorch image on LUMI): pip install --target=/projappl/<project>/pylibs tifffile and put "
        "that directory on PYTHONPATH in the job's inner script"
    ) from exc


def read_stack(path: Path) -> np.ndarray:
    """The whole [planes, H, W] uint16 stack in one contiguous read."""
    return tifffile.imread(path)


def write_stack(path: Path, stack: np.ndarray) -> None:
    """One uncompressed, contiguous TIFF per series, written to a temp name and renamed."""
    tmp = path.with_name(path.name + ".tmp")
    tifffile.imwrite(tmp, stack, photometric="minisblack", contiguous=True)
    os.replace(tmp, path)
