"""The stages' optimizer: weights in group 0 with the weight decay, each learning-rate scale in a
group of its own without it, and the schedule's rate applied times each group's scale."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from vcloud.config import load_config
from vcloud.models.cfdt import CFDT, CFDTConfig
from vcloud.optim import build_optimizer, learning_rate_scale, scale_learning_rate, set_learning_rate

TINY_YAML = Path(__file__).resolve().parents[2] / "trainer" / "configs" / "model_tiny.yaml"


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(3))
        self.frozen = nn.Parameter(torch.zeros(2), requires_grad=False)
        self.decay = scale_learning_rate(nn.Parameter(torch.ones(())), 100.0)


def test_scaled_parameters_get_their_own_group_without_weight_decay() -> None:
    model = _Scaled()
    optimizer = build_optimizer(model, lr=2e-4, weight_decay=0.01)
    weights, scaled = optimizer.param_groups
    assert weights["lr"] == pytest.approx(2e-4) and scaled["lr"] == pytest.approx(2e-2)
    assert [p is model.weight for p in weights["params"]] == [True]
    assert (weights["lr_scale"], weights["weight_decay"]) == (1.0, 0.01)
    assert [p is model.decay for p in scaled["params"]] == [True]
    assert (scaled["lr_scale"], scaled["weight_decay"]) == (100.0, 0.0)
    set_learning_rate(optimizer, 1e-4)
    assert weights["lr"] == pytest.approx(1e-4) and scaled["lr"] == pytest.approx(1e-2)


def test_adam_moves_a_scaled_parameter_scale_times_further() -> None:
    """The reason for the scale: Adam's step is about the rate whatever the gradient's size."""
    model = _Scaled()
    optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.0)
    for _ in range(5):
        optimizer.zero_grad()
        (model.weight.sum() * 1e-3 + model.decay * 1e-3).backward()
        optimizer.step()
    moved_weight = -float(model.weight[0].detach())
    moved_decay = 1.0 - float(model.decay.detach())
    assert moved_weight == pytest.approx(5e-3, rel=1e-3)
    assert moved_decay == pytest.approx(100 * moved_weight, rel=1e-3)


def test_bad_scale_and_no_trainable_parameter_are_refused() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        scale_learning_rate(nn.Parameter(torch.ones(())), 0.0)
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_optimizer(frozen, lr=1e-3, weight_decay=0.0)


def test_cfdt_date_decay_trains_at_its_configured_scale() -> None:
    section = dict(load_config(TINY_YAML).model.section(1))
    model = CFDT(CFDTConfig.from_dict(section))
    assert learning_rate_scale(model.date_decay) == CFDTConfig().date_decay_lr_scale == 100.0
    assert learning_rate_scale(model.decoder.head[0].weight) == 1.0
    section["date_decay_lr_scale"] = 10
    assert learning_rate_scale(CFDT(CFDTConfig.from_dict(section)).date_decay) == 10.0
    section["date_decay_lr_scale"] = 0
    with pytest.raises(Exception, match="date_decay_lr_scale"):
        CFDTConfig.from_dict(section)
