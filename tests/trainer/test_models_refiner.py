"""Stage-2 latent diffusion refiner: schedules, DDIM determinism, learning on a fixed batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vcloud.models.autoencoder import Autoencoder, AutoencoderConfig
from vcloud.models.config_fields import ModelConfigError
from vcloud.models.diffusion import ddim_sample, ddim_timesteps, make_alphas_cumprod, q_sample
from vcloud.models.refiner import LatentDiffusionRefiner, RefinerConfig

AE = AutoencoderConfig(base_channels=8, channel_mult=(1, 2), num_res_blocks=1, latent_channels=4, norm_groups=4)
REFINER = {"base_channels": 16, "channel_mult": [1, 2], "num_res_blocks": 1, "attention_heads": 2,
           "sample_steps": 4, "norm_groups": 4}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def batch(h: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    target = torch.rand(2, 13, h, h, generator=g)
    return {"draft": (target + 0.1 * torch.randn(2, 13, h, h, generator=g)).clamp(0, 1),
            "observation": torch.rand(2, 13, h, h, generator=g),
            "mask": (torch.rand(2, 1, h, h, generator=g) > 0.5).float(), "target": target}


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_schedules_decrease_from_one_to_near_zero(schedule):
    ac = make_alphas_cumprod(schedule, 1000)
    assert ac.shape == (1000,)
    assert bool((ac[1:] < ac[:-1]).all())
    assert 0.99 < float(ac[0]) <= 1.0
    assert float(ac[-1]) < 0.01


def test_q_sample_endpoints_and_ddim_timesteps():
    ac = make_alphas_cumprod("cosine", 1000)
    x0, noise = torch.ones(2, 3), torch.zeros(2, 3)
    out = q_sample(x0, torch.tensor([0, 999]), noise, ac)
    assert out[0, 0] > 0.99 and out[1, 0] < 0.1
    assert ddim_timesteps(1000, 4) == [999, 666, 333, 0]
    with pytest.raises(ValueError, match="DDIM steps=0"):
        ddim_timesteps(1000, 0)


def test_ddim_with_perfect_noise_prediction_recovers_x0():
    """If the network predicts the true noise, deterministic DDIM returns the clean sample."""
    ac = make_alphas_cumprod("linear", 1000)
    x0 = torch.linspace(-1, 1, 8).reshape(1, 8)
    g = torch.Generator().manual_seed(3)
    start = torch.randn((1, 8), generator=torch.Generator().manual_seed(3))

    def oracle(x, t):
        a = ac[t].float().view(-1, 1)
        return (x - a.sqrt() * x0) / (1 - a).sqrt()

    out = ddim_sample(oracle, (1, 8), ac, 5, g, torch.device("cpu"))
    torch.testing.assert_close(out, x0, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(start, x0)


def test_config_validation():
    with pytest.raises(ModelConfigError, match=r"model\.stage2\.schedule='quadratic'.*cosine, linear"):
        RefinerConfig.from_dict({**REFINER, "schedule": "quadratic"})
    with pytest.raises(ModelConfigError, match=r"sample_steps=2000.*train_timesteps=1000"):
        RefinerConfig.from_dict({**REFINER, "sample_steps": 2000})
    with pytest.raises(ModelConfigError, match=r"unknown key\(s\) steps"):
        RefinerConfig.from_dict({**REFINER, "steps": 4})


def test_autoencoder_is_frozen_and_stays_in_eval_mode():
    refiner = LatentDiffusionRefiner(RefinerConfig.from_dict(REFINER), Autoencoder(AE))
    refiner.train()
    assert not refiner.autoencoder.training
    assert not any(p.requires_grad for p in refiner.autoencoder.parameters())
    assert all(p.requires_grad for p in refiner.denoiser.parameters())


def test_noise_prediction_loss_falls_and_autoencoder_untouched():
    torch.manual_seed(0)
    refiner = LatentDiffusionRefiner(RefinerConfig.from_dict(REFINER), Autoencoder(AE)).train()
    ae_before = {k: v.clone() for k, v in refiner.autoencoder.state_dict().items()}
    b = batch()
    opt = torch.optim.Adam([p for p in refiner.parameters() if p.requires_grad], lr=2e-3)
    losses = []
    for _ in range(20):
        g = torch.Generator().manual_seed(0)  # same t and noise every step: a fixed batch
        loss = refiner.loss(b["draft"], b["observation"], b["mask"], b["target"], generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    assert float(refiner.latent_scale) > 0  # measured on the first batch, saved with the weights
    assert "latent_scale" in refiner.state_dict()
    for k, v in refiner.autoencoder.state_dict().items():
        assert torch.equal(v, ae_before[k]), k


def test_sampling_is_deterministic_per_seed_and_in_range():
    torch.manual_seed(0)
    refiner = LatentDiffusionRefiner(RefinerConfig.from_dict(REFINER), Autoencoder(AE))
    with torch.no_grad():
        for p in refiner.denoiser.parameters():
            p.add_(0.05 * torch.randn_like(p))
    b = batch()
    refiner.eval()

    def sample(seed):
        return refiner.sample(b["draft"], b["observation"], b["mask"], generator=torch.Generator().manual_seed(seed))

    first, again, other = sample(1), sample(1), sample(2)
    assert first.shape == b["draft"].shape
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert float(first.min()) >= 0.0 and float(first.max()) <= 1.0
