"""Checkpoint files: atomic, generational and device-agnostic.

A job can be killed at any instant (walltime, preemption, node failure), including in the middle
of writing a 342 MB checkpoint. So a checkpoint is first written to a temporary file in the same
directory, flushed and fsync'ed, then renamed over the old one (rename is atomic within a file
system) and the directory is fsync'ed so the rename itself survives a crash. The previous
``latest.pt`` is kept as ``latest.prev.pt``; if ``latest.pt`` turns out to be unreadable the loader
falls back to it with a warning instead of starting over.

Loading always maps tensors to the CPU (``map_location``) so a checkpoint written on an MI250X or
A100 resumes on a CPU-only machine and vice versa (seed 003); the caller moves state to its device.
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from vcloud.durable import atomic_write_bytes, previous_generation

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1
"""Bumped when the layout of the saved dict changes incompatibly."""

REQUIRED_KEYS = ("format", "stage", "model")


class CheckpointError(RuntimeError):
    """A checkpoint file exists but cannot be used (truncated, corrupt, wrong format)."""


def file_digest(path: Path, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's bytes: which checkpoint something was derived from."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Delete ``.*.tmp`` files left by a process killed in the middle of a write."""
    removed = []
    for tmp in Path(directory).glob(".*.tmp"):
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def save_checkpoint(path: Path, state: Mapping[str, Any], *, keep_previous: bool = True) -> None:
    """Serialise ``state`` with ``torch.save`` and write it atomically (keeping the old generation)."""
    if "format" not in state:
        state = {"format": CHECKPOINT_FORMAT, **state}
    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    atomic_write_bytes(Path(path), buffer.getvalue(), keep_previous=keep_previous)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load one checkpoint onto the CPU; raises :class:`CheckpointError` if it is unusable."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:  # truncated zip, bad pickle, disk error: all mean "unusable"
        raise CheckpointError(f"checkpoint {path} is unreadable ({type(exc).__name__}: {exc})") from exc
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS):
        raise CheckpointError(f"checkpoint {path} is not a vcloud checkpoint (missing {REQUIRED_KEYS})")
    if state["format"] != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"checkpoint {path} has format {state['format']}, this code reads format {CHECKPOINT_FORMAT}; "
            "resume with the code version that wrote it or start over with --restart"
        )
    return state


def load_latest(path: Path) -> tuple[dict[str, Any], Path] | None:
    """Load ``path`` (normally ``latest.pt``) or, if it is missing or corrupt, its previous generation.

    Returns ``(state, file_read)``, or ``None`` when neither file exists (a fresh start). Raises
    :class:`CheckpointError` when files exist but none is readable: silently starting over would
    throw away days of training.
    """
    path = Path(path)
    candidates = [path, previous_generation(path)]
    errors: list[str] = []
    for candidate in candidates:
        if not candidate.exists():
            continue
        try:
            state = load_checkpoint(candidate)
        except CheckpointError as exc:
            errors.append(str(exc))
            log.warning("%s; trying the previous generation", exc)
            continue
        if candidate != path:
            reason = "unreadable" if path.exists() else "missing"
            log.warning("%s is %s; resuming from the previous generation %s", path.name, reason, candidate)
        return state, candidate
    if errors:
        raise CheckpointError(
            "no readable checkpoint: " + "; ".join(errors)
            + ". Inspect the files, or start the stage over with --restart (old files are moved aside)"
        )
    return None
