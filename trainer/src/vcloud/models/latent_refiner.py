"""Stage 2: conditional latent diffusion refiner.

Works in the latent space of the frozen stage-0 autoencoder. It diffuses the *residual* latent
``(z_target - z_draft) / latent_scale`` conditioned on the latents of the stage-1 draft and of the
target's cloudy observation plus its cloud mask, and is sampled with a few deterministic DDIM
steps (eta = 0; a fixed generator seed gives a fixed result). The refined image is
``draft + decode(z_draft + r) - decode(z_draft)``: the refiner adds a correction to the draft, so
the autoencoder's own reconstruction error does not cap the output quality.

The denoiser predicts the clean residual (``prediction: x0``) through a zero-initialised output
layer, so an untrained refiner returns the draft exactly, whatever the starting noise, and
training moves it away from the draft only where the loss says the draft is wrong. (With noise
prediction the same untrained network returns the starting noise scaled up, which decodes to a
refinement several dB worse than the draft it was given.) Besides the diffusion loss, a pixel
loss on the refinement decoded from the clean-residual estimate (``pixel_loss_weight``; squared
error relative to the draft's, so 1 means "no better than the draft") trains the correction
through the actual decoder: when the autoencoder reconstructs worse than the draft is accurate,
``decode(z_target) - decode(z_draft)`` is not ``target - draft``, and the latent objective alone
would move the output away from the target.

``latent_scale`` (LDM's scale factor) is the standard deviation of the residual latent measured on
the first training batch; it is a buffer, so it is saved and restored with the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vcloud.models.attention import SelfAttention
from vcloud.models.autoencoder import Autoencoder
from vcloud.models.blocks import Downsample, ResBlock, Upsample, group_norm
from vcloud.config_fields import build_config, require, require_channels, require_positive_int
from vcloud.models.diffusion import (
    PREDICTIONS,
    SCHEDULES,
    ddim_sample,
    make_alphas_cumprod,
    q_sample,
    timestep_embedding,
)

SECTION = "model.stage2"


@dataclass(frozen=True)
class RefinerConfig:
    """Shape of the stage-2 denoiser and its diffusion process."""

    base_channels: int = 32
    """Width of the denoiser U-Net's first level."""
    channel_mult: tuple[int, ...] = (1, 2)
    """Width multiplier per U-Net level; the latent side must be divisible by 2**(levels-1)."""
    num_res_blocks: int = 1
    """Residual blocks per U-Net level."""
    attention_heads: int = 2
    """Heads of the self-attention at the U-Net's coarsest level (SDPA)."""
    schedule: str = "cosine"
    """Noise schedule: cosine or linear."""
    train_timesteps: int = 1000
    """Diffusion steps of the training process."""
    sample_steps: int = 4
    """Deterministic DDIM steps at inference (production: 50)."""
    norm_groups: int = 8
    """GroupNorm groups; every width must be a multiple of it."""
    clip_x0: float = 3.0
    """Clamp DDIM's clean-residual estimates to +-clip_x0 (units of the residual's std); 0 = off."""
    prediction: str = "x0"
    """Denoiser output: x0 (the clean residual; untrained = the draft unchanged) or eps (the noise)."""
    pixel_loss_weight: float = 10.0
    """Weight of the pixel loss: the decoded refinement's squared error relative to the draft's
    (1 = no better than the draft). Dominates the diffusion loss so that, while the autoencoder is
    imperfect, its latent residual cannot pull the output below the draft; 0 = diffusion loss only."""
    level_correction: bool = False
    """Correct the draft's level under the target date's clouds, per band, from the target date's
    clear pixels before the refiner sees it (:mod:`vcloud.models.level`); trained with an L1 loss on
    the corrected draft beside the refiner's."""

    def __post_init__(self) -> None:
        require_positive_int(SECTION, "norm_groups", self.norm_groups)
        require(isinstance(self.clip_x0, (int, float)) and self.clip_x0 >= 0, SECTION, "clip_x0",
                self.clip_x0, "a number >= 0 (0 = no clamping)")
        require_channels(SECTION, "base_channels", self.base_channels, self.norm_groups)
        require(isinstance(self.channel_mult, tuple) and len(self.channel_mult) >= 1
                and all(isinstance(m, int) and m > 0 for m in self.channel_mult),
                SECTION, "channel_mult", self.channel_mult, "a non-empty list of integers > 0")
        require_positive_int(SECTION, "num_res_blocks", self.num_res_blocks)
        require_positive_int(SECTION, "attention_heads", self.attention_heads)
        top = self.base_channels * self.channel_mult[-1]
        require(top % self.attention_heads == 0, SECTION, "attention_heads", self.attention_heads,
                f"a divisor of the coarsest width {top}")
        require(self.prediction in PREDICTIONS, SECTION, "prediction", self.prediction, ", ".join(PREDICTIONS))
        require(isinstance(self.pixel_loss_weight, (int, float)) and self.pixel_loss_weight >= 0, SECTION,
                "pixel_loss_weight", self.pixel_loss_weight, "a number >= 0 (0 = diffusion loss only)")
        require(self.schedule in SCHEDULES, SECTION, "schedule", self.schedule, ", ".join(SCHEDULES))
        require(isinstance(self.level_correction, bool), SECTION, "level_correction", self.level_correction,
                "true or false")
        require_positive_int(SECTION, "train_timesteps", self.train_timesteps)
        require_positive_int(SECTION, "sample_steps", self.sample_steps)
        require(self.sample_steps <= self.train_timesteps, SECTION, "sample_steps", self.sample_steps,
                f"an integer <= train_timesteps={self.train_timesteps}")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "RefinerConfig":
        return build_config(cls, d, SECTION, check_scalars=False)


class _AttentionBlock(nn.Module):
    def __init__(self, channels: int, heads: int, groups: int) -> None:
        super().__init__()
        self.norm = group_norm(channels, groups)
        self.attn = SelfAttention(channels, heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        tokens = self.norm(x).flatten(2).transpose(1, 2)
        return x + self.attn(tokens).transpose(1, 2).reshape(b, c, h, w)


class Denoiser(nn.Module):
    """U-Net predicting the clean residual latent (or its noise), given the time step and the
    condition. The output layer starts at zero: see the module docstring."""

    def __init__(self, cfg: RefinerConfig, latent_channels: int) -> None:
        super().__init__()
        g = cfg.norm_groups
        widths = [cfg.base_channels * m for m in cfg.channel_mult]
        emb_dim = 4 * cfg.base_channels
        self.base_channels = cfg.base_channels
        self.time_mlp = nn.Sequential(nn.Linear(cfg.base_channels, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        cond_channels = 2 * latent_channels + 1  # draft latent, observation latent, cloud mask
        self.stem = nn.Conv2d(latent_channels + cond_channels, widths[0], 3, padding=1)
        self.down = nn.ModuleList()
        skip_widths = [widths[0]]
        ch = widths[0]
        for level, width in enumerate(widths):
            for _ in range(cfg.num_res_blocks):
                self.down.append(ResBlock(ch, width, g, emb_dim))
                ch = width
                skip_widths.append(ch)
            if level < len(widths) - 1:
                self.down.append(Downsample(ch))
                skip_widths.append(ch)
        self.mid1 = ResBlock(ch, ch, g, emb_dim)
        self.mid_attn = _AttentionBlock(ch, cfg.attention_heads, g)
        self.mid2 = ResBlock(ch, ch, g, emb_dim)
        self.up = nn.ModuleList()
        for level in reversed(range(len(widths))):
            for _ in range(cfg.num_res_blocks + 1):
                self.up.append(ResBlock(ch + skip_widths.pop(), widths[level], g, emb_dim))
                ch = widths[level]
            if level > 0:
                self.up.append(Upsample(ch))
        self.norm_out = group_norm(ch, g)
        self.out = nn.Conv2d(ch, latent_channels, 3, padding=1)
        nn.init.zeros_(self.out.weight)
        assert self.out.bias is not None
        nn.init.zeros_(self.out.bias)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        emb = self.time_mlp(timestep_embedding(t, self.base_channels).to(x.dtype))
        h = self.stem(torch.cat([x, cond], dim=1))
        skips = [h]
        for layer in self.down:
            h = layer(h, emb) if isinstance(layer, ResBlock) else layer(h)
            skips.append(h)
        h = self.mid2(self.mid_attn(self.mid1(h, emb)), emb)
        for layer in self.up:
            if isinstance(layer, ResBlock):
                h = layer(torch.cat([h, skips.pop()], dim=1), emb)
            else:
                h = layer(h, size=skips[-1].shape[-2:])
        return self.out(F.silu(self.norm_out(h)))


class LatentDiffusionRefiner(nn.Module):
    """Refines a stage-1 draft with conditional diffusion in the frozen autoencoder's latent."""

    alphas_cumprod: torch.Tensor
    latent_scale: torch.Tensor

    def __init__(self, cfg: RefinerConfig, autoencoder: Autoencoder) -> None:
        super().__init__()
        self.cfg = cfg
        self.autoencoder = autoencoder
        self.autoencoder.requires_grad_(False)
        self.denoiser = Denoiser(cfg, autoencoder.cfg.latent_channels)
        self.register_buffer("alphas_cumprod", make_alphas_cumprod(cfg.schedule, cfg.train_timesteps).float())
        self.register_buffer("latent_scale", torch.zeros(()))

    def train(self, mode: bool = True) -> "LatentDiffusionRefiner":
        super().train(mode)
        self.autoencoder.eval()  # frozen: its normalisation statistics never change
        return self

    def _condition(self, draft: torch.Tensor, observation: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            z_draft = self.autoencoder.encode(draft)
            z_obs = self.autoencoder.encode(observation)
        mask_lat = F.interpolate(mask, size=z_draft.shape[-2:], mode="area")
        return z_draft, torch.cat([z_draft, z_obs, mask_lat.to(z_draft.dtype)], dim=1)

    def _scale(self) -> torch.Tensor:
        return torch.where(self.latent_scale > 0, self.latent_scale, torch.ones_like(self.latent_scale))

    def loss(self, draft: torch.Tensor, observation: torch.Tensor, mask: torch.Tensor, target: torch.Tensor,
             generator: torch.Generator | None = None) -> torch.Tensor:
        """Diffusion loss on the residual latent of ``target`` w.r.t. ``draft`` (MSE on the clean
        residual or on the noise, per ``prediction``), plus ``pixel_loss_weight`` times the squared
        error of the refinement decoded from the clean-residual estimate, relative to the draft's.

        draft, observation, target: [B, 13, H, W]; mask: [B, 1, H, W] (1 = cloud)."""
        draft = draft.detach()
        z_draft, cond = self._condition(draft, observation, mask)
        with torch.no_grad():
            residual = (self.autoencoder.encode(target) - z_draft).float()
            if self.training and float(self.latent_scale) == 0.0:
                self.latent_scale.fill_(float(residual.std().clamp_min(1e-3)))
        x0 = residual / self._scale()
        b = x0.shape[0]
        t = torch.randint(0, self.cfg.train_timesteps, (b,), device=x0.device, generator=generator)
        noise = torch.randn(x0.shape, device=x0.device, generator=generator)
        xt = q_sample(x0, t, noise, self.alphas_cumprod)
        pred = self.denoiser(xt, t, cond).float()
        if self.cfg.prediction == "eps":
            loss = F.mse_loss(pred, noise)
            if self.cfg.pixel_loss_weight == 0:
                return loss
            a = self.alphas_cumprod[t].float().view(-1, 1, 1, 1)
            x0_hat = (xt - (1 - a).sqrt() * pred) / a.sqrt()
        else:
            loss = F.mse_loss(pred, x0)
            if self.cfg.pixel_loss_weight == 0:
                return loss
            x0_hat = pred
        if self.cfg.clip_x0 > 0:
            x0_hat = x0_hat.clamp(-self.cfg.clip_x0, self.cfg.clip_x0)
        refined = self._add_correction(draft, z_draft, x0_hat).float()
        draft_error = F.mse_loss(draft.float(), target.float()).detach().clamp_min(1e-8)
        return loss + self.cfg.pixel_loss_weight * F.mse_loss(refined, target.float()) / draft_error

    def _add_correction(self, draft: torch.Tensor, z_draft: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Draft plus the decoded effect of a (normalised) residual latent; unclamped. A zero
        residual returns ``draft`` bit for bit."""
        with torch.no_grad():
            decoded_draft = self.autoencoder.decode(z_draft)
        z_refined = z_draft + residual.to(z_draft.dtype) * self._scale()
        return draft + (self.autoencoder.decode(z_refined) - decoded_draft)

    @torch.no_grad()
    def sample(self, draft: torch.Tensor, observation: torch.Tensor, mask: torch.Tensor,
               steps: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Refined target [B, 13, H, W] in [0, 1] after ``steps`` DDIM steps (default: config)."""
        z_draft, cond = self._condition(draft, observation, mask)
        residual = ddim_sample(
            lambda x, t: self.denoiser(x.to(cond.dtype), t, cond),
            tuple(z_draft.shape), self.alphas_cumprod, steps or self.cfg.sample_steps, generator, z_draft.device,
            clip_x0=float(self.cfg.clip_x0), prediction=self.cfg.prediction,
        )
        return self._add_correction(draft, z_draft, residual).clamp(0.0, 1.0)
