"""Layout of a run's output directory, computed in this one place.

``RUN_OUTPUT_DIR/stage{N}/`` holds ``latest.pt`` (+ ``latest.prev.pt``), ``best.pt``,
``progress.json`` and, once the stage reached its epoch count, ``COMPLETE``. Later stages read
their predecessors' ``best.pt`` from the sibling directories.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vcloud.checkpoint import previous_generation


@dataclass(frozen=True)
class StagePaths:
    """Files of one stage inside a run output directory."""

    run_dir: Path
    stage: int

    @property
    def dir(self) -> Path:
        return self.run_dir / f"stage{self.stage}"

    @property
    def latest(self) -> Path:
        """Resume point, rewritten every epoch (and every ``checkpoint_every_steps`` steps)."""
        return self.dir / "latest.pt"

    @property
    def latest_prev(self) -> Path:
        return previous_generation(self.latest)

    @property
    def best(self) -> Path:
        """Best validation model so far; what later stages and the export read."""
        return self.dir / "best.pt"

    @property
    def progress(self) -> Path:
        """Small JSON status the orchestrator reads over SSH."""
        return self.dir / "progress.json"

    @property
    def complete(self) -> Path:
        """Completion marker: present only when the stage reached its epoch count."""
        return self.dir / "COMPLETE"

    def of_stage(self, stage: int) -> "StagePaths":
        """The same run's paths for another stage (a predecessor)."""
        return StagePaths(self.run_dir, stage)
