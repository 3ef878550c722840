"""Why a job waits, in a few words, and when Slurm expects it to start. Pure.

A task log line and a row of a jobs view have room for a phrase, not for the sentence
:func:`~slurm_provider.pending_reasons.classify_pending_reason` explains a reason with (that one goes
into failure messages). Both come from the same batched ``squeue`` the poller makes: the reason
(``%r``) and, for a pending job, Slurm's estimated start (``%S``, the backfill scheduler's estimate,
or the ``--begin`` time), so saying why a job waits costs no extra scheduler call.
"""

from __future__ import annotations

from slurm_provider.cli.values import slurm_minutes
from slurm_provider.pending_reasons import ReasonKind, classify_pending_reason, split_reason

REASON_WORDS: dict[str, str] = {
    "None": "waiting to be scheduled",
    "WaitingForScheduling": "waiting to be scheduled",
    "Priority": "waiting for higher-priority jobs",
    "Resources": "waiting for free nodes",
    "BeginTime": "waiting for its start time (--begin)",
    "Dependency": "waiting for the jobs it depends on",
    "DependencyNeverSatisfied": "never starts: a job it depends on failed or was cancelled",
    "JobHeldUser": "on user hold until released ('scontrol release <job id>')",
    "JobHeldAdmin": "held by an administrator",
    "JobHoldMaxRequeue": "held after too many requeues",
    "launch failed requeued held": "never starts: held after a failed launch",
    "ReqNodeNotAvail": "waiting for nodes that are unavailable (down, drained or reserved)",
    "Reservation": "waiting for its reservation to begin",
    "Licenses": "waiting for a license",
    "NodeDown": "waiting for a node that is down",
    "PartitionDown": "waiting: the partition is down",
    "PartitionInactive": "waiting: the partition is inactive",
    "PartitionTimeLimit": "never starts: its --time is above the partition's limit",
    "PartitionNodeLimit": "never starts: its node count does not fit the partition",
    "PartitionConfig": "never starts: the request does not fit the partition",
    "InvalidAccount": "never starts: the account is invalid",
    "InvalidQOS": "never starts: the QOS is invalid",
    "BadConstraints": "never starts: no node matches the request",
    "JobArrayTaskLimit": "waiting for other elements of its array to end",
    "Cleaning": "waiting while its previous run is cleaned up",
    "Prolog": "starting: the site's prolog runs",
    "SchedDefer": "waiting: scheduling deferred",
    "AssocGrpBillingMinutes": "waiting for the project's GPU-hour allocation",
    "AssocGrpGRES": "waiting: the project's GPUs in use are at its limit",
    "AssocGrpCpuLimit": "waiting: the project's CPUs in use are at its limit",
    "AssocGrpJobsLimit": "waiting: the project's running jobs are at its limit",
    "AssocMaxJobsLimit": "waiting: your running jobs are at the account's limit",
    "QOSMaxGRESPerUser": "waiting: your GPUs in use are at the QOS per-user limit",
    "QOSMaxJobsPerUserLimit": "waiting: your running jobs are at the QOS per-user limit",
    "QOSMaxSubmitJobPerUserLimit": "waiting: your submitted jobs are at the QOS per-user limit",
    "QOSGrpGRES": "waiting: the QOS's GPUs in use are at its limit",
}
"""Slurm's reason code -> a phrase for a log line or a table cell (the common codes; others are
phrased by how hopeful they are, see :data:`KIND_WORDS`)."""

KIND_WORDS: dict[ReasonKind, str] = {
    ReasonKind.WAITING: "waiting",
    ReasonKind.LIMIT: "waiting for a usage limit",
    ReasonKind.HELD: "held",
    ReasonKind.ALLOCATION: "waiting for the account's allocation",
    ReasonKind.NEVER: "never starts as submitted",
}


def reason_words(reason: str | None) -> str:
    """``Priority`` -> "waiting for higher-priority jobs"; an unlisted code gets its kind's phrase
    with the code (``AssocGrpMemLimit`` -> "waiting for a usage limit (AssocGrpMemLimit)")."""
    code, _ = split_reason(reason)
    if code in REASON_WORDS:
        return REASON_WORDS[code]
    kind = classify_pending_reason(reason).kind
    return f"{KIND_WORDS[kind]} ({code})"


def expected_start_words(expected_start: str | None) -> str | None:
    """Slurm's ``2026-11-27T14:05:00`` as "expected to start 2026-11-27 14:05"; None without one."""
    shown = slurm_minutes(expected_start)
    return f"expected to start {shown}" if shown else None


def waiting_line(reason: str | None, expected_start: str | None, maintenance: str | None = None) -> str:
    """What a pending job waits for and when it may start, in one phrase with Slurm's own code:
    "waiting for free nodes (Resources); expected to start 2026-11-27 14:05". ``maintenance``: the
    window it waits out (:func:`slurm_provider.watch.maintenance.maintenance_words`), said after the reason."""
    code, detail = split_reason(reason)
    words = reason_words(reason)
    if f"({code})" in words or code == "None":
        said = words
    else:
        said = f"{words} ({code}{', ' + detail if detail else ''})"
    if maintenance:
        said = f"{said}; {maintenance}"
    start = expected_start_words(expected_start)
    return f"{said}; {start}" if start else said
