"""Stopping cleanly before Slurm kills the job, then asking Slurm to requeue it.

Slurm sends a signal some minutes before the walltime when asked to (``#SBATCH
--signal=USR2@300``) and SIGTERM on cancel, preemption or walltime (followed by SIGKILL after
``KillWait``). The handler only records which signal arrived: checkpointing from inside a signal
handler would interrupt a half-finished optimizer step or a collective and save inconsistent
state. The loop polls :attr:`StopRequest.requested` at each step boundary, checkpoints, and then
:func:`request_requeue` asks Slurm to put the job back in the queue; the process exits with
:data:`vcloud.exitcodes.REQUEUE` either way so the orchestrator knows the stage is resumable.

Requeueing is only requested after USR2 (the pre-timeout warning we asked for): SIGTERM is also
what ``scancel`` sends, and requeueing a job its owner just cancelled would be wrong. Preempted
jobs submitted with ``--requeue`` are requeued by Slurm itself.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)
"""Signals that mean "checkpoint at the next step boundary and exit"."""

REQUEUE_SIGNALS = frozenset({signal.SIGUSR2})
"""Signals after which a requeue is requested (see module docstring for why not SIGTERM)."""

_TRUE = {"1", "true", "yes", "on"}


class StopRequest:
    """A flag set from a signal handler and read by the training loop at step boundaries."""

    def __init__(self) -> None:
        self.signal_number: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signal_number is not None

    def handle(self, signum: int, frame: FrameType | None = None) -> None:
        """Signal handler: record the first signal and return immediately."""
        if self.signal_number is None:
            self.signal_number = signum


    def restore_handlers(self) -> None:
        """Put back the handlers that were installed before :func:`install_stop_handlers`."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()


def install_stop_handlers(signals: Iterable[int] = STOP_SIGNALS) -> StopRequest:
    """Route ``signals`` to a new :class:`StopRequest`. Call once, early, in the main thread."""
    stop = StopRequest()
    for signum in signals:
        stop._previous[signum] = signal.signal(signum, stop.handle)
    return stop


@dataclass(frozen=True)
class RequeuePolicy:
    """Whether and for which Slurm job a requeue may be requested."""

    job_id: str | None
    """``SLURM_JOB_ID`` of the running job, ``None`` outside Slurm."""
    allowed: bool
    """From ``--requeue``/``--no-requeue`` or env ``SLURM_REQUEUE`` (1/true/yes); off by default so
    an orchestrator that resubmits jobs itself is not raced by Slurm requeueing them too."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, flag: bool | None = None) -> "RequeuePolicy":
        env = os.environ if env is None else env
        job_id = env.get("SLURM_JOB_ID") or None
        allowed = flag if flag is not None else env.get("SLURM_REQUEUE", "").strip().lower() in _TRUE
        return cls(job_id=job_id, allowed=allowed)


Runner = Callable[..., subprocess.CompletedProcess]


def request_requeue(policy: RequeuePolicy, signal_number: int | None, run: Runner = subprocess.run) -> bool:
    """Run ``scontrol requeue $SLURM_JOB_ID`` when policy and signal allow it; never raises.

    Returns True when Slurm accepted the request. Every other outcome is logged with what to do,
    and the caller still exits with the requeue code: the checkpoint is on disk either way.
    """
    name = signal.Signals(signal_number).name if signal_number else "no signal"
    if signal_number not in REQUEUE_SIGNALS:
        log.info("stopped on %s: not requesting a requeue (%s may be a cancel); resubmit to resume", name, name)
        return False
    if policy.job_id is None:
        log.info("stopped on %s outside a Slurm job (no SLURM_JOB_ID): rerun the same command to resume", name)
        return False
    if not policy.allowed:
        log.info("stopped on %s: requeue not enabled (pass --requeue or set SLURM_REQUEUE=1); "
                 "job %s ends and the orchestrator resubmits", name, policy.job_id)
        return False
    command = ["scontrol", "requeue", policy.job_id]
    try:
        result = run(command, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        log.warning("cannot requeue job %s: scontrol not found on PATH; resubmit to resume", policy.job_id)
        return False
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("cannot requeue job %s: %s failed (%s); resubmit to resume",
                    policy.job_id, " ".join(command), exc)
        return False
    if result.returncode != 0:
        reason = (result.stderr or result.stdout or "").strip() or "no output"
        log.warning("cannot requeue job %s: scontrol exited %d (%s); resubmit to resume",
                    policy.job_id, result.returncode, reason)
        return False
    log.info("requeue of job %s requested after %s", policy.job_id, name)
    return True
