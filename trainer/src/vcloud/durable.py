"""Durable, atomic file writes, torch-free: shared by the checkpoint writer, the dataset index and the
outputs mirror.

Every file is created with the process's umask, as ``open`` would: a project's members share the
output and data directories (umask 002), and ``mkstemp``'s 0600 would hide a file from the others."""

from __future__ import annotations

import os
import tempfile
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


def previous_generation(path: Path) -> Path:
    """``latest.pt`` -> ``latest.prev.pt``."""
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes, *, keep_previous: bool = False) -> None:
    """Replace ``path`` with ``data`` so that readers see either the old or the new file, whole.

    With ``keep_previous`` the replaced file survives as :func:`previous_generation` of ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        os.fchmod(fd, 0o666 & ~_current_umask())  # mkstemp's 0600 would hide it from the project group
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if keep_previous and path.exists():
            os.replace(path, previous_generation(path))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """Atomic replacement for small text files (``progress.json``, ``COMPLETE``)."""
    atomic_write_bytes(path, text.encode("utf-8"))
