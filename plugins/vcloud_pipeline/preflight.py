"""Checks before any long job: Slurm accepts it, the image exists, the budget holds.

Each check is cheap next to what it prevents: a job that sits in the queue for a day and then
dies at its first line, or a 3-day job the allocation cannot pay for. The import check in the
job environment is a real (short) job on the debug partition, submitted by the DAG like every
other job; this module holds the checks that need only the login node.

The ledger is this project's jobs as ``sacct`` knows them (found by the JSON comment every job
of the pipeline carries), billed by :mod:`vcloud_pipeline.budget`: spent hours of finished and
running jobs, plus the worst case still ahead of jobs that are queued or running.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from slurm_provider.commands import PROJECT_TAG, parse_job_comment
from slurm_provider.parsers import expand_hostlist
from slurm_provider.status import JobStatus

from vcloud_pipeline.budget import LedgerSummary, Usage, WorstCase, check_budget, summarize_ledger
from vcloud_pipeline.jobspec import JobSpec
from vcloud_pipeline.profiles import ClusterProfile
from vcloud_pipeline.render import RenderedJob

LEDGER_SINCE = "now-365days"
"""How far back the ledger reads sacct: allocations on LUMI run for a year."""


class PreflightError(RuntimeError):
    """A check failed; the message says which and what to do."""


@dataclass(frozen=True)
class Ledger:
    summary: LedgerSummary
    reserved: float
    """Worst case still ahead of this project's queued and running jobs."""

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


def ledger_from_statuses(profile: ClusterProfile, statuses: Iterable[JobStatus]) -> Ledger:
    """Bill this project's jobs (by comment and account); pure.

    A job id may come more than once: first its current state, then each earlier run of a
    requeued job (``find_jobs(every_run=True)``). Every run is billed; only the current state
    can still hold time ahead.
    """
    rows: list[Usage] = []
    reserved = 0.0
    seen: set[str] = set()
    for status in statuses:
        if not _own(status, profile.account):
            continue
        comment = parse_job_comment(status.comment)
        assert comment is not None
        label = comment.stage or comment.task
        row = Usage(run=comment.run, label=label, partition=status.partition or profile.default_partition,
                    nodes=_nodes(status), gpus=status.gpus, elapsed_seconds=float(status.elapsed_s or 0),
                    job_id=status.job_id)
        rows.append(row)
        current = status.job_id not in seen
        seen.add(status.job_id)
        if current and not status.is_terminal and status.time_limit_s:
            ahead = max(status.time_limit_s - (status.elapsed_s or 0), 0)
            gpus = status.gpus or 1
            reserved += gpus * ahead / 3600 * profile.billing.factor
    return Ledger(summary=summarize_ledger(profile, rows), reserved=reserved)


def read_ledger(hook: Any, profile: ClusterProfile, since: str = LEDGER_SINCE) -> Ledger:
    """This project's jobs from squeue and sacct, every run of a requeued job billed on its own."""
    statuses = hook.find_jobs(comment_contains=f'"project":"{PROJECT_TAG}"', since=since, every_run=True)
    return ledger_from_statuses(profile, statuses)


def check_jobs_budget(profile: ClusterProfile, specs: Mapping[str, JobSpec], ledger: Ledger) -> dict[str, WorstCase]:
    """Each job's worst case must fit in what is left; so must all of them together."""
    worst = {label: check_budget(profile, spec, ledger.used, reserved=ledger.reserved)
             for label, spec in specs.items()}
    allocation = profile.billing.allocation
    total = sum(w.amount for w in worst.values())
    if allocation is not None and total > allocation - ledger.used - ledger.reserved:
        left = max(allocation - ledger.used - ledger.reserved, 0.0)
        detail = ", ".join(f"{label} {w.amount:.1f} ({w.describe()})" for label, w in worst.items())
        raise PreflightError(
            f"the run's jobs need up to {total:.1f} {profile.billing.unit} together ({detail}); "
            f"{left:.1f} of {allocation:g} left (used {ledger.used:.1f}, held {ledger.reserved:.1f}). "
            "Run fewer stages, shorten time_limit, or raise billing.allocation of profile "
            f"{profile.name} if the project got more"
        )
    return worst


def test_only(hook: Any, job: RenderedJob) -> str:
    """``sbatch --test-only`` of the rendered script: Slurm's own verdict on the request."""
    try:
        result = hook.test_only(job.outer, job_name=job.job_name, output=str(job.stdout_pattern))
    except Exception as exc:  # SbatchRefused, validation: Slurm's text is the useful part
        raise PreflightError(f"sbatch --test-only refused {job.job_name} "
                             f"({' '.join(job.sbatch_options)}): {exc}") from exc
    return (f"{job.job_name}: Slurm would start it at {result.start} on {result.nodes} "
            f"in partition {result.partition}")


def check_image(runner: Any, profile: ClusterProfile) -> str | None:
    """The container image must be readable on the login node (profiles with a container).

    A Charliecloud image is a directory, and ``ch-run`` must be installed: both missing is what a
    local cluster without ``make image`` looks like. Whether the image holds what the jobs import is
    the preflight import job's question, answered inside the container.
    """
    if profile.container is None:
        return None
    image = profile.container.image
    if profile.container.runtime == "charliecloud":
        result = runner.run("command -v ch-run", timeout=60)
        if result.exit_status != 0:
            raise PreflightError(f"ch-run (Charliecloud) is not installed on the login node of profile "
                                 f"{profile.name}; install charliecloud-runtime (make image does)")
        result = runner.run(f"test -d {shlex.quote(image)} && test -r {shlex.quote(image)}", timeout=60)
        if result.exit_status != 0:
            raise PreflightError(f"Charliecloud image directory {image} of profile {profile.name} is missing or "
                                 "unreadable on the login node; build it with `make image` "
                                 "(include/local_cluster/build_image.sh) or fix container.image")
        return image
    result = runner.run(f"test -r {shlex.quote(image)}", timeout=60)
    if result.exit_status != 0:
        raise PreflightError(f"container image {image} of profile {profile.name} is missing or unreadable on "
                             "the login node; fix container.image (images move when CSC updates them)")
    return image
