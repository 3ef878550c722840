"""Layout of a run's output directory, from the file names of :mod:`vcloud.contract`.

``RUN_OUTPUT_DIR/stage{N}/`` holds ``latest.pt`` (+ ``latest.prev.pt``), ``best.pt``,
``progress.json``, the training curve (``metrics.jsonl`` and ``tensorboard/``) and, once the stage
reached its epoch count, ``COMPLETE``. Later stages read
their predecessors' ``best.pt`` from the sibling directories.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vcloud import contract
from vcloud.durable import previous_generation


@dataclass(frozen=True)
class StagePaths:
    """Files of one stage inside a run output directory."""

    run_dir: Path
    stage: int

    @property
    def dir(self) -> Path:
        return self.run_dir / contract.stage_dir_name(self.stage)

    @property
    def latest(self) -> Path:
        """Resume point, rewritten every epoch (and every ``checkpoint_every_steps`` steps)."""
        return self.dir / contract.LATEST_CHECKPOINT

    @property
    def latest_prev(self) -> Path:
        return previous_generation(self.latest)

    @property
    def best(self) -> Path:
        """Best validation model so far; what later stages and the export read."""
        return self.dir / contract.BEST_CHECKPOINT

    @property
    def progress(self) -> Path:
        """Small JSON status the orchestrator reads over SSH."""
        return self.dir / contract.PROGRESS_FILE

    @property
    def complete(self) -> Path:
        """Completion marker: present only when the stage reached its epoch count."""
        return self.dir / contract.COMPLETE_FILE

    @property
    def metrics(self) -> Path:
        """Append-only training curve, a JSON line per log step and per validation."""
        return self.dir / contract.METRICS_FILE

    @property
    def tensorboard(self) -> Path:
        """Directory of the TensorBoard event files (the same curve)."""
        return self.dir / contract.TENSORBOARD_DIR

    def of_stage(self, stage: int) -> "StagePaths":
        """The same run's paths for another stage (a predecessor)."""
        return StagePaths(self.run_dir, stage)
