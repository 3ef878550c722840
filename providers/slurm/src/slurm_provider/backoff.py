"""``Backoff``: the one shape of every growing wait in the provider (base, factor, cap, jitter).

A wait that grows (the poll interval while nothing changes, the tries while the login node does not
answer, Slurm's "not now", a lookup retried) is a value of this type; the numbers of each schedule
live in :mod:`slurm_provider.timing`. The delays are pure functions of the attempt (or of the wait
before) and of a random draw the caller may pass, so a schedule is tested without sleeping and
without chance.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

Draw = Callable[[float, float], float]
"""A uniform draw in ``[low, high]`` (``random.uniform``, or a seeded ``random.Random(n).uniform``)."""

NO_JITTER = (1.0, 1.0)
"""Every delay exactly as scheduled."""


def spread(fraction: float) -> tuple[float, float]:
    """Jitter of ``fraction`` either side of the scheduled delay (0.1: 90 % to 110 %)."""
    return (1.0 - fraction, 1.0 + fraction)


@dataclass(frozen=True)
class Backoff:
    """Delays growing from ``base`` by ``factor`` per attempt up to ``cap``, each drawn at random
    within ``jitter`` (fractions of the scheduled delay) so that many waiters do not knock at once."""

    base: float
    """Seconds of the first delay (attempt 0)."""
    factor: float = 2.0
    """Growth per attempt (1: a constant delay)."""
    cap: float = math.inf
    """The longest scheduled delay; jitter above 1 may exceed it by its fraction."""
    jitter: tuple[float, float] = NO_JITTER
    """``(low, high)``: a delay is the scheduled one times a uniform draw in that range."""

    def __post_init__(self) -> None:
        low, high = self.jitter
        if self.base < 0 or self.factor < 1 or self.cap < 0 or not 0 <= low <= high:
            raise ValueError(f"not a back-off: base {self.base} (>= 0), factor {self.factor} (>= 1), "
                             f"cap {self.cap} (>= 0), jitter {self.jitter} (0 <= low <= high)")

    def scheduled(self, attempt: int) -> float:
        """The delay before try ``attempt + 1`` without jitter: ``base * factor ** attempt``, capped.
        An outage of days is thousands of attempts: a growth past any float is the cap."""
        if self.base == 0 or self.factor == 1:
            return min(self.cap, self.base)
        try:
            grown = self.base * self.factor ** max(0, attempt)
        except OverflowError:
            grown = math.inf
        return min(self.cap, grown)

    def delay(self, attempt: int, draw: Draw = random.uniform) -> float:
        """The delay before try ``attempt + 1``, jittered."""
        return self.jittered(self.scheduled(attempt), draw)

    def after(self, current: float) -> float:
        """The delay that follows ``current`` without jitter: ``factor`` times it, at least ``base``,
        capped (for a wait whose last value, not a count of tries, is what the caller keeps)."""
        return min(self.cap, max(self.base, current * self.factor))

    def jittered(self, seconds: float, draw: Draw = random.uniform) -> float:
        """``seconds`` times a draw within ``jitter``."""
        low, high = self.jitter
        return seconds * draw(low, high) if low != high else seconds * low

    def capped_at(self, most: float) -> Backoff:
        """The same schedule, never longer than ``most`` (a caller's own limit)."""
        return replace(self, cap=min(self.cap, most))
