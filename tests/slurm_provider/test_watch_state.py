"""What a trigger keeps and asks about its task: which task states mean "stop the job", and the task key."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slurm_provider.watch_state import ENDED_BY_A_PERSON, TaskKey, ended_by_a_person


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
