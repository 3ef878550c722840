"""Stage 1: CFDT, the cloud-free draft model.

Given T cloudy dates of one location (Sentinel-2, optionally Sentinel-1), their cloud masks and
which date is the target, CFDT predicts the cloud-free target image:

1. a per-date encoder (shared weights) turns each date into a 4-level feature pyramid;
2. a change gate looks at every ordered date pair (T(T-1) pairs, 240 for T=16) and predicts
   where land cover stayed the same, so content from a date where the field was ploughed or
   flooded is not copied into the target;
3. a temporal transformer (TMT) attends across dates at every pixel of the coarsest level, with
   the pair gates as an additive attention bias (``log g``: changed pairs are ignored);
4. a draft decoder upsamples the target's TMT features with skip connections from the target
   date's pyramid and predicts a correction to a composite of the clear pixels (zero at the start, and scaled to the
   composite's reflectance error so that the first optimizer steps refine the composite rather than
   overwrite it).

The composite keeps the target's own clear pixels as observed and fills its cloudy ones from the
other dates, each first shifted to the target's local brightness where both are clear
(:mod:`vcloud.models.composite`), weighting a clear pixel of another date by its pair gate and by
``exp(-d * k)`` for a date ``k`` acquisitions away from the target (``d`` learned, starting at
``date_decay``, at ``date_decay_lr_scale`` times the stage's learning rate): surfaces change with
time, so a near date is the better default, which is why the nearest-clear mosaic beats the mean
mosaic. Pixels no date sees clear are filled from their
surroundings. With the decoder's correction starting at zero, the untrained draft is
already a soft nearest-clear mosaic rather than a mean, and training starts from there.

Dates are reordered internally so the target comes first; the transformer sees the original
date index through an embedding, so the reordering does not change what is computed.
The four model-side memory switches are in :mod:`vcloud.models.memory`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from vcloud.models.attention import TransformerBlock
from vcloud.models.blocks import Downsample, ResBlock, Upsample, group_norm
from vcloud.models.composite import fill_gaps, harmonize
from vcloud.models.dtypes import at_least_float32
from vcloud.config_fields import build_config, require, require_channels, require_positive_int
from vcloud.models.memory import MemoryOptions
from vcloud.optim import scale_learning_rate

if TYPE_CHECKING:
    from vcloud.config import MemoryConfig

SECTION = "model.stage1"
S2_BANDS = 13
S1_BANDS = 2
LEVELS = 4


@dataclass(frozen=True)
class CFDTConfig:
    """Shape of the stage-1 draft model."""

    use_s1: bool = False
    """Feed Sentinel-1 (2 bands) alongside Sentinel-2; S1 sees through clouds."""
    max_dates: int = 4
    """Largest series length T the date embedding supports."""
    encoder_channels: tuple[int, int, int, int] = (16, 32, 64, 64)
    """Widths of the 4 pyramid levels (full, 1/2, 1/4, 1/8 resolution)."""
    encoder_blocks: int = 1
    """Residual blocks per pyramid level in the per-date encoder."""
    decoder_blocks: int = 1
    """Residual blocks per level in the draft decoder."""
    gate_channels: int = 16
    """Width of the change gate's per-date stem and pair network."""
    gate_blocks: int = 1
    """Residual blocks in the change gate's pair network."""
    tmt_dim: int = 64
    """Token width of the temporal transformer (the coarsest level is projected to it)."""
    tmt_layers: int = 1
    """Transformer blocks over dates."""
    tmt_heads: int = 2
    """Attention heads; ``tmt_dim`` must be divisible by it."""
    tmt_mlp_ratio: float = 4.0
    """Hidden width of the transformer MLP relative to ``tmt_dim``."""
    norm_groups: int = 8
    """GroupNorm groups; every convolutional width must be a multiple of it."""
    date_decay: float = 1.0
    """Initial decay of a date's composite weight per acquisition away from the target (learned);
    0 = every clear date counts the same at the start."""
    date_decay_lr_scale: float = 100.0
    """The date decay trains at this multiple of the stage's learning rate (see :mod:`vcloud.optim`):
    at the weights' rate, the 92 steps of the CPU quality benchmark moved it from 1.0 to 0.994,
    while the validation split scored the trained draft 0.16 dB higher with 0.5."""
    harmonize_radius: int = 15
    """Half-width in pixels of the window over which another date is shifted to the target's local
    brightness before it enters the composite; 0 = no harmonisation."""
    fill_radii: tuple[int, ...] = (2, 8, 32)
    """Radii of the normalised convolutions that fill pixels no date sees clear; () = none."""
    correction_scale: float = 0.05
    """Reflectance per unit of the decoder head's output: the correction is ``correction_scale *
    head(...)``. Adam moves every weight of the zero-initialised head by about the learning rate on
    its first steps, whatever its gradient; unscaled, those steps change the draft by more than the
    composite's error (~0.01 reflectance) and training starts by spoiling its start. Scaled to the
    size of that error, the first steps nudge the composite instead."""

    def __post_init__(self) -> None:
        require(isinstance(self.use_s1, bool), SECTION, "use_s1", self.use_s1, "true or false")
        require(isinstance(self.date_decay, (int, float)) and not isinstance(self.date_decay, bool)
                and self.date_decay >= 0, SECTION, "date_decay", self.date_decay, "a number >= 0")
        require(isinstance(self.date_decay_lr_scale, (int, float)) and not isinstance(self.date_decay_lr_scale, bool)
                and self.date_decay_lr_scale > 0, SECTION, "date_decay_lr_scale", self.date_decay_lr_scale,
                "a number > 0 (1 = the weights' learning rate)")
        require(isinstance(self.harmonize_radius, int) and not isinstance(self.harmonize_radius, bool)
                and self.harmonize_radius >= 0, SECTION, "harmonize_radius", self.harmonize_radius,
                "an integer >= 0")
        require(isinstance(self.fill_radii, tuple) and all(
            isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in self.fill_radii),
            SECTION, "fill_radii", self.fill_radii, "a list of integers > 0")
        require(isinstance(self.correction_scale, (int, float)) and not isinstance(self.correction_scale, bool)
                and self.correction_scale > 0, SECTION, "correction_scale", self.correction_scale, "a number > 0")
        require_positive_int(SECTION, "max_dates", self.max_dates)
        require(self.max_dates >= 2, SECTION, "max_dates", self.max_dates, "an integer >= 2")
        require_positive_int(SECTION, "norm_groups", self.norm_groups)
        require(isinstance(self.encoder_channels, tuple) and len(self.encoder_channels) == LEVELS,
                SECTION, "encoder_channels", self.encoder_channels, f"a list of {LEVELS} widths")
        for width in self.encoder_channels:
            require_channels(SECTION, "encoder_channels", width, self.norm_groups)
        require_channels(SECTION, "gate_channels", self.gate_channels, self.norm_groups)
        for name in ("encoder_blocks", "decoder_blocks", "gate_blocks", "tmt_layers", "tmt_heads", "tmt_dim"):
            require_positive_int(SECTION, name, getattr(self, name))
        require(self.tmt_dim % self.tmt_heads == 0, SECTION, "tmt_dim", self.tmt_dim,
                f"a multiple of tmt_heads={self.tmt_heads}")
        require(isinstance(self.tmt_mlp_ratio, (int, float)) and self.tmt_mlp_ratio > 0,
                SECTION, "tmt_mlp_ratio", self.tmt_mlp_ratio, "a number > 0")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "CFDTConfig":
        return build_config(cls, d, SECTION, check_scalars=False)

    @property
    def in_channels(self) -> int:
        """Per-date input: S2 bands, cloud mask, and S1 when used."""
        return S2_BANDS + 1 + (S1_BANDS if self.use_s1 else 0)


class PyramidEncoder(nn.Module):
    """Per-date encoder: one date's bands + mask -> 4 feature maps at 1, 1/2, 1/4, 1/8."""

    def __init__(self, cfg: CFDTConfig) -> None:
        super().__init__()
        g = cfg.norm_groups
        widths = cfg.encoder_channels
        self.stem = nn.Conv2d(cfg.in_channels, widths[0], 3, padding=1)
        self.levels = nn.ModuleList()
        self.downs = nn.ModuleList()
        ch = widths[0]
        for level, width in enumerate(widths):
            blocks = []
            for _ in range(cfg.encoder_blocks):
                blocks.append(ResBlock(ch, width, g))
                ch = width
            self.levels.append(nn.Sequential(*blocks))
            if level < LEVELS - 1:
                self.downs.append(Downsample(ch))

    def forward(self, x: torch.Tensor, full_pyramid: bool = True) -> tuple[torch.Tensor, ...]:
        """All 4 levels (finest first), or only the coarsest when ``full_pyramid`` is False."""
        h = self.stem(x)
        feats = []
        for level, blocks in enumerate(self.levels):
            h = blocks(h)
            if full_pyramid or level == LEVELS - 1:
                feats.append(h)
            if level < LEVELS - 1:
                h = self.downs[level](h)
        return tuple(feats)


class ChangeGate(nn.Module):
    """Predicts, for an ordered date pair (i, j), where land cover is unchanged (gate ~ 1)."""

    def __init__(self, cfg: CFDTConfig) -> None:
        super().__init__()
        gc, g = cfg.gate_channels, cfg.norm_groups
        self.date_stem = nn.Sequential(
            nn.Conv2d(cfg.in_channels, gc, 3, padding=1), group_norm(gc, g), nn.SiLU()
        )
        self.pair_in = nn.Conv2d(3 * gc, gc, 3, padding=1)
        self.pair_blocks = nn.Sequential(*[ResBlock(gc, gc, g) for _ in range(cfg.gate_blocks)])
        self.pair_norm = group_norm(gc, g)
        self.pair_out = nn.Conv2d(gc, 1, 3, padding=1)
        nn.init.zeros_(self.pair_out.weight)
        assert self.pair_out.bias is not None
        nn.init.constant_(self.pair_out.bias, 2.0)  # start trusting every date (gate ~0.88)

    def embed_dates(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, C, h, w] -> per-date embeddings [B, T, gc, h, w] (O(T), shared by all pairs)."""
        b, t = x.shape[:2]
        return self.date_stem(x.flatten(0, 1)).unflatten(0, (b, t))

    def score_pairs(self, emb: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """Gates of the pairs ``(first[k], second[k])``: [B, P, 1, h, w] in (0, 1)."""
        b, p = emb.shape[0], first.numel()
        ei, ej = emb[:, first].flatten(0, 1), emb[:, second].flatten(0, 1)
        h = self.pair_in(torch.cat([ei, ej, (ei - ej).abs()], dim=1))
        h = self.pair_out(F.silu(self.pair_norm(self.pair_blocks(h))))
        return torch.sigmoid(h).unflatten(0, (b, p))


class TemporalTransformer(nn.Module):
    """TMT: attention across dates at each pixel of the coarsest level, biased by the gates."""

    def __init__(self, cfg: CFDTConfig) -> None:
        super().__init__()
        c4, d = cfg.encoder_channels[-1], cfg.tmt_dim
        self.proj_in = nn.Linear(c4, d)
        self.date_embed = nn.Embedding(cfg.max_dates, d)
        self.target_embed = nn.Parameter(torch.zeros(d))
        self.cloud_embed = nn.Linear(1, d)
        self.blocks = nn.ModuleList(
            [TransformerBlock(d, cfg.tmt_heads, cfg.tmt_mlp_ratio) for _ in range(cfg.tmt_layers)]
        )
        self.norm = nn.LayerNorm(d)
        self.proj_out = nn.Linear(d, c4)

    def forward(self, feats: torch.Tensor, dates: torch.Tensor, cloud: torch.Tensor,
                bias: torch.Tensor) -> torch.Tensor:
        """feats [B, T, C4, h, w] (target first), dates [B, T] original indices, cloud [B, T, h, w]
        cloud fraction, bias [B*h*w, 1, T, T] -> fused target features [B, C4, h, w]."""
        b, t, c, h, w = feats.shape
        tokens = self.proj_in(feats.permute(0, 3, 4, 1, 2).reshape(b * h * w, t, c))
        extra = self.date_embed(dates)[:, None, None] + self.cloud_embed(
            cloud.permute(0, 2, 3, 1)[..., None]
        )
        tokens = tokens + extra.reshape(b * h * w, t, -1)
        tokens[:, 0] = tokens[:, 0] + self.target_embed
        for block in self.blocks:
            tokens = block(tokens, bias)
        out = self.proj_out(self.norm(tokens[:, 0]))
        return out.reshape(b, h, w, c).permute(0, 3, 1, 2)


class DraftDecoder(nn.Module):
    """Upsamples the fused coarsest features with skips from the target date's pyramid and
    predicts a correction to the gate-weighted composite at full resolution."""

    def __init__(self, cfg: CFDTConfig) -> None:
        super().__init__()
        g, widths = cfg.norm_groups, cfg.encoder_channels
        self.fuse = ResBlock(2 * widths[-1], widths[-1], g)
        self.ups = nn.ModuleList()
        self.levels = nn.ModuleList()
        ch = widths[-1]
        for level in reversed(range(LEVELS - 1)):
            self.ups.append(Upsample(ch))
            blocks = []
            in_ch = ch + widths[level]
            for _ in range(cfg.decoder_blocks):
                blocks.append(ResBlock(in_ch, widths[level], g))
                in_ch = widths[level]
            self.levels.append(nn.Sequential(*blocks))
            ch = widths[level]
        head_in = ch + S2_BANDS + 1 + cfg.in_channels
        self.head = nn.Sequential(
            nn.Conv2d(head_in, ch, 3, padding=1), group_norm(ch, g), nn.SiLU(),
            nn.Conv2d(ch, S2_BANDS, 3, padding=1),
        )
        head_out = self.head[-1]
        assert isinstance(head_out, nn.Conv2d) and head_out.bias is not None
        nn.init.zeros_(head_out.weight)
        nn.init.zeros_(head_out.bias)
        self.correction_scale = float(cfg.correction_scale)

    def forward(self, fused: torch.Tensor, skips: Sequence[torch.Tensor], composite: torch.Tensor,
                coverage: torch.Tensor, target_input: torch.Tensor) -> torch.Tensor:
        h = self.fuse(torch.cat([fused, skips[-1]], dim=1))
        for up, blocks, skip in zip(self.ups, self.levels, reversed(skips[:-1])):
            h = blocks(torch.cat([up(h, size=skip.shape[-2:]), skip], dim=1))
        delta = self.head(torch.cat([h, composite, coverage, target_input], dim=1))
        return composite + self.correction_scale * delta


def order_target_first(target_index: torch.Tensor, num_dates: int) -> torch.Tensor:
    """[B] target indices -> [B, T] date order with the target first, others in time order."""
    b = target_index.shape[0]
    dates = torch.arange(num_dates, device=target_index.device).expand(b, num_dates)
    others = dates[dates != target_index[:, None]].reshape(b, num_dates - 1)
    return torch.cat([target_index[:, None], others], dim=1)


def ordered_pairs(num_dates: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """All T(T-1) ordered pairs (i, j), i != j, as two index vectors; pairs (0, j) come first."""
    i, j = torch.meshgrid(torch.arange(num_dates, device=device),
                          torch.arange(num_dates, device=device), indexing="ij")
    keep = i != j
    return i[keep], j[keep]


class CFDT(nn.Module):
    """Cloud-free draft model (stage 1); see the module docstring for the architecture."""

    def __init__(self, cfg: CFDTConfig, memory: MemoryOptions | MemoryConfig | dict | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.memory = MemoryOptions.coerce(memory)
        self.encoder = PyramidEncoder(cfg)
        self.gate = ChangeGate(cfg)
        self.tmt = TemporalTransformer(cfg)
        self.decoder = DraftDecoder(cfg)
        self.date_decay = scale_learning_rate(nn.Parameter(torch.tensor(float(cfg.date_decay))),
                                              cfg.date_decay_lr_scale)

    def _check(self, inputs: torch.Tensor, masks: torch.Tensor, target_index: torch.Tensor,
               s1: torch.Tensor | None) -> None:
        if inputs.ndim != 5 or inputs.shape[2] != S2_BANDS:
            raise ValueError(f"CFDT inputs must be [B, T, {S2_BANDS}, H, W], got {list(inputs.shape)}")
        b, t, _, h, w = inputs.shape
        if masks.shape != (b, t, 1, h, w):
            raise ValueError(f"CFDT masks must be {[b, t, 1, h, w]}, got {list(masks.shape)}")
        if not 2 <= t <= self.cfg.max_dates:
            raise ValueError(f"series has T={t} dates; the model supports 2..{self.cfg.max_dates} "
                             "(raise model.stage1.max_dates)")
        multiple = 2 ** (LEVELS - 1)
        if h % multiple or w % multiple:
            raise ValueError(f"patch size {h}x{w} must be divisible by {multiple} (the pyramid has "
                             f"{LEVELS} levels); crop or pad the patches")
        if target_index.shape != (b,):
            raise ValueError(f"target_index must be [B]={[b]}, got {list(target_index.shape)}")
        if self.cfg.use_s1 and (s1 is None or s1.shape != (b, t, S1_BANDS, h, w)):
            got = None if s1 is None else list(s1.shape)
            raise ValueError(f"model.stage1.use_s1 is true: s1 must be {[b, t, S1_BANDS, h, w]}, got {got}")

    def _encode_dates(self, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Target pyramid (4 levels) and every date's coarsest level [B, T, C4, h, w]."""
        mem = self.memory
        num_dates = x.shape[1]
        pyramids: list[tuple[torch.Tensor, ...]] = []
        for t in range(num_dates):
            full = t == 0 or not mem.target_only_pyramid
            if mem.grad_checkpointing and torch.is_grad_enabled():
                feats = checkpoint(self.encoder, x[:, t], full, use_reentrant=False)
            else:
                feats = self.encoder(x[:, t], full)
            pyramids.append(feats)
        coarse = torch.stack([p[-1] for p in pyramids], dim=1)
        return list(pyramids[0]), coarse

    def _gates(self, x: torch.Tensor) -> torch.Tensor:
        """Gates of all ordered pairs [B, P, 1, h_g, w_g] at the gate resolution."""
        mem = self.memory
        b, t, c, h, w = x.shape
        size = mem.gate_size(h, w)
        if size != (h, w):
            x = F.interpolate(x.flatten(0, 1), size=size, mode="area").unflatten(0, (b, t))
        first, second = ordered_pairs(t, x.device)
        use_ckpt = mem.grad_checkpointing and torch.is_grad_enabled()
        emb = checkpoint(self.gate.embed_dates, x, use_reentrant=False) if use_ckpt else self.gate.embed_dates(x)
        chunk = mem.pair_chunk_size or first.numel()
        out = []
        for start in range(0, first.numel(), chunk):
            fi, se = first[start:start + chunk], second[start:start + chunk]
            if use_ckpt:
                out.append(checkpoint(self.gate.score_pairs, emb, fi, se, use_reentrant=False))
            else:
                out.append(self.gate.score_pairs(emb, fi, se))
        return torch.cat(out, dim=1)

    def forward(self, inputs: torch.Tensor, masks: torch.Tensor, target_index: torch.Tensor,
                s1: torch.Tensor | None = None) -> torch.Tensor:
        """-> draft [B, 13, H, W] of the target date."""
        self._check(inputs, masks, target_index, s1)
        b, t, _, h, w = inputs.shape
        order = order_target_first(target_index.long(), t)
        rows = torch.arange(b, device=inputs.device)[:, None]
        parts = [inputs, masks]
        if self.cfg.use_s1:
            assert s1 is not None  # _check refuses a missing s1
            parts.append(s1)
        x = torch.cat(parts, dim=2)[rows, order]
        bands, clouds = x[:, :, :S2_BANDS], x[:, :, S2_BANDS:S2_BANDS + 1]

        skips, coarse = self._encode_dates(x)
        ch, cw = coarse.shape[-2:]

        gates = self._gates(x)  # [B, P, 1, hg, wg], pairs (0, j) first
        num_pairs = gates.shape[1]
        first, second = ordered_pairs(t, x.device)
        log_g = torch.log(at_least_float32(gates).clamp_min(1e-4))
        log_g = F.interpolate(log_g.flatten(0, 1), size=(ch, cw), mode="area").reshape(b, num_pairs, ch, cw)
        bias = log_g.new_zeros(b, t * t, ch, cw)
        bias[:, first * t + second] = log_g
        bias = bias.permute(0, 2, 3, 1).reshape(b * ch * cw, 1, t, t)

        cloud_coarse = F.interpolate(at_least_float32(clouds.flatten(0, 1)), size=(ch, cw), mode="area")
        fused = self.tmt(coarse, order, cloud_coarse.reshape(b, t, ch, cw), bias)

        target_gates = gates[:, : t - 1, 0]  # pairs (0, j), j = 1..T-1
        if target_gates.shape[-2:] != (h, w):
            target_gates = F.interpolate(target_gates, size=(h, w), mode="bilinear", align_corners=False)
        clear = 1.0 - clouds[:, :, 0]
        steps_away = (order[:, 1:] - target_index.long()[:, None]).abs().to(clear.dtype)  # [B, T-1]
        trust = clear[:, 1:] * target_gates.to(clear.dtype)  # [B, T-1, H, W]
        own = clear[:, :1]  # the target's clear pixels are observed: they pass through unchanged
        others = bands[:, 1:]
        if self.cfg.harmonize_radius:
            others = harmonize(others, bands[:, 0], trust * own, self.cfg.harmonize_radius).to(bands.dtype)
        # Normalised in log space, so a far clear date still wins over near cloudy ones.
        log_w = torch.log(trust + 1e-6) - self.date_decay.clamp_min(0.0) * steps_away[:, :, None, None]
        filled = (torch.softmax(log_w, dim=1)[:, :, None] * others).sum(1)
        composite = own * bands[:, 0] + (1.0 - own) * filled
        if self.cfg.fill_radii:  # pixels no date sees clear: from their surroundings, not from a cloud
            seen = own + (1.0 - own) * clear[:, 1:].sum(1, keepdim=True).clamp(max=1.0)
            composite = fill_gaps(composite, seen, self.cfg.fill_radii).to(bands.dtype)
        coverage = own + (1.0 - own) * trust.sum(1, keepdim=True).clamp(max=1.0)
        return self.decoder(fused, skips, composite, coverage.clamp(max=1.0), x[:, 0])
