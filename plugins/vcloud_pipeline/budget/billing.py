"""GPU-hour accounting: the worst case of a job before it is submitted, the allocation, the ledger.

A site bills what a job holds, each partition by its own rule (:mod:`vcloud_pipeline.budget.rates`,
the one place the rules are applied): on LUMI a ``standard-g`` node-hour costs 4 GPU-hours whatever
the job uses, and a GCD on ``small-g`` 0.5 or more by its cores and memory. The DAG checks a
stage's worst case (what it asks for, billed until the time limit) against what the usage leaves
of the allocation before submitting, and fails with the numbers when it does not fit. What running (and queued) jobs hold is not spent yet: they release what they do
not use as they end, so a job that fits what the usage leaves is submitted and waits for them
(Slurm pends it with ``AssocGrpBillingMinutes``; the provider's watch waits at most
``watch_deadline``), the same rule :mod:`slurm_provider.watch.allocation` applies to a pending job.

Where the allocation comes from (:class:`Allocation`, ``billing.allocation_source``): a site's own
command where Slurm's accounting is not the site's billing (LUMI's ``lumi-allocations``,
:mod:`vcloud_pipeline.budget.site_allocation`); a site that enforces it in Slurm holds it there,
as ``GrpTRESMins=<tres>=<minutes>`` on the project account, shared with every job of the account,
not only ours. Slurm starts a job only while limit - usage - what running jobs still hold covers
the job's TRES x time limit (``AccountingStorageEnforce=safe``); otherwise the job pends with
``AssocGrpBillingMinutes``. That limit, its usage and the running jobs' share are read with one
``sshare`` and win over the profile. Where neither gives an answer, the profile's
``billing.allocation`` is the limit and the ledger of this project's own jobs (``sacct``) the usage.

Slurm counts TRES-minutes; the profile counts billing units (GPU-hours). The one conversion is
:func:`units_from_slurm_minutes`: ``units = minutes / billing.slurm_minutes_per_unit``, where
``slurm_minutes_per_unit`` = 60 x the TRES weight of one accelerator / ``billing.factor``. On the
local cluster ``TRESBillingWeights=GRES/gpu=1.0``: one GPU for one hour is 60 billing-minutes, one
GPU-hour; ``GrpTRESMins=billing=60000`` is 1000 GPU-hours.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from vcloud_pipeline.budget.site_allocation import SiteAllocation
from vcloud_pipeline.budget.rates import HourlyRate, JobShape, figure, hourly_rate, partition_rate
from vcloud_pipeline.plan.jobspec import JobKind, JobSpec, resolve_resources
from vcloud_pipeline.profile import BillingSpec, ClusterProfile
from vcloud_pipeline.schema import slurm_mib



class BudgetExceeded(RuntimeError):
    """A job's worst case does not fit in what is left of the allocation."""


@dataclass(frozen=True)
class WorstCase:
    """What one job can cost at most: its partition's hourly rate for what it asks, until its time limit."""

    label: str
    rate: HourlyRate
    seconds: float
    unit_name: str
    """What one accelerator is called (``GCD``): the advice names it."""
    billing_unit: str

    @property
    def hours(self) -> float:
        return self.seconds / 3600

    @property
    def amount(self) -> float:
        return self.rate.amount(self.seconds)

    def describe(self) -> str:
        """``1 node x 4 GPU-hours/node-hour x 72 h``; by the flat rule ``8 GCDs x 72 h x 1.0``."""
        return self.rate.describe(self.seconds)


def _label(spec: JobSpec) -> str:
    return f"stage {spec.stage}" if spec.kind is JobKind.TRAIN else f"{spec.kind.value} job"


def worst_case(profile: ClusterProfile, spec: JobSpec) -> WorstCase:
    """The most a job can cost: what it asks for (nodes, accelerators, cores, memory) billed by its
    partition's rule until the time limit."""
    res = resolve_resources(profile, spec)
    mem = (slurm_mib(res.mem) or 0.0) if res.mem else 0.0
    shape = JobShape(nodes=res.nodes, gpus=res.nodes * res.gpus_per_node,
                     cores=res.nodes * res.cpus_per_task, mem_mib=res.nodes * mem)
    return WorstCase(
        label=_label(spec),
        rate=partition_rate(profile, res.partition, shape),
        seconds=res.time_seconds,
        unit_name=profile.accelerator.unit,
        billing_unit=profile.billing.unit,
    )


# --------------------------------------------------------------------------- the allocation

SLURM = "slurm"
PROFILE = "profile"
COMMAND = "command"
"""The values of :attr:`Allocation.source`: ``billing.allocation_source`` as the check used it."""


def units_from_slurm_minutes(billing: BillingSpec, minutes: float) -> float:
    """Slurm TRES-minutes of ``billing.slurm_tres`` in billing units: the only conversion (module doc)."""
    return minutes / billing.slurm_minutes_per_unit


def slurm_minutes_from_units(billing: BillingSpec, units: float) -> float:
    """Billing units in Slurm TRES-minutes of ``billing.slurm_tres`` (what Slurm will ask for a job)."""
    return units * billing.slurm_minutes_per_unit


@dataclass(frozen=True)
class Allocation:
    """The allocation, what is spent of it and what queued/running jobs still hold, in billing units,
    each figure with the words that say where it came from."""

    unit: str
    limit: float | None
    """``None``: no allocation is tracked (no Slurm limit, no ``billing.allocation``)."""
    used: float
    held: float
    source: str
    """:data:`SLURM` (the account's ``GrpTRESMins``), :data:`COMMAND` (the site's command) or
    :data:`PROFILE` (``billing.allocation``)."""
    limit_from: str
    used_from: str
    held_from: str
    note: str = ""
    """Why Slurm's figures are not used, when they are not."""
    slurm: dict[str, Any] | None = None
    """Slurm's own figures in TRES-minutes (``account``, ``tres``, ``limit``, ``used``, ``running``)."""

    @property
    def left(self) -> float | None:
        """What a new job may still spend: limit less usage and what queued/running jobs hold."""
        return None if self.limit is None else self.limit - self.used - self.held

    @property
    def remaining(self) -> float | None:
        """Limit less usage (the burn-down's figure)."""
        return None if self.limit is None else self.limit - self.used

    def headroom(self) -> str:
        """``412.5 of 100000 left by the usage`` (never below zero): what a job can ever get."""
        return f"{figure(max(self.remaining or 0.0, 0.0))} of {figure(self.limit or 0.0)} left by the usage"

    def waits_for_holders(self, amount: float) -> bool:
        """True when ``amount`` fits what the usage leaves but not what running and queued jobs leave
        now: a job of that worst case waits for them to end (Slurm: ``AssocGrpBillingMinutes``)."""
        return self.left is not None and self.remaining is not None and self.left < amount <= self.remaining

    def wait_note(self, amount: float) -> str:
        """`` [waits: ...]`` when a job of ``amount`` will wait for running jobs, else ``""``."""
        if not self.waits_for_holders(amount):
            return ""
        return (f" [running and queued jobs hold {figure(self.held)} now ({self.held_from}), so it waits until they "
                f"have released enough: {figure(max(self.left or 0.0, 0.0))} is free at the moment]")

    def figures(self) -> str:
        """``limit 1000 (Slurm association limit ...), used 2.5 (...), held 0.5 (...)``."""
        if self.limit is None:
            return f"no allocation tracked ({self.limit_from}); used {figure(self.used)} ({self.used_from})"
        return (f"limit {figure(self.limit)} ({self.limit_from}), used {figure(self.used)} ({self.used_from}), "
                f"held {figure(self.held)} ({self.held_from})")

    def describe(self) -> str:
        """One log line: every figure, its source, what is left, and why Slurm's are not used."""
        left = "" if self.left is None else f"; left {figure(self.left)}"
        note = f" [{self.note}]" if self.note else ""
        return f"{self.unit}: {self.figures()}{left}{note}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("limit", "used", "held"):
            data[key] = None if data[key] is None else round(data[key], 4)
        data["left"] = None if self.left is None else round(self.left, 4)
        data["remaining"] = None if self.remaining is None else round(self.remaining, 4)
        return data

    @classmethod
    def from_slurm(cls, profile: ClusterProfile, *, account: str, limit_minutes: int, used_minutes: int,
                   running_minutes: int, queued: float = 0.0, queued_jobs: int = 0) -> "Allocation":
        """From the account's ``GrpTRESMins`` limit, its ``GrpTRESRaw`` usage and its running jobs'
        ``TRESRunMins``; ``queued`` adds the worst case of this project's pending jobs (Slurm does not
        count pending jobs until they start)."""
        billing = profile.billing
        tres = billing.slurm_tres or "billing"
        queued_words = f" + {queued_jobs} queued job(s) of this project" if queued_jobs else ""
        return cls(
            unit=billing.unit,
            limit=units_from_slurm_minutes(billing, limit_minutes),
            used=units_from_slurm_minutes(billing, used_minutes),
            held=units_from_slurm_minutes(billing, running_minutes) + queued,
            source=SLURM,
            limit_from=f"Slurm association limit GrpTRESMins {tres}={limit_minutes} on account {account}",
            used_from=(f"Slurm GrpTRESRaw {tres}={used_minutes} of account {account}, "
                       "every job of the account"),
            held_from=(f"Slurm TRESRunMins {tres}={running_minutes} of the account's running "
                       f"jobs{queued_words}"),
            slurm={"account": account, "tres": tres, "limit": limit_minutes, "used": used_minutes,
                   "running": running_minutes, "minutes_per_unit": billing.slurm_minutes_per_unit},
        )

    @classmethod
    def from_command(cls, profile: ClusterProfile, site: SiteAllocation, *, held: float) -> "Allocation":
        """From the site's own command (``billing.allocation_command``): the project's allocation and
        usage as the site bills them, every job of the project; ``held`` is what this project's queued
        and running jobs may still spend (the site's figures are refreshed now and then, not live)."""
        command = profile.billing.allocation_command
        assert command is not None
        updated = f", data updated {site.updated}" if site.updated else ""
        return cls(
            unit=profile.billing.unit, limit=site.limit, used=site.used, held=held, source=COMMAND,
            limit_from=(f"site command `{command.run}`{updated}" if site.limit is not None
                        else f"site command `{command.run}` lists no {profile.billing.unit} allocation{updated}"),
            used_from=f"`{command.run}`: every job of the project, as the site bills it",
            held_from="this project's queued and running jobs",
        )

    @classmethod
    def from_profile(cls, profile: ClusterProfile, *, used: float, held: float,
                     note: str = "") -> "Allocation":
        """From the profile's ``billing.allocation`` and the ledger of this project's own jobs."""
        limit = profile.billing.allocation
        return cls(
            unit=profile.billing.unit, limit=limit, used=used, held=held, source=PROFILE,
            limit_from=(f"profile {profile.name} billing.allocation" if limit is not None
                        else f"profile {profile.name} sets no billing.allocation"),
            used_from="ledger: this project's jobs in sacct",
            held_from="this project's queued and running jobs", note=note,
        )


def more_allocation(profile: ClusterProfile, allocation: Allocation) -> str:
    """Where more allocation comes from, by the source the check used."""
    if allocation.source == SLURM and allocation.slurm:
        return (f"ask the project's PI or the cluster support to raise GrpTRESMins of account "
                f"{allocation.slurm['account']}")
    if allocation.source == COMMAND:
        return f"ask the project's PI to apply for more (the site's command reports the project {profile.account})"
    return f"raise billing.allocation of profile {profile.name} if the project got more"


def _advice(profile: ClusterProfile, allocation: Allocation, unit_name: str) -> str:
    return f"Shorten the time limit, use fewer {unit_name}s, or {more_allocation(profile, allocation)}"


def check_budget(profile: ClusterProfile, spec: JobSpec, allocation: Allocation) -> WorstCase:
    """Raise :class:`BudgetExceeded` unless the job's worst case fits in what the usage leaves of the
    allocation (limit less usage; see the module doc for why what running jobs hold is not counted).

    The message names the job's need, the limit, the usage and what queued/running jobs hold, each
    with its source. Without a tracked allocation every job passes.
    """
    worst = worst_case(profile, spec)
    remaining = allocation.remaining
    if remaining is None or worst.amount <= remaining:
        return worst
    in_slurm = ""
    if allocation.source == SLURM and allocation.slurm:
        minutes = slurm_minutes_from_units(profile.billing, worst.amount)
        in_slurm = f" = {minutes:g} {allocation.slurm['tres']}-minutes"
    raise BudgetExceeded(
        f"{worst.label} needs up to {worst.amount:.1f} {worst.billing_unit} ({worst.describe()}{in_slurm}); "
        f"{allocation.headroom()}: {allocation.figures()}; no running job's end can free that. "
        f"{_advice(profile, allocation, worst.unit_name)}"
    )


# --------------------------------------------------------------------------- the ledger


class UsageRow(Protocol):
    """What the ledger needs of a finished (or running) job; ``JobStatus``-like objects fit."""

    @property
    def run(self) -> str: ...

    @property
    def label(self) -> str:
        """``stage1``, ``export``, ``preflight``: the job's :attr:`JobSpec.label`."""

    @property
    def partition(self) -> str: ...

    @property
    def nodes(self) -> int: ...

    @property
    def gpus(self) -> int:
        """Accelerators allocated to the job in total (``gres/gpu`` of sacct's AllocTRES)."""

    @property
    def cores(self) -> int:
        """CPU cores allocated to the job in total (``cpu`` of AllocTRES); 0 when unknown."""

    @property
    def mem_mib(self) -> float:
        """Memory allocated to the job in total, in MiB (``mem`` of AllocTRES); 0 when unknown."""

    @property
    def elapsed_seconds(self) -> float: ...


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
    cores: int = 0
    mem_mib: float = 0.0


def billed_hours(profile: ClusterProfile, row: UsageRow) -> float:
    """Billing units spent by one job (or one run of a requeued job): its partition's hourly rate
    (:func:`~vcloud_pipeline.budget.rates.hourly_rate`) for what it held x elapsed hours, what the
    ledger, the preflight and the HPC view count."""
    shape = JobShape(nodes=row.nodes, gpus=row.gpus, cores=row.cores, mem_mib=row.mem_mib)
    return hourly_rate(profile, row.partition, shape).amount(row.elapsed_seconds)


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
        """One line per run and stage, for the task log (the allocation is :class:`Allocation`'s)."""
        out = [f"{run} {label}: {figure(hours)}" for (run, label), hours in sorted(self.by_stage.items())]
        return out + [f"total: {figure(self.total)} over {self.jobs} job(s)"]


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
