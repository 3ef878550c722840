"""What a trigger keeps and asks about its task: which task states mean "stop the job", and the task key."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slurm_provider.watch.notes import ENDED_BY_A_PERSON, TaskKey, ended_by_a_person


@pytest.mark.parametrize("state", ["failed", "success", "skipped", "upstream_failed", "removed"])
def test_a_task_ended_by_a_person_stops_its_job(state: str) -> None:
    assert ended_by_a_person(state)


@pytest.mark.parametrize("state", [None, "scheduled", "queued", "running", "restarting", "up_for_retry",
                                   "deferred", "up_for_reschedule"])
def test_a_cleared_retried_or_still_deferred_task_keeps_its_job(state: str | None) -> None:
    # None/scheduled/queued/running: the task was cleared and its next try adopts the job;
    # deferred: the trigger only moved to another triggerer.
    assert not ended_by_a_person(state)


def test_the_stopping_states_are_airflow_task_states() -> None:
    from airflow.utils.state import TaskInstanceState

    assert ENDED_BY_A_PERSON <= {s.value for s in TaskInstanceState}


def test_task_key_of_the_triggers_task_instance() -> None:
    assert TaskKey.of(None) is None
    ti = SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=None)
    assert TaskKey.of(ti) == TaskKey("d", "t", "r", -1)
    assert TaskKey.of(SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=3)).map_index == 3


def test_a_restarted_triggerer_recalls_how_long_the_job_waited_for_its_allocation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The note goes into an XCom of the task try and comes back whole (here Airflow's XCom store is a dict)."""
    import asyncio

    from airflow.sdk.execution_time.xcom import XCom

    from slurm_provider.watch.notes import TaskKey, WatchNote, recall_watch, remember_watch

    stored: dict[str, object] = {}

    async def aset(key: str, value: object, **where: object) -> None:
        stored[key] = value

    async def aget_one(key: str, **where: object) -> object:
        return stored.get(key)

    monkeypatch.setattr(XCom, "aset", aset, raising=False)
    monkeypatch.setattr(XCom, "aget_one", aget_one, raising=False)
    task = TaskKey("d", "t", "r")
    note = WatchNote(log_offset=10, state="PENDING", err_offset=3, allocation_since=1_795_000_000.5)
    asyncio.run(remember_watch(task, "42", "/logs/x.out", note))
    assert asyncio.run(recall_watch(task, "42", "/logs/x.out")) == note
    assert asyncio.run(recall_watch(task, "43", "/logs/x.out")) == WatchNote()  # another job: a fresh note
    del stored["slurm_watch"]["allocation_since"]  # noted before the field existed
    assert asyncio.run(recall_watch(task, "42", "/logs/x.out")).allocation_since is None
