"""The operators' records of Slurm jobs, turned into what the HPC view shows. Pure.

``SlurmSubmitOperator`` leaves two XComs per task: ``slurm_job_id`` as soon as a job is submitted
(or adopted), and, when the job completed, a return value with every job id of the task
(resubmissions included), the final state, elapsed time, restarts and the GPU-hours it cost
(from ``sacct``). The view reads these records from Airflow's metadata database; it never asks
Slurm on a page view: on LUMI every ``squeue`` is a command on a shared login node, and the API
server holds no cluster credentials (a training stage's record carries its curve: :mod:`hpc_view.curves`).
The training DAG's jobs also record the allocation when they ended (``allocation``: Slurm's
``GrpTRESMins`` limit on the account with its usage, the site's own command's figures (LUMI's
``lumi-allocations``), or the profile's ``billing.allocation``, each
figure with its source); the newest such record is the budget the page shows. A training stage's
record also says what its best weights gained on validation over the model the stage started from
(``validation_gain``) and why the stage stopped: with its GPU-hours, what each stage bought.

A task that is still waiting (deferred) has its job id here and the trigger's note of the task try
(``slurm_watch``): the job's state, pending reason and expected start as the watch's last poll saw
them, and when that poll was; while the watch cannot reach the login node, since when. The view shows
them with their age ("RUNNING as of 12 s ago", "cluster unreachable since 04:51 UTC"): the API
server never runs a command on the cluster, whatever the number of people looking. The files the
watch follows as they grow (``slurm_followed``: a training stage's ``metrics.jsonl``, folded into its
curve) come with the record too, each with when it was last read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
import time
from datetime import date, datetime, timezone
from typing import Any

from slurm_provider import (
    FOLLOW_XCOM_KEY,
    JOB_HANDLES_XCOM_KEY,
    JOB_ID_XCOM_KEY,
    JobHandles,
    JobSummary,
    LEFT_OUT_XCOM_KEY,
    WATCH_XCOM_KEY,
    classify_pending_reason,
    clock,
    parse_state,
    SlurmState,
    span,
    task_log_url,
    waiting_line,
)
from slurm_provider.cli.values import format_duration
from vcloud.contract import gain_per_gpu_hour
from vcloud_pipeline.budget.pacing import WINDOW_DAYS, Pace, pace_of
from vcloud_pipeline.dag.job_summary import RunJobSummary

RETURN_VALUE_KEY = "return_value"
"""The XCom of a task's return value: a job task's summary (``JobSummary.is_summary``), else not a Slurm record."""
UNASSIGNED = ""
"""Profile of records that name none (a plain ``SlurmSubmitOperator`` outside the training DAG)."""
WAITING_TASK_STATES = ("deferred", "running", "queued", "scheduled", "up_for_retry", "up_for_reschedule",
                       "restarting")


@dataclass(frozen=True)
class XComRow:
    """One XCom of a Slurm task, with what the view needs from its task instance and DAG run."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    key: str
    value: Any
    task_state: str | None = None
    start_date: datetime | None = None
    end_date: datetime | None = None
    run_conf: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Submission:
    job_id: str
    number: int
    cause: str


@dataclass(frozen=True)
class PendingWords:
    """A pending job's reason in plain words (``classify_pending_reason``, ``waiting_line``)."""

    code: str
    kind: str
    explanation: str
    words: str = ""
    """Why it waits and when Slurm expects it to start, in one phrase (the task log says the same)."""
    expected_start: str | None = None


@dataclass(frozen=True)
class JobRecord:
    """One Slurm task of one DAG run, as its operator recorded it."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    task_state: str | None
    profile: str
    run_name: str
    stage: str
    job_id: str
    job_ids: tuple[str, ...]
    submissions: tuple[Submission, ...] = ()
    state: str | None = None
    """Slurm state of the last job (``None``: not recorded yet, the task has not finished)."""
    exit_code: int | None = None
    elapsed_s: int | None = None
    restarts: int = 0
    node_list: str | None = None
    gpus: int = 0
    gpu_hours: float = 0.0
    finished_at: datetime | None = None
    pending: PendingWords | None = None
    metrics: Mapping[str, Any] | None = None
    allocation: Mapping[str, Any] | None = None
    """The allocation when the job ended, as the training DAG's operator read it (``Allocation.to_json``)."""
    curve: Mapping[str, Any] | None = None
    """The stage's training curve as its operator read it when the job completed (``TrainingCurve.to_json``)."""
    final: bool = False
    """True when this is the operator's final record (its return value): only those are billed here."""
    unreachable_since: datetime | None = None
    """While the task waits: since when its watch cannot reach the login node (the trigger's note)."""
    last_seen: str | None = None
    """The job's last state the waiting watch saw (the trigger's note)."""
    polled_at: datetime | None = None
    """When the waiting watch last had an answer from the cluster (the trigger's note)."""
    followed: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """While the task waits: the files its watch follows, by path (``FollowedFile.to_json``: the fold's
    state, ``read_at``, ``problem``)."""
    validation_gain: float | None = None
    """A training stage's: its ``best.pt``'s validation score minus its start's (``gain_metric``'s units)."""
    gain_metric: str | None = None
    stop_reason: str | None = None
    """Why the stage stopped (``epochs`` or ``patience``), from its ``COMPLETE`` record."""
    left_out: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """The nodes the job was submitted not to run on (``--exclude``), each with the job that failed there
    for the node's fault (``slurm_provider.bad_nodes.left_out_xcom``)."""
    handles: JobHandles | None = None
    """While the task waits: the commands a person reaches the job with (a shell beside it, its output,
    its cancel), as its operator wrote them when it handed the job to the trigger."""

    @property
    def left_out_words(self) -> str:
        """``nid005001 (job 11: exit 89)``, for the page."""
        return ", ".join(f"{node} (job {fault.get('job_id')}: {fault.get('why')})"
                         for node, fault in self.left_out.items())

    @property
    def slurm_state(self) -> SlurmState | None:
        return None if self.state is None else parse_state(self.state)

    @property
    def state_description(self) -> str:
        return self.describe()

    def describe(self, now: float | None = None) -> str:
        """The state in words; a waiting task's as its watch last saw it, with how old that is."""
        if self.slurm_state is not None:
            return self.slurm_state.description
        if self.task_state not in WAITING_TASK_STATES:
            return "No final record: the task ended without the job completing (see the task log)."
        now = time.time() if now is None else now
        seen = "not seen by the watch yet"
        if self.last_seen:
            seen = f"last seen {self.last_seen}"
            if self.polled_at is not None:
                seen += f" {span(now - self.polled_at.timestamp())} ago"
        if self.unreachable_since is not None:
            return (f"Cluster unreachable since {clock(self.unreachable_since.timestamp(), now)}: the task "
                    f"waits for its login node; the job runs on ({seen}).")
        if self.polled_at is not None and self.last_seen:
            return f"{self.last_seen} as of {span(now - self.polled_at.timestamp())} ago (the watch's last poll)."
        if self.last_seen:
            return f"{self.last_seen}, as its watch last noted it."
        return "Submitted; the task waits for the job (its watch has not noted a poll yet)."

    def age_s(self, now: float | None = None) -> float | None:
        """Seconds since the watch's last answered poll (None: no note of one)."""
        if self.polled_at is None:
            return None
        return round(max((time.time() if now is None else now) - self.polled_at.timestamp(), 0.0), 1)

    @property
    def resubmissions(self) -> int:
        return max(len(self.job_ids) - 1, 0)

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """The page's row; ``now`` (epoch seconds) dates the watch's note (default: the clock)."""
        data = asdict(self)
        data["job_ids"] = list(self.job_ids)
        data["submissions"] = [asdict(s) for s in self.submissions]
        data["finished_at"] = self.finished_at.isoformat() if self.finished_at else None
        data["unreachable_since"] = self.unreachable_since.isoformat() if self.unreachable_since else None
        data["polled_at"] = self.polled_at.isoformat() if self.polled_at else None
        data["followed"] = sorted(self.followed)  # the paths; the states go to the curves
        data["as_of_s"] = self.age_s(now)
        data["state_description"] = self.describe(now)
        data["category"] = self.slurm_state.category.value if self.slurm_state else None
        data["elapsed"] = format_duration(self.elapsed_s)
        data["resubmissions"] = self.resubmissions
        data["log_url"] = task_log_url("", self.dag_id, self.run_id, self.task_id, self.map_index, self.job_id)
        data["gain_per_gpu_hour"] = gain_per_gpu_hour(self.validation_gain, self.gpu_hours)
        data["left_out_words"] = self.left_out_words
        data["handles"] = self.handles.to_json() if self.handles else None
        return data



def pending_words(state: str | SlurmState | None, reason: str | None,
                  expected_start: str | None = None, maintenance: str | None = None) -> PendingWords | None:
    """The reason of a job waiting in the queue, explained, with the maintenance window it waits out
    (as its watch named it) and Slurm's estimated start; None once it runs or ended."""
    parsed = parse_state(state)
    if parsed not in (SlurmState.PENDING, SlurmState.REQUEUED, SlurmState.REQUEUE_HOLD):
        return None
    classified = classify_pending_reason(reason)
    return PendingWords(code=classified.code, kind=classified.kind.value, explanation=classified.explanation,
                        words=waiting_line(reason, expected_start, maintenance), expected_start=expected_start)


def _watched_pending(note: XComRow | None, job_id: str) -> PendingWords | None:
    """Why the job of a waiting task pends, as its watch last saw it (the trigger's note: no call to
    the cluster); None when the note is about another job or the job does not pend."""
    value = note.value if note is not None else None
    if note is None or note.task_state not in WAITING_TASK_STATES or not isinstance(value, Mapping):
        return None
    if str(value.get("job_id")) != job_id or value.get("state") != SlurmState.PENDING.value:
        return None
    return pending_words(SlurmState.PENDING, value.get("reason"), value.get("expected_start"),
                         value.get("maintenance"))


def _submissions(value: Any) -> tuple[Submission, ...]:
    out: list[Submission] = []
    for item in value or ():
        if isinstance(item, Mapping) and "job_id" in item:
            out.append(Submission(str(item["job_id"]), int(item.get("number") or len(out) + 1),
                                  str(item.get("cause") or "")))
    return tuple(out)


@dataclass(frozen=True)
class WatchSeen:
    """What the watch note of a waiting task says about its job."""

    state: str | None = None
    polled_at: datetime | None = None
    unreachable_since: datetime | None = None


def _moment(value: Any) -> datetime | None:
    return datetime.fromtimestamp(value, timezone.utc) if isinstance(value, (int, float)) else None


def _watch_seen(note: XComRow | None, job_id: str) -> WatchSeen:
    """The job's last state seen, when the cluster last answered and since when it has not (an outage),
    from the watch note of a waiting task; nothing when the note is about another job."""
    value = note.value if note is not None else None
    if note is None or note.task_state not in WAITING_TASK_STATES or not isinstance(value, Mapping):
        return WatchSeen()
    if str(value.get("job_id")) != job_id:
        return WatchSeen()
    state = value.get("state")
    return WatchSeen(str(state) if state else None, _moment(value.get("polled_at")),
                     _moment(value.get("unreachable_since")))


def _followed(note: XComRow | None, job_id: str) -> dict[str, Mapping[str, Any]]:
    """The files the watch of a waiting task follows (its ``slurm_followed`` XCom), by path; nothing when
    the XCom is about another job."""
    value = note.value if note is not None else None
    if note is None or note.task_state not in WAITING_TASK_STATES or not isinstance(value, Mapping):
        return {}
    if str(value.get("job_id")) != job_id or not isinstance(value.get("files"), list):
        return {}
    return {f["path"]: f for f in value["files"] if isinstance(f, Mapping) and isinstance(f.get("path"), str)}


def _left_out(note: XComRow | None, job_id: str) -> dict[str, Mapping[str, Any]]:
    """The nodes the task's job ``job_id`` was submitted without (its ``slurm_left_out`` XCom); nothing
    when the XCom is about an earlier job of the task."""
    value = note.value if note is not None else None
    if not isinstance(value, Mapping) or str(value.get("job_id")) != job_id or not isinstance(value.get("nodes"), Mapping):
        return {}
    return {str(node): fault for node, fault in value["nodes"].items() if isinstance(fault, Mapping)}


def _handles(note: XComRow | None, job_id: str) -> JobHandles | None:
    """The commands to reach the waiting task's job ``job_id`` by hand; None when its task no longer
    waits or the XCom is about an earlier job of the task."""
    if note is None or note.task_state not in WAITING_TASK_STATES:
        return None
    handles = JobHandles.from_json(note.value)
    return handles if handles is not None and handles.job_id == job_id else None


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def records_from_xcoms(rows: Iterable[XComRow]) -> list[JobRecord]:
    """One record per Slurm task instance: its return value when it completed, else its job id.

    A task is a Slurm task when it pushed ``slurm_job_id``; its profile comes from its return value
    (the training DAG's jobs carry it) or from the DAG run's ``conf``; its stage label from the
    return value's ``job`` (the training DAG) or the task id.
    """
    by_task: dict[tuple[str, str, str, int], dict[str, XComRow]] = {}
    for row in rows:
        by_task.setdefault((row.dag_id, row.run_id, row.task_id, row.map_index), {})[row.key] = row
    records = []
    for key, xcoms in by_task.items():
        job_row = xcoms.get(JOB_ID_XCOM_KEY)
        summary_row = xcoms.get(RETURN_VALUE_KEY)
        summary = (RunJobSummary.from_json(summary_row.value)
                   if summary_row is not None and JobSummary.is_summary(summary_row.value) else None)
        if job_row is None and summary is None:
            continue
        anchor = summary_row if summary is not None else job_row
        assert anchor is not None
        conf = anchor.run_conf or {}
        profile = str((summary.profile if summary is not None else None) or conf.get("profile") or UNASSIGNED)
        dag_id, run_id, task_id, map_index = key
        if summary is None:
            assert job_row is not None
            job_id = str(job_row.value)
            seen = _watch_seen(xcoms.get(WATCH_XCOM_KEY), job_id)
            records.append(JobRecord(
                dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index,
                task_state=anchor.task_state, profile=profile, run_name=str(conf.get("run_name") or ""),
                stage=task_id, job_id=job_id, job_ids=(job_id,), finished_at=anchor.end_date,
                unreachable_since=seen.unreachable_since, last_seen=seen.state, polled_at=seen.polled_at,
                followed=_followed(xcoms.get(FOLLOW_XCOM_KEY), job_id),
                pending=_watched_pending(xcoms.get(WATCH_XCOM_KEY), job_id),
                left_out=_left_out(xcoms.get(LEFT_OUT_XCOM_KEY), job_id),
                handles=_handles(xcoms.get(JOB_HANDLES_XCOM_KEY), job_id)))
            continue
        job = summary.job
        records.append(JobRecord(
            dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index,
            task_state=anchor.task_state, profile=profile,
            run_name=summary.run or str(conf.get("run_name") or ""),
            stage=summary.label or task_id,
            job_id=job.job_id, job_ids=job.job_ids,
            submissions=_submissions(job.submissions),
            state=job.state, exit_code=job.exit_code,
            elapsed_s=job.elapsed_s, restarts=job.restarts,
            node_list=job.node_list, gpus=job.gpus,
            gpu_hours=job.gpu_hours,
            finished_at=anchor.end_date, metrics=summary.metrics,
            allocation=summary.allocation, curve=summary.curve,
            final=True, validation_gain=summary.validation_gain,
            gain_metric=summary.gain_metric, stop_reason=summary.stop_reason,
            left_out=_left_out(xcoms.get(LEFT_OUT_XCOM_KEY), job.job_id)))
    records.sort(key=lambda r: (r.finished_at is None, r.finished_at or datetime.min, r.dag_id, r.run_id,
                                r.task_id), reverse=False)
    return records


@dataclass(frozen=True)
class BurnPoint:
    """The allocation after one completed task: cumulative use and what is left."""

    at: datetime | None
    label: str
    used: float
    left: float | None


SLURM_SOURCE = "slurm"
COMMAND_SOURCE = "command"
PROFILE_SOURCE = "profile"
SITE_SOURCES = (SLURM_SOURCE, COMMAND_SOURCE)
"""Allocations the site reports with the usage of every job of the project (``billing.allocation_source``)."""


@dataclass(frozen=True)
class ProfileBudget:
    """GPU-hours spent by the recorded jobs of one profile, against its allocation.

    ``source`` says where the allocation comes from: ``slurm`` (the account's ``GrpTRESMins`` limit,
    as the newest job record read it; ``account_used`` is then every job of the account, ours or
    not), ``command`` (the site's own command, e.g. LUMI's ``lumi-allocations``, read the same way:
    every job of the project) or ``profile`` (``billing.allocation``, against the jobs recorded here).
    """

    profile: str
    unit: str
    allocation: float | None
    total: float
    by_run: dict[str, float] = field(default_factory=dict)
    by_stage: dict[str, float] = field(default_factory=dict)
    by_run_stage: dict[tuple[str, str], float] = field(default_factory=dict)
    gains: dict[tuple[str, str], JobRecord] = field(default_factory=dict)
    """Per (run, stage): the newest record that measured a validation gain (what the hours bought)."""
    burn: tuple[BurnPoint, ...] = ()
    jobs: int = 0
    source: str = PROFILE_SOURCE
    allocation_from: str = ""
    account_used: float | None = None
    used_from: str = "the jobs recorded here"
    as_of: datetime | None = None
    """When the site's figures were read (the end of the job whose record carries them)."""

    @property
    def left(self) -> float | None:
        if self.allocation is None:
            return None
        return self.allocation - (self.account_used if self.account_used is not None else self.total)

    def _yield(self, run: str, stage: str, hours: float) -> dict[str, Any]:
        """What ``hours`` of ``stage`` in ``run`` bought on validation (None where nothing was measured)."""
        record = self.gains.get((run, stage))
        gain = record.validation_gain if record is not None else None
        per_hour = gain_per_gpu_hour(gain, hours)
        return {"validation_gain": None if gain is None else round(gain, 4),
                "gain_metric": record.gain_metric if record is not None else None,
                "gain_per_gpu_hour": None if per_hour is None else round(per_hour, 4),
                "stop_reason": record.stop_reason if record is not None else None}

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile, "unit": self.unit, "allocation": self.allocation,
            "source": self.source, "allocation_from": self.allocation_from,
            "account_used": None if self.account_used is None else round(self.account_used, 4),
            "used_from": self.used_from, "as_of": self.as_of.isoformat() if self.as_of else None,
            "used": round(self.total, 4), "left": None if self.left is None else round(self.left, 4),
            "jobs": self.jobs,
            "by_run": [{"run_id": run, "gpu_hours": round(h, 4)} for run, h in self.by_run.items()],
            "by_stage": [{"stage": stage, "gpu_hours": round(h, 4)} for stage, h in self.by_stage.items()],
            "by_run_stage": [{"run_id": run, "stage": stage, "gpu_hours": round(h, 4),
                              **self._yield(run, stage, h)} for (run, stage), h in self.by_run_stage.items()],
            "burn": [{"at": p.at.isoformat() if p.at else None, "label": p.label, "used": round(p.used, 4),
                      "left": None if p.left is None else round(p.left, 4)} for p in self.burn],
        }


def budget_pace(budget: ProfileBudget, records: Iterable[JobRecord], *, ends_on: date | None, margin_percent: int,
                now: float) -> Pace:
    """The burn rate of the profile's completed jobs over the last days against what is left of its
    allocation by ``ends_on`` (:mod:`vcloud_pipeline.budget.pacing`)."""
    done = [r for r in records if r.profile == budget.profile and r.final and r.finished_at is not None]
    window_start = now - WINDOW_DAYS * 86400
    spent = sum(r.gpu_hours for r in done if r.finished_at is not None and r.finished_at.timestamp() >= window_start)
    starts = [r.finished_at.timestamp() - (r.elapsed_s or 0) for r in done if r.finished_at is not None]
    history_days = (now - min(starts)) / 86400 if starts else 0.0
    return pace_of(spent=spent, history_days=history_days, left=budget.left, ends_on=ends_on,
                   now=datetime.fromtimestamp(now, timezone.utc), margin_percent=margin_percent, unit=budget.unit)


def _site_snapshot(record: JobRecord) -> Mapping[str, Any] | None:
    """The record's allocation when the site reported it (Slurm's limit or the site's command), with
    the figures the view needs."""
    snap = record.allocation
    if not snap or snap.get("source") not in SITE_SOURCES:
        return None
    if not all(isinstance(snap.get(key), (int, float)) for key in ("limit", "used")):
        return None
    return snap


def profile_budget(profile: str, records: Iterable[JobRecord], *, allocation: float | None,
                   unit: str = "GPU-hours", allocation_from: str = "") -> ProfileBudget:
    """Sum the GPU-hours of one profile's completed jobs per run and per stage, in time order.

    The figures are what each operator recorded from ``sacct`` when its job completed (every
    submission of the task, billed by its partition's rule in the profile:
    :func:`vcloud_pipeline.budget.rates.hourly_rate`); tasks that have not completed
    add nothing yet. Where the records carry Slurm's figures, the allocation is Slurm's limit on
    the account as the newest record read it, and the burn-down follows what Slurm said was left
    after each job (the account's usage, jobs of other pipelines included); otherwise it is
    ``allocation`` (the profile's) less the recorded GPU-hours.
    """
    done = sorted((r for r in records if r.profile == profile and r.final),
                  key=lambda r: (r.finished_at is None, r.finished_at or datetime.min))
    slurm = [(r, snap) for r in done if (snap := _site_snapshot(r)) is not None]
    newest = slurm[-1] if slurm else None
    if newest is not None:
        allocation = float(newest[1]["limit"])
    by_run: dict[str, float] = {}
    by_stage: dict[str, float] = {}
    by_run_stage: dict[tuple[str, str], float] = {}
    gains: dict[tuple[str, str], JobRecord] = {}
    burn: list[BurnPoint] = []
    total = 0.0
    left = allocation
    for record in done:
        by_run[record.run_id] = by_run.get(record.run_id, 0.0) + record.gpu_hours
        by_stage[record.stage] = by_stage.get(record.stage, 0.0) + record.gpu_hours
        key = (record.run_id, record.stage)
        by_run_stage[key] = by_run_stage.get(key, 0.0) + record.gpu_hours
        if record.validation_gain is not None or record.stop_reason is not None:
            gains[key] = record
        total += record.gpu_hours
        snap = _site_snapshot(record) if newest is not None else None
        if snap is not None:
            left = float(snap["limit"]) - float(snap["used"])
        elif left is not None:
            left -= record.gpu_hours
        burn.append(BurnPoint(record.finished_at, f"{record.stage} ({record.job_id})", total, left))
    common: dict[str, Any] = dict(profile=profile, unit=unit, allocation=allocation, total=total, by_run=by_run,
                                  by_stage=by_stage, by_run_stage=by_run_stage, gains=gains, burn=tuple(burn),
                                  jobs=len(done))
    if newest is None:
        return ProfileBudget(**common, allocation_from=allocation_from)
    record, snap = newest
    return ProfileBudget(**common, source=str(snap["source"]), allocation_from=str(snap.get("limit_from") or ""),
                         account_used=float(snap["used"]), used_from=str(snap.get("used_from") or ""),
                         as_of=record.finished_at)
