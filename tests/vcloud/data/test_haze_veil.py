"""The noisy student's extra haze veil: the scattering model, its spectral shape, its draws."""

from __future__ import annotations

import pytest
import torch

from vcloud.data.bands import S2_WAVELENGTH_NM
from vcloud.data.haze_veil import AIRLIGHT_AT_REFERENCE, HazeVeil, spectral_scale, veil

BLUE, SWIR2 = S2_WAVELENGTH_NM.index(490), S2_WAVELENGTH_NM.index(2190)


def _series(dates: int = 3, size: int = 16) -> torch.Tensor:
    return torch.rand(dates, 13, size, size, generator=torch.Generator().manual_seed(0)) * 0.3


def test_full_transmission_is_the_scene_and_none_is_the_airlight() -> None:
    scene = _series()
    torch.testing.assert_close(veil(scene, torch.ones(1)), scene)
    opaque = veil(scene, torch.zeros(1))
    torch.testing.assert_close(opaque[:, 1], torch.full_like(opaque[:, 1], AIRLIGHT_AT_REFERENCE))
    assert torch.all(opaque[:, BLUE] > opaque[:, SWIR2])  # aerosol scatters the blue most


def test_haze_hits_the_visible_bands_harder_than_the_swir() -> None:
    scale = spectral_scale()
    assert scale[BLUE] == pytest.approx(1.0)
    assert torch.all(scale[:-1] > scale[1:])  # monotone in wavelength
    scene = torch.full((1, 13, 8, 8), 0.5)  # brighter than the airlight: haze darkens it
    hazy = HazeVeil(max_depth=1.0, probability=1.0).apply(scene, torch.Generator().manual_seed(1))
    change = (scene - hazy).abs().mean(dim=(0, 2, 3))
    assert change[BLUE] > 3 * change[SWIR2] > 0


def test_draws_are_seeded_per_date_and_stay_in_range() -> None:
    inputs = _series(dates=6)
    v = HazeVeil(max_depth=0.5, probability=0.5)
    a = v.apply(inputs, torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, v.apply(inputs, torch.Generator().manual_seed(3)))
    assert not torch.equal(a, v.apply(inputs, torch.Generator().manual_seed(4)))
    untouched = [t for t in range(6) if torch.equal(a[t], inputs[t])]
    assert 0 < len(untouched) < 6  # with probability 0.5, some of six dates are spared (for this seed)
    assert a.min() >= 0 and a.max() <= max(float(inputs.max()), AIRLIGHT_AT_REFERENCE * 1.2)
    assert inputs.equal(_series(dates=6))  # the caller's tensor is not modified


def test_a_disabled_veil_returns_a_copy_and_bad_settings_are_refused() -> None:
    inputs = _series()
    out = HazeVeil(max_depth=0.0).apply(inputs)
    assert torch.equal(out, inputs) and out is not inputs
    with pytest.raises(ValueError, match="optical depth"):
        HazeVeil(max_depth=-0.1)
    with pytest.raises(ValueError, match="probability"):
        HazeVeil(probability=1.5)
    with pytest.raises(ValueError, match=r"\[T, 13, H, W\]"):
        HazeVeil().apply(torch.zeros(13, 8, 8))
