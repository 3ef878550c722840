"""Numerical precision of a training run: an autocast context factory and (never) a GradScaler.

bf16 autocast on GPU is the biggest single memory win (seed 000). A GradScaler must never be
combined with it: the scaler was built for float16, and with bfloat16's short mantissa its initial
scale of 65536 produced false infinities that skipped 75-87% of optimizer steps; the model seemed
to train but validation stayed frozen for days (seed 001). bf16 has float32's exponent range, so
there is no underflow for a scaler to protect against. :class:`Precision` refuses the combination
at construction, and the training loop only ever builds one through :func:`resolve_precision`.

On CPU we train in float32: CPU bf16 autocast is slow and the CPU path exists for tests and
debugging, where exact, comparable numbers matter more than memory.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch


class PrecisionError(ValueError):
    """An unsafe or unsupported precision combination was requested."""


@dataclass(frozen=True)
class Precision:
    """How forward passes run: ``with precision.autocast(): loss = ...``.

    ``scaler`` is ``None`` for every supported mode; the field exists so the invariant
    "no GradScaler with bf16" is checked in one place rather than assumed.
    """

    device_type: str
    """``cuda`` (also ROCm/HIP, which PyTorch exposes as ``cuda``) or ``cpu``."""
    dtype: torch.dtype
    """Autocast compute dtype; ``torch.float32`` means autocast is off."""
    scaler: Any = None
    """Loss scaler; must be ``None`` whenever ``dtype`` is bfloat16."""

    def __post_init__(self) -> None:
        if self.dtype == torch.bfloat16 and self.scaler is not None:
            raise PrecisionError(
                "GradScaler combined with bfloat16 autocast: the scaler skips most optimizer steps "
                "on false infinities (seed 001). bf16 needs no loss scaling; drop the scaler."
            )
        if self.dtype not in (torch.float32, torch.bfloat16):
            raise PrecisionError(f"unsupported training dtype {self.dtype} (allowed: float32, bfloat16)")

    @property
    def name(self) -> str:
        return "bf16" if self.dtype == torch.bfloat16 else "fp32"

    def autocast(self) -> AbstractContextManager:
        """A fresh context manager for one forward pass (and its loss)."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)


def resolve_precision(device_type: str, bf16: bool) -> Precision:
    """The precision for a device and the ``memory.bf16`` switch: bf16 only on GPU, never a scaler."""
    if device_type == "cuda" and bf16:
        return Precision(device_type="cuda", dtype=torch.bfloat16, scaler=None)
    return Precision(device_type=device_type, dtype=torch.float32, scaler=None)
