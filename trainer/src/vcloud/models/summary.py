"""Parameter counts of every stage of a config, without allocating memory.

``python -m vcloud.models.summary --config trainer/configs/model_full.yaml`` builds every model
on PyTorch's ``meta`` device (shapes only, no storage), so the 154M-parameter production draft
model can be checked on a laptop or login node. Prints one line per stage and, last, one JSON
object ``{"stage0": n, "stage1": n, "stage2": n, "stage3": n}``.

Counts are *trainable* parameters of each stage: stage 2 trains only the denoiser (autoencoder
and draft model frozen); stage 3 fine-tunes draft model and denoiser together.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Mapping, TypedDict

import torch
import yaml
from torch import nn

from vcloud.models.autoencoder import Autoencoder, AutoencoderConfig
from vcloud.models.cfdt import CFDT, CFDTConfig
from vcloud.config_fields import ModelConfigError
from vcloud.models.draft_and_refiner import DraftAndRefiner
from vcloud.models.latent_refiner import LatentDiffusionRefiner, RefinerConfig
from vcloud.models.selftrain import SelfTrainConfig


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class StageModels(TypedDict):
    """Every stage's model, as :func:`build_stage_models` builds them (stages 2 and 3 share modules)."""

    stage0: Autoencoder
    stage1: CFDT
    stage2: DraftAndRefiner
    stage3: DraftAndRefiner


def build_stage_models(model_sections: Mapping[str, Any], memory: Any = None,
                       device: str | torch.device = "meta") -> StageModels:
    """Every stage's model from the ``model:`` sections of a config (on ``device``)."""
    with torch.device(device):
        autoencoder = Autoencoder(AutoencoderConfig.from_dict(dict(model_sections.get("stage0") or {})))
        draft = CFDT(CFDTConfig.from_dict(dict(model_sections.get("stage1") or {})), memory=memory)
        refiner = LatentDiffusionRefiner(RefinerConfig.from_dict(dict(model_sections.get("stage2") or {})),
                                         autoencoder)
        stage2 = DraftAndRefiner(draft, refiner, train_draft=False)
        selftrain = SelfTrainConfig.from_dict(dict(model_sections.get("stage3") or {}))
        stage3 = DraftAndRefiner(draft, refiner, train_draft=True,
                                 draft_loss_weight=selftrain.draft_loss_weight,
                                 refiner_loss_weight=selftrain.refiner_loss_weight)
    return {"stage0": autoencoder, "stage1": draft, "stage2": stage2, "stage3": stage3}


def parameter_counts(config: Mapping[str, Any]) -> dict[str, int]:
    """Trainable parameters per stage of a parsed YAML config document."""
    models = build_stage_models(config.get("model") or {}, (config.get("memory") or None))
    # Stage 2 trains only the denoiser, stage 3 the draft model and the denoiser; counted by
    # module rather than requires_grad because stages 2 and 3 share (and re-freeze) modules here.
    counts = {
        "stage0": count_parameters(models["stage0"]),
        "stage1": count_parameters(models["stage1"]),
        "stage2": count_parameters(models["stage2"].refiner.denoiser),
    }
    counts["stage3"] = counts["stage1"] + counts["stage2"]
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vcloud.models.summary", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, type=Path, help="trainer/configs/model_*.yaml")
    args = parser.parse_args(argv)
    try:
        config = yaml.safe_load(args.config.read_text()) or {}
        counts = parameter_counts(config)
    except (OSError, yaml.YAMLError, ModelConfigError) as exc:
        print(f"error: {args.config}: {exc}", file=sys.stderr)
        return 2
    labels = {"stage0": "autoencoder", "stage1": "draft model (CFDT)",
              "stage2": "refiner denoiser (autoencoder, draft frozen)", "stage3": "self-training (draft + denoiser)"}
    for name, n in counts.items():
        print(f"{name}  {labels[name]:<46} {n:>13,d} parameters ({n / 1e6:.1f}M)")
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
