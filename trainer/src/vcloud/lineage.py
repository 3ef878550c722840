"""Which checkpoints a stage's model was built from, and whether they are still the run's.

A stage builds on its predecessors' ``best.pt`` (stage 3 on stage 2's, stage 2 on stages 0 and 1).
Each checkpoint a stage writes records the digests of the ``best.pt`` files it was built from
(``lineage``), and ``COMPLETE`` repeats them. A stage trained again replaces its ``best.pt``; the
later stages' outputs then belong to the weights it replaced. Stage 3 run without stage 2 (off by
default) would otherwise build on a ``stage2/best.pt`` that an earlier forced run trained from
another stage 1, and say nothing. So loading a predecessor checks that the checkpoints it was
built from are still the run's, and refuses, naming both digests, where one was trained again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vcloud.checkpoint import file_digest
from vcloud.contract import LINEAGE_KEY, describe_built_from, describe_lineage, recorded_lineage, short_digest
from vcloud.training.paths import StagePaths

__all__ = ["LINEAGE_KEY", "Replaced", "checkpoint_digest", "current_digests", "describe_built_from",
           "describe_lineage", "lineage_json", "mismatch_message", "recorded_lineage", "replaced_since",
           "resume_refusal", "short_digest"]

_digests: dict[tuple[str, int, int, int], str] = {}
"""sha256 by (path, inode, size, mtime): a checkpoint loaded twice in one process is read once."""


def checkpoint_digest(path: Path) -> str:
    """The sha256 of a checkpoint file's bytes (cached while the file is unchanged)."""
    stat = os.stat(path)
    key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _digests:
        _digests[key] = file_digest(path)
    return _digests[key]


def lineage_json(built_from: Mapping[int, str]) -> dict[str, str]:
    """The record's form of ``built_from``: JSON object keys are strings."""
    return {str(stage): digest for stage, digest in sorted(built_from.items())}


@dataclass(frozen=True)
class Replaced:
    """A checkpoint a stage was built from that is no longer the run's."""

    stage: int
    recorded: str
    now: str | None
    """The digest of that stage's ``best.pt`` now; None where it is gone."""


def replaced_since(recorded: Mapping[int, str], now: Mapping[int, str | None]) -> list[Replaced]:
    """The recorded predecessors whose ``best.pt`` is now another file (or none), by stage."""
    return [Replaced(stage, digest, now.get(stage)) for stage, digest in sorted(recorded.items())
            if now.get(stage) != digest]


def current_digests(run_dir: Path, stages: Mapping[int, Any]) -> dict[int, str | None]:
    """The digest of each named stage's ``best.pt`` in ``run_dir`` now (None: none there)."""
    now: dict[int, str | None] = {}
    for stage in stages:
        best = StagePaths(run_dir, stage).best
        now[stage] = checkpoint_digest(best) if best.is_file() else None
    return now


def mismatch_message(stage: int, path: Path, replaced: list[Replaced], *, off_by_default: bool) -> str:
    """Why a predecessor's ``best.pt`` is refused, and the two ways on."""
    changes = "; ".join(f"stage {r.stage}'s best.pt {short_digest(r.recorded)}, which is now {short_digest(r.now)}"
                        for r in replaced)
    trained_again = ", ".join(str(r.stage) for r in replaced)
    aside = (f", or move {path.parent} aside: stage {stage} is off by default, and without its best.pt the next "
             f"stage starts from stage {stage}'s untrained start" if off_by_default else "")
    return (f"{path} (stage {stage}) was built from {changes}: stage(s) {trained_again} were trained again "
            f"after stage {stage}, so its weights belong to an earlier lineage of this run. Train stage "
            f"{stage} again from the current checkpoints (mode restart, with stage {stage} selected){aside}")


def resume_refusal(stage: int, source: Path, recorded: Mapping[int, str], now: Mapping[int, str]) -> str | None:
    """Why ``source`` (the stage's ``latest.pt``) cannot go on: it was trained on predecessors that
    were trained again since. None when it resumes on the same ones."""
    if dict(recorded) == dict(now):
        return None
    return (f"{source} holds weights {describe_built_from(recorded)}, but stage {stage} would now be "
            f"{describe_built_from(now)}: an earlier stage was trained again while stage {stage} was under way, "
            f"and its weights do not go on from another start. Train stage {stage} again (mode restart)")
