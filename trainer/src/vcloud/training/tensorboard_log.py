"""TensorBoard event files of a stage, next to ``metrics.jsonl``: the same curve for ``tensorboard --logdir``.

Written offline (plain files, no server, no network: it works inside the container with networking
off) by global rank 0, flushed at every write so a checkpoint never gets ahead of them. A resumed
stage opens its writer with ``purge_step`` = the first step it will log, so TensorBoard hides what
the interrupted run wrote past the checkpoint and shows no step twice. Optional at run time: without
the ``tensorboard`` package the stage logs one warning and keeps ``metrics.jsonl``, which holds the
same numbers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class TensorBoardLog:
    """Scalars of one stage under ``train/...`` and ``val/...``, by global step."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer

    @classmethod
    def open(cls, log_dir: Path, *, purge_step: int) -> TensorBoardLog | None:
        """A writer into ``log_dir`` that hides earlier events from ``purge_step`` on (0: a fresh
        start hides whatever a killed first attempt left); None, with a warning, without tensorboard."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            log.warning("no TensorBoard files for this stage (%s); metrics.jsonl has the same curve. "
                        "Install the pinned tensorboard of trainer/requirements-runtime.txt to get them", exc)
            return None
        log_dir.mkdir(parents=True, exist_ok=True)
        return cls(SummaryWriter(log_dir=str(log_dir), purge_step=purge_step))

    def scalars(self, group: str, values: Mapping[str, float | None], step: int, walltime: float) -> None:
        """``group/name`` for each finite value, then flush to disk."""
        for name, value in values.items():
            if value is not None:
                self._writer.add_scalar(f"{group}/{name}", value, global_step=step, walltime=walltime)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
