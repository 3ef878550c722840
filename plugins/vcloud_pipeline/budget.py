"""GPU-hour accounting: the worst case of a job before it is submitted, and the ledger after.

LUMI bills accelerator time, and whole nodes on full-node partitions: one wall-hour on
``standard-g`` costs all 8 GCDs whatever the job uses, and a 3-day job on 8 GCDs costs 576
GPU-hours (seed 001). The DAG checks a stage's worst case (every GPU busy until the time limit)
against what is left of the allocation before submitting, and fails with the numbers when it
does not fit.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from vcloud_pipeline.jobspec import JobKind, JobSpec, resolve_resources
from vcloud_pipeline.profiles import ClusterProfile, ProfileError

_TRES_GPU = re.compile(r"(?:^|,)gres/gpu(?::[^=,]+)?=(\d+)")


class BudgetExceeded(RuntimeError):
    """A job's worst case does not fit in what is left of the allocation."""


def _num(value: float) -> str:
    """412.5 -> '412.5', 100000.0 -> '100000': figures as people write them."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class WorstCase:
    """Billed units x time limit x billing factor, for one job."""

    label: str
    units: int
    unit_name: str
    hours: float
    factor: float
    billing_unit: str

    @property
    def amount(self) -> float:
        return self.units * self.hours * self.factor

    def describe(self) -> str:
        """``8 GCDs x 72 h x 1.0``."""
        return f"{self.units} {self.unit_name}s x {_num(self.hours)} h x {self.factor}"


def _label(spec: JobSpec) -> str:
    return f"stage {spec.stage}" if spec.kind is JobKind.TRAIN else f"{spec.kind.value} job"


def worst_case(profile: ClusterProfile, spec: JobSpec) -> WorstCase:
    """The most a job can cost: all billed accelerators busy until the time limit."""
    res = resolve_resources(profile, spec)
    return WorstCase(
        label=_label(spec),
        units=res.nodes * res.billed_gpus_per_node,
        unit_name=profile.accelerator.unit,
        hours=res.time_seconds / 3600,
        factor=profile.billing.factor,
        billing_unit=profile.billing.unit,
    )


def check_budget(profile: ClusterProfile, spec: JobSpec, used: float, *, reserved: float = 0.0) -> WorstCase:
    """Raise :class:`BudgetExceeded` unless the job's worst case fits in the allocation.

    ``used`` is what the ledger says was spent; ``reserved`` the worst case of jobs already queued
    or running that the ledger does not count yet. Profiles without an allocation always pass.
    """
    worst = worst_case(profile, spec)
    allocation = profile.billing.allocation
    if allocation is None:
        return worst
    left = allocation - used - reserved
    if worst.amount > left:
        held = f", {_num(reserved)} held by queued jobs" if reserved else ""
        raise BudgetExceeded(
            f"{worst.label} needs up to {worst.amount:.1f} {worst.billing_unit} ({worst.describe()}); "
            f"{_num(max(left, 0.0))} of {_num(allocation)} left{held}. Shorten the time limit, use "
            f"fewer {worst.unit_name}s, or raise billing.allocation of profile {profile.name} if the "
            "project got more"
        )
    return worst


# --------------------------------------------------------------------------- the ledger


class UsageRow(Protocol):
    """What the ledger needs of a finished (or running) job; ``JobStatus``-like objects fit."""

    run: str
    label: str
    """``stage1``, ``export``, ``preflight``: the job's :attr:`JobSpec.label`."""
    partition: str
    nodes: int
    gpus: int
    """Accelerators allocated to the job in total (``gres/gpu`` of sacct's AllocTRES)."""
    elapsed_seconds: float


@dataclass(frozen=True)
class Usage:
    """A plain :class:`UsageRow`."""

    run: str
    label: str
    partition: str
    nodes: int
    gpus: int
    elapsed_seconds: float
    job_id: str = ""


def gpus_from_tres(tres: str) -> int:
    """Accelerators in a TRES string such as sacct's ``billing=16,cpu=16,gres/gpu=1,node=1``."""
    return sum(int(n) for n in _TRES_GPU.findall(tres or ""))


def billed_hours(profile: ClusterProfile, row: UsageRow) -> float:
    """Billing units spent by one job: whole nodes on full-node partitions, else its accelerators."""
    try:
        full_node = profile.partition(row.partition).full_node
    except ProfileError:
        full_node = False
    units = row.nodes * profile.accelerator.per_node if full_node else row.gpus
    return units * (max(row.elapsed_seconds, 0.0) / 3600) * profile.billing.factor


@dataclass(frozen=True)
class LedgerSummary:
    """Spent billing units, in total, per run, and per (run, job label)."""

    total: float
    by_run: dict[str, float] = field(default_factory=dict)
    by_stage: dict[tuple[str, str], float] = field(default_factory=dict)
    jobs: int = 0
    allocation: float | None = None

    @property
    def left(self) -> float | None:
        return None if self.allocation is None else self.allocation - self.total

    def lines(self) -> list[str]:
        """One line per run and stage, for the task log."""
        out = [f"{run} {label}: {_num(hours)}" for (run, label), hours in sorted(self.by_stage.items())]
        tail = ""
        if self.allocation is not None:
            tail = f" of {_num(self.allocation)} ({_num(self.left or 0.0)} left)"
        return out + [f"total: {_num(self.total)}{tail} over {self.jobs} job(s)"]


def summarize_ledger(profile: ClusterProfile, rows: Iterable[UsageRow]) -> LedgerSummary:
    by_run: dict[str, float] = defaultdict(float)
    by_stage: dict[tuple[str, str], float] = defaultdict(float)
    total, jobs = 0.0, set()
    for index, row in enumerate(rows):
        hours = billed_hours(profile, row)
        by_run[row.run] += hours
        by_stage[(row.run, row.label)] += hours
        total += hours
        jobs.add(getattr(row, "job_id", "") or index)  # the runs of a requeued job are one job
    return LedgerSummary(total=total, by_run=dict(by_run), by_stage=dict(by_stage), jobs=len(jobs),
                         allocation=profile.billing.allocation)
