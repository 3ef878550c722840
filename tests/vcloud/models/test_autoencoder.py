"""Stage-0 autoencoder: config validation, shapes, parameter count of the production config,
and that it learns on a fixed tiny batch."""

from __future__ import annotations

import pytest
import torch

from vcloud.models.autoencoder import Autoencoder, AutoencoderConfig
from vcloud.config_fields import ModelConfigError

TINY = {"base_channels": 16, "channel_mult": [1, 2], "num_res_blocks": 1, "latent_channels": 4,
        "norm_groups": 8}
FULL = {"base_channels": 96, "channel_mult": [1, 2, 4], "num_res_blocks": 2, "latent_channels": 8,
        "norm_groups": 32}


def test_from_dict_converts_lists_and_is_frozen():
    cfg = AutoencoderConfig.from_dict(TINY)
    assert cfg.channel_mult == (1, 2)
    assert cfg.downsample_factor == 2
    with pytest.raises(AttributeError):
        cfg.base_channels = 8  # type: ignore[misc]


def test_from_dict_rejects_unknown_keys_listing_valid_ones():
    with pytest.raises(ModelConfigError, match=r"unknown key\(s\) latent_dim.*valid: in_channels"):
        AutoencoderConfig.from_dict({**TINY, "latent_dim": 4})


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("base_channels", 12, "multiple of norm_groups=8"),
        ("channel_mult", [], "non-empty list"),
        ("num_res_blocks", 0, "integer > 0"),
        ("latent_channels", True, "integer > 0"),
    ],
)
def test_invalid_values_name_the_field(key, value, fragment):
    with pytest.raises(ModelConfigError, match=rf"model\.stage0\.{key}=.*{fragment}"):
        AutoencoderConfig.from_dict({**TINY, key: value})


def test_shapes_tiny():
    torch.manual_seed(0)
    model = Autoencoder(AutoencoderConfig.from_dict(TINY))
    x = torch.rand(2, 13, 32, 32)
    z = model.encode(x)
    assert z.shape == (2, 4, 16, 16)
    assert model.decode(z).shape == x.shape
    assert model(x).shape == x.shape


def test_rejects_wrong_band_count_and_indivisible_size():
    model = Autoencoder(AutoencoderConfig.from_dict(TINY))
    with pytest.raises(ValueError, match=r"expects \[B, 13, H, W\]"):
        model.encode(torch.rand(1, 12, 32, 32))
    with pytest.raises(ValueError, match="divisible by the downsampling factor 2"):
        model.encode(torch.rand(1, 13, 33, 32))


def test_full_config_matches_production_parameter_count_on_meta_device():
    with torch.device("meta"):
        model = Autoencoder(AutoencoderConfig.from_dict(FULL))
    n = sum(p.numel() for p in model.parameters())
    assert abs(n - 29.8e6) / 29.8e6 < 0.10, n
    assert all(p.device.type == "meta" for p in model.parameters())


def test_reconstruction_loss_falls_on_fixed_batch():
    torch.manual_seed(0)
    model = Autoencoder(AutoencoderConfig.from_dict(TINY))
    x = torch.rand(2, 13, 16, 16)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses = []
    for _ in range(15):
        loss = torch.nn.functional.l1_loss(model(x), x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
