"""Stage-1 draft model (CFDT): shapes, the memory switches, SDPA, learning on a fixed batch."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vcloud.config import load_config
from vcloud.models.cfdt import CFDT, CFDTConfig, ChangeGate, order_target_first, ordered_pairs
from vcloud.config_fields import ModelConfigError
from vcloud.models.memory import MemoryOptions

TINY_YAML = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "model_tiny.yaml"
B, T, H = 2, 4, 32


@pytest.fixture
def tiny_cfg() -> CFDTConfig:
    return CFDTConfig.from_dict(load_config(TINY_YAML).model.section(1))


def make_batch(seed: int = 1, t: int = T, h: int = H) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "inputs": torch.rand(B, t, 13, h, h, generator=g),
        "masks": (torch.rand(B, t, 1, h, h, generator=g) > 0.5).float(),
        "target_index": torch.tensor([1, t - 1]),
        "s1": torch.rand(B, t, 2, h, h, generator=g),
        "target": torch.rand(B, 13, h, h, generator=g),
    }


def forward(model: CFDT, batch: dict) -> torch.Tensor:
    return model(batch["inputs"], batch["masks"], batch["target_index"], batch["s1"])


def perturbed_model(cfg: CFDTConfig, memory: MemoryOptions, seed: int = 0) -> CFDT:
    """Zero-initialised output layers would make gradients trivially equal; perturb all weights."""
    torch.manual_seed(seed)
    model = CFDT(cfg, memory)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def output_and_grads(model: CFDT, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    out = forward(model, batch)
    F.l1_loss(out, batch["target"]).backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_config_rejects_unknown_and_invalid_values():
    with pytest.raises(ModelConfigError, match=r"model\.stage1: unknown key\(s\) tmt_depth .*valid: use_s1"):
        CFDTConfig.from_dict({"tmt_depth": 2})
    with pytest.raises(ModelConfigError, match=r"model\.stage1\.encoder_channels=.*4 widths"):
        CFDTConfig.from_dict({"encoder_channels": [8, 16, 32]})
    with pytest.raises(ModelConfigError, match=r"model\.stage1\.tmt_dim=30.*multiple of tmt_heads=4"):
        CFDTConfig.from_dict({"tmt_dim": 30, "tmt_heads": 4, "norm_groups": 2})


def test_memory_options_validation_and_coercion_from_loop_config():
    with pytest.raises(ModelConfigError, match=r"memory\.pair_chunk_size=-1"):
        MemoryOptions.from_dict({"pair_chunk_size": -1})
    loop_memory = load_config(TINY_YAML).memory
    assert MemoryOptions.coerce(loop_memory) == MemoryOptions(**dataclasses.asdict(loop_memory))
    assert MemoryOptions(gate_downsample=64).gate_size(256, 256) == (64, 64)
    assert MemoryOptions(gate_downsample=64).gate_size(32, 32) == (32, 32)
    assert MemoryOptions(gate_downsample=0).gate_size(256, 256) == (256, 256)


def test_target_first_order_and_pairs():
    order = order_target_first(torch.tensor([2, 0]), 4)
    assert order.tolist() == [[2, 0, 1, 3], [0, 1, 2, 3]]
    first, second = ordered_pairs(16, torch.device("cpu"))
    assert first.numel() == 240  # T(T-1) for T=16, as in production
    assert bool((first != second).all())
    assert first[:15].tolist() == [0] * 15  # pairs with the target come first


def test_draft_shape_with_and_without_s1(tiny_cfg):
    batch = make_batch()
    model = CFDT(tiny_cfg, MemoryOptions.all_off())
    assert forward(model, batch).shape == (B, 13, H, H)
    no_s1 = CFDT(dataclasses.replace(tiny_cfg, use_s1=False), MemoryOptions.all_off())
    assert no_s1(batch["inputs"], batch["masks"], batch["target_index"]).shape == (B, 13, H, H)
    with pytest.raises(ValueError, match="use_s1 is true: s1 must be"):
        model(batch["inputs"], batch["masks"], batch["target_index"], None)


def test_rejects_bad_shapes_with_actionable_messages(tiny_cfg):
    model = CFDT(tiny_cfg, MemoryOptions.all_off())
    batch = make_batch(t=4)
    with pytest.raises(ValueError, match=r"T=5 dates.*raise model\.stage1\.max_dates"):
        b5 = make_batch(t=5)
        forward(model, b5)
    with pytest.raises(ValueError, match="divisible by 8"):
        b = make_batch(h=36)
        forward(model, b)
    with pytest.raises(ValueError, match="masks must be"):
        model(batch["inputs"], batch["masks"][:, :3], batch["target_index"], batch["s1"])


@pytest.mark.parametrize(
    "switches",
    [
        {"grad_checkpointing": True},
        {"target_only_pyramid": True},
        {"pair_chunk_size": 5},
        {"grad_checkpointing": True, "target_only_pyramid": True, "pair_chunk_size": 5},
        # gate_downsample at (or above) the patch size is the identity resolution: same function
        {"grad_checkpointing": True, "target_only_pyramid": True, "pair_chunk_size": 3, "gate_downsample": H},
    ],
)
def test_memory_switches_compute_the_same_function(tiny_cfg, switches):
    """Chunking and recomputation change how sums are grouped (and which GEMM kernels a CPU picks),
    so in float32 the two sides could differ by rounding that depends on the CPU. Both run in
    float64 (unit roundoff 1.1e-16; outputs are O(1), gradients O(0.05)), where any regrouping stays
    below ~1e-14: the tolerances hold on any CPU and still catch a switch that changes the function
    (gate_downsample below the patch size changes outputs by ~1e-2, see the next test)."""
    batch = {k: v.double() if v.is_floating_point() else v for k, v in make_batch().items()}
    off = perturbed_model(tiny_cfg, MemoryOptions.all_off()).double()
    on = CFDT(tiny_cfg, dataclasses.replace(MemoryOptions.all_off(), **switches)).double()
    on.load_state_dict(off.state_dict())
    out_off, grads_off = output_and_grads(off, batch)
    out_on, grads_on = output_and_grads(on, batch)
    assert out_on.dtype == torch.float64
    torch.testing.assert_close(out_on, out_off, rtol=1e-10, atol=1e-12)
    assert grads_on.keys() == grads_off.keys()
    for name in grads_off:
        torch.testing.assert_close(grads_on[name], grads_off[name], rtol=1e-9, atol=1e-12, msg=name)
    assert any(g.abs().sum() > 0 for n, g in grads_on.items() if n.startswith("gate."))


def test_gate_downsample_runs_the_gate_at_reduced_resolution(tiny_cfg, monkeypatch):
    """Switch 3 changes the function by design: the pair network sees 8x8 instead of 32x32
    inputs, the model still trains end to end, and the output differs from full resolution."""
    seen: list[tuple[int, int]] = []
    original = ChangeGate.score_pairs

    def spy(self, emb, first, second):
        seen.append(tuple(emb.shape[-2:]))
        return original(self, emb, first, second)

    monkeypatch.setattr(ChangeGate, "score_pairs", spy)
    batch = make_batch()
    full = perturbed_model(tiny_cfg, MemoryOptions.all_off())
    reduced = CFDT(tiny_cfg, dataclasses.replace(MemoryOptions.all_off(), gate_downsample=8))
    reduced.load_state_dict(full.state_dict())
    out_full, _ = output_and_grads(full, batch)
    assert seen == [(H, H)]
    seen.clear()
    out_reduced, grads = output_and_grads(reduced, batch)
    assert seen == [(8, 8)]
    assert out_reduced.shape == out_full.shape
    assert not torch.allclose(out_reduced, out_full)
    assert grads["gate.pair_out.weight"].abs().sum() > 0


def test_checkpointing_recomputes_in_backward(tiny_cfg, monkeypatch):
    """With switch 2 the encoder runs once more per date during backward (recompute)."""
    calls = {"n": 0}
    encoder_forward = type(CFDT(tiny_cfg).encoder).forward

    def counting(self, x, full_pyramid=True):
        calls["n"] += 1
        return encoder_forward(self, x, full_pyramid)

    monkeypatch.setattr(type(CFDT(tiny_cfg).encoder), "forward", counting)
    batch = make_batch()
    model = CFDT(tiny_cfg, dataclasses.replace(MemoryOptions.all_off(), grad_checkpointing=True))
    output_and_grads(model, batch)
    assert calls["n"] == 2 * T
    calls["n"] = 0
    with torch.no_grad():
        forward(model, batch)
    assert calls["n"] == T


def test_temporal_transformer_uses_sdpa(tiny_cfg, monkeypatch):
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        calls.append((tuple(q.shape), None if attn_mask is None else tuple(attn_mask.shape)))
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model = CFDT(tiny_cfg, MemoryOptions.all_off())
    forward(model, make_batch())
    coarse = (H // 8) ** 2
    heads, dim = tiny_cfg.tmt_heads, tiny_cfg.tmt_dim
    assert calls == [((B * coarse, heads, T, dim // heads), (B * coarse, 1, T, T))] * tiny_cfg.tmt_layers


def test_runs_under_bf16_autocast(tiny_cfg):
    model = CFDT(tiny_cfg, MemoryOptions(grad_checkpointing=True, gate_downsample=16, pair_chunk_size=4))
    batch = make_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = forward(model, batch)
        loss = F.l1_loss(out.float(), batch["target"])
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_draft_loss_falls_on_fixed_batch(tiny_cfg):
    torch.manual_seed(0)
    batch = make_batch()
    # a target the model can reach from what it sees: an affine map of the target date's input
    rows = torch.arange(B)
    batch["target"] = 0.5 * batch["inputs"][rows, batch["target_index"]] + 0.25
    # that target is ~0.17 reflectance from the composite, not the ~0.01 of a real series: a head
    # scaled to that distance learns it in the same few steps
    cfg = dataclasses.replace(tiny_cfg, correction_scale=1.0)
    model = CFDT(cfg, MemoryOptions(grad_checkpointing=True, pair_chunk_size=4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(15):
        loss = F.l1_loss(forward(model, batch), batch["target"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.95 * losses[0], losses
    assert min(losses[-3:]) < min(losses[:3]), losses


@pytest.mark.parametrize("decay", [0.0, 1.0])
def test_untrained_draft_weights_clear_dates_by_distance_from_the_target(tiny_cfg, decay):
    """Before training (zero correction, uniform gates) the draft is the composite: with
    ``date_decay`` the clear date one acquisition from the target outweighs the one three away
    by exp(2 * decay); with 0 both count the same."""
    cfg = dataclasses.replace(tiny_cfg, date_decay=decay)
    model = CFDT(cfg).eval()
    t, h = 4, 32
    inputs = torch.zeros(1, t, 13, h, h)
    inputs[0, 1], inputs[0, 3] = 0.2, 0.6
    masks = torch.ones(1, t, 1, h, h)
    masks[0, 1], masks[0, 3] = 0.0, 0.0  # the target (date 0) and date 2 are cloudy everywhere
    with torch.no_grad():
        draft = model(inputs, masks, torch.tensor([0]), torch.zeros(1, t, 2, h, h))
    near = math.exp(-decay * 1)
    far = math.exp(-decay * 3)
    expected = (0.2 * near + 0.6 * far) / (near + far)
    assert float(draft.mean()) == pytest.approx(expected, abs=2e-3)


def test_untrained_draft_keeps_the_targets_clear_pixels_as_observed(tiny_cfg):
    """Where the target itself is clear, the observation is the answer: the composite takes it
    unchanged (the other dates fill only the cloudy part)."""
    model = CFDT(tiny_cfg).eval()
    t, h = 4, 32
    torch.manual_seed(0)
    inputs = torch.rand(1, t, 13, h, h)
    masks = torch.zeros(1, t, 1, h, h)
    masks[0, 2, :, : h // 2] = 1.0  # the target (date 2) is cloudy in its top half
    with torch.no_grad():
        draft = model(inputs, masks, torch.tensor([2]), torch.zeros(1, t, 2, h, h))
    assert torch.equal(draft[0, :, h // 2:], inputs[0, 2, :, h // 2:])
    assert not torch.allclose(draft[0, :, : h // 2], inputs[0, 2, :, : h // 2], atol=1e-2)


@pytest.mark.parametrize(("field", "value", "allowed"), [
    ("harmonize_radius", -1, "an integer >= 0"),
    ("harmonize_radius", 2.5, "an integer >= 0"),
    ("fill_radii", [2, 0], "a list of integers > 0"),
    ("correction_scale", 0, "a number > 0"),
    ("correction_scale", True, "a number > 0"),
])
def test_composite_settings_are_validated(tiny_cfg, field, value, allowed):
    with pytest.raises(ModelConfigError, match=rf"model\.stage1\.{field}=.*{allowed}"):
        CFDTConfig.from_dict({**dataclasses.asdict(tiny_cfg), field: value})


def test_date_decay_validation_and_learned(tiny_cfg):
    with pytest.raises(ModelConfigError, match=r"model\.stage1\.date_decay=-1.*>= 0"):
        CFDTConfig.from_dict({**dataclasses.asdict(tiny_cfg), "date_decay": -1})
    model = CFDT(tiny_cfg)
    assert model.date_decay.requires_grad and float(model.date_decay.detach()) == tiny_cfg.date_decay
