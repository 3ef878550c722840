"""DataLoader keyword arguments that are valid for every worker count.

``prefetch_factor``, ``persistent_workers`` and ``multiprocessing_context`` are only accepted by
PyTorch when ``num_workers > 0``; passing ``prefetch_factor`` with ``num_workers=0`` raises
``ValueError: prefetch_factor option could only be specified in multiprocessing`` (field notes, seed 002
issue 2). They are therefore added only for worker processes.
"""

from __future__ import annotations

import random

import numpy as np
import torch

MP_CONTEXTS: tuple[str, ...] = ("spawn", "forkserver", "fork")


def seed_worker(worker_id: int) -> None:
    """Seed numpy and ``random`` in a worker from the per-worker torch seed the DataLoader derived."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def dataloader_kwargs(batch_size: int, num_workers: int, *, shuffle: bool, seed: int,
                      prefetch_factor: int = 2, persistent_workers: bool = True, pin_memory: bool = False,
                      drop_last: bool, multiprocessing_context: str = "spawn") -> dict:
    """Keyword arguments for ``torch.utils.data.DataLoader(dataset, **kwargs)``.

    The shuffle order is a function of ``seed`` alone. Workers start with ``spawn`` by default: forking
    a process that has initialised a GPU runtime (CUDA or HIP) is unsafe.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if prefetch_factor < 1:
        raise ValueError(f"prefetch_factor must be >= 1, got {prefetch_factor}")
    if multiprocessing_context not in MP_CONTEXTS:
        raise ValueError(f"multiprocessing_context {multiprocessing_context!r} unknown "
                         f"(known: {', '.join(MP_CONTEXTS)})")
    generator = torch.Generator()
    generator.manual_seed(seed)
    kwargs: dict = {
        "batch_size": batch_size,
        "shuffle": shuffle,
        "num_workers": num_workers,
        "pin_memory": pin_memory,
        "drop_last": drop_last,
        "generator": generator,
        "worker_init_fn": seed_worker,
    }
    if num_workers > 0:
        kwargs["prefetch_factor"] = prefetch_factor
        kwargs["persistent_workers"] = persistent_workers
        kwargs["multiprocessing_context"] = multiprocessing_context
    return kwargs
