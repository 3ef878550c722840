"""The draft model and the refiner trained together as one module (stages 2 and 3).

The training loop calls ``model(batch)`` for the loss (so DDP synchronises gradients) and
``model.refine(batch)`` for predictions. In stage 2 the draft model is frozen and the refiner
learns, with the level correction of the draft under the target's clouds where the config has one
(``model.stage2.level_correction``); in stage 3 (self-training) the refiner learns with the scene
adapter, the draft model or both (``model.stage3.scene_adapter``, ``model.stage3.train_draft``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vcloud.models.cfdt import CFDT
from vcloud.models.latent_refiner import LatentDiffusionRefiner
from vcloud.models.level import LevelCorrection
from vcloud.models.scene_adapter import SceneAdapter

EVAL_SEED = 0
"""DDIM seed of validation predictions, so the best-checkpoint metric is reproducible."""


def target_observation(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target date's cloudy observation [B, 13, H, W] and its cloud mask [B, 1, H, W]."""
    rows = torch.arange(batch["inputs"].shape[0], device=batch["inputs"].device)
    index = batch["target_index"].long()
    return batch["inputs"][rows, index], batch["masks"][rows, index]


def run_draft(model: CFDT, batch: dict[str, Any]) -> torch.Tensor:
    """Stage-1 draft of a batch (S1 only passed when the model uses it)."""
    s1 = batch.get("s1") if model.cfg.use_s1 else None
    return model(batch["inputs"], batch["masks"], batch["target_index"], s1)


class DraftAndRefiner(nn.Module):
    """CFDT draft followed by the latent diffusion refiner; the draft may pass through a level
    correction (stage 2, :mod:`vcloud.models.level`) and a scene adapter (stage 3,
    :mod:`vcloud.models.scene_adapter`) before the refiner sees it."""

    def __init__(self, draft_model: CFDT, refiner: LatentDiffusionRefiner, *, train_draft: bool,
                 draft_loss_weight: float = 1.0, refiner_loss_weight: float = 1.0,
                 adapter: SceneAdapter | None = None, level: LevelCorrection | None = None) -> None:
        super().__init__()
        self.draft_model = draft_model
        self.refiner = refiner
        self.level = level
        self.adapter = adapter
        self.train_draft = train_draft
        self.draft_loss_weight = draft_loss_weight
        self.refiner_loss_weight = refiner_loss_weight
        self.draft_model.requires_grad_(train_draft)

    @property
    def learns_draft(self) -> bool:
        """Whether training changes the draft the refiner starts from (the draft model, the level
        correction or the adapter)."""
        return self.train_draft or self.adapter is not None or self.level is not None

    def train(self, mode: bool = True) -> "DraftAndRefiner":
        super().train(mode)
        if not self.train_draft:
            self.draft_model.eval()
        return self

    def _adapted_draft(self, batch: dict[str, Any]) -> torch.Tensor:
        """The draft model's output with the level correction under the target's clouds and the
        adapter's per-band correction (float32, unclamped)."""
        if self.train_draft:
            draft = run_draft(self.draft_model, batch).float()
        else:
            with torch.no_grad():
                draft = run_draft(self.draft_model, batch).float()
        if self.level is not None:
            draft = self.level(batch["inputs"], batch["masks"], batch["target_index"], draft).float()
        if self.adapter is not None:
            draft = draft + self.adapter(batch["inputs"], batch["masks"], batch["target_index"]).float()
        return draft

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Training loss of one batch."""
        target = batch["target"]
        observation, mask = target_observation(batch)
        draft = self._adapted_draft(batch)
        refiner_loss = self.refiner.loss(draft.clamp(0, 1), observation, mask, target)
        if not self.learns_draft:
            return refiner_loss
        draft_loss = F.l1_loss(draft, target)
        return self.draft_loss_weight * draft_loss + self.refiner_loss_weight * refiner_loss

    @torch.no_grad()
    def draft(self, batch: dict[str, Any]) -> torch.Tensor:
        """The draft [B, 13, H, W] in [0, 1] that :meth:`refine` starts from."""
        return self._adapted_draft(batch).clamp(0, 1)

    @torch.no_grad()
    def refine(self, batch: dict[str, Any], generator: torch.Generator | None = None,
               steps: int | None = None, draft: torch.Tensor | None = None) -> torch.Tensor:
        """Refined target [B, 13, H, W] in [0, 1]; deterministic for a given generator seed.

        ``draft`` (from :meth:`draft` on the same batch) skips the draft model, so several samples
        of one batch pay for the draft once."""
        if generator is None:
            generator = torch.Generator().manual_seed(EVAL_SEED)
        if draft is None:
            draft = self.draft(batch)
        observation, mask = target_observation(batch)
        return self.refiner.sample(draft, observation, mask, steps=steps, generator=generator)
