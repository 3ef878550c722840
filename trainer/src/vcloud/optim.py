"""The optimizer every stage trains with (AdamW), and per-parameter learning-rate scales.

Adam moves each parameter by about the learning rate per step, whatever the size of its gradient.
That suits network weights of order 1e-2; a physical scalar of order 1 (such as CFDT's date decay)
trained at the same rate would move by a hundredth of a percent per step and stay at its initial
value for a whole run. Such a parameter carries a scale (:func:`scale_learning_rate`); the
optimizer puts it in a group of its own whose rate is the schedule's times that scale, without
weight decay (it is not a weight to keep small).
"""

from __future__ import annotations

import torch
from torch import nn

_SCALE_ATTRIBUTE = "_vcloud_lr_scale"


def scale_learning_rate(parameter: nn.Parameter, factor: float) -> nn.Parameter:
    """Mark ``parameter`` to train at ``factor`` times the stage's learning rate."""
    if not factor > 0:
        raise ValueError(f"learning-rate scale must be > 0, got {factor}")
    setattr(parameter, _SCALE_ATTRIBUTE, float(factor))
    return parameter


def learning_rate_scale(parameter: nn.Parameter) -> float:
    """The scale :func:`scale_learning_rate` set on ``parameter`` (1 when none)."""
    return float(getattr(parameter, _SCALE_ATTRIBUTE, 1.0))


def build_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over ``model``'s trainable parameters: the weights first (group 0, the one whose rate
    the logs report), then one group per learning-rate scale, each with ``lr_scale`` set."""
    groups: dict[float, list[nn.Parameter]] = {}
    for parameter in model.parameters():
        if parameter.requires_grad:
            groups.setdefault(learning_rate_scale(parameter), []).append(parameter)
    if not groups:
        raise ValueError("the model has no trainable parameters")
    param_groups = [{"params": groups.pop(1.0, []), "lr": lr, "lr_scale": 1.0, "weight_decay": weight_decay}]
    param_groups += [{"params": params, "lr": lr * scale, "lr_scale": scale, "weight_decay": 0.0}
                     for scale, params in sorted(groups.items())]
    return torch.optim.AdamW(param_groups, lr=lr, weight_decay=weight_decay)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the schedule's rate ``lr`` on every group, times the group's ``lr_scale``."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
