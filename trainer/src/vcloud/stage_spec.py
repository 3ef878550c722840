"""What a training stage is: the interface between the one training loop and the four stages.

The training loop is the same for every stage; a :class:`StageSpec` supplies the parts that are
not: how to build the model (from its config section and the predecessors' ``best.pt``), the loss
of a batch, and the prediction validation compares with the cloud-free target. The stages
themselves are in :mod:`vcloud.models.stage_specs`, listed by :mod:`vcloud.stage_registry`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from vcloud.config import VCloudConfig
from vcloud.training.paths import StagePaths

log = logging.getLogger(__name__)

Batch = dict[str, Any]
"""One collated batch of ``SeriesDataset`` items on the training device: ``inputs`` [B,T,13,H,W],
``masks`` [B,T,1,H,W], ``target`` [B,13,H,W], ``target_index`` [B], ``s1`` [B,T,2,H,W], ``series_id``."""

class StageError(RuntimeError):
    """A stage cannot run: not registered, or a predecessor's ``best.pt`` is missing or of another
    lineage."""


StageLoader = Callable[[int, Path, "BuildContext"], tuple[nn.Module, dict[str, Any]]]
"""Rebuilds stage N's model from a checkpoint, with its checkpoint (:func:`vcloud.stage_registry.load_stage_model`)."""


@dataclass(frozen=True)
class BuildContext:
    """What a stage may use to build its model."""

    config: VCloudConfig
    """The run's configuration (memory switches, other stages' settings)."""
    run_dir: Path
    """Run output directory holding ``stage{k}/best.pt`` of earlier stages."""
    device: torch.device
    data_root: Path | None = None
    """The prepared dataset the stage trains on, when it is being trained (stage 3's scene adapter
    takes its reference from the labeled training split); None when a checkpoint is only loaded."""
    built_from: dict[int, str] = field(default_factory=dict, compare=False)
    """The digest of each predecessor ``best.pt`` loaded so far, by stage: the model's lineage."""
    load_stage: StageLoader | None = field(default=None, compare=False)
    """How a predecessor's model is rebuilt from its checkpoint, handed in by what knows the stages
    (:func:`vcloud.stage_registry.build_context`): a stage built on another never imports the
    registry that lists it."""

    def predecessor_checkpoint(self, stage: int) -> Path:
        path = StagePaths(self.run_dir, stage).best
        if not path.is_file():
            raise StageError(
                f"stage {stage} checkpoint {path} not found: train stage {stage} first "
                f"(python -m vcloud.train --stage {stage} ... --out {self.run_dir})"
            )
        return path

    def load_predecessor(self, stage: int) -> nn.Module:
        """Stage ``stage``'s best model, architecture from its checkpoint, in eval mode on ``device``."""
        from vcloud import lineage

        if self.load_stage is None:
            raise StageError(f"cannot load stage {stage}'s model: this build context was made without a stage "
                             "loader (make it with vcloud.stage_registry.build_context)")
        path = self.predecessor_checkpoint(stage)
        model, checkpoint = self.load_stage(stage, path, self)
        recorded = lineage.recorded_lineage(checkpoint)
        replaced = lineage.replaced_since(recorded, lineage.current_digests(self.run_dir, recorded))
        if replaced:
            off = stage > 0 and not self.config.train.for_stage(stage).run_by_default
            raise StageError(lineage.mismatch_message(stage, path, replaced, off_by_default=off))
        self.built_from[stage] = lineage.checkpoint_digest(path)
        log.info("stage %d's best.pt %s: %s", stage, lineage.short_digest(self.built_from[stage]),
                 lineage.describe_lineage(checkpoint))
        return model.eval()


@dataclass(frozen=True)
class StageSpec:
    """The stage-specific parts of training."""

    number: int
    name: str
    parse_model_config: Callable[[dict[str, Any]], Any]
    """Validate ``model.stage{N}`` (``XConfig.from_dict``); rejects unknown keys."""
    build_model: Callable[[Any, BuildContext], nn.Module]
    """Model from its parsed config; may load predecessors through the context."""
    loss: Callable[[nn.Module, Batch], torch.Tensor]
    """Scalar training loss. The model may be DDP-wrapped: call ``model(...)`` (its forward) so
    gradients are synchronised, not other methods."""
    predict: Callable[[nn.Module, Batch], torch.Tensor]
    """[B,13,H,W] in [0,1] that validation scores against ``batch["target"]`` (unwrapped model)."""
    restore: Callable[[nn.Module, Batch], torch.Tensor] | None = None
    """Cloud-free estimate from the cloudy inputs alone, for export; defaults to ``predict``."""
    requires: tuple[int, ...] = ()
    """Earlier stages whose ``best.pt`` must exist before this stage starts."""
    uses_curriculum: bool = False
    """Train on the cloud-type curriculum (``thin_only`` -> ``mixed`` -> ``all``)."""
    train_dataset: Callable[[Dataset, BuildContext], Dataset] | None = None
    """Given the labeled training split, the dataset to train on (stage 3 adds pseudo-labels).
    Called on every rank before DDP starts, so any cache it builds exists on all ranks."""
    validate_start: bool = False
    """The untrained model already gives its predecessor's answer: validate it before the first
    step, so ``best.pt`` is never worse than what the stage started from."""
    start_tolerance: Callable[[Any], float | None] | None = None
    """Given the parsed model config: None when trained weights must beat the validated start (by
    ``train.start_min_gain``) to become ``best.pt``; a number when validation only guards the stage
    (stage 3 adapting to an unlabeled domain): the latest validated weights that lose at most this
    against the start become ``best.pt`` (:func:`vcloud.training.best.keeps_trained`)."""

    def restore_batch(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return (self.restore or self.predict)(model, batch)
