"""What a trigger keeps and asks about its own task in Airflow, over the triggerer's Execution API link.

* **How far the watch got**: the bytes of the job's log already copied into the task log, the
  last job state announced there, when the cluster last answered a poll (noted at least once a
  minute while it answers) and, while the login node does not answer, since when (the wait's
  deadline counts from it), kept as an XCom of the task try. A UI plugin reading XComs shows the
  note as the job's state "as of" the poll, without asking the cluster itself. A triggerer that restarts
  rebuilds every trigger from the arguments it had when the task deferred (offset 0); without this
  note the new trigger would copy the whole log into the task log again and announce the state
  again. XComs live as long as the try: a retry starts a new task log, shown from the start.
* **The task instance's state**, read when Airflow stops a trigger. Airflow 3.3 calls a trigger's
  ``on_kill`` whenever the trigger leaves a running triggerer: when a person marked the task failed,
  successful or skipped, but also when the task was cleared (its next try adopts the job) and when
  the trigger moved to another triggerer (the task is still deferred). Only the first is a stop.

Every function here needs the triggerer's supervisor link; a trigger run without one (in a test, or
in ``airflow dags test``) has no task instance attached and does not call them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

WATCH_XCOM_KEY = "slurm_watch"
"""XCom of the task try holding ``{"job_id", "log_path", "log_offset", "state", "err_offset",
"unreachable_since", "allocation_since", "reason", "expected_start", "polled_at"}`` of the watch in progress."""

NOTE_REFRESH_S = 60.0
"""Least seconds between two notes that only move ``polled_at`` on (nothing else changed): a UI says
how old the last poll is to within this, at one XCom write a minute per watched job."""

ENDED_BY_A_PERSON = frozenset({"failed", "success", "skipped", "upstream_failed", "removed"})
"""Task instance states in which a stopped trigger means "stop the job": the task was ended for good."""


def ended_by_a_person(task_state: str | None) -> bool:
    """True when a stopped watch's task has ended (marked failed, success, skipped...), so its job should
    stop too; False for a cleared task (None, scheduled, queued...: the next try adopts the job) or a
    task still deferred (the trigger moved to another triggerer)."""
    return task_state in ENDED_BY_A_PERSON


@dataclass(frozen=True)
class TaskKey:
    """The task instance a trigger serves (the triggerer attaches it as ``trigger.task_instance``)."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1

    @classmethod
    def of(cls, task_instance: Any) -> TaskKey | None:
        if task_instance is None:
            return None
        map_index = getattr(task_instance, "map_index", -1)
        return cls(task_instance.dag_id, task_instance.task_id, task_instance.run_id,
                   -1 if map_index is None else int(map_index))


@dataclass(frozen=True)
class WatchNote:
    """How far the watch of one job got in this task try."""

    log_offset: int = 0
    """Bytes of the job's log already copied into the task log."""
    state: str | None = None
    """The last job state announced in the task log (a ``SlurmState`` value)."""
    err_offset: int = 0
    """Bytes of the job's error output already copied into the task log."""
    unreachable_since: float | None = None
    """Since when the login node has not answered (epoch seconds); None while it answers."""
    allocation_since: float | None = None
    """When (epoch seconds) the watch first saw the job pend on its account's allocation: the start of
    the wait that ``watch_deadline`` bounds. None while it does not wait for it."""
    reason: str | None = None
    """While the job pends: Slurm's reason, as the last poll saw it (a UI shows it in words)."""
    expected_start: str | None = None
    """While the job pends: when Slurm expects it to start, as the last poll saw it."""
    polled_at: float | None = None
    """When (epoch seconds) the watch last had an answer from the cluster: what a UI shows is that old."""
    maintenance: str | None = None
    """While the job pends for a maintenance reservation: the window(s) it waits out, in words."""
    person_since: float | None = None
    """Since when (epoch seconds) the login has waited for a person: the start of the wait that
    ``watch_deadline`` bounds. None while the login needs nobody."""


async def recall_watch(key: TaskKey, job_id: str, log_path: str | None) -> WatchNote:
    """What an earlier trigger of this try noted about watching ``job_id`` (nothing: a fresh note)."""
    from airflow.sdk.execution_time.xcom import XCom

    note = await XCom.aget_one(key=WATCH_XCOM_KEY, dag_id=key.dag_id, task_id=key.task_id, run_id=key.run_id,
                               map_index=key.map_index)
    if isinstance(note, dict) and note.get("job_id") == job_id and note.get("log_path") == log_path:
        since, waiting, polled = note.get("unreachable_since"), note.get("allocation_since"), note.get("polled_at")
        person = note.get("person_since")
        return WatchNote(int(note.get("log_offset") or 0), note.get("state"), int(note.get("err_offset") or 0),
                         unreachable_since=float(since) if isinstance(since, (int, float)) else None,
                         allocation_since=float(waiting) if isinstance(waiting, (int, float)) else None,
                         polled_at=float(polled) if isinstance(polled, (int, float)) else None,
                         person_since=float(person) if isinstance(person, (int, float)) else None)
    return WatchNote()


async def remember_watch(key: TaskKey, job_id: str, log_path: str | None, note: WatchNote) -> None:
    from airflow.sdk.execution_time.xcom import XCom

    await XCom.aset(WATCH_XCOM_KEY, {"job_id": job_id, "log_path": log_path, "log_offset": note.log_offset,
                                     "state": note.state, "err_offset": note.err_offset,
                                     "unreachable_since": note.unreachable_since,
                                     "allocation_since": note.allocation_since, "reason": note.reason,
                                     "expected_start": note.expected_start, "polled_at": note.polled_at,
                                     "maintenance": note.maintenance, "person_since": note.person_since},
                    dag_id=key.dag_id, task_id=key.task_id, run_id=key.run_id, map_index=key.map_index)


async def task_state(key: TaskKey) -> str | None:
    """The task instance's current state as Airflow's API reports it (None: no state, e.g. cleared)."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    states = await asyncio.to_thread(
        RuntimeTaskInstance.get_task_states, dag_id=key.dag_id, task_ids=[key.task_id], run_ids=[key.run_id],
        map_index=key.map_index if key.map_index >= 0 else None)
    of_run = (states or {}).get(key.run_id, {})
    name = key.task_id if key.map_index < 0 else f"{key.task_id}_{key.map_index}"
    state = of_run.get(name)
    return None if state is None else str(getattr(state, "value", state))


async def recall_followed(key: TaskKey, job_id: str) -> list[dict[str, Any]]:
    """The followed files (``FollowedFile.to_json``) an earlier trigger of this try kept for ``job_id``."""
    from airflow.sdk.execution_time.xcom import XCom

    from slurm_provider.watch.followed_files import FOLLOW_XCOM_KEY

    kept = await XCom.aget_one(key=FOLLOW_XCOM_KEY, dag_id=key.dag_id, task_id=key.task_id, run_id=key.run_id,
                               map_index=key.map_index)
    if isinstance(kept, dict) and kept.get("job_id") == job_id and isinstance(kept.get("files"), list):
        return [f for f in kept["files"] if isinstance(f, dict)]
    return []


async def remember_followed(key: TaskKey, job_id: str, files: list[dict[str, Any]]) -> None:
    from airflow.sdk.execution_time.xcom import XCom

    from slurm_provider.watch.followed_files import FOLLOW_XCOM_KEY

    await XCom.aset(FOLLOW_XCOM_KEY, {"job_id": job_id, "files": files}, dag_id=key.dag_id, task_id=key.task_id,
                    run_id=key.run_id, map_index=key.map_index)
