"""``JobStatus``: what the plugin knows about one Slurm job, and how it travels in trigger events.

Built from parsed squeue, sacct or scontrol output (:mod:`slurm_provider.cli`).
:func:`resolve_statuses` combines one batched squeue call and one batched sacct call into a
status per requested job id, following these rules:

* squeue answers from slurmctld's memory, so while it lists a job as not finished it is the
  freshest source (sacct lags behind, and during a requeue shows the old run's end first);
* once a job has finished, sacct is the source of truth (exit code, elapsed time, newest run
  of a requeued job), because squeue forgets finished jobs after ``MinJobAge`` seconds;
* a job neither lists is ``UNKNOWN`` with ``source="none"``: never success.

``to_event()`` gives a JSON-safe dict for ``TriggerEvent``; ``from_event()`` reads it back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slurm_provider.cli.job_files import expand_filename_pattern
from slurm_provider.cli.sacct import SacctRow, rows_by_job
from slurm_provider.cli.squeue import SqueueRow
from slurm_provider.cli.values import (
    expand_hostlist,
    format_duration,
    gpus_from_tres,
    parse_duration,
    parse_exit_code,
    parse_int,
    parse_slurm_time,
)
from slurm_provider.state_vocabulary import SlurmState, StateCategory, parse_state_text
from slurm_provider.pending_reasons import PendingReason, classify_pending_reason

EVENT_VERSION = 1



def gpu_hours(gpus: int, elapsed_s: float, billing_factor: float = 1.0) -> float:
    """Billed GPUs x elapsed hours x ``billing_factor``: what a job costs, the one GPU-hour formula.

    It is what Slurm bills where ``TRESBillingWeights`` gives a GPU the weight 1.0 (billing-minutes /
    60), times the site's units per GPU-hour. Where each GPU Slurm schedules is billed as one unit
    the factor is 1.0 (8 GPUs for 3 days = 576 GPU-hours); a site billing whole dual-die cards, each
    scheduled as two GPUs, would use 0.5. Which GPUs are billed is the site's rule (e.g. whole nodes
    on full-node partitions); a negative elapsed time counts as none.
    """
    if not gpus or elapsed_s <= 0:
        return 0.0
    return gpus * (elapsed_s / 3600.0) * billing_factor


@dataclass(frozen=True)
class JobStatus:
    """One job's state and the facts needed to explain it, report it and bill it."""

    job_id: str
    """The id we asked about: ``123``, or ``123_4`` for an array element."""
    state: SlurmState
    raw_state: str = ""
    """The state text exactly as Slurm printed it (``CANCELLED by 1001``)."""
    reason: str | None = None
    """Slurm's reason (pending reason, or e.g. ``NonZeroExitCode``); None when Slurm says None."""
    exit_code: int | None = None
    signal: int | None = None
    """The signal that ended the job's script (``0:9`` -> 9), 0 if it exited normally."""
    elapsed_s: int | None = None
    restarts: int = 0
    """How many times the job was requeued (preemption, node failure, ``scontrol requeue``)."""
    node_list: str | None = None
    gpus: int = 0
    """GPUs allocated (each GPU Slurm schedules), from the allocated TRES."""
    tres: str | None = None
    """The job's TRES as Slurm prints them (``cpu=1,mem=1000M,node=1,billing=2,gres/gpu=2``): what it
    asks for while it waits, what it holds once it started; ``billing`` is what an allocation charges."""
    start: str | None = None
    end: str | None = None
    submit: str | None = None
    """Times as ISO text in the cluster's local time (as Slurm prints them)."""
    expected_start: str | None = None
    """While the job pends: when Slurm expects it to start (squeue's ``StartTime``: the backfill
    scheduler's estimate, or the ``--begin`` time); None when Slurm has no estimate."""
    name: str | None = None
    comment: str | None = None
    std_out: str | None = None
    """The log file path with Slurm's %j/%x patterns expanded when we could."""
    std_err: str | None = None
    cancelled_by: str | None = None
    """uid (from sacct) that cancelled the job."""
    partition: str | None = None
    account: str | None = None
    user: str | None = None
    """The user who submitted the job (a project's members share its directories)."""
    time_limit_s: int | None = None
    array_job_id: str | None = None
    array_task_id: str | None = None
    source: str = "none"
    """Where this came from: ``squeue``, ``sacct``, ``scontrol``, ``array`` (aggregate) or ``none``."""
    step_states: tuple[str, ...] = field(default_factory=tuple)
    """States of the job's steps when sacct listed them (``batch:CANCELLED by 0``)."""

    # --- interpretation ------------------------------------------------------------------------

    @property
    def category(self) -> StateCategory:
        return self.state.category

    @property
    def is_terminal(self) -> bool:
        return self.state.is_terminal

    @property
    def is_success(self) -> bool:
        return self.state.is_success

    @property
    def is_retryable(self) -> bool:
        return self.state.is_retryable

    @property
    def found(self) -> bool:
        return self.source != "none"

    def pending_reason(self, down_nodes: Iterable[str] | None = None) -> PendingReason | None:
        """The classified reason while the job waits in the queue (None once it runs or ended)."""
        if self.state not in (SlurmState.PENDING, SlurmState.REQUEUE_HOLD, SlurmState.REQUEUED):
            return None
        down = None if down_nodes is None else set(down_nodes)
        return classify_pending_reason(self.reason, down_nodes=down)

    def gpu_hours(self, billing_factor: float = 1.0) -> float:
        """:func:`gpu_hours` of the job's allocated GPUs over its elapsed time."""
        return gpu_hours(self.gpus, self.elapsed_s or 0, billing_factor)

    def summary(self) -> str:
        """One line for logs and failure messages, with Slurm's reason, exit code and log path."""
        label = f"job {self.job_id}" + (f" ({self.name})" if self.name else "")
        if not self.found:
            return f"{label}: not found in squeue or sacct"
        parts = [f"{label} {self.raw_state or self.state.value}"]
        if self.exit_code is not None and self.is_terminal:
            parts.append(f"exit code {self.exit_code}" + (f", signal {self.signal}" if self.signal else ""))
        if self.elapsed_s is not None and self.state.has_started:
            parts.append(f"ran {format_duration(self.elapsed_s, unknown='?')}")
        if self.node_list:
            parts.append(f"on {self.node_list}")
        if self.restarts:
            parts.append(f"requeued {self.restarts}x")
        if self.reason and not (self.is_terminal and _is_queue_reason(self.reason)):
            parts.append(f"reason {self.reason}")
        if self.std_out:
            parts.append(f"log {self.std_out}")
        return "; ".join(parts)

    # --- event payload -------------------------------------------------------------------------

    def to_event(self) -> dict[str, Any]:
        """A JSON-safe dict for a trigger event. Derived keys (category, is_terminal, is_success)
        are included for readers of the raw event and ignored by :meth:`from_event`."""
        payload: dict[str, Any] = {"version": EVENT_VERSION}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if isinstance(value, SlurmState):
                value = value.value
            elif isinstance(value, tuple):
                value = list(value)
            payload[item.name] = value
        payload["category"] = self.category.value
        payload["is_terminal"] = self.is_terminal
        payload["is_success"] = self.is_success
        return payload

    @classmethod
    def from_event(cls, payload: Mapping[str, Any]) -> JobStatus:
        """Read back :meth:`to_event` output; raises ValueError naming a missing or bad key."""
        missing = [key for key in ("job_id", "state") if key not in payload]
        if missing:
            raise ValueError(f"job status event lacks {', '.join(missing)}; got keys {sorted(payload)}")
        state_text = payload["state"]
        if state_text not in SlurmState.__members__:
            raise ValueError(f"job status event has unknown state {state_text!r}")
        values: dict[str, Any] = {}
        for item in dataclasses.fields(cls):
            if item.name not in payload:
                continue
            value = payload[item.name]
            if item.name == "state":
                value = SlurmState[value]
            elif item.name == "step_states":
                value = tuple(value or ())
            values[item.name] = value
        return cls(**values)

    # --- builders ------------------------------------------------------------------------------

    @classmethod
    def unknown(cls, job_id: str) -> JobStatus:
        return cls(job_id=str(job_id), state=SlurmState.UNKNOWN, raw_state="", source="none")

    @classmethod
    def from_squeue(cls, row: SqueueRow) -> JobStatus:
        parsed = parse_state_text(row.state)
        nodes = expand_hostlist(row.node_list) if row.node_list else []

        def expand(pattern: str | None) -> str | None:
            if pattern is None:
                return None
            return expand_filename_pattern(
                pattern,
                job_id=row.job_id_raw,
                job_name=row.name,
                user=row.user,
                array_job_id=row.array_job_id,
                array_task_id=row.array_task_id,
                first_node=nodes[0] if nodes else None,
            )

        return cls(
            job_id=row.job_id,
            state=parsed.state,
            raw_state=parsed.raw,
            reason=row.reason,
            exit_code=row.exit_code if parsed.state.is_terminal else None,
            signal=row.signal if parsed.state.is_terminal else None,
            elapsed_s=row.time_used_s,
            restarts=row.restarts,
            node_list=row.node_list,
            gpus=gpus_from_tres(row.tres) if parsed.state.has_started else 0,
            tres=row.tres,
            start=row.start if parsed.state.has_started else None,
            end=row.end if parsed.state.is_terminal else None,
            submit=row.submit,
            expected_start=row.start if parsed.state is SlurmState.PENDING else None,
            name=row.name,
            comment=row.comment,
            std_out=expand(row.std_out),
            std_err=expand(row.std_err),
            cancelled_by=parsed.cancelled_by,
            partition=row.partition,
            account=row.account,
            user=row.user,
            time_limit_s=row.time_limit_s,
            array_job_id=row.array_job_id,
            array_task_id=row.array_task_id,
            source="squeue",
        )

    @classmethod
    def from_sacct(
        cls,
        row: SacctRow,
        *,
        restarts: int = 0,
        steps: Iterable[SacctRow] = (),
    ) -> JobStatus:
        """From the job's (newest) sacct row; ``restarts`` = number of earlier runs (sacct -D)."""
        parsed = parse_state_text(row.state)
        parts = row.id_parts
        return cls(
            job_id=row.job_id,
            state=parsed.state,
            raw_state=parsed.raw,
            reason=row.reason,
            exit_code=row.exit_code if parsed.state.is_terminal else None,
            signal=row.signal if parsed.state.is_terminal else None,
            elapsed_s=row.elapsed_s,
            restarts=restarts,
            node_list=row.node_list,
            gpus=gpus_from_tres(row.alloc_tres),
            tres=row.alloc_tres,
            start=row.start,
            end=row.end,
            submit=row.submit,
            name=row.name,
            comment=row.comment,
            cancelled_by=parsed.cancelled_by,
            partition=row.partition,
            account=row.account,
            user=row.user,
            time_limit_s=row.time_limit_s,
            array_job_id=parts.base if parts.array_task is not None else None,
            array_task_id=parts.array_task,
            source="sacct",
            step_states=tuple(f"{step.step}:{step.state}" for step in steps),
        )

    @classmethod
    def from_scontrol(cls, record: Mapping[str, str]) -> JobStatus:
        """From one ``slurm_provider.cli.scontrol.parse_scontrol_show_job`` record (``Restarts=``, ``StdOut=`` expanded)."""
        parsed = parse_state_text(record.get("JobState"))
        exit_code, signal = parse_exit_code(record.get("ExitCode"))
        array_job = record.get("ArrayJobId")
        array_task = record.get("ArrayTaskId")
        is_element = bool(array_job and array_task and array_task.isdigit())
        job_id = f"{array_job}_{array_task}" if is_element else record["JobId"]
        reason = record.get("Reason")
        return cls(
            job_id=job_id,
            state=parsed.state,
            raw_state=parsed.raw,
            reason=None if reason in (None, "", "None") else reason.replace(",_", ", "),
            exit_code=exit_code if parsed.state.is_terminal else None,
            signal=signal if parsed.state.is_terminal else None,
            elapsed_s=parse_duration(record.get("RunTime")),
            restarts=parse_int(record.get("Restarts")) or 0,
            node_list=record.get("NodeList") or None,
            gpus=gpus_from_tres(record.get("TRES")) if parsed.state.has_started else 0,
            tres=record.get("TRES") or None,
            start=parse_slurm_time(record.get("StartTime")) if parsed.state.has_started else None,
            end=parse_slurm_time(record.get("EndTime")) if parsed.state.is_terminal else None,
            submit=parse_slurm_time(record.get("SubmitTime")),
            name=record.get("JobName"),
            comment=record.get("Comment") or None,
            std_out=record.get("StdOut") or None,
            std_err=record.get("StdErr") or None,
            cancelled_by=parsed.cancelled_by,
            partition=record.get("Partition"),
            account=record.get("Account"),
            user=(record.get("UserId") or "").split("(")[0] or None,
            time_limit_s=parse_duration(record.get("TimeLimit")),
            array_job_id=array_job if array_task and array_task.isdigit() else None,
            array_task_id=array_task if array_task and array_task.isdigit() else None,
            source="scontrol",
        )


def _is_queue_reason(reason: str) -> bool:
    """A leftover queueing reason (sacct keeps the last one, e.g. BeginTime on a finished job)."""
    from_queue = classify_pending_reason(reason)
    return from_queue.kind.value == "waiting"


# --- combining sources -----------------------------------------------------------------------------


# Facts that do not change between runs, so either source may supply them.
_DESCRIPTIVE_FIELDS = (
    "name",
    "comment",
    "std_out",
    "std_err",
    "partition",
    "account",
    "user",
    "time_limit_s",
    "array_job_id",
    "array_task_id",
    "step_states",
)


def _fill_missing(primary: JobStatus, secondary: JobStatus | None) -> JobStatus:
    """Keep ``primary``'s facts; take the ones it lacks from ``secondary`` (same job)."""
    if secondary is None:
        return primary
    updates = {}
    for name in _DESCRIPTIVE_FIELDS:
        if getattr(primary, name) in (None, ()) and getattr(secondary, name) not in (None, ()):
            updates[name] = getattr(secondary, name)
    updates["restarts"] = max(primary.restarts, secondary.restarts)
    return dataclasses.replace(primary, **updates)


def _choose(squeue: JobStatus | None, sacct: JobStatus | None) -> JobStatus | None:
    if squeue is not None and not squeue.is_terminal:
        return _fill_missing(squeue, sacct)
    if sacct is not None and (sacct.is_terminal or squeue is None):
        return _fill_missing(sacct, squeue)
    if squeue is not None:  # finished in slurmctld, accounting not updated yet
        return _fill_missing(squeue, sacct)
    return None


def statuses_from_sacct(rows: Iterable[SacctRow]) -> dict[str, JobStatus]:
    """A status per job / array element in sacct output: newest run, restarts = earlier runs."""
    return {job_id: JobStatus.from_sacct(job.latest, restarts=len(job.runs) - 1, steps=job.steps)
            for job_id, job in rows_by_job(rows).items()}


def resolve_statuses(
    job_ids: Iterable[str | int],
    *,
    squeue_rows: Iterable[SqueueRow] = (),
    sacct_rows: Iterable[SacctRow] = (),
) -> dict[str, JobStatus]:
    """One :class:`JobStatus` per requested id from one squeue and one sacct answer (see module doc).

    An id that names a whole job array (``123`` submitted with ``--array``) gets an aggregate:
    waiting while any element waits, success only if every element succeeded, otherwise the
    first element that did not succeed.
    """
    by_squeue: dict[str, JobStatus] = {}
    raw_to_display: dict[str, str] = {}
    for row in squeue_rows:
        by_squeue[row.job_id] = JobStatus.from_squeue(row)
        raw_to_display.setdefault(row.job_id_raw, row.job_id)
    sacct_rows = list(sacct_rows)
    by_sacct = statuses_from_sacct(sacct_rows)
    for sacct_row in sacct_rows:
        if not sacct_row.is_step:
            raw_to_display.setdefault(sacct_row.job_id_raw, sacct_row.job_id)

    result: dict[str, JobStatus] = {}
    for requested in (str(j) for j in job_ids):
        chosen = _choose(by_squeue.get(requested), by_sacct.get(requested))
        if chosen is None:
            elements = sorted(
                {k for k in (*by_squeue, *by_sacct) if k.split("_", 1)[0] == requested and "_" in k}
            )
            if elements:
                statuses = [_choose(by_squeue.get(k), by_sacct.get(k)) for k in elements]
                chosen = _aggregate_array(requested, [s for s in statuses if s is not None])
        if chosen is None and requested in raw_to_display:
            display = raw_to_display[requested]
            chosen = dataclasses.replace(
                _choose(by_squeue.get(display), by_sacct.get(display)) or JobStatus.unknown(display),
                job_id=requested,
            )
        result[requested] = chosen if chosen is not None else JobStatus.unknown(requested)
    return result


def _aggregate_array(array_id: str, elements: list[JobStatus]) -> JobStatus:
    waiting = [s for s in elements if not s.is_terminal]
    if waiting:
        running = [s for s in waiting if s.state.has_started]
        representative = (running or waiting)[0]
    else:
        failed = [s for s in elements if not s.is_success]
        representative = failed[0] if failed else elements[0]
    total_elapsed = sum(s.elapsed_s or 0 for s in elements)
    return dataclasses.replace(
        representative,
        job_id=array_id,
        array_job_id=array_id,
        array_task_id=None,
        elapsed_s=total_elapsed,
        gpus=max((s.gpus for s in elements), default=0),
        restarts=sum(s.restarts for s in elements),
        source="array",
    )
