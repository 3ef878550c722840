"""Task retries: on by default, set per DAG or per task, and only ever for a lost watch.

A lost watch (the trigger gave up on SSH, the job vanished from view, the worker died) raises a
plain ``AirflowException``, which Airflow retries, and the retry adopts the job. A job that itself
ended badly raises ``AirflowFailException``, which Airflow never retries, so a broken job is never
submitted again behind anyone's back. The cluster here is a recording stand-in for ``SlurmHook``
(pure decision logic); tests/deploy/test_gestures.py shows both halves in a running deployment.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from airflow.exceptions import TaskDeferred
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from support.hook_stand_in import HookStandIn
from slurm_provider import hooks
from slurm_provider.hooks import CancelResult
from slurm_provider.operators import HISTORY_KEY, SlurmSubmitOperator, job_name_for
from slurm_provider.cli.sbatch import SbatchRefused, SubmitResult
from slurm_provider.resubmission import Submission, SubmissionHistory
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.job_status import JobStatus
from slurm_provider.transport import AuthenticationFailed
from slurm_provider.triggers import ERROR, FINISHED, LOST, NEVER_STARTS

RUN_ID = "manual__retries"
NAME = job_name_for("retries", "train", RUN_ID)


class Cluster(HookStandIn):
    """Stands in for ``SlurmHook``: answers from a table of job statuses and records what was asked."""

    def __init__(self, *statuses: JobStatus, submit_error: Exception | None = None) -> None:
        self.jobs = {s.job_id: s for s in statuses}
        self.submit_error = submit_error
        self.submitted: list[str] = []
        self.cancelled: list[str] = []

    def statuses(self, job_ids: Any) -> dict[str, JobStatus]:
        return {j: self.jobs.get(j, JobStatus(j, SlurmState.UNKNOWN)) for j in map(str, job_ids)}

    def runs(self, job_id: Any) -> list[JobStatus]:
        return [self.jobs[str(job_id)]] if str(job_id) in self.jobs else []

    def find_jobs(self, name: str | None = None, **kwargs: Any) -> list[JobStatus]:
        return []

    def submit(self, script: str, **fields: Any) -> SubmitResult:
        if self.submit_error is not None:
            raise self.submit_error
        job_id = str(900 + len(self.submitted))
        self.submitted.append(job_id)
        return SubmitResult(job_id=job_id, cluster=None)

    def cancel(self, job_id: Any, signal: Any = None) -> CancelResult:
        self.cancelled.append(str(job_id))
        return CancelResult(str(job_id), None, 0, None)

    def file_sizes(self, paths: Any) -> dict[str, int]:
        return {}

    def read_log(self, path: str, offset: int = 0, max_bytes: int = 0) -> tuple[str, int]:
        return "", offset

    def read_file(self, path: str) -> str | None:
        return None


class StateStore(dict):
    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        self[key] = value


class TaskTry:
    dag_id, task_id, run_id, map_index = "retries", "train", RUN_ID, -1

    def __init__(self, try_number: int) -> None:
        self.try_number = try_number

    def xcom_push(self, key: str, value: Any) -> None:
        pass


class DagRun:
    clear_number = 0


def _status(job_id: str, state: SlurmState, **fields: Any) -> JobStatus:
    return JobStatus(job_id, state, raw_state=state.value, name=NAME, source="sacct", **fields)


def _context(try_number: int = 1, *submitted: str) -> dict[str, Any]:
    history = SubmissionHistory([Submission(j, n, "initial", 1) for n, j in enumerate(submitted, start=1)])
    store = StateStore({HISTORY_KEY: history.to_json()} if submitted else {})
    return {"ti": TaskTry(try_number), "task_state_store": store, "dag_run": DagRun()}


def _operator(**kwargs: Any) -> SlurmSubmitOperator:
    return SlurmSubmitOperator(task_id="train", conn_id="c", script="#!/bin/bash\ntrue\n",
                               log_dir="/srv/logs", resubmit_budgets={"TIMEOUT": 0}, **kwargs)


def _event(kind: str, status: JobStatus | None, message: str = "what the trigger saw") -> dict[str, Any]:
    return {"kind": kind, "job_id": "101", "status": status.to_event() if status else None,
            "message": message, "carry": {}}


# --- defaults, per DAG and per task -------------------------------------------------------------------


def test_job_tasks_retry_by_default_with_a_growing_delay() -> None:
    op = _operator()
    assert op.retries == 2
    assert op.retry_delay == timedelta(minutes=2) and op.retry_exponential_backoff == 2.0
    assert op.max_retry_delay == timedelta(minutes=30)


def test_a_dags_default_args_set_the_retries_and_a_task_argument_wins_over_them() -> None:
    with DAG("retry_defaults", schedule=None, start_date=datetime(2026, 1, 1),
             default_args={"retries": 5, "retry_delay": timedelta(seconds=7),
                           "retry_exponential_backoff": 0}):
        by_dag = _operator()
        by_task = SlurmSubmitOperator(task_id="other", conn_id="c", script="#!/bin/bash\ntrue\n",
                                      log_dir="/srv/logs", retries=0)
    assert by_dag.retries == 5 and by_dag.retry_delay == timedelta(seconds=7)
    assert by_dag.retry_exponential_backoff == 0
    assert by_dag.max_retry_delay == timedelta(minutes=30)  # not in default_args: the operator's default
    assert by_task.retries == 0 and by_task.retry_delay == timedelta(seconds=7)


def test_a_task_group_s_default_args_reach_the_operator_too() -> None:
    from airflow.sdk import TaskGroup

    with DAG("retry_group", schedule=None, start_date=datetime(2026, 1, 1)):
        with TaskGroup("jobs", default_args={"retries": 4}):
            op = _operator()
    assert op.retries == 4


# --- the split: a lost watch retries, a job that ended badly does not ----------------------------------


@pytest.mark.parametrize(("kind", "message"), [
    (ERROR, "cannot watch job 101 on c: connection refused"),
    (LOST, "job 101 is known neither to squeue nor to sacct after 6 polls"),
])
def test_a_lost_watch_fails_the_try_so_that_a_retry_adopts_the_job(kind: str, message: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster(_status("101", SlurmState.RUNNING))
    monkeypatch.setattr(hooks, "SlurmHook", cluster)
    with pytest.raises(AirflowException) as raised:
        _operator().execute_complete(_context(1, "101"), _event(kind, None, message))
    assert not isinstance(raised.value, AirflowFailException)
    assert message in str(raised.value) and "retry of this task" in str(raised.value)
    assert cluster.submitted == [] and cluster.cancelled == []


@pytest.mark.parametrize(("state", "fields", "says"), [
    (SlurmState.FAILED, {"exit_code": 3}, "ended FAILED"),
    (SlurmState.OUT_OF_MEMORY, {"exit_code": 0}, "ended OUT_OF_MEMORY"),
    (SlurmState.CANCELLED, {"cancelled_by": "1001"}, "Cancelled by uid/user 1001"),
    (SlurmState.DEADLINE, {}, "ended DEADLINE"),
    (SlurmState.TIMEOUT, {}, "Not resubmitted: resubmission budget for TIMEOUT used up"),
])
def test_a_job_that_ended_badly_fails_the_task_for_good(state: SlurmState, fields: dict[str, Any], says: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    ended = _status("101", state, **fields)
    cluster = Cluster(ended)
    monkeypatch.setattr(hooks, "SlurmHook", cluster)
    with pytest.raises(AirflowFailException, match=says):
        _operator().execute_complete(_context(1, "101"), _event(FINISHED, ended))
    assert cluster.submitted == []


def test_a_job_that_can_never_start_is_cancelled_and_fails_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    pending = _status("101", SlurmState.PENDING, reason="AssocGrpBillingMinutes")
    cluster = Cluster(pending)
    monkeypatch.setattr(hooks, "SlurmHook", cluster)
    with pytest.raises(AirflowFailException, match="Job 101 was cancelled"):
        _operator().execute_complete(_context(1, "101"),
                                     _event(NEVER_STARTS, pending, "job 101 will not start"))
    assert cluster.cancelled == ["101"]


@pytest.mark.parametrize("event", [{"kind": FINISHED}, {**_event("exploded", None)}])
def test_an_event_the_operator_cannot_read_fails_for_good(event: dict[str, Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks, "SlurmHook", Cluster())
    with pytest.raises(AirflowFailException):
        _operator().execute_complete(_context(1, "101"), event)


def test_a_retry_adopts_the_job_its_lost_watch_left_running(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster(_status("101", SlurmState.RUNNING))
    monkeypatch.setattr(hooks, "SlurmHook", cluster)
    with pytest.raises(TaskDeferred) as deferred:
        _operator().execute(_context(2, "101"))
    assert deferred.value.trigger.job_id == "101" and cluster.submitted == []


def test_the_watch_deadline_reaches_the_trigger_and_must_be_a_positive_number(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks, "SlurmHook", Cluster(_status("101", SlurmState.PENDING)))
    with pytest.raises(TaskDeferred) as deferred:
        _operator().execute(_context(2, "101"))
    assert deferred.value.trigger.watch_deadline == 86400.0  # a day unless said otherwise
    with pytest.raises(TaskDeferred) as deferred:
        _operator(watch_deadline=7200).execute(_context(2, "101"))
    assert deferred.value.trigger.serialize()[1]["watch_deadline"] == 7200.0
    for bad in (0, -5, "1 day", True):
        with pytest.raises(AirflowFailException, match="watch_deadline: must be a positive number of seconds"):
            _operator(watch_deadline=bad).execute(_context(2, "101"))


@pytest.mark.parametrize("state", [SlurmState.FAILED, SlurmState.CANCELLED, SlurmState.OUT_OF_MEMORY])
def test_a_retry_that_finds_its_job_ended_badly_fails_instead_of_submitting_again(
        state: SlurmState, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster(_status("101", state, exit_code=1))
    monkeypatch.setattr(hooks, "SlurmHook", cluster)
    with pytest.raises(AirflowFailException, match=f"Slurm job 101 ended {state.value}"):
        _operator().execute(_context(2, "101"))
    assert cluster.submitted == []


def test_a_retry_whose_job_the_cluster_forgot_submits_it_again(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster()  # neither squeue nor sacct knows job 101 any more
    monkeypatch.setattr(hooks, "SlurmHook", cluster)
    context = _context(2, "101")
    with pytest.raises(TaskDeferred) as deferred:
        _operator().execute(context)
    assert cluster.submitted == [deferred.value.trigger.job_id]
    assert [s["cause"] for s in context["task_state_store"][HISTORY_KEY]] == ["initial", "retry"]


def test_sbatch_refusing_the_job_fails_for_good_and_a_login_failure_is_retried(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks, "SlurmHook", Cluster(submit_error=SbatchRefused("Invalid account", "")))
    with pytest.raises(AirflowFailException, match="sbatch refused"):
        _operator().execute(_context())
    monkeypatch.setattr(hooks, "SlurmHook", Cluster(submit_error=AuthenticationFailed("password expired")))
    with pytest.raises(AirflowException) as raised:
        _operator().execute(_context())
    assert not isinstance(raised.value, AirflowFailException)  # a person may fix the login before the retry
