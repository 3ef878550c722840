"""DataLoader worker processes that survive the stop signals meant for the training process.

Slurm signals every process of a job step (``timeout``, ``scancel`` and walltime TERM reach the
whole process group too), so with ``num_workers > 0`` the workers receive the pre-timeout USR2 or
TERM as well. Their default action is to die, and the training process then fails fetching its
next batch - or anywhere, from torch's SIGCHLD check - before it reaches the step boundary where
it would checkpoint: the signal that was supposed to save the run loses it.

So workers ignore the stop signals. They are started with the signals blocked (the mask is
inherited through fork and exec, which closes the window before a spawned worker has imported
torch), ignore them on start-up, and are shut down explicitly when iteration ends, because the
usual way of stopping a worker is a SIGTERM that they no longer obey.

Python's multiprocessing starts its resource tracker on the first queue a spawn (or forkserver)
DataLoader creates, and unblocks SIGINT and SIGTERM once the tracker runs: inside the first
iterator's blocked window that would let the first epoch's workers start with SIGTERM deliverable
and default, so :func:`shielded_batches` starts the tracker before it blocks anything.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import multiprocessing
import os
import signal
import sys
from multiprocessing import resource_tracker
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader

from vcloud.training.signals import STOP_SIGNALS


PR_SET_PDEATHSIG = 1
ORPHANED_EXIT_CODE = 1
"""Exit status of a worker that found its training process gone before it started working."""


def ignore_stop_signals(worker_id: int, *, then: Callable[[int], None] | None = None,
                        parent: int | None = None) -> None:
    """``worker_init_fn``: die with the training process ``parent``, ignore USR2/TERM in this
    worker, then run the original init (``then``)."""
    if parent is not None:
        die_with_parent(parent)
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # a pending signal is now discarded
    if then is not None:
        then(worker_id)


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent exits; exit now if ``parent`` is gone."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # it died before the request above could cover it
        os._exit(ORPHANED_EXIT_CODE)


def shield_loader_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """DataLoader keyword arguments with :func:`ignore_stop_signals` chained before the worker init.

    Workers are not persistent: each epoch's iterator starts and shuts down its own, so that
    :func:`shielded_batches` can stop them and their seeds follow the per-epoch generator."""
    if kwargs.get("num_workers", 0) == 0:
        return kwargs
    context = kwargs.get("multiprocessing_context")
    method = context if isinstance(context, str) else (
        context.get_start_method() if context is not None else multiprocessing.get_start_method())
    parent = os.getpid() if method in ("spawn", "fork") else None  # forkserver: the server is the parent
    return {**kwargs, "persistent_workers": False,
            "worker_init_fn": functools.partial(ignore_stop_signals, then=kwargs.get("worker_init_fn"),
                                                parent=parent)}


@contextlib.contextmanager
def shielded_batches(loader: DataLoader) -> Iterator[Iterator[Any]]:
    """``with shielded_batches(loader) as batches: for batch in batches: ...``

    Workers start with the stop signals blocked and are shut down when the block exits, also on
    an early return (a stop at a step boundary) or an exception."""
    if loader.num_workers > 0:
        resource_tracker.ensure_running()  # it would unblock SIGTERM in the window below
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        batches = iter(loader)  # workers are created here and inherit the blocked mask
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    try:
        yield batches
    finally:
        shutdown = getattr(batches, "_shutdown_workers", None)  # multi-process iterators only
        if shutdown is not None:
            shutdown()
