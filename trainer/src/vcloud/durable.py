"""Durable renames, torch-free: shared by the checkpoint writer and the outputs mirror."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (where the file system lets a directory be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # some file systems do not allow opening directories; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
