"""Stage-2 latent diffusion refiner: schedules, DDIM determinism, learning on a fixed batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vcloud.models.autoencoder import Autoencoder, AutoencoderConfig
from vcloud.config_fields import ModelConfigError
from vcloud.models.diffusion import ddim_sample, ddim_timesteps, make_alphas_cumprod, q_sample
from vcloud.models.latent_refiner import LatentDiffusionRefiner, RefinerConfig

AE = AutoencoderConfig(base_channels=8, channel_mult=(1, 2), num_res_blocks=1, latent_channels=4, norm_groups=4)
REFINER = {"base_channels": 16, "channel_mult": [1, 2], "num_res_blocks": 1, "attention_heads": 2,
           "sample_steps": 4, "norm_groups": 4}


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
    assert ddim_timesteps(1000, 1) == [999]
    assert ddim_timesteps(1000, 2) == [999, 0]
    with pytest.raises(ValueError, match="DDIM steps=0"):
        ddim_timesteps(1000, 0)


def test_ddim_with_perfect_noise_prediction_recovers_x0(float64_default):
    """If the network predicts the true noise, deterministic DDIM returns the clean sample.

    In float64: the oracle's noise is divided by sqrt(1 - alpha_bar) ~ 0.01 at the last step, which
    amplifies rounding ~100-fold; from float64's 1e-16 that stays below 1e-12, whatever the CPU."""
    ac = make_alphas_cumprod("linear", 1000)
    x0 = torch.linspace(-1, 1, 8).reshape(1, 8)
    g = torch.Generator().manual_seed(3)
    start = torch.randn((1, 8), generator=torch.Generator().manual_seed(3))

    def oracle(x, t):
        a = ac[t].to(x.dtype).view(-1, 1)
        return (x - a.sqrt() * x0) / (1 - a).sqrt()

    out = ddim_sample(oracle, (1, 8), ac, 5, g, torch.device("cpu"))
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, x0, atol=1e-10, rtol=1e-10)
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


@pytest.mark.parametrize("prediction", ["x0", "eps"])
def test_diffusion_loss_falls_and_autoencoder_untouched(prediction):
    torch.manual_seed(0)
    cfg = RefinerConfig.from_dict({**REFINER, "prediction": prediction, "pixel_loss_weight": 0})
    refiner = LatentDiffusionRefiner(cfg, Autoencoder(AE)).train()
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


def test_ddim_with_perfect_clean_prediction_recovers_x0_and_zero_prediction_gives_zero():
    """x0 parameterisation: an oracle recovers the clean sample, and a network that outputs zeros
    samples exactly zero whatever the starting noise (an untrained refiner changes nothing)."""
    ac = make_alphas_cumprod("cosine", 1000)
    x0 = torch.linspace(-1, 1, 8).reshape(1, 8)
    out = ddim_sample(lambda x, t: x0.expand_as(x), (1, 8), ac, 5, torch.Generator().manual_seed(3),
                      torch.device("cpu"), prediction="x0")
    torch.testing.assert_close(out, x0)
    zero = ddim_sample(lambda x, t: torch.zeros_like(x), (1, 8), ac, 5, torch.Generator().manual_seed(3),
                       torch.device("cpu"), clip_x0=3.0, prediction="x0")
    assert torch.equal(zero, torch.zeros(1, 8))
    with pytest.raises(ValueError, match="unknown prediction 'v'.*x0, eps"):
        ddim_sample(lambda x, t: x, (1, 8), ac, 5, None, torch.device("cpu"), prediction="v")


def test_prediction_and_pixel_loss_validation():
    assert RefinerConfig().prediction == "x0"
    with pytest.raises(ModelConfigError, match=r"model\.stage2\.prediction='v'.*x0, eps"):
        RefinerConfig.from_dict({**REFINER, "prediction": "v"})
    with pytest.raises(ModelConfigError, match=r"model\.stage2\.pixel_loss_weight=-1.*>= 0"):
        RefinerConfig.from_dict({**REFINER, "pixel_loss_weight": -1})


@pytest.mark.parametrize("seed", [0, 1])
def test_untrained_refiner_returns_the_draft_exactly(seed):
    """The zero-initialised output layer predicts a zero clean residual, so before any training
    the refinement is the draft bit for bit, for every DDIM seed."""
    torch.manual_seed(seed)
    refiner = LatentDiffusionRefiner(RefinerConfig.from_dict(REFINER), Autoencoder(AE)).eval()
    refiner.latent_scale.fill_(0.5)
    b = batch(seed=seed)
    out = refiner.sample(b["draft"], b["observation"], b["mask"], generator=torch.Generator().manual_seed(seed))
    assert torch.equal(out, b["draft"])


def test_noise_prediction_untrained_refiner_does_not_return_the_draft():
    """Why x0 is the default: the same untrained network under eps prediction turns the starting
    noise into a correction, so the output moves away from the draft before any training."""
    torch.manual_seed(0)
    refiner = LatentDiffusionRefiner(RefinerConfig.from_dict({**REFINER, "prediction": "eps"}),
                                     Autoencoder(AE)).eval()
    refiner.latent_scale.fill_(0.5)
    b = batch()
    out = refiner.sample(b["draft"], b["observation"], b["mask"], generator=torch.Generator().manual_seed(0))
    assert float((out - b["draft"]).abs().mean()) > 1e-3


def test_training_moves_the_refinement_from_the_draft_towards_the_target():
    """On a fixed batch whose draft is off by a smooth bias, a trained refiner's deterministic
    sample is closer to the target than the draft, even through an untrained autoencoder: the
    pixel loss trains the correction through the real decoder."""
    torch.manual_seed(0)
    refiner = LatentDiffusionRefiner(RefinerConfig.from_dict(REFINER), Autoencoder(AE)).train()
    b = batch()
    g = torch.Generator().manual_seed(1)
    bias = F.interpolate(0.1 * torch.randn(2, 13, 2, 2, generator=g), size=b["target"].shape[-2:], mode="bilinear")
    b["draft"] = (b["target"] + bias).clamp(0, 1)
    opt = torch.optim.Adam([p for p in refiner.parameters() if p.requires_grad], lr=2e-3)
    for step in range(60):
        loss = refiner.loss(b["draft"], b["observation"], b["mask"], b["target"],
                            generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
    refiner.eval()
    out = refiner.sample(b["draft"], b["observation"], b["mask"], generator=torch.Generator().manual_seed(0))
    draft_error = float(F.mse_loss(b["draft"], b["target"]))
    refined_error = float(F.mse_loss(out, b["target"]))
    assert refined_error < draft_error, (refined_error, draft_error)
