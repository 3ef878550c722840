"""Slurm's pending reasons: the one place that decides what they mean. Pure.

A pending job's reason (``squeue``'s ``%r``) becomes a :class:`PendingReason` that says, in plain
words, whether the job is merely waiting or will never start without somebody changing something,
and which allocation it waits for when it pends on one.

Reason codes follow Slurm 22.05 (``squeue(1)``, section JOB REASON CODES, and ``slurm/slurm.h``).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum

from slurm_provider.cli.values import expand_hostlist


class ReasonKind(str, Enum):
    """How hopeful a pending job's reason is."""

    WAITING = "waiting"
    """Normal queueing: it starts when resources, priority, time or dependencies allow."""
    LIMIT = "limit"
    """A concurrency limit of the user/account/QOS is reached: it starts when your other running jobs
    end. If none are running, the request itself is over the limit and it never starts."""
    HELD = "held"
    """Held: it waits until a person runs ``scontrol release``."""
    ALLOCATION = "allocation"
    """The account's TRES-minute allocation (``GrpTRESMins``) cannot pay for the job's whole time limit
    now. With ``AccountingStorageEnforce=safe`` the running jobs of the account hold what they may still
    use: if they hold what is missing, it starts as they end; if the usage alone leaves too little, it
    never starts. Which of the two holds takes the account's figures (``sshare``)."""
    NEVER = "never"
    """It will never start as submitted: a budget is used up, the request breaks a limit, or an
    account/QOS/dependency/node is invalid. Cancel, fix and resubmit."""


@dataclass(frozen=True)
class PendingReason:
    """A pending job's reason, classified and explained for people."""

    code: str
    """Slurm's reason code, e.g. ``AssocGrpBillingMinutes`` (``None`` when Slurm gave none)."""
    detail: str
    """Anything Slurm printed after the code, e.g. ``UnavailableNodes:nid[005001-005002]``."""
    kind: ReasonKind
    explanation: str

    @property
    def blocks_forever(self) -> bool:
        return self.kind is ReasonKind.NEVER

    @property
    def allocation_tres(self) -> str | None:
        """The TRES whose account allocation the job waits for (``billing`` for
        ``AssocGrpBillingMinutes``), as ``sshare`` names it; None for any other reason."""
        if self.kind is not ReasonKind.ALLOCATION:
            return None
        match = _GRP_MINUTES.match(self.code)
        return _ALLOCATION_TRES.get(match.group("what")) if match else None

    @property
    def unavailable_nodes(self) -> str | None:
        """The hostlist from ``ReqNodeNotAvail, UnavailableNodes:<hostlist>``, if present."""
        match = re.search(r"UnavailableNodes:(\S*)", self.detail)
        return match.group(1) or None if match else None


_EXACT_REASONS: dict[str, tuple[ReasonKind, str]] = {
    "None": (ReasonKind.WAITING, "No reason given: the job is running or about to be scheduled."),
    "Priority": (
        ReasonKind.WAITING,
        "Other jobs have higher priority in this partition; it starts when its turn comes.",
    ),
    "Resources": (ReasonKind.WAITING, "Waiting for enough free nodes/GPUs/memory; it is next in line."),
    "BeginTime": (
        ReasonKind.WAITING,
        "Its earliest start time has not been reached yet (also used briefly after a requeue).",
    ),
    "Dependency": (ReasonKind.WAITING, "Waiting for the jobs it depends on to finish."),
    "Prolog": (ReasonKind.WAITING, "The site's prolog script is still running; it starts in a moment."),
    "Cleaning": (ReasonKind.WAITING, "Being requeued; Slurm is still cleaning up the previous run."),
    "WaitingForScheduling": (ReasonKind.WAITING, "The scheduler has not looked at it yet."),
    "Reservation": (ReasonKind.WAITING, "Waiting for its advance reservation to begin."),
    "Licenses": (ReasonKind.WAITING, "Waiting for a license to become free."),
    "JobArrayTaskLimit": (
        ReasonKind.WAITING,
        "Array throttle (%N) reached: this element starts when another element ends.",
    ),
    "SchedDefer": (ReasonKind.WAITING, "Scheduling was deferred; it will be considered again shortly."),
    "BurstBufferResources": (ReasonKind.WAITING, "Waiting for burst-buffer space."),
    "BurstBufferStageIn": (ReasonKind.WAITING, "Staging files into the burst buffer."),
    "PartitionDown": (
        ReasonKind.WAITING,
        "The partition is down (often maintenance); it starts when administrators bring it back.",
    ),
    "PartitionInactive": (
        ReasonKind.WAITING,
        "The partition is inactive; it starts when administrators reactivate it.",
    ),
    "NodeDown": (ReasonKind.WAITING, "A node it needs is down; it starts when the node is back."),
    "FrontEndDown": (ReasonKind.WAITING, "No front-end node is available; waiting for one."),
    "ReqNodeNotAvail": (
        ReasonKind.WAITING,
        "A node it can use is unavailable right now (in use, reserved, e.g. for maintenance).",
    ),
    "AssociationJobLimit": (
        ReasonKind.LIMIT,
        "Your account's maximum number of jobs is reached; it starts when some of your jobs end.",
    ),
    "AssociationResourceLimit": (
        ReasonKind.LIMIT,
        "Your account's resource limit is reached; it starts when some of your jobs end.",
    ),
    "AssociationTimeLimit": (ReasonKind.LIMIT, "Your account's time limit is reached."),
    "QOSJobLimit": (ReasonKind.LIMIT, "The QOS job-count limit is reached; it starts when jobs end."),
    "QOSResourceLimit": (ReasonKind.LIMIT, "The QOS resource limit is reached; it starts when jobs end."),
    "QOSTimeLimit": (ReasonKind.LIMIT, "The QOS time limit is reached."),
    "JobHeldUser": (ReasonKind.HELD, "On user hold, by its owner or by the site (some hold queued jobs after a "
                                      "maintenance break); it waits until someone runs 'scontrol release <job id>'."),
    "JobHeldAdmin": (
        ReasonKind.HELD,
        "Held by an administrator; ask the cluster support why, or cancel and resubmit.",
    ),
    "JobHoldMaxRequeue": (
        ReasonKind.HELD,
        "Held after being requeued too many times; look at its log, then release or cancel it.",
    ),
    "DependencyNeverSatisfied": (
        ReasonKind.NEVER,
        "A job it depends on failed or was cancelled, so this job can never start. Cancel it.",
    ),
    "PartitionTimeLimit": (
        ReasonKind.NEVER,
        "It asks for more time than the partition allows. Lower --time or use another partition.",
    ),
    "PartitionNodeLimit": (
        ReasonKind.NEVER,
        "It asks for more (or fewer) nodes than the partition allows, or the nodes it needs are "
        "down/drained. Change the node count or partition.",
    ),
    "PartitionConfig": (
        ReasonKind.NEVER,
        "The request does not fit the partition's configuration. Check partition, GPUs and memory.",
    ),
    "InvalidAccount": (
        ReasonKind.NEVER,
        "The account is invalid or you are not a member of it. Check --account ('sacctmgr show assoc user=$USER' lists yours).",
    ),
    "InvalidQOS": (ReasonKind.NEVER, "The QOS is invalid for this account/partition. Check --qos."),
    "AccountNotAllowed": (ReasonKind.NEVER, "The account may not use this partition."),
    "QOSNotAllowed": (ReasonKind.NEVER, "The QOS may not be used in this partition."),
    "BadConstraints": (
        ReasonKind.NEVER,
        "No node matches the requested features/GPUs/memory combination. Fix the request.",
    ),
    "QOSUsageThreshold": (ReasonKind.NEVER, "The QOS usage threshold is used up."),
    "InactiveLimit": (ReasonKind.NEVER, "The job reached the system InactiveLimit."),
    "JobLaunchFailure": (
        ReasonKind.NEVER,
        "Slurm could not launch it (file system problem, bad program path, ...). Look at the log.",
    ),
    "launch failed requeued held": (
        ReasonKind.NEVER,
        "Slurm could not launch it on the node and held it. Look at the log, then cancel and resubmit.",
    ),
    "SystemFailure": (ReasonKind.NEVER, "A Slurm, file-system or network failure. Ask the cluster support."),
    "NonZeroExitCode": (ReasonKind.NEVER, "A previous run ended with a non-zero exit code and it was held."),
    "TimeLimit": (ReasonKind.NEVER, "It used up its time limit."),
    "BurstBufferOperation": (ReasonKind.NEVER, "A burst-buffer operation failed."),
}

_RESOURCE_WORDS = {
    "Cpu": "CPU",
    "CPU": "CPU",
    "Mem": "memory",
    "Memory": "memory",
    "Node": "node",
    "GRES": "GPU/GRES",
    "Billing": "billing",
    "Energy": "energy",
    "License": "license",
    "Wall": "wall-clock",
    "Jobs": "job-count",
    "SubmitJobs": "submitted-job",
    "Unknown": "resource",
}

_GRP_MINUTES = re.compile(r"^(?P<scope>Assoc|QOS)Grp(?P<what>[A-Za-z]*?)Minutes(?:Limit)?$")
_GRP_RUN_MINUTES = re.compile(r"^(?P<scope>Assoc|QOS)Grp(?P<what>[A-Za-z]*?)RunMinutes(?:Limit)?$")
_GRP_WALL = re.compile(r"^(?P<scope>Assoc|QOS)GrpWall(?:Limit)?$")
_GRP_OTHER = re.compile(r"^(?P<scope>Assoc|QOS)Grp(?P<what>[A-Za-z]+?)(?:Limit)?$")
_MAX_PER_JOB = re.compile(r"^(?P<scope>Assoc|QOS)Max(?P<what>[A-Za-z]*?)(?:Per(?:Job|Node))(?:Limit)?$")
_MAX_WALL = re.compile(r"^(?P<scope>Assoc|QOS)MaxWallDurationPerJob(?:Limit)?$")
_MAX_CONCURRENT = re.compile(
    r"^(?P<scope>Assoc|QOS)Max(?:Jobs|SubmitJobs?)(?:Per(?:User|Account))?(?:Limit)?$"
)
_MAX_PER_USER = re.compile(r"^(?P<scope>Assoc|QOS)Max(?P<what>[A-Za-z]+?)Per(?:User|Account)(?:Limit)?$")
_QOS_MIN = re.compile(r"^QOSMin(?P<what>[A-Za-z]+?)(?:NotSatisfied|Limit)?$")

_SCOPE_WORDS = {"Assoc": "your project account", "QOS": "the QOS"}

_ALLOCATION_TRES = {"Billing": "billing", "CPU": "cpu", "Cpu": "cpu", "Mem": "mem", "Node": "node",
                    "Energy": "energy"}
"""``AssocGrp<what>Minutes`` -> the TRES ``sshare`` reports it under (GRES minutes name no single TRES)."""


def _resource(what: str) -> str:
    what = what.replace("Per", "")
    return _RESOURCE_WORDS.get(what, what.lower() or "resource")


def _pattern_reason(code: str) -> tuple[ReasonKind, str] | None:
    """Classify the Assoc*/QOS* limit family, whose names are built from parts."""
    if match := _GRP_RUN_MINUTES.match(code):
        scope = _SCOPE_WORDS[match.group("scope")]
        return (
            ReasonKind.LIMIT,
            f"The running {_resource(match.group('what'))}-minutes of {scope} are at their limit; "
            "it starts as your running jobs finish.",
        )
    if match := _GRP_MINUTES.match(code):
        scope = _SCOPE_WORDS[match.group("scope")]
        what = _resource(match.group("what"))
        if match.group("scope") == "Assoc" and match.group("what") in _ALLOCATION_TRES:
            extra = (" That is the project's GPU-hour allocation." if match.group("what") == "Billing" else "")
            return (
                ReasonKind.ALLOCATION,
                f"What is left of the {what}-minutes limit of {scope} (GrpTRESMins, less the usage and what "
                f"the account's running jobs may still use) cannot pay for this job's whole time limit yet.{extra} "
                "If the running jobs hold what is missing, it starts as they end; if the usage alone leaves "
                "too little, it never starts: then shorten --time, or ask the project's PI or the cluster "
                "support to raise the limit.",
            )
        extra = (" The project's GPU-hour allocation is used up, or too little of it is left for this job."
                 if match.group("what") == "Billing" else "")
        return (
            ReasonKind.NEVER,
            f"What is left of the {what}-minutes limit of {scope} (GrpTRESMins, less what running jobs "
            f"still hold) cannot pay for this job's whole time limit, so Slurm will not start it.{extra} "
            "It starts only once the limit is raised or the usage reset; a shorter --time may fit what is "
            "left. Ask the project's PI or the cluster support.",
        )
    if match := _GRP_WALL.match(code):
        scope = _SCOPE_WORDS[match.group("scope")]
        return (ReasonKind.NEVER, f"The accumulated wall-time budget of {scope} is used up.")
    if match := _MAX_WALL.match(code):
        scope = _SCOPE_WORDS[match.group("scope")]
        return (ReasonKind.NEVER, f"Its --time is above the per-job maximum of {scope}. Lower --time.")
    if match := _MAX_CONCURRENT.match(code):
        scope = _SCOPE_WORDS[match.group("scope")]
        return (
            ReasonKind.LIMIT,
            f"The maximum number of running/submitted jobs of {scope} is reached; "
            "it starts when some of your jobs end.",
        )
    if match := _MAX_PER_USER.match(code):
        return (
            ReasonKind.LIMIT,
            f"The per-user {_resource(match.group('what'))} limit of {_SCOPE_WORDS[match.group('scope')]} "
            "is reached by your "
            "running jobs; it starts when some of them end.",
        )
    if match := _MAX_PER_JOB.match(code):
        scope = _SCOPE_WORDS[match.group("scope")]
        return (
            ReasonKind.NEVER,
            f"It asks for more {_resource(match.group('what'))} per job than {scope} allows. "
            "Request less or use another partition/QOS.",
        )
    if match := _QOS_MIN.match(code):
        return (
            ReasonKind.NEVER,
            f"It asks for less {_resource(match.group('what'))} than the QOS minimum. Request more.",
        )
    if match := _GRP_OTHER.match(code):
        scope = _SCOPE_WORDS[match.group("scope")]
        return (
            ReasonKind.LIMIT,
            f"The {_resource(match.group('what'))} limit shared by all jobs of {scope} is reached; "
            "it starts when running jobs of the group end.",
        )
    return None


# Newer Slurm prints this sentence instead of a code for ReqNodeNotAvail.
_NODES_DOWN_PREFIX = "Nodes required for job are DOWN"


def split_reason(reason: str | None) -> tuple[str, str]:
    """Split ``ReqNodeNotAvail, UnavailableNodes:nid01`` into code and detail; strip squeue's parentheses."""
    text = (reason or "").strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1].strip()
    text = text.replace(",_", ", ")  # scontrol prints spaces in Reason= as underscores
    if not text:
        return "None", ""
    if text.lower().startswith("launch failed requeued held"):
        return "launch failed requeued held", text[len("launch failed requeued held") :].strip(" ,")
    match = re.match(r"[^,\s]+", text)
    code = match.group(0) if match else text
    return code, text[len(code) :].strip(" ,")


def classify_pending_reason(
    reason: str | None,
    *,
    down_nodes: Collection[str] | None = None,
) -> PendingReason:
    """Classify a pending job's reason and explain it in plain words.

    ``down_nodes`` is the set of node names that ``sinfo`` reports down/drained/failing
    (see ``slurm_provider.cli.sinfo.build_sinfo_unavailable_nodes``). ``ReqNodeNotAvail`` is only "never"
    when it names unavailable nodes and every one of them is in that set; Slurm lists
    nodes that are merely reserved for maintenance the same way, and those come back.
    Unknown codes are treated as ordinary waiting, with Slurm's code in the explanation.
    """
    code, detail = split_reason(reason)
    if (reason or "").strip("() ").startswith(_NODES_DOWN_PREFIX):
        return PendingReason(
            "ReqNodeNotAvail",
            (reason or "").strip("() "),
            ReasonKind.WAITING,
            "The nodes it needs are down, drained or reserved for higher-priority jobs right now.",
        )
    known = _EXACT_REASONS.get(code) or _pattern_reason(code)
    if known is None:
        kind, explanation = ReasonKind.WAITING, f"Slurm reports '{code}'; treating it as ordinary queueing."
    else:
        kind, explanation = known
    result = PendingReason(code, detail, kind, explanation)
    if code == "ReqNodeNotAvail":
        result = _classify_req_node_not_avail(result, down_nodes)
    return result


def _classify_req_node_not_avail(reason: PendingReason, down_nodes: Collection[str] | None) -> PendingReason:
    listed = reason.unavailable_nodes
    if not listed:
        return reason
    nodes = expand_hostlist(listed)
    if down_nodes is not None and nodes and all(node in down_nodes for node in nodes):
        return PendingReason(
            reason.code,
            reason.detail,
            ReasonKind.NEVER,
            f"The node(s) it needs ({listed}) are down or drained; it cannot start until an "
            "administrator brings them back. Cancel it, or exclude those nodes and resubmit.",
        )
    return PendingReason(
        reason.code,
        reason.detail,
        ReasonKind.WAITING,
        f"Some nodes ({listed}) are unavailable right now (down, drained or reserved); it waits for "
        "the others or for those to come back.",
    )
