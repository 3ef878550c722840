"""The draft composite's parameter-free steps: window sums, local harmonisation, gap filling.

Identities are checked in float64 (the steps keep float64 inputs in float64), where integral-image
window sums are exact to ~1e-12, so the tolerances hold on any CPU. The float32 path (what bf16
autocast runs) is checked against the float64 result within its accumulation bound."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vcloud.models.composite import fill_gaps, harmonize, window_sum


@pytest.mark.parametrize("radius", [0, 1, 3, 9])
def test_window_sum_equals_a_clipped_box_filter(radius: int) -> None:
    torch.manual_seed(0)
    x = torch.rand(2, 3, 17, 23, dtype=torch.float64)
    k = 2 * radius + 1
    ones = torch.ones(1, 1, 17, 23, dtype=torch.float64)
    expected = F.avg_pool2d(x, k, stride=1, padding=radius, count_include_pad=True) * k * k
    assert torch.allclose(window_sum(x, radius), expected)
    counts = F.avg_pool2d(ones, k, stride=1, padding=radius, count_include_pad=True) * k * k
    assert torch.allclose(window_sum(ones, radius), counts)


def test_harmonize_removes_a_local_brightness_offset_where_both_dates_are_clear(float64_default) -> None:
    torch.manual_seed(0)
    target = torch.rand(1, 13, 32, 32)
    offset = torch.linspace(-0.1, 0.1, 13)[None, :, None, None]
    other = (target + offset)[:, None]  # another season: same structure, other brightness
    weight = torch.ones(1, 1, 32, 32)
    weight[..., :8, :] = 0.0  # the target is cloudy in the top rows
    shifted = harmonize(other, target, weight, radius=6)
    assert shifted.dtype == torch.float64
    assert torch.allclose(shifted[0, 0, :, 8:], target[0, :, 8:], rtol=0, atol=1e-12)
    # rows within the window of clear pixels are shifted too: the offset is local, not per pixel
    assert torch.allclose(shifted[0, 0, :, 3:8], target[0, :, 3:8], rtol=0, atol=1e-12)
    # nothing to compare with: the date keeps its own values
    assert torch.equal(harmonize(other, target, torch.zeros_like(weight), radius=6), other)


def test_fill_gaps_takes_the_surroundings_not_the_missing_values(float64_default) -> None:
    image = torch.full((1, 13, 40, 40), 0.3)
    image[..., 10:20, 10:20] = 5.0  # a cloud nobody saw through
    known = torch.ones(1, 1, 40, 40)
    known[..., 10:20, 10:20] = 0.0
    filled = fill_gaps(image, known, radii=(2, 8))
    assert filled.dtype == torch.float64
    assert torch.allclose(filled, torch.full_like(filled, 0.3), rtol=0, atol=1e-12)
    assert torch.equal(fill_gaps(image, torch.ones_like(known), radii=(2, 8)), image)


def test_gradients_reach_the_weights_and_the_images() -> None:
    torch.manual_seed(0)
    target = torch.rand(1, 13, 16, 16, requires_grad=True)
    other = torch.rand(1, 2, 13, 16, 16, requires_grad=True)
    weight = torch.rand(1, 2, 16, 16, requires_grad=True)
    out = fill_gaps(harmonize(other, target, weight, radius=3).mean(1), weight[:, :1], radii=(2,))
    out.square().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0
               for t in (target, other, weight))


def float32_shift_error_bound(height: int, width: int, radius: int, max_value: float) -> float:
    """Worst-case error of one float32 harmonisation shift (standard summation bound, unit roundoff u).

    An integral-image entry sums up to H*W values <= max_value through H + W additions: error
    <= (H + W) * u * H * W * max_value. A window sum combines four entries, the shift is the
    difference of two window sums over the support (at least (radius + 1)^2 pixels, in a corner)."""
    u = 2.0**-24
    entry = (height + width) * u * height * width * max_value
    return 2 * 4 * entry / (radius + 1) ** 2


def test_bf16_autocast_keeps_the_window_sums_in_float32() -> None:
    torch.manual_seed(0)
    target = torch.rand(1, 13, 64, 64)
    other = (target + 0.05)[:, None]
    weight = torch.ones(1, 1, 64, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        shifted = harmonize(other, target, weight, radius=15)
    assert shifted.dtype == torch.float32
    reference = harmonize(other.double(), target.double(), weight.double(), radius=15)
    bound = float32_shift_error_bound(64, 64, 15, max_value=1.05)
    assert bound < 0.05 / 10, "the bound must still tell a missing shift (0.05) apart"
    assert torch.allclose(shifted.double(), reference, rtol=0, atol=bound)
    # the offset is gone, up to the bound and float32's rounding of the inputs (other = target + 0.05)
    assert torch.allclose(shifted[0, 0].double(), target[0].double(), rtol=0, atol=bound + 4 * 2.0**-24 * 1.05)
