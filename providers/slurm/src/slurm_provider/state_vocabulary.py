"""Slurm job states: the one place that decides what they mean (pending reasons:
:mod:`slurm_provider.pending_reasons`).

Everything here is pure. The hook reports raw text from ``squeue``/``sacct``/``scontrol``;
this module turns it into a :class:`SlurmState` and a :class:`StateCategory`.

State codes follow Slurm 22.05 (``squeue(1)`` and ``sacct(1)``, section JOB STATE CODES).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum



class StateCategory(str, Enum):
    """What a state means for the task that watches the job."""

    WAITING = "waiting"
    """Not finished: queued, starting, running, requeued, suspended, completing."""
    SUCCESS = "success"
    """Finished and every process exited 0."""
    INTERRUPTED = "interrupted"
    """Ended by the system, not by the job's code: a resubmission can succeed (resume from checkpoint)."""
    FAILED = "failed"
    """Ended for a reason a plain resubmission will not fix (non-zero exit, cancelled, out of memory)."""
    UNKNOWN = "unknown"
    """Slurm does not know the job (yet or any more), or printed a state we cannot read. Never success."""


class SlurmState(str, Enum):
    """Every Slurm 22.05 job state, plus ``UNKNOWN`` for "not found" or unreadable text."""

    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    RESIZING = "RESIZING"
    REVOKED = "REVOKED"
    SIGNALING = "SIGNALING"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STAGE_OUT = "STAGE_OUT"
    STOPPED = "STOPPED"
    SUSPENDED = "SUSPENDED"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    UNKNOWN = "UNKNOWN"

    @property
    def short_code(self) -> str:
        """The compact code ``squeue -t``/``%t`` prints (``PD``, ``R``, ...); ``?`` for UNKNOWN."""
        return _SHORT_CODE_OF[self]

    @property
    def category(self) -> StateCategory:
        return _CATEGORY_OF[self]

    @property
    def is_terminal(self) -> bool:
        """True when the job will not change state by itself any more."""
        return self.category in (StateCategory.SUCCESS, StateCategory.INTERRUPTED, StateCategory.FAILED)

    @property
    def is_success(self) -> bool:
        return self is SlurmState.COMPLETED

    @property
    def is_retryable(self) -> bool:
        """True for system interruptions where resubmitting (and resuming from checkpoint) makes sense."""
        return self.category is StateCategory.INTERRUPTED

    @property
    def has_started(self) -> bool:
        """True once the job holds (or held) an allocation; False while it only waits in the queue."""
        return self not in (
            SlurmState.PENDING,
            SlurmState.REQUEUED,
            SlurmState.REQUEUE_HOLD,
            SlurmState.REQUEUE_FED,
            SlurmState.RESV_DEL_HOLD,
            SlurmState.UNKNOWN,
        )

    @property
    def keeps_place_in_queue(self) -> bool:
        """True while Slurm keeps the job in its queue: every waiting state, and ``SPECIAL_EXIT``, whose
        job is held there for a person. A watcher that gives up on such a job leaves it behind."""
        return self.category is StateCategory.WAITING or self is SlurmState.SPECIAL_EXIT

    @property
    def description(self) -> str:
        """One sentence for people (UI, failure messages)."""
        return _DESCRIPTION_OF[self]


_W, _S, _I, _F, _U = (
    StateCategory.WAITING,
    StateCategory.SUCCESS,
    StateCategory.INTERRUPTED,
    StateCategory.FAILED,
    StateCategory.UNKNOWN,
)

# state: (short code, category, description)
_STATE_TABLE: dict[SlurmState, tuple[str, StateCategory, str]] = {
    SlurmState.PENDING: ("PD", _W, "Waiting in the queue for resources to be allocated."),
    SlurmState.CONFIGURING: ("CF", _W, "Resources are allocated and being prepared (e.g. nodes booting)."),
    SlurmState.RUNNING: ("R", _W, "Running."),
    SlurmState.COMPLETING: ("CG", _W, "Finishing: Slurm is cleaning up processes on the nodes."),
    SlurmState.COMPLETED: ("CD", _S, "Finished; every process exited with code 0."),
    SlurmState.FAILED: ("F", _F, "Finished with a non-zero exit code or another failure in the job itself."),
    SlurmState.TIMEOUT: (
        "TO",
        _I,
        "Stopped by Slurm at its time limit; resubmitting resumes from the latest checkpoint.",
    ),
    SlurmState.CANCELLED: ("CA", _F, "Cancelled by a user or an administrator."),
    SlurmState.NODE_FAIL: (
        "NF",
        _I,
        "Stopped because a node it ran on failed; resubmitting usually works.",
    ),
    SlurmState.PREEMPTED: (
        "PR",
        _I,
        "Stopped to make room for a higher-priority job and not requeued; resubmitting usually works.",
    ),
    SlurmState.OUT_OF_MEMORY: (
        "OOM",
        _F,
        "Killed because it used more host memory (RAM) than it requested with --mem.",
    ),
    SlurmState.BOOT_FAIL: (
        "BF",
        _I,
        "Could not start because a node failed to boot; resubmitting usually works.",
    ),
    SlurmState.DEADLINE: ("DL", _F, "Stopped because its --deadline passed."),
    SlurmState.REQUEUED: ("RQ", _W, "Put back in the queue; it will start again (and should resume)."),
    SlurmState.REQUEUE_HOLD: (
        "RH",
        _W,
        "Put back in the queue and held; it waits until someone runs 'scontrol release'.",
    ),
    SlurmState.REQUEUE_FED: ("RF", _W, "Being requeued by a federation of clusters."),
    SlurmState.RESIZING: ("RS", _W, "Running; its allocation is about to change size."),
    SlurmState.REVOKED: (
        "RV",
        _F,
        "Removed from this cluster because another cluster of the federation started it.",
    ),
    SlurmState.SIGNALING: ("SI", _W, "Running; Slurm is delivering a signal to it."),
    SlurmState.SPECIAL_EXIT: (
        "SE",
        _F,
        "Ended with an exit value the site treats specially and was held; it needs a person to look at it.",
    ),
    SlurmState.STAGE_OUT: ("SO", _W, "Finished computing; staging files out (burst buffer)."),
    SlurmState.STOPPED: ("ST", _W, "Stopped with SIGSTOP but still holds its CPUs."),
    SlurmState.SUSPENDED: ("S", _W, "Suspended; its CPUs were given to other jobs for now."),
    SlurmState.RESV_DEL_HOLD: (
        "RD",
        _W,
        "Held because the reservation it asked for was deleted; it waits until released.",
    ),
    SlurmState.UNKNOWN: ("?", _U, "Slurm does not report this job (not found, purged, or unreadable state)."),
}

_SHORT_CODE_OF = {state: row[0] for state, row in _STATE_TABLE.items()}
_CATEGORY_OF = {state: row[1] for state, row in _STATE_TABLE.items()}
_DESCRIPTION_OF = {state: row[2] for state, row in _STATE_TABLE.items()}
_BY_SHORT_CODE = {code: state for state, code in _SHORT_CODE_OF.items() if state is not SlurmState.UNKNOWN}
# Spellings seen in the wild that are not the canonical names.
_ALIASES = {
    "CANCELED": SlurmState.CANCELLED,
    "OOM": SlurmState.OUT_OF_MEMORY,
    "NOT_FOUND": SlurmState.UNKNOWN,
}

_STATE_TEXT = re.compile(r"^\s*(?P<word>[A-Za-z_?]+)\+?(?:\s+by\s+(?P<by>\S+))?")


@dataclass(frozen=True)
class ParsedState:
    """A state word as Slurm printed it, taken apart."""

    state: SlurmState
    cancelled_by: str | None
    """The uid (sacct: ``CANCELLED by 1001``) or user name that cancelled the job, if shown."""
    raw: str


def parse_state_text(text: str | None) -> ParsedState:
    """Read any spelling Slurm uses for a job state.

    Accepts long names (``COMPLETED``), compact codes (``CD``), any case, the ``+`` that
    sacct appends when a state was truncated, and ``CANCELLED by 1234``. Empty text or a
    word we do not know gives ``UNKNOWN`` (which is never success).
    """
    raw = (text or "").strip()
    match = _STATE_TEXT.match(raw)
    if not match:
        return ParsedState(SlurmState.UNKNOWN, None, raw)
    word = match.group("word").upper()
    state = _lookup(word)
    cancelled_by = match.group("by") if state is SlurmState.CANCELLED else None
    return ParsedState(state, cancelled_by, raw)


def parse_state(text: str | SlurmState | None) -> SlurmState:
    """Like :func:`parse_state_text` but returns only the state."""
    if isinstance(text, SlurmState):
        return text
    return parse_state_text(text).state


def _lookup(word: str) -> SlurmState:
    if word in SlurmState.__members__:
        return SlurmState[word]
    if word in _ALIASES:
        return _ALIASES[word]
    return _BY_SHORT_CODE.get(word, SlurmState.UNKNOWN)


def category(state: str | SlurmState | None) -> StateCategory:
    return parse_state(state).category


def is_terminal(state: str | SlurmState | None) -> bool:
    return parse_state(state).is_terminal


def is_success(state: str | SlurmState | None) -> bool:
    return parse_state(state).is_success


def is_retryable(state: str | SlurmState | None) -> bool:
    return parse_state(state).is_retryable
