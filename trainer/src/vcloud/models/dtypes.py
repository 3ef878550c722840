"""Compute-dtype rules shared by the models.

Parts that lose accuracy in half precision (window sums that subtract running sums, log-gates) run
in float32 also under bf16 autocast. They promote to *at least* float32 rather than cast to it, so
a float64 reference run stays float64 end to end (the numerical parity tests compare such runs,
whose rounding differences are ~1e-13 instead of float32's ~1e-5).
"""

from __future__ import annotations

import torch


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` as float32, or unchanged when it is already float32 or float64."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()
