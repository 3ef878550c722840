"""When a shared poller asks Slurm next: the regular polls, Slurm's "not now", errors and outages.

Every wait of :class:`~slurm_provider.watch.poller.JobPoller` is decided here, from what its
subscribers asked for (:class:`Asked`) and the schedules of :mod:`slurm_provider.timing`; nothing
here sleeps, reads a clock or talks to a cluster, so each schedule is tested as plain numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from slurm_provider.backoff import Backoff
from slurm_provider.timing import SLURM_ERROR_RETRY, SLURM_THROTTLE, TRANSPORT_RETRY


@dataclass(frozen=True)
class Asked:
    """What the watches subscribed to a poller allow: its shortest poll interval and the longest
    wait between polls that every one of them accepts."""

    shortest: float
    longest: float

    @classmethod
    def of(cls, intervals: Iterable[tuple[float, float]], default: float = 1.0) -> Asked:
        """From the subscribers' ``(poll_interval, max_poll_interval)``; none: ``default`` and no limit."""
        pairs = list(intervals)
        if not pairs:
            return cls(default, math.inf)
        return cls(min(p for p, _ in pairs), min(m for _, m in pairs))


@dataclass
class PollSchedule:
    """The poller's waits. ``polls`` is ``timing.POLLS`` with the poller's growth and jitter."""

    polls: Backoff
    interval: float | None = None
    """The last regular interval (None: start again from the shortest one asked for)."""
    throttle: float = 0.0
    """The least wait between polls that Slurm's "not now" answers asked for (0: none)."""

    def restart(self) -> None:
        """A new watch arrived: the next poll comes at the shortest interval asked for."""
        self.interval = None

    def next_wait(self, asked: Asked, changed: bool) -> float:
        """The wait before the next poll: from the shortest interval asked for, growing while nothing
        changed up to the longest wait allowed, never under what Slurm's refusals asked for (which
        shrinks by the growth factor per answered poll), jittered."""
        polls = replace(self.polls, base=asked.shortest, cap=asked.longest)
        self.interval = polls.base if changed or self.interval is None else polls.after(self.interval)
        wait = max(self.interval, self.throttle)
        eased = self.throttle / polls.factor
        self.throttle = eased if eased > polls.base else 0.0
        return polls.jittered(wait)

    def slow_down(self, asked: Asked) -> float:
        """Slurm asked for fewer calls (``timing.SLURM_THROTTLE``): twice the last wait (at least twice
        the current interval), never longer than the longest wait allowed. Kept as the new throttle."""
        now = self.interval or asked.shortest
        self.throttle = SLURM_THROTTLE.capped_at(asked.longest).after(max(self.throttle, now))
        return self.throttle

    @staticmethod
    def error_retry(asked: Asked, errors: int) -> float:
        """The wait after the ``errors``-th error in a row Slurm answered with (``timing.SLURM_ERROR_RETRY``):
        from the shortest poll interval, doubling, never longer than the longest wait allowed."""
        return replace(SLURM_ERROR_RETRY, base=asked.shortest).capped_at(asked.longest).delay(errors - 1)

    @staticmethod
    def transport_retry(asked: Asked, attempt: int) -> float:
        """The wait before trying a connection again (``timing.TRANSPORT_RETRY``), never longer than
        the longest wait allowed."""
        return TRANSPORT_RETRY.capped_at(asked.longest).delay(attempt)
