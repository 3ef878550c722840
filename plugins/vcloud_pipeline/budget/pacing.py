"""The allocation paced: the burn rate against the rate that spends what is left by the allocation's end.

An allocation is granted for a period. A project that spends too fast runs out before its end; one
that spends too slowly loses what it did not spend (both are lost science). :func:`pace_of` compares
what this project's jobs spent over the last days (:data:`WINDOW_DAYS`, or the project's whole
history when it is younger) with what is left spread evenly over the weeks to the end
(``billing.allocation_ends`` of the profile: Slurm holds no end date), and calls it over- or
under-spending beyond ``billing.pace_margin_percent``. Pure: the figures come in.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any, Literal

WINDOW_DAYS = 7.0
"""How far back the burn rate looks."""

MIN_HISTORY_DAYS = 1.0
"""A younger history is measured as one day: a first hour of jobs does not make a weekly rate."""

MAX_WEEKS = 52 * 100
"""What is left lasting longer than this at the measured rate has no date (a century is "never" here)."""

Verdict = Literal["over", "under", "on pace"]


@dataclass(frozen=True)
class Pace:
    """The burn rate, the planned rate and what they mean for the allocation's end."""

    unit: str
    per_week: float
    """Spent per week, at the rate of the measured days."""
    measured_days: float
    left: float | None
    ends_on: dt.date | None
    planned_per_week: float | None = None
    """What is left over the weeks to ``ends_on``: the even pace that spends it all."""
    runs_out_on: dt.date | None = None
    """When nothing is left at ``per_week`` (None: nothing is being spent, or nothing is tracked)."""
    verdict: Verdict | None = None
    margin_percent: int = 0

    @property
    def words(self) -> str:
        """One sentence for the run's report and the HPC view."""
        unit = self.unit
        said = f"{self.per_week:,.1f} {unit}/week over the last {self.measured_days:.0f} day(s)"
        if self.left is None:
            return f"spent {said}; no allocation is tracked to pace against"
        if self.ends_on is None:
            return (f"spent {said}{self._lasts()}; the allocation's end is not known (set billing.allocation_ends "
                    "in the profile to pace against it)")
        if self.planned_per_week is None:
            return f"spent {said}; the allocation ended on {self.ends_on}"
        plan = f"{self.planned_per_week:,.1f} {unit}/week would spend the {self.left:,.1f} left by {self.ends_on}"
        if self.verdict == "over":
            return (f"over-spending: {said}, while {plan}; at this rate nothing is left on {self.runs_out_on}, "
                    f"before the allocation ends")
        if self.verdict == "under":
            lost = f"; at this rate about {self._unspent():,.1f} would go unspent (lost when the allocation ends)"
            return f"under-spending: {said}, while {plan}{lost}"
        return f"on pace: {said}, and {plan} (within {self.margin_percent} %)"

    def _lasts(self) -> str:
        """How long what is left lasts at this rate, where the allocation's end is not known."""
        if self.per_week <= 0:
            return ""
        until = f"until {self.runs_out_on}" if self.runs_out_on else "beyond a century"
        return f"; at this rate what is left ({self.left:,.1f}) lasts {until}"

    def _unspent(self) -> float:
        assert self.left is not None and self.ends_on is not None
        return max(self.left - self.per_week * self._weeks_left, 0.0)

    @property
    def _weeks_left(self) -> float:
        assert self.planned_per_week is not None and self.left is not None
        return self.left / self.planned_per_week if self.planned_per_week else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"unit": self.unit, "per_week": round(self.per_week, 4), "measured_days": round(self.measured_days, 2),
                "left": None if self.left is None else round(self.left, 4),
                "ends_on": self.ends_on.isoformat() if self.ends_on else None,
                "planned_per_week": None if self.planned_per_week is None else round(self.planned_per_week, 4),
                "runs_out_on": self.runs_out_on.isoformat() if self.runs_out_on else None,
                "verdict": self.verdict, "margin_percent": self.margin_percent, "words": self.words}


def pace_of(*, spent: float, history_days: float, left: float | None, ends_on: dt.date | None,
            now: dt.datetime, margin_percent: int, unit: str) -> Pace:
    """The pace of ``spent`` units over the last ``min(history_days, WINDOW_DAYS)`` days (at least
    :data:`MIN_HISTORY_DAYS`), against ``left`` to spend by the end of ``ends_on``."""
    days = min(max(history_days, MIN_HISTORY_DAYS), WINDOW_DAYS)
    per_week = max(spent, 0.0) / days * 7
    runs_out_on = None
    if left is not None and per_week > 0 and max(left, 0.0) / per_week <= MAX_WEEKS:
        runs_out_on = (now + dt.timedelta(weeks=max(left, 0.0) / per_week)).date()
    pace = Pace(unit=unit, per_week=per_week, measured_days=days, left=left, ends_on=ends_on,
                runs_out_on=runs_out_on, margin_percent=margin_percent)
    if left is None or ends_on is None:
        return pace
    end = dt.datetime.combine(ends_on + dt.timedelta(days=1), dt.time(), now.tzinfo)
    weeks_left = (end - now).total_seconds() / (7 * 86400)
    if weeks_left <= 0:
        return pace  # the allocation has ended: nothing to pace
    planned = max(left, 0.0) / weeks_left
    margin = margin_percent / 100
    verdict: Verdict = "on pace"
    if left <= 0 or per_week > planned * (1 + margin):
        verdict = "over"
    elif per_week < planned * (1 - margin):
        verdict = "under"
    return dataclasses.replace(pace, planned_per_week=planned, verdict=verdict)
