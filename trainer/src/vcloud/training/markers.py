"""``progress.json`` and ``COMPLETE``: what the orchestrator reads instead of parsing logs.

Both are tiny JSON files written atomically, so an ``ssh cat`` never sees half a file.
``progress.json`` is rewritten at every checkpoint with where training stands and the per-epoch
history (also the source of the export's training curves); ``COMPLETE`` appears once, when the
stage reached its epoch count, and carries the last epoch's metrics and those of ``best.pt`` (the
weights the next stage and the export use; with ``validate_start`` possibly the starting model).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from vcloud.checkpoint import atomic_write_text

STATUS_RUNNING = "running"
STATUS_STOPPED = "stopped"
"""Stopped on a signal after checkpointing; the stage resumes when rerun."""
STATUS_COMPLETE = "complete"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_json(path: Path, payload: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=False) + "\n")


def read_json(path: Path) -> dict[str, Any] | None:
    """Parsed JSON object, or ``None`` if the file does not exist."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None


def progress_record(*, stage: int, status: str, epoch: int, epochs_total: int, step: int,
                    batch_in_epoch: int, batches_per_epoch: int, best: dict[str, Any] | None,
                    last_metrics: dict[str, float] | None, history: list[dict[str, Any]],
                    world_size: int, device: str, code_hash: str | None = None) -> dict[str, Any]:
    """The content of ``progress.json``; ``epoch`` counts completed epochs; ``code_hash``: the synced
    code that wrote it (None outside a cluster job)."""
    return {
        "stage": stage,
        "status": status,
        "epoch": epoch,
        "epochs_total": epochs_total,
        "step": step,
        "batch_in_epoch": batch_in_epoch,
        "batches_per_epoch": batches_per_epoch,
        "best_metric": best,
        "last_metrics": last_metrics or {},
        "world_size": world_size,
        "device": device,
        "code_hash": code_hash,
        "updated_at": _now(),
        "history": history,
    }


def complete_record(*, stage: int, epochs: int, step: int, final_metrics: dict[str, float],
                    best: dict[str, Any] | None, code_version: str,
                    code_hash: str | None = None) -> dict[str, Any]:
    """The content of ``COMPLETE``; ``code_hash``: the synced code that finished the stage."""
    return {
        "stage": stage,
        "epochs": epochs,
        "step": step,
        "final_metrics": final_metrics,
        "best_metric": best,
        "code_version": code_version,
        "code_hash": code_hash,
        "completed_at": _now(),
    }
