"""``progress.json`` and ``COMPLETE``: what the orchestrator reads instead of parsing logs.

Both are tiny JSON files written atomically, so an ``ssh cat`` never sees half a file.
``progress.json`` is rewritten at every checkpoint with where training stands and the per-epoch
history (also the source of the export's training curves); ``COMPLETE`` appears once, when the
stage reached its epoch count, and carries the last epoch's metrics and those of ``best.pt`` (the
weights the next stage and the export use; with ``validate_start`` possibly the starting model).
Their records are :mod:`vcloud.stage_records`'s, which the orchestrator parses too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vcloud.durable import atomic_write_text
from vcloud.contract import STATUS_COMPLETE, STATUS_RUNNING, STATUS_STOPPED
from vcloud.stage_records import CompleteRecord, ProgressRecord

__all__ = ["STATUS_COMPLETE", "STATUS_RUNNING", "STATUS_STOPPED", "CompleteRecord", "ProgressRecord", "read_json",
           "write_json"]


def write_json(path: Path, payload: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=False) + "\n")


def read_json(path: Path) -> dict[str, Any] | None:
    """Parsed JSON object, or ``None`` if the file does not exist."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
