"""Stage 2's level correction: the statistics it reads, the draft unchanged before training, an
offset only under the target's clouds, and a correction it can learn from the target's clear pixels."""

from __future__ import annotations

import torch

from vcloud.models.level import FEATURE_SCALE, FEATURES, LR_SCALE, LevelCorrection, level_statistics
from vcloud.optim import build_optimizer

BANDS, DATES, SIDE = 13, 3, 16


def scene(target_shift: float, cloud_rows: int = 8) -> dict[str, torch.Tensor]:
    """Three dates of one surface; the target date (1) is ``target_shift`` brighter in every band
    and clouded over its first ``cloud_rows`` rows, where the draft copies the other dates."""
    surface = 0.1 + 0.2 * torch.rand(1, 1, BANDS, SIDE, SIDE, generator=torch.Generator().manual_seed(0))
    inputs = surface.expand(1, DATES, BANDS, SIDE, SIDE).clone()
    inputs[:, 1] += target_shift
    masks = torch.zeros(1, DATES, 1, SIDE, SIDE)
    masks[:, 1, :, :cloud_rows] = 1.0
    target = inputs[:, 1].clone()
    inputs[:, 1, :, :cloud_rows] = 0.8  # the cloud
    draft = target.clone()
    draft[:, :, :cloud_rows] -= target_shift  # the other dates' level under the cloud
    return {"inputs": inputs, "masks": masks, "target_index": torch.tensor([1]), "target": target, "draft": draft}


def test_statistics_show_the_target_level_against_the_other_dates() -> None:
    s = scene(0.05)
    stats = level_statistics(s["inputs"], s["masks"], s["target_index"], s["draft"])
    assert stats.shape == (1, FEATURES)
    per_band = stats[0, :4 * BANDS].view(4, BANDS) / FEATURE_SCALE
    torch.testing.assert_close(per_band[0], torch.full((BANDS,), 0.05))  # draft - others where clear
    torch.testing.assert_close(per_band[1], torch.zeros(BANDS), atol=1e-6, rtol=0)  # under the cloud
    torch.testing.assert_close(per_band[2], torch.zeros(BANDS), atol=1e-6, rtol=0)  # observation - draft, clear
    torch.testing.assert_close(stats[0, -3:], torch.tensor([0.5, 0.5, 0.5]))


def test_the_untrained_correction_returns_the_draft_bit_for_bit() -> None:
    s = scene(0.05)
    level = LevelCorrection()
    assert torch.equal(level(s["inputs"], s["masks"], s["target_index"], s["draft"]), s["draft"])
    groups = build_optimizer(level, 1e-4, 0.01).param_groups
    assert [(g["lr_scale"], g["lr"]) for g in groups] == [(1.0, 1e-4), (LR_SCALE, 1e-4 * LR_SCALE)]
    assert len(groups[1]["params"]) == 2 and groups[0]["params"] == []


def test_a_learned_correction_moves_the_level_under_the_clouds_only() -> None:
    """Trained on scenes whose target dates are brighter or darker by up to 0.04, it learns to read
    that amount from the clear pixels and applies it under the clouds."""
    level = LevelCorrection()
    optimizer = build_optimizer(level, 1e-4, 0.0)  # the small config's stage-2 rate, times LR_SCALE
    shifts = torch.linspace(-0.04, 0.04, 9)
    scenes = [scene(float(shift)) for shift in shifts]
    for _ in range(300):
        for s in scenes:
            corrected = level(s["inputs"], s["masks"], s["target_index"], s["draft"])
            loss = torch.nn.functional.l1_loss(corrected, s["target"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    s = scene(0.03)
    with torch.no_grad():
        corrected = level(s["inputs"], s["masks"], s["target_index"], s["draft"])
    before = (s["draft"] - s["target"]).abs().mean()
    after = (corrected - s["target"]).abs().mean()
    assert after < 0.2 * before, (float(before), float(after))
    assert torch.equal(corrected[:, :, 8:], s["draft"][:, :, 8:]), "clear pixels are left as the draft has them"
