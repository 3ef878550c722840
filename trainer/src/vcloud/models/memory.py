"""The five memory switches that let the full draft model (154M parameters, T=16, 256x256)
train on one 64 GB MI250X GCD: the production model needed ~90 GB in fp32 without them and ~55 GB
with all five (seed 000).

This implementation, measured on one H200 with ``benchmarks/trainer_memory.py --config full``
(150M parameters, T=16, 256x256, batch 1; peak memory one training step adds): with all five on,
7.9 GB and 0.40 s a step. With all off it does not fit in 139 GB (at T=8: 55.7 GB off, 4.6 GB on).
Each switch off while the others stay on: ``gate_downsample`` 51.0 GB (1.60 s a step),
``grad_checkpointing`` 24.8 GB (0.28 s), ``pair_chunk_size`` 12.3 GB, ``bf16`` 10.9 GB,
``target_only_pyramid`` 7.9 GB: it only shortens how long the other dates' finer levels live
inside the encoder loop, which is not where the step peaks.

Read from the run config's top-level ``memory`` section. ``bf16`` is applied by the training loop
(``torch.autocast("cuda", dtype=torch.bfloat16)``, never with a GradScaler: it skips most bf16
steps on false infinities); the other four change how :class:`vcloud.models.cfdt.CFDT` computes.
Switches 2, 4 and 5 leave the computed function unchanged; ``gate_downsample`` changes it by
design (the change gate runs at a coarser resolution).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vcloud.config_fields import build_config, require

SECTION = "memory"


@dataclass(frozen=True)
class MemoryOptions:
    """Memory switches of the stage 1-3 models (all on in the ``full`` config)."""

    bf16: bool = True
    """1. bf16 autocast on GPU, applied by the loop; no GradScaler. Ignored on CPU."""
    grad_checkpointing: bool = True
    """2. Recompute the per-date encoder and the change gate in backward instead of storing
    their activations (``use_reentrant=False``). ~30% more compute, far less activation memory."""
    gate_downsample: int = 64
    """3. Side length in pixels the change gate is computed at (64: 256x256 -> 64x64, area
    averaging), its output bilinearly upsampled back. 0, or a size >= the patch, runs the gate at
    full resolution."""
    target_only_pyramid: bool = True
    """4. Keep the 4-level feature pyramid only for the target date; other dates keep only the
    coarsest level the temporal transformer needs. Memory O(T*4) -> O(4 + T) feature maps."""
    pair_chunk_size: int = 64
    """5. Date pairs sent through the change gate at once (T=16 gives 240 pairs). 0 sends all
    pairs in one batch."""

    def __post_init__(self) -> None:
        for name in ("bf16", "grad_checkpointing", "target_only_pyramid"):
            value = getattr(self, name)
            require(isinstance(value, bool), SECTION, name, value, "true or false")
        require(
            isinstance(self.gate_downsample, int) and not isinstance(self.gate_downsample, bool)
            and self.gate_downsample >= 0,
            SECTION, "gate_downsample", self.gate_downsample, "an integer >= 0 (0 = full resolution)",
        )
        require(
            isinstance(self.pair_chunk_size, int) and not isinstance(self.pair_chunk_size, bool)
            and self.pair_chunk_size >= 0,
            SECTION, "pair_chunk_size", self.pair_chunk_size, "an integer >= 0 (0 = no chunking)",
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "MemoryOptions":
        return build_config(cls, d, SECTION, check_scalars=False)

    @classmethod
    def all_off(cls) -> "MemoryOptions":
        return cls(bf16=False, grad_checkpointing=False, gate_downsample=0,
                   target_only_pyramid=False, pair_chunk_size=0)

    def gate_size(self, height: int, width: int) -> tuple[int, int]:
        """Resolution the change gate runs at for a ``height`` x ``width`` patch."""
        side = self.gate_downsample
        if side == 0 or side >= min(height, width):
            return height, width
        return side, max(1, round(width * side / height))

    @classmethod
    def coerce(cls, value: Any) -> "MemoryOptions":
        """Accept a ``MemoryOptions``, a mapping, or any object with the five attributes
        (such as the loop's typed config section), so callers need not convert."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return cls.from_dict(value)
        names = ("bf16", "grad_checkpointing", "gate_downsample", "target_only_pyramid", "pair_chunk_size")
        return cls(**{n: getattr(value, n) for n in names if hasattr(value, n)})
