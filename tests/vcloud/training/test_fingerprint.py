"""The fingerprint of what a checkpoint holds, and the resume decision taken from it (pure)."""

from __future__ import annotations

import io
import json

import pytest
import torch
from torch import nn

from vcloud.optim import build_optimizer, scale_learning_rate
from vcloud.training.fingerprint import (
    Fingerprint,
    ResumeOutcome,
    after_failed_optimizer_load,
    checkpoint_fingerprint,
    decide_resume,
    fingerprint_of,
    fresh_optimizer_line,
    optimizer_differences,
    refusal_message,
)

HASH_A, HASH_B = "a" * 64, "b" * 64


class Draft(nn.Module):
    """A model shaped like the stage models: convolutions, a norm, a scalar with its own rate."""

    def __init__(self, width: int = 4, kernel: int = 3, decay_group: bool = True, extra: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, width, kernel, padding=kernel // 2)
        self.norm = nn.BatchNorm2d(width)
        self.head = nn.Conv2d(width, 1, 1)
        self.decay = nn.Parameter(torch.tensor(1.0))
        if decay_group:
            scale_learning_rate(self.decay, 100.0)
        if extra:
            self.adapter = nn.Linear(3, 3)


def single_group(model: nn.Module) -> torch.optim.AdamW:
    """The optimizer as it was before a parameter got a group of its own."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)


def stepped(model: nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    loss = model.head(model.norm(model.conv(torch.randn(2, 2, 4, 4)))).mean() + model.decay
    loss.backward()
    optimizer.step()
    return optimizer


def checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, *, recorded: bool = True) -> dict:
    """A checkpoint as the loop writes it, through torch.save/torch.load(weights_only=True)."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    if recorded:
        state["fingerprint"] = fingerprint_of(model, optimizer).to_json()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def current(model: nn.Module) -> Fingerprint:
    return fingerprint_of(model, build_optimizer(model, 1e-3, 0.01))


def test_the_fingerprint_names_every_weight_and_each_groups_parameters_in_order() -> None:
    model = Draft()
    fp = current(model)
    assert fp.model == (("decay", ()), ("conv.weight", (4, 2, 3, 3)), ("conv.bias", (4,)), ("norm.weight", (4,)),
                        ("norm.bias", (4,)), ("norm.running_mean", (4,)), ("norm.running_var", (4,)),
                        ("norm.num_batches_tracked", ()), ("head.weight", (1, 4, 1, 1)), ("head.bias", (1,)))
    assert fp.optimizer is not None and len(fp.optimizer) == 2
    assert [name for name, _ in fp.optimizer[0].params] == ["conv.weight", "conv.bias", "norm.weight", "norm.bias",
                                                            "head.weight", "head.bias"]
    assert fp.optimizer[1].params == (("decay", ()),)
    assert "lr_scale" in fp.optimizer[0].keys and "params" not in fp.optimizer[0].keys
    assert fp.optimizer_type == "AdamW" and "lr" in fp.default_keys and "lr_scale" not in fp.default_keys


def test_it_is_deterministic_small_and_survives_a_checkpoint_round_trip() -> None:
    torch.manual_seed(0)
    first = current(Draft())
    torch.manual_seed(1)
    second = current(Draft())  # other weights, same layout
    assert first == second
    assert json.dumps(first.to_json()) == json.dumps(second.to_json())
    assert len(json.dumps(first.to_json())) < 2000
    model = Draft()
    optimizer = build_optimizer(model, 1e-3, 0.0)
    assert checkpoint_fingerprint(checkpoint(model, optimizer)) == fingerprint_of(model, optimizer)


def test_the_same_layout_resumes_as_written() -> None:
    model = Draft()
    saved = checkpoint(model, stepped(model, build_optimizer(model, 1e-3, 0.01)))
    decision = decide_resume(checkpoint_fingerprint(saved), current(Draft()), "refuse")
    assert decision.outcome is ResumeOutcome.RESUME and not decision.refused


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "before-fingerprints"])
def test_a_parameter_moved_into_a_group_of_its_own_keeps_the_weights_with_a_fresh_optimizer(recorded: bool) -> None:
    old = Draft(decay_group=False)
    saved = checkpoint(old, stepped(old, single_group(old)), recorded=recorded)
    decision = decide_resume(checkpoint_fingerprint(saved), current(Draft()), "keep_weights")
    assert decision.outcome is ResumeOutcome.FRESH_OPTIMIZER and not decision.weights
    assert decision.optimizer[0] == "groups 1 -> 2"
    if recorded:
        assert "group 0: -decay scalar" in decision.optimizer
        assert "group 1 (new): +decay scalar" in decision.optimizer
        assert "group 0 settings: +lr_scale" in decision.optimizer
    else:  # no names: counts and the moments' shapes
        assert "group 0: 7 parameters -> 6" in decision.optimizer
    refused = decide_resume(checkpoint_fingerprint(saved), current(Draft()), "refuse")
    assert refused.outcome is ResumeOutcome.REFUSE_OPTIMIZER and refused.optimizer == decision.optimizer


def test_a_checkpoint_before_fingerprints_whose_optimizer_never_stepped_is_compared_by_counts() -> None:
    old = Draft(decay_group=False)
    saved = checkpoint(old, single_group(old), recorded=False)
    assert saved["optimizer"]["state"] == {}
    fp = checkpoint_fingerprint(saved)
    assert fp.optimizer is not None and fp.optimizer[0].params[0] == (None, None)
    same = Draft(decay_group=False)
    assert decide_resume(fp, fingerprint_of(same, single_group(same)), "refuse").outcome is ResumeOutcome.RESUME
    # today's optimizer gives every group its rate scale: a setting the old groups lack
    assert decide_resume(fp, current(same), "keep_weights").optimizer == ("group 0 settings: +lr_scale",)


def test_same_counts_but_other_shapes_in_a_group_is_an_optimizer_change() -> None:
    """torch's load_state_dict checks only the counts: it would pair moments with the wrong weights."""
    a, b = nn.Linear(3, 4), nn.Linear(4, 3)
    saved = checkpoint(a, stepped_linear(a), recorded=False)
    differences = optimizer_differences(checkpoint_fingerprint(saved), fingerprint_of(b, torch.optim.AdamW(b.parameters())))
    assert differences == ("group 0: parameter 0 4x3 -> 3x4, parameter 1 4 -> 3",)


def stepped_linear(model: nn.Linear) -> torch.optim.Optimizer:
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, model.in_features)).sum().backward()
    optimizer.step()
    return optimizer


def test_parameters_in_another_order_are_an_optimizer_change() -> None:
    model = Draft(decay_group=False)
    params = list(model.parameters())
    saved = fingerprint_of(model, torch.optim.AdamW(params))
    now = fingerprint_of(model, torch.optim.AdamW(params[::-1]))
    assert optimizer_differences(saved, now) == ("group 0: the same parameters in another order",)


def test_settings_pytorch_fills_in_itself_are_not_a_change() -> None:
    model = Draft()
    optimizer = build_optimizer(model, 1e-3, 0.0)
    saved = checkpoint(model, optimizer, recorded=False)
    for group in saved["optimizer"]["param_groups"]:
        group.pop("foreach")  # as written by an older PyTorch
        group["removed_option"] = False
    fp = checkpoint_fingerprint(saved)
    # a checkpoint without fingerprint knows no defaults: only the running optimizer's count
    assert optimizer_differences(fp, current(model)) == ("group 0 settings: -removed_option",
                                                         "group 1 settings: -removed_option")
    saved["optimizer"]["param_groups"][1].pop("removed_option")
    saved["optimizer"]["param_groups"][1].pop("lr_scale")
    assert "group 1 settings: +lr_scale" in optimizer_differences(checkpoint_fingerprint(saved), current(model))


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "before-fingerprints"])
@pytest.mark.parametrize("on_code_change", ["keep_weights", "refuse"])
def test_weights_that_no_longer_fit_are_refused_whatever_the_run_asked(recorded: bool, on_code_change: str) -> None:
    old = Draft()
    saved = checkpoint_fingerprint(checkpoint(old, stepped(old, build_optimizer(old, 1e-3, 0.0)), recorded=recorded))
    reshaped = decide_resume(saved, current(Draft(kernel=5)), on_code_change)
    assert reshaped.outcome is ResumeOutcome.REFUSE_WEIGHTS and reshaped.refused
    assert reshaped.weights == ("conv.weight 4x2x3x3 -> 4x2x5x5",)
    added = decide_resume(saved, current(Draft(extra=True)), on_code_change)
    assert added.weights == ("+adapter.weight 3x3", "+adapter.bias 3")
    wider = Draft(extra=True)
    removed = decide_resume(checkpoint_fingerprint(checkpoint(wider, build_optimizer(wider, 1e-3, 0.0), recorded=recorded)),
                            current(Draft()), on_code_change)
    assert removed.weights == ("-adapter.weight 3x3", "-adapter.bias 3")


def test_an_unknown_setting_is_refused_naming_the_choices() -> None:
    model = Draft(decay_group=False)
    saved = fingerprint_of(model, single_group(model))
    with pytest.raises(ValueError, match=r"train.on_code_change='keep' is invalid \(allowed: keep_weights, refuse\)"):
        decide_resume(saved, current(Draft()), "keep")


def test_a_load_pytorch_refuses_after_all_follows_the_setting() -> None:
    assert after_failed_optimizer_load("boom", "keep_weights").outcome is ResumeOutcome.FRESH_OPTIMIZER
    refused = after_failed_optimizer_load("boom", "refuse")
    assert refused.refused and refused.optimizer == ("loading its state failed: boom",)


def test_the_messages_name_both_codes_what_differs_and_the_remedies() -> None:
    old = Draft(decay_group=False)
    saved = checkpoint_fingerprint(checkpoint(old, single_group(old)))
    fresh = decide_resume(saved, current(Draft()), "keep_weights")
    line = fresh_optimizer_line(fresh, stage=1, source="/o/stage1/latest.pt", saved_hash=HASH_A,
                                running_hash=HASH_B, epoch=3, step=120)
    assert "\n" not in line
    assert line.startswith(f"stage 1: /o/stage1/latest.pt was written by code {HASH_A}, this is code {HASH_B}, "
                           "and the optimizer's layout differs (groups 1 -> 2; group 0: -decay scalar; ")
    assert line.endswith("the weights fit: resuming them at epoch 3, step 120 with a fresh optimizer state "
                         "(train.on_code_change: keep_weights)")

    weights = decide_resume(saved, current(Draft(kernel=5)), "keep_weights")
    message = refusal_message(weights, stage=1, source="/o/stage1/latest.pt", saved_hash=HASH_A, running_hash=HASH_B)
    assert message.startswith(f"cannot resume stage 1 from /o/stage1/latest.pt: it was written by code {HASH_A}, "
                              f"this job runs code {HASH_B}, and its weights no longer fit the model: "
                              "conv.weight 4x2x3x3 -> 4x2x5x5. Nothing was trained.")
    assert 'mode: restart for this stage (DAG run params {"stages": [1], "mode": "restart"}' in message
    assert f"finish the stage with code {HASH_A}: deploy that code version" in message

    refused = decide_resume(saved, current(Draft()), "refuse")
    message = refusal_message(refused, stage=2, source="latest.pt", saved_hash=None, running_hash=None)
    assert "written by code of unknown hash, this job runs code of unknown hash" in message
    assert "but train.on_code_change is refuse" in message
    assert "--set train.on_code_change=keep_weights" in message and "mode: restart" in message
    assert "finish the stage with the code that wrote it" in message


def test_long_lists_of_differences_are_counted() -> None:
    saved = fingerprint_of(nn.Sequential(*[nn.Linear(2, 2) for _ in range(6)]),
                           torch.optim.AdamW(nn.Linear(1, 1).parameters()))
    now = fingerprint_of(nn.Sequential(*[nn.Linear(3, 3) for _ in range(6)]),
                         torch.optim.AdamW(nn.Linear(1, 1).parameters()))
    decision = decide_resume(saved, now, "keep_weights")
    assert len(decision.weights) == 12
    message = refusal_message(decision, stage=0, source="latest.pt", saved_hash=HASH_A, running_hash=HASH_B)
    assert "0.weight 2x2 -> 3x3; 0.bias 2 -> 3; " in message and "; and 6 more. Nothing was trained." in message
