"""The refresh button: ask the cluster about the jobs whose tasks are still waiting.

Only jobs without a final record are asked about, one batched status call per cluster
connection (``SlurmHook.statuses``: squeue, then sacct), and not more often than every
``MIN_INTERVAL_S`` per connection whatever the number of people pressing the button: on LUMI
each call is a command on a shared login node behind a one-time-password ControlMaster.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from hpc_view.records import WAITING_TASK_STATES, JobRecord, pending_words

MIN_INTERVAL_S = 15.0

StatusSource = Callable[[str, list[str]], Mapping[str, Any]]
"""``(conn_id, job_ids) -> {job_id: JobStatus}``; the default opens a ``SlurmHook``."""


def hook_statuses(conn_id: str, job_ids: list[str]) -> Mapping[str, Any]:
    from slurm_provider.hooks import SlurmHook

    with SlurmHook(conn_id) as hook:
        return hook.statuses(job_ids)


def needs_cluster(record: JobRecord) -> bool:
    """A task still waiting for its job, with no final record yet."""
    return record.state is None and record.task_state in WAITING_TASK_STATES


@dataclass
class LiveStates:
    """Recent status answers per connection, shared by every request of the API server process."""

    source: StatusSource = hook_statuses
    min_interval_s: float = MIN_INTERVAL_S
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, frozenset[str], Mapping[str, Any]]] = {}

    def statuses(self, conn_id: str, job_ids: list[str]) -> tuple[Mapping[str, Any], float]:
        """Statuses of ``job_ids`` and their age in seconds (0 when just asked)."""
        wanted = frozenset(job_ids)
        with self._lock:
            cached = self._cache.get(conn_id)
            now = self.clock()
            if cached and wanted <= cached[1] and now - cached[0] < self.min_interval_s:
                return cached[2], now - cached[0]
            answer = dict(self.source(conn_id, sorted(wanted)))
            self._cache[conn_id] = (self.clock(), wanted, answer)
            return answer, 0.0


def refresh(records: Iterable[JobRecord], conn_of: Callable[[str], str | None],
            live: LiveStates) -> tuple[list[JobRecord], list[str]]:
    """Records with the cluster's current state of waiting jobs, and one message per cluster that
    could not be asked (the page shows them; the records keep what the database says)."""
    records = list(records)
    by_conn: dict[str, list[str]] = {}
    problems: list[str] = []
    for record in records:
        if not needs_cluster(record):
            continue
        conn_id = conn_of(record.profile)
        if conn_id is None:
            problems.append(f"job {record.job_id} ({record.dag_id}.{record.task_id}): its DAG run names no "
                            "cluster profile, so the view does not know which cluster to ask")
            continue
        by_conn.setdefault(conn_id, []).append(record.job_id)
    answers: dict[str, Mapping[str, Any]] = {}
    for conn_id, job_ids in by_conn.items():
        try:
            answers[conn_id], _ = live.statuses(conn_id, job_ids)
        except Exception as exc:  # transport errors, a missing connection: shown, never fatal
            problems.append(f"cannot ask cluster connection {conn_id}: {exc}")
    out = []
    for record in records:
        conn_id = conn_of(record.profile) if needs_cluster(record) else None
        status = answers.get(conn_id, {}).get(record.job_id) if conn_id else None
        if status is None:
            out.append(record)
            continue
        state = getattr(status.state, "value", str(status.state))
        out.append(replace(record, state=state, pending=pending_words(state, status.reason, status.expected_start),
                           restarts=status.restarts or record.restarts, elapsed_s=status.elapsed_s,
                           node_list=status.node_list or record.node_list, gpus=status.gpus or record.gpus))
    return out, problems
