"""The stage registry: the four training stages by number, listed once.

What a stage is (:class:`StageSpec`, :class:`BuildContext`) lives in :mod:`vcloud.stage_spec`; the
stages themselves in :mod:`vcloud.models.stage_specs`. This module puts them in one table and
rebuilds a stage's model from its checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from vcloud.checkpoint import load_checkpoint
from vcloud.config import VCloudConfig
from vcloud.models.stage_specs import STAGE_SPECS, least_cloudy_input
from vcloud.stage_spec import Batch, BuildContext, StageError, StageSpec

__all__ = ["STAGES_BY_NUMBER", "Batch", "BuildContext", "StageError", "StageSpec", "available_stages", "build_context",
           "get_stage", "least_cloudy_input", "load_stage_model"]

STAGES_BY_NUMBER: dict[int, StageSpec] = {spec.number: spec for spec in STAGE_SPECS}


def available_stages() -> list[int]:
    return sorted(STAGES_BY_NUMBER)


def get_stage(number: int) -> StageSpec:
    try:
        return STAGES_BY_NUMBER[number]
    except KeyError:
        known = ", ".join(map(str, sorted(STAGES_BY_NUMBER))) or "none"
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


def build_context(config: VCloudConfig, run_dir: Path, device: torch.device,
                  data_root: Path | None = None) -> BuildContext:
    """What a stage builds its model with, able to load the stages it is built on."""
    return BuildContext(config=config, run_dir=run_dir, device=device, data_root=data_root,
                        load_stage=load_stage_model)
