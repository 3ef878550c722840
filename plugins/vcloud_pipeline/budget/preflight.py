"""Checks before any long job: Slurm accepts it, the image exists, the budget holds.

Each check is cheap next to what it prevents: a job that sits in the queue for a day and then
dies at its first line, or a 3-day job the allocation cannot pay for. The import check in the
job environment is a real (short) job on the debug partition, submitted by the DAG like every
other job; this module holds the checks that need only the login node.

The ledger is this project's jobs as ``sacct`` knows them (found by the JSON comment every job
of the pipeline carries), billed by :mod:`vcloud_pipeline.budget.billing`: spent hours of finished and
running jobs, plus the worst case still ahead of jobs that are queued or running. The allocation
the budget is checked against is read where the profile says (:func:`read_allocation`): the site's
own command (LUMI's ``lumi-allocations``), the account's ``GrpTRESMins`` limit in Slurm (one
``sshare``: limit, usage of every job of the account, what running jobs hold), or the profile's
``billing.allocation`` against the ledger, also where the other two give no answer.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from slurm_provider import JobStatus, SlurmCommandFailed, SlurmVerbs
from slurm_provider.cli.sbatch import parse_job_comment
from slurm_provider.cli.values import expand_hostlist

from vcloud_pipeline.budget.billing import (
    COMMAND,
    SLURM,
    Allocation,
    LedgerSummary,
    Usage,
    WorstCase,
    billed_hours,
    check_budget,
    more_allocation,
    slurm_minutes_from_units,
    summarize_ledger,
)
from vcloud_pipeline.budget import ledger_cache
from vcloud_pipeline.budget.pacing import WINDOW_DAYS, Pace, pace_of
from vcloud_pipeline.budget.rates import JobShape
from vcloud_pipeline.budget.site_allocation import SiteOutputError, command_script, parse_site_allocation
from vcloud_pipeline.plan.jobspec import JobSpec
from vcloud_pipeline.plan.labels import JobLabel
from vcloud_pipeline.profile import ClusterProfile

log = logging.getLogger(__name__)

LEDGER_DAYS = 365
"""How far back the ledger reads sacct: allocations on LUMI run for a year."""

PROJECT_TAG = "vcloud"
"""The ``project`` of every pipeline job's comment (``PipelineJobOperator``): the ledger counts these jobs."""


class PreflightError(RuntimeError):
    """A check failed; the message says which and what to do."""


@dataclass(frozen=True)
class Ledger:
    summary: LedgerSummary
    reserved: float
    """Worst case still ahead of this project's queued and running jobs."""
    queued: float = 0.0
    """The part of ``reserved`` held by jobs that have not started (Slurm counts only running ones)."""
    queued_jobs: int = 0
    recent: float = 0.0
    """Spent by the runs that ended in the last :data:`~vcloud_pipeline.budget.pacing.WINDOW_DAYS` days
    or still run (their time so far): the burn rate's figure."""
    history_days: float = 0.0
    """Days since the oldest run of the ledger started (the burn rate of a younger project is
    measured over its own history)."""

    @property
    def used(self) -> float:
        return self.summary.total

    def lines(self) -> list[str]:
        held = [f"held by queued/running jobs: {self.reserved:.2f}"] if self.reserved else []
        return self.summary.lines() + held


def _own(status: JobStatus, account: str) -> bool:
    comment = parse_job_comment(status.comment)
    if comment is None or comment.project != PROJECT_TAG:
        return False
    return status.account in (None, "", account)


def _nodes(status: JobStatus) -> int:
    try:
        return max(1, len(expand_hostlist(status.node_list))) if status.node_list else 1
    except Exception:
        return 1


def usage_of(profile: ClusterProfile, status: JobStatus, run: str = "", label: str = "") -> Usage:
    """One job (or one run of a requeued job) as the ledger bills it: its nodes, accelerators, cores and
    memory from the TRES Slurm lists (sacct's AllocTRES once it ran, what it asks while it pends).

    The cores are Slurm's ``cpu`` count; on nodes where Slurm counts hardware threads as CPUs that is
    twice the cores, and a site that bills cores bills fewer than it reads here."""
    shape = JobShape.from_tres(status.tres, nodes=_nodes(status), gpus=status.gpus)
    return Usage(run=run, label=label, partition=status.partition or profile.default_partition,
                 nodes=shape.nodes, gpus=shape.gpus, elapsed_seconds=float(status.elapsed_s or 0),
                 job_id=status.job_id, cores=shape.cores, mem_mib=shape.mem_mib)


def _cluster_time(stamp: str | None) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(stamp) if stamp else None
    except ValueError:
        return None


def ledger_from_statuses(profile: ClusterProfile, statuses: Iterable[JobStatus],
                         now: dt.datetime | None = None) -> Ledger:
    """Bill this project's jobs (by comment and account); pure but for ``now`` (default: this host's
    local time, compared with Slurm's times, which are the cluster's local time).

    A job id may come more than once: first its current state, then each earlier run of a
    requeued job (``find_jobs(every_run=True)``). Every run is billed; only the current state
    can still hold time ahead.
    """
    now = now or dt.datetime.now()
    window_start = now - dt.timedelta(days=WINDOW_DAYS)
    rows: list[Usage] = []
    reserved = queued = recent = 0.0
    oldest: dt.datetime | None = None
    queued_jobs = 0
    seen: set[str] = set()
    for status in statuses:
        if not _own(status, profile.account):
            continue
        comment = parse_job_comment(status.comment)
        assert comment is not None
        label = comment.stage or comment.task
        row = usage_of(profile, status, comment.run, label)
        rows.append(row)
        ended, started = _cluster_time(status.end), _cluster_time(status.start)
        if started is not None and (oldest is None or started < oldest):
            oldest = started
        if (ended is None and status.state.has_started) or (ended is not None and ended >= window_start):
            recent += billed_hours(profile, row)
        current = status.job_id not in seen
        seen.add(status.job_id)
        if current and not status.is_terminal and status.time_limit_s:
            ahead = max(status.time_limit_s - (status.elapsed_s or 0), 0)
            hours = billed_hours(profile, replace(row, gpus=row.gpus or 1, elapsed_seconds=ahead))
            reserved += hours
            if not status.state.has_started:
                queued += hours
                queued_jobs += 1
    history = (now - oldest).total_seconds() / 86400 if oldest is not None else 0.0
    return Ledger(summary=summarize_ledger(profile, rows), reserved=reserved, queued=queued,
                  queued_jobs=queued_jobs, recent=recent, history_days=max(history, 0.0))


def read_ledger(hook: SlurmVerbs, profile: ClusterProfile, days: int = LEDGER_DAYS, *,
                now: float | None = None, cache_dir: str | None = None) -> Ledger:
    """This project's jobs from squeue and sacct, every run of a requeued job billed on its own; with
    the profile's ``billing.incremental_ledger`` the runs that ended are kept on this host and only
    what is new is read (:mod:`vcloud_pipeline.budget.ledger_cache`; ``cache_dir``: where, default
    ``$VCLOUD_CACHE_DIR`` or ``$AIRFLOW_HOME/cache``)."""
    query = f'"project":"{PROJECT_TAG}"'
    if not profile.billing.incremental_ledger:
        return ledger_from_statuses(profile, hook.find_jobs(comment_contains=query, since=f"now-{days}days",
                                                            every_run=True))
    now = time.time() if now is None else now
    path = ledger_cache.cache_file(profile.connection.conn_id, profile.account, cache_dir)
    kept = ledger_cache.load(path)
    plan = ledger_cache.plan_read(kept, now, days)
    found = hook.find_jobs(comment_contains=query, since=plan.since, every_run=True)
    statuses, kept = ledger_cache.merge(kept, plan, found, now, days)
    ledger_cache.save(path, kept)
    log.info("ledger: %s: %d job runs read, %d ended runs kept on this host",
             "a year of accounting read" if plan.full else f"accounting read since {plan.since}", len(found),
             len(kept.runs))
    return ledger_from_statuses(profile, statuses)


def ledger_pace(profile: ClusterProfile, ledger: Ledger, allocation: Allocation,
                now: dt.datetime | None = None) -> Pace:
    """The burn rate of this project's jobs (the ledger's recent runs) against what is left of
    ``allocation`` by the profile's ``billing.allocation_ends``."""
    return pace_of(spent=ledger.recent, history_days=ledger.history_days, left=allocation.left,
                   ends_on=profile.billing.allocation_ends, now=now or dt.datetime.now(dt.timezone.utc),
                   margin_percent=profile.billing.pace_margin_percent, unit=profile.billing.unit)


@dataclass(frozen=True)
class Budget:
    """What a run's summary and its report say of the money: the ledger, the allocation, the pace."""

    ledger: Ledger
    allocation: Allocation
    pace: Pace


def read_budget(hook: SlurmVerbs, profile: ClusterProfile) -> Budget:
    """The ledger of this project's jobs, the allocation read as the profile says, and their pace."""
    ledger = read_ledger(hook, profile)
    allocation = read_allocation(hook, profile, ledger)
    return Budget(ledger, allocation, ledger_pace(profile, ledger, allocation))


def read_allocation(hook: SlurmVerbs, profile: ClusterProfile, ledger: Ledger) -> Allocation:
    """The allocation from where the profile says it is read (``billing.allocation_source``).

    ``slurm``: the account's ``GrpTRESMins`` on ``billing.slurm_tres`` (one ``sshare``). ``command``: the
    site's own command (``billing.allocation_command``, e.g. LUMI's ``lumi-allocations``), parsed. Where
    either gives no answer (the command fails, sshare lists no limit), the profile's
    ``billing.allocation`` against the ledger is used and the note says why; ``profile`` uses that
    directly. :attr:`Allocation.source` says which was used.
    """
    source = profile.billing.source
    if source == SLURM:
        found, note = _from_slurm(hook, profile, ledger)
    elif source == COMMAND:
        found, note = _from_command(hook, profile, ledger)
    else:
        found, note = None, f"profile {profile.name} reads its allocation from the profile (billing.allocation_source)"
        if profile.billing.allocation_source is None:
            note = f"profile {profile.name} does not read Slurm's limit (billing.slurm_tres: none)"
    if found is not None:
        return found
    return Allocation.from_profile(profile, used=ledger.used, held=ledger.reserved, note=note)


def _from_slurm(hook: SlurmVerbs, profile: ClusterProfile, ledger: Ledger) -> tuple[Allocation | None, str]:
    tres = profile.billing.slurm_tres
    assert tres is not None  # the profile's validation: source slurm needs slurm_tres
    try:
        figures = hook.account_tres(profile.account, tres)
    except SlurmCommandFailed as exc:
        return None, f"sshare gave no answer ({exc})"
    if figures is None:
        return None, f"sshare lists no association for account {profile.account}"
    if figures.limit is None:
        return None, f"account {profile.account} has no GrpTRESMins limit on {tres} in Slurm"
    return Allocation.from_slurm(profile, account=profile.account, limit_minutes=figures.limit,
                                 used_minutes=figures.used, running_minutes=figures.running,
                                 queued=ledger.queued, queued_jobs=ledger.queued_jobs), ""


def _from_command(hook: SlurmVerbs, profile: ClusterProfile, ledger: Ledger) -> tuple[Allocation | None, str]:
    command = profile.billing.allocation_command
    assert command is not None  # the profile's validation: source command needs allocation_command
    result = hook.run_script(command_script(command), verb="allocation")
    if not result.ok:
        said = (result.stderr or result.stdout).strip().splitlines()
        return None, (f"`{command.run}` failed with exit status {result.exit_status}"
                      + (f" ({said[-1]})" if said else ""))
    try:
        site = parse_site_allocation(command, result.stdout, profile.account)
    except SiteOutputError as exc:
        return None, f"`{command.run}` printed what the {command.format} parser cannot read: {exc}"
    return Allocation.from_command(profile, site, held=ledger.reserved), ""


def check_jobs_budget(profile: ClusterProfile, specs: Mapping[JobLabel, JobSpec],
                      allocation: Allocation) -> dict[JobLabel, WorstCase]:
    """Each job's worst case must fit in what the usage leaves; so must all of them together (what
    running and queued jobs hold is theirs only until they end: the run's jobs wait for it)."""
    worst = {label: check_budget(profile, spec, allocation) for label, spec in specs.items()}
    total = sum(w.amount for w in worst.values())
    remaining = allocation.remaining
    if remaining is not None and total > remaining:
        detail = ", ".join(f"{label} {w.amount:.1f} ({w.describe()})" for label, w in worst.items())
        in_slurm = ""
        if allocation.slurm:
            minutes = slurm_minutes_from_units(profile.billing, total)
            in_slurm = f" = {minutes:g} {allocation.slurm['tres']}-minutes"
        raise PreflightError(
            f"the run's jobs need up to {total:.1f} {profile.billing.unit} together{in_slurm} ({detail}); "
            f"{allocation.headroom()}: {allocation.figures()}; no running job's end can free that. "
            f"Run fewer stages or shorten time_limit; or {more_allocation(profile, allocation)}"
        )
    return worst


def test_only(hook: SlurmVerbs, job_name: str, script: str, *, output: str) -> str:
    """``sbatch --test-only`` of the rendered script: Slurm's own verdict on the request."""
    try:
        result = hook.test_only(script, job_name=job_name, output=output)
    except Exception as exc:  # SbatchRefused, validation: Slurm's text is the useful part
        directives = " ".join(line.split(None, 1)[1] for line in script.splitlines()
                              if line.startswith("#SBATCH ") and " " in line)
        raise PreflightError(f"sbatch --test-only refused {job_name} ({directives}): {exc}") from exc
    return (f"{job_name}: Slurm would start it at {result.start} on {result.nodes} "
            f"in partition {result.partition}")


def check_image(hook: SlurmVerbs, profile: ClusterProfile) -> str | None:
    """The container image must be readable on the login node (profiles with a container).

    A Charliecloud image is a directory, and ``ch-run`` must be installed: both missing is what a
    local cluster without ``make image`` looks like. Whether the image holds what the jobs import is
    the preflight import job's question, answered inside the container.
    """
    if profile.container is None:
        return None
    image = profile.container.image
    if profile.container.runtime == "charliecloud":
        if not hook.command_exists("ch-run"):
            raise PreflightError(f"ch-run (Charliecloud) is not installed on the login node of profile "
                                 f"{profile.name}; install charliecloud-runtime (make image does)")
        if not hook.readable(image, directory=True):
            raise PreflightError(f"Charliecloud image directory {image} of profile {profile.name} is missing or "
                                 "unreadable on the login node; build it with `make image` "
                                 "(include/local_cluster/build_image.sh) or fix container.image")
        return image
    if not hook.readable(image):
        raise PreflightError(f"container image {image} of profile {profile.name} is missing or unreadable on "
                             "the login node; fix container.image (images move when CSC updates them)")
    return image
