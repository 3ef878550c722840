"""What the page shows, per cluster profile: the jobs, the budget and its charts, the training curves.

Each profile's billing unit comes from its YAML under ``include/profiles/`` (with the deployment's
``VCLOUD_PROFILE_OVERRIDES``). The allocation is the one the DAG's budget check used: Slurm's
``GrpTRESMins`` limit on the account or the site command's figures where the jobs' records carry
them, else the profile's
``billing.allocation``; the payload says which (``budget.source``, ``budget.allocation_from``).
Every figure is a record of Airflow's database; ``as_of`` says when the view was put together, and
each waiting job's row says how old its watch's last poll is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
import time
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any

from hpc_view.charts import budget_charts
from hpc_view.curves import CURVE_INTERVAL_S
from hpc_view.records import UNASSIGNED, JobRecord, budget_pace, profile_budget


@dataclass(frozen=True)
class ProfileInfo:
    """The parts of a cluster profile the view needs."""

    name: str
    allocation: float | None
    unit: str
    conn_id: str | None
    description: str = ""
    problem: str | None = None
    """Why the profile could not be loaded (then no allocation is shown)."""
    allocation_ends: date | None = None
    pace_margin_percent: int = 20


def profile_info(name: str) -> ProfileInfo:
    """Load profile ``name``; a missing or broken profile is reported, not raised."""
    if name == UNASSIGNED:
        return ProfileInfo(name, None, "GPU-hours", None, "jobs of DAG runs that name no cluster profile")
    from vcloud_pipeline.profile import ProfileError, load_profile, overrides_from_environ

    try:
        profile = load_profile(name, overrides_from_environ(name))
    except (ProfileError, ValueError) as exc:
        return ProfileInfo(name, None, "GPU-hours", None, problem=str(exc))
    return ProfileInfo(name, profile.billing.allocation, profile.billing.unit, profile.connection.conn_id,
                       profile.description, allocation_ends=profile.billing.allocation_ends,
                       pace_margin_percent=profile.billing.pace_margin_percent)


def allocation_words(meta: ProfileInfo) -> str:
    """Where the profile's own figure comes from, in the words the budget check logs."""
    if meta.allocation is None:
        return f"profile {meta.name} sets no billing.allocation" if meta.name else "no profile"
    return f"profile {meta.name} billing.allocation"


def build_view(records: Iterable[JobRecord], *, info: Callable[[str], ProfileInfo] = profile_info,
               curves: Sequence[Mapping[str, Any]] = (), now: float | None = None) -> dict[str, Any]:
    """The page's JSON: one entry per profile that has records, named profiles first, each with
    its stages' training curves (:func:`hpc_view.curves.stage_curves`); ``now`` (epoch seconds, default
    the clock) dates the watches' notes."""
    now = time.time() if now is None else now
    records = list(records)
    names = sorted({r.profile for r in records}, key=lambda n: (n == UNASSIGNED, n))
    profiles = []
    for name in names:
        meta = info(name)
        mine = [r for r in records if r.profile == name]
        budget = profile_budget(name, mine, allocation=meta.allocation, unit=meta.unit,
                                allocation_from=allocation_words(meta))
        pace = budget_pace(budget, mine, ends_on=meta.allocation_ends, margin_percent=meta.pace_margin_percent,
                           now=now)
        profiles.append({
            "profile": name,
            "title": name or "no cluster profile",
            "description": meta.description,
            "problem": meta.problem,
            "budget": {**budget.to_json(), "pace": pace.to_json()},
            "charts": budget_charts(budget),
            "jobs": [r.to_json(now) for r in mine],
            "curves": [dict(c) for c in curves if c["profile"] == name],
        })
    return {"profiles": profiles, "jobs": len(records), "curve_interval_s": CURVE_INTERVAL_S,
            "as_of": datetime.fromtimestamp(now, timezone.utc).isoformat()}
