"""``metrics.jsonl``: a stage's training curve, one JSON object a line, written by global rank 0.

Append-only while training: each line is flushed and fsync'ed as it is written, so a checkpoint
written after it never records a step whose line a node crash could still lose. When the stage
resumes, the lines after the checkpoint's step (written before the job died, and about to be written
again) are dropped in one atomic rewrite; a stage stopped and resumed any number of times then has
each step's line once, as an uninterrupted run has. The record layout is :mod:`vcloud.contract`'s
(``metrics_train_record``, ``metrics_val_record``), where the orchestrator reads it too.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from vcloud.durable import atomic_write_text
from vcloud.contract import parse_metrics_lines

log = logging.getLogger(__name__)


def encode_record(record: Mapping[str, Any]) -> str:
    """One line of strict JSON (no ``NaN``/``Infinity``, which browsers' JSON parsers refuse: null)."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
    return json.dumps(clean, separators=(", ", ": "), allow_nan=False)


def keep_through_step(path: Path, step: int | None) -> int:
    """Rewrite ``path`` atomically with only its records of ``global_step <= step`` (``None``: none,
    a fresh start); returns how many lines were dropped, a torn last line included. Leaves a file
    that needs no change untouched."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return 0
    records = parse_metrics_lines(text)
    kept = [r for r in records if step is not None and r["global_step"] <= step]
    new_text = "".join(encode_record(r) + "\n" for r in kept)
    if new_text != text:
        atomic_write_text(path, new_text)
    return sum(1 for line in text.splitlines() if line.strip()) - len(kept)


class MetricsFile:
    """The open, append-only ``metrics.jsonl`` of the stage being trained."""

    def __init__(self, path: Path, handle: IO[str]) -> None:
        self.path = path
        self._handle = handle

    @classmethod
    def open(cls, path: Path, *, resumed_step: int | None) -> MetricsFile:
        """Cut the file back to the checkpoint's step (``None``: training starts afresh), then open
        it for appending."""
        dropped = keep_through_step(path, resumed_step)
        if dropped:
            where = f"after step {resumed_step}" if resumed_step is not None else "of a run without a checkpoint"
            log.info("%s: dropped %d line(s) %s; they are written again as training repeats those steps",
                     path, dropped, where)
        path.parent.mkdir(parents=True, exist_ok=True)
        return cls(path, open(path, "a", encoding="utf-8"))

    def append(self, record: Mapping[str, Any]) -> None:
        self._handle.write(encode_record(record) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()
