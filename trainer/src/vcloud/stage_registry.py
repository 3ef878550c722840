"""Stage registry: what differs between the four training stages, behind one small interface.

The training loop is the same for every stage; a :class:`StageSpec` supplies the parts that are
not: how to build the model (from its config section and the predecessors' ``best.pt``), the loss
of a batch, and the prediction validation compares with the cloud-free target.

Stage 0 (the autoencoder) is defined here. Stages 1-3 are registered by the model package with
:func:`register_stage` from ``vcloud.models.stage_specs``, which :func:`get_stage` imports on first use.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from vcloud.checkpoint import load_checkpoint
from vcloud.config import VCloudConfig
from vcloud.training.paths import StagePaths

Batch = dict[str, Any]
"""One collated batch of ``SeriesDataset`` items on the training device: ``inputs`` [B,T,13,H,W],
``masks`` [B,T,1,H,W], ``target`` [B,13,H,W], ``target_index`` [B], ``s1`` [B,T,2,H,W], ``series_id``."""

STAGE_PROVIDERS = ("vcloud.models.stage_specs",)
"""Modules imported on first registry lookup; they call :func:`register_stage` for stages 1-3."""


class StageError(RuntimeError):
    """A stage cannot run: not registered, or a predecessor's ``best.pt`` is missing."""


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
        model, _ = load_stage_model(stage, self.predecessor_checkpoint(stage), self)
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


_REGISTRY: dict[int, StageSpec] = {}
_providers_loaded = False


def register_stage(spec: StageSpec) -> None:
    """Add or replace the spec for ``spec.number``."""
    _REGISTRY[spec.number] = spec


def _load_providers() -> None:
    global _providers_loaded
    if _providers_loaded:
        return
    _providers_loaded = True
    for module in STAGE_PROVIDERS:
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)


def available_stages() -> list[int]:
    _load_providers()
    return sorted(_REGISTRY)


def get_stage(number: int) -> StageSpec:
    _load_providers()
    try:
        return _REGISTRY[number]
    except KeyError:
        known = ", ".join(map(str, sorted(_REGISTRY))) or "none"
        raise StageError(f"stage {number} is not available in this code version (registered: {known})") from None


def load_stage_model(stage: int, path: Path, ctx: BuildContext) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild a stage's model from a checkpoint: architecture from the checkpoint, then weights."""
    state = load_checkpoint(path)
    if state["stage"] != stage:
        raise StageError(f"{path} holds a stage {state['stage']} model, expected stage {stage}")
    spec = get_stage(stage)
    model = spec.build_model(spec.parse_model_config(dict(state["model_config"])), ctx)
    model.load_state_dict(state["model"])
    return model.to(ctx.device), state


# ---- stage 0: autoencoder ---------------------------------------------------------------------

def _build_autoencoder(cfg: Any, ctx: BuildContext) -> nn.Module:
    from vcloud.models.autoencoder import Autoencoder

    return Autoencoder(cfg)


def _parse_autoencoder(section: Mapping[str, Any]) -> Any:
    from vcloud.models.autoencoder import AutoencoderConfig

    return AutoencoderConfig.from_dict(dict(section))


def _autoencoder_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """L1 reconstruction of the cloud-free scene and of the target date's cloudy observation.

    The stage-2 refiner encodes both (drafts and targets are clean, its condition is the cloudy
    observation), so the latent must represent clean and cloudy surfaces; L1 keeps edges sharper
    than MSE."""
    target, inputs = batch["target"], batch["inputs"]
    observed = inputs[torch.arange(inputs.shape[0], device=inputs.device), batch["target_index"]]
    images = torch.cat([target, observed])
    return F.l1_loss(model(images), images)


def _autoencoder_predict(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(batch["target"]).clamp(0.0, 1.0)


def least_cloudy_input(batch: Batch) -> torch.Tensor:
    """[B,13,H,W]: for each series the observation with the smallest cloud fraction."""
    cloud_fraction = batch["masks"].flatten(2).mean(dim=2)  # [B, T]
    best = cloud_fraction.argmin(dim=1)
    return batch["inputs"][torch.arange(best.shape[0], device=best.device), best]


def _autoencoder_restore(model: nn.Module, batch: Batch) -> torch.Tensor:
    """With only stage 0 trained, the best cloud-free guess is the clearest input, reconstructed."""
    return model(least_cloudy_input(batch)).clamp(0.0, 1.0)


STAGE0 = StageSpec(
    number=0,
    name="autoencoder",
    parse_model_config=_parse_autoencoder,
    build_model=_build_autoencoder,
    loss=_autoencoder_loss,
    predict=_autoencoder_predict,
    restore=_autoencoder_restore,
)
register_stage(STAGE0)
