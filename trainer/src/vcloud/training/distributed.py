"""Device selection and DDP process-group setup (``torchrun`` or a single process).

One process per GPU under ``torchrun --nproc_per_node=N`` (8 GCDs on a LUMI node, 4 APUs on a
Cosmos node): NCCL on CUDA, which PyTorch maps to RCCL on ROCm; gloo on CPU so the same code path
runs in CI. Without ``WORLD_SIZE`` in the environment the run is a plain single process.

The rule that prevents the seed-002 deadlock lives in the loop, not here: every rank builds its
model, datasets and caches completely *before* the model is wrapped in DDP, and after that no rank
does one-off work the others would wait for inside a collective. Rank 0 alone writes files; the
others wait at a barrier.

A job that was given GPUs never trains on the CPU: the job script sets :data:`GPUS_REQUIRED_ENV`
to the number of GPUs Slurm gave this node when the cluster profile's accelerator is real, and
:func:`init_distributed` raises :class:`GpusMissing` when PyTorch sees fewer, before any process
group, model or data exists. Without the variable (the local CPU cluster, tests) the CPU fallback
stays.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from vcloud.contract import GPU_HINT_ENV, GPUS_REQUIRED_ENV

log = logging.getLogger(__name__)

# GPUS_REQUIRED_ENV: GPUs this node of the job was given, set by the job script when the profile
# requires GPUs; unset or 0: CPU training is allowed. GPU_HINT_ENV: the profile's advice for a job
# whose GPUs PyTorch cannot see, logged with the refusal.


class GpusMissing(RuntimeError):
    """GPUs are required, but PyTorch sees fewer than the job was given: do not train on the CPU."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None
    """``nccl`` (RCCL on ROCm), ``gloo``, or ``None`` for a single process."""

    @property
    def is_main(self) -> bool:
        """Rank 0: the only rank that writes checkpoints, markers and progress lines."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    try:
        return int(raw) if raw else default
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer (set by torchrun)") from None


def gpus_required(env: Mapping[str, str]) -> int:
    """How many GPUs this process must see (:data:`GPUS_REQUIRED_ENV`; 0 when unset)."""
    raw = env.get(GPUS_REQUIRED_ENV, "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise ValueError(f"environment variable {GPUS_REQUIRED_ENV}={raw!r} is not a number of GPUs "
                         "(the job script sets it from the profile and Slurm's SLURM_GPUS_ON_NODE)")
    return int(raw)


def torch_build() -> str:
    """Which PyTorch this is and what it was built for, for messages about missing GPUs."""
    if torch.version.hip:
        target = f"a ROCm build (HIP {torch.version.hip})"
    elif torch.version.cuda:
        target = f"a CUDA {torch.version.cuda} build"
    else:
        target = "a CPU-only build"
    return f"torch {torch.__version__}, {target}"


def gpu_shortfall(required: int, visible: int, build: str) -> str | None:
    """Why this process must not start (PyTorch sees fewer GPUs than the job was given), or None."""
    if required <= 0 or visible >= required:
        return None
    gpus = "GPU" if required == 1 else "GPUs"
    return (f"GPUs required: this node of the job was given {required} {gpus}, but PyTorch sees {visible} "
            f"({build}); refusing to train on the CPU")


def visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_gpus(env: Mapping[str, str]) -> None:
    """Raise :class:`GpusMissing` when the job was given GPUs that PyTorch does not see."""
    required = gpus_required(env)
    if required == 0:
        return
    problem = gpu_shortfall(required, visible_gpus(), torch_build())
    if problem:
        raise GpusMissing(problem, hint=env.get(GPU_HINT_ENV, "").strip() or None)


def init_distributed(env: Mapping[str, str] | None = None, timeout_minutes: int = 30) -> DistContext:
    """Check that the GPUs the job was given are visible, pick the device and, under torchrun, join
    the process group."""
    env = os.environ if env is None else env
    world_size = _env_int(env, "WORLD_SIZE", 1)
    rank = _env_int(env, "RANK", 0)
    local_rank = _env_int(env, "LOCAL_RANK", 0)
    check_gpus(env)
    cuda = torch.cuda.is_available()
    if cuda:
        device_index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(device_index)
        device = torch.device("cuda", device_index)
    else:
        device = torch.device("cpu")
    backend = None
    if world_size > 1:
        backend = "nccl" if cuda else "gloo"
        dist.init_process_group(backend=backend, timeout=dt.timedelta(minutes=timeout_minutes))
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device, backend=backend)


def describe_device(ctx: DistContext) -> str:
    """The start-of-log line saying which hardware trains (seed 003: detect GPU, fall back to CPU)."""
    ranks = f"rank {ctx.rank}/{ctx.world_size}" + (f" ({ctx.backend})" if ctx.backend else "")
    if ctx.device.type == "cuda":
        props = torch.cuda.get_device_properties(ctx.device)
        stack = f"ROCm {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
        return (f"GPU: {props.name}, {props.total_memory / 1e9:.1f} GB, {torch.cuda.device_count()} visible; "
                f"torch {torch.__version__} ({stack}); {ranks}")
    return (f"no GPU visible (torch.cuda.is_available() is False): training on CPU with "
            f"{torch.get_num_threads()} threads; torch {torch.__version__}; {ranks}")


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def max_over_ranks(ctx: DistContext, value: int) -> int:
    """The largest ``value`` of any rank, on every rank: how ranks agree on whether (and on which
    signal) to stop, so all of them checkpoint at the same step boundary."""
    if not ctx.distributed:
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def all_reduce_sum(ctx: DistContext, values: list[float]) -> list[float]:
    """Element-wise sum of ``values`` over all ranks."""
    if not ctx.distributed:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def gather_to_main(ctx: DistContext, obj: Any) -> list[Any] | None:
    """Collect one picklable object per rank on rank 0 (``None`` elsewhere)."""
    if not ctx.distributed:
        return [obj]
    out: list[Any] | None = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(obj, out, dst=0)
    return out


def shutdown(ctx: DistContext, *, together: bool = False) -> None:
    """Leave the process group. ``together`` (every rank ended the same way: the stage complete, or
    a stop all ranks agreed on): meet at a barrier first, so no rank tears its connections down
    while another is still in its last collective; across nodes that aborts the late rank
    (SIGABRT, "terminate called without an active exception") and fails a finished job."""
    if ctx.distributed and dist.is_initialized():
        if together:
            dist.barrier()
        dist.destroy_process_group()

