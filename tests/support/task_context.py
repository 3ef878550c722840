"""Stand-ins for what Airflow hands `execute()`: a task try, its task state store and its DAG run.

Tests that drive `SlurmSubmitOperator.execute()` directly against the real cluster (as a retried,
cleared or concurrent task try would call it) build the context from these.
"""

from __future__ import annotations

from typing import Any


class StateStore:
    """What `context["task_state_store"]` offers: survives task tries of one task instance."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        self.data[key] = value

    def keeping(self, *keys: str) -> "StateStore":
        """A store with only ``keys`` of this one: what survives when a try dies after writing them."""
        kept = StateStore()
        kept.data = {k: v for k, v in self.data.items() if k in keys}
        return kept


class TaskTry:
    def __init__(self, run_id: str, try_number: int = 1, *, dag_id: str, task_id: str) -> None:
        self.dag_id, self.task_id, self.run_id = dag_id, task_id, run_id
        self.try_number, self.map_index = try_number, -1
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


class DagRun:
    def __init__(self, clear_number: int) -> None:
        self.clear_number = clear_number


def task_context(run_id: str, store: StateStore, *, dag_id: str, task_id: str, try_number: int = 1,
                 clear_number: int = 0) -> dict[str, Any]:
    """The context of one try of task ``dag_id.task_id`` in DAG run ``run_id``."""
    return {"ti": TaskTry(run_id, try_number, dag_id=dag_id, task_id=task_id), "task_state_store": store,
            "dag_run": DagRun(clear_number)}
