"""Multi-head self-attention through ``F.scaled_dot_product_attention``.

SDPA dispatches to the fused flash / memory-efficient kernels (Flash Attention 3 in the LUMI
container), so attention memory is linear rather than quadratic in sequence length where the
kernel allows it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    """Pre-norm-free multi-head self-attention over ``[N, L, C]`` tokens with an optional
    additive bias ``[N, 1 or heads, L, L]``."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"attention width {dim} is not divisible by heads={heads}")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        n, length, dim = x.shape
        qkv = self.qkv(x).reshape(n, length, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if bias is not None:
            bias = bias.to(q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.proj(out.transpose(1, 2).reshape(n, length, dim))


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: attention then MLP, both residual."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), bias)
        return x + self.mlp(self.norm2(x))
