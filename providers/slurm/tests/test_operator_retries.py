"""Task retries: on by default, set per DAG or per task, and only ever for a lost watch.

A lost watch (the trigger gave up on SSH, the job vanished from view, the worker died) raises a
plain ``AirflowException``, which Airflow retries, and the retry adopts the job. A job that itself
ended badly raises ``AirflowFailException``, which Airflow never retries, so a broken job is never
submitted again behind anyone's back. The cluster here is the fake Slurm of tests/support/fake_slurm.py
under the real hook; tests/deploy/test_gestures.py shows both halves in a running deployment.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from airflow.exceptions import TaskDeferred
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from support.fake_slurm import FakeSlurm, install
from slurm_provider.operators import HISTORY_KEY, SlurmSubmitOperator, job_name_for
from slurm_provider.resubmission import Submission, SubmissionHistory
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.job_status import JobStatus
from slurm_provider.transport import AuthenticationFailed, TransportUnavailable
from slurm_provider.triggers import ERROR, FINISHED, LOST, NEVER_STARTS
from slurm_provider.job_task import naming, submission

RUN_ID = "manual__retries"
NAME = job_name_for("retries", "train", RUN_ID)


def _cluster(monkeypatch: pytest.MonkeyPatch, *statuses: JobStatus) -> FakeSlurm:
    """The fake Slurm under every hook the operator builds, holding a job for each status."""
    fake = install(monkeypatch)
    for status in statuses:
        fake.add(status.job_id, status.name or NAME, state=status.state.value, reason=status.reason,
                 exit_code=status.exit_code or 0, signal=status.signal or 0, cancelled_by=status.cancelled_by)
    return fake


def _cancelled(fake: FakeSlurm) -> list[str]:
    """The jobs scancel was asked to cancel, in order."""
    return [asked.line.split()[-1] for asked in fake.asked if asked.verb == "scancel"]


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
    kwargs.setdefault("resubmit_budgets", {"TIMEOUT": 0})
    return SlurmSubmitOperator(task_id="train", conn_id="c", script="#!/bin/bash\ntrue\n",
                               log_dir="/srv/logs", **kwargs)


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
    cluster = _cluster(monkeypatch, _status("101", SlurmState.RUNNING))
    with pytest.raises(AirflowException) as raised:
        _operator().execute_complete(_context(1, "101"), _event(kind, None, message))
    assert not isinstance(raised.value, AirflowFailException)
    assert message in str(raised.value) and "retry of this task" in str(raised.value)
    assert cluster.submitted == [] and _cancelled(cluster) == []


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
    cluster = _cluster(monkeypatch, ended)
    with pytest.raises(AirflowFailException, match=says):
        _operator().execute_complete(_context(1, "101"), _event(FINISHED, ended))
    assert cluster.submitted == []


def test_a_job_that_can_never_start_is_cancelled_and_fails_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    pending = _status("101", SlurmState.PENDING, reason="AssocGrpBillingMinutes")
    cluster = _cluster(monkeypatch, pending)
    with pytest.raises(AirflowFailException, match="Job 101 was cancelled"):
        _operator().execute_complete(_context(1, "101"),
                                     _event(NEVER_STARTS, pending, "job 101 will not start"))
    assert _cancelled(cluster) == ["101"] and cluster.job(101).state == "CANCELLED"


@pytest.mark.parametrize("event", [{"kind": FINISHED}, {**_event("exploded", None)}])
def test_an_event_the_operator_cannot_read_fails_for_good(event: dict[str, Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _cluster(monkeypatch)
    with pytest.raises(AirflowFailException):
        _operator().execute_complete(_context(1, "101"), event)


def test_a_retry_adopts_the_job_its_lost_watch_left_running(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = _cluster(monkeypatch, _status("101", SlurmState.RUNNING))
    with pytest.raises(TaskDeferred) as deferred:
        _operator().execute(_context(2, "101"))
    assert deferred.value.trigger.job_id == "101" and cluster.submitted == []


def test_the_watch_deadline_reaches_the_trigger_and_must_be_a_positive_number(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _cluster(monkeypatch, _status("101", SlurmState.PENDING))
    with pytest.raises(TaskDeferred) as deferred:
        _operator().execute(_context(2, "101"))
    assert deferred.value.trigger.schedule.watch_deadline == 86400.0  # a day unless said otherwise
    with pytest.raises(TaskDeferred) as deferred:
        _operator(watch_deadline=7200).execute(_context(2, "101"))
    assert deferred.value.trigger.serialize()[1]["schedule"]["watch_deadline"] == 7200.0
    for bad in (0, -5, "1 day", True):
        with pytest.raises(AirflowFailException, match="watch_deadline: must be a positive number of seconds"):
            _operator(watch_deadline=bad).execute(_context(2, "101"))


@pytest.mark.parametrize("state", [SlurmState.FAILED, SlurmState.CANCELLED, SlurmState.OUT_OF_MEMORY])
def test_a_retry_that_finds_its_job_ended_badly_fails_instead_of_submitting_again(
        state: SlurmState, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = _cluster(monkeypatch, _status("101", state, exit_code=1))
    with pytest.raises(AirflowFailException, match=f"Slurm job 101 ended {state.value}"):
        _operator().execute(_context(2, "101"))
    assert cluster.submitted == []


def test_a_retry_whose_job_the_cluster_forgot_submits_it_again(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = _cluster(monkeypatch)  # neither squeue nor sacct knows job 101 any more
    context = _context(2, "101")
    with pytest.raises(TaskDeferred) as deferred:
        _operator().execute(context)
    assert cluster.submitted == [deferred.value.trigger.job_id]
    assert [s["cause"] for s in context["task_state_store"][HISTORY_KEY]] == ["initial", "retry"]


def test_sbatch_refusing_the_job_fails_for_good_and_a_login_failure_is_retried(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = _cluster(monkeypatch)
    cluster.refuse_submits("Batch job submission failed: Invalid account or account/partition combination")
    with pytest.raises(AirflowFailException, match="sbatch refused"):
        _operator().execute(_context())
    cluster.fail_submits(AuthenticationFailed("password expired"))
    with pytest.raises(AirflowException) as raised:
        _operator().execute(_context())
    assert not isinstance(raised.value, AirflowFailException)  # a person may fix the login before the retry


# --- a batch script killed from outside is an interruption ---------------------------------------------


def _record_path(context: dict[str, Any], job_id: str) -> str:
    from slurm_provider.watch.end_records import end_record_path

    return end_record_path(naming.log_path(_operator(), context, job_id))


def test_a_script_killed_before_it_could_end_is_resubmitted_as_an_interruption(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """FAILED with signal 9 and no exit record of the run (an administrator's kill, a controller that
    lost the job's start): resubmitted within the KILLED budget, the cause in the task log."""
    killed = _status("101", SlurmState.FAILED, exit_code=0, signal=9)
    cluster = _cluster(monkeypatch, killed)
    context = _context(1, "101")
    with pytest.raises(TaskDeferred) as deferred:
        _operator(writes_end_record=True, resubmit_budgets={"KILLED": 1}).execute_complete(
            context, _event(FINISHED, killed))
    assert cluster.submitted == [deferred.value.trigger.job_id]
    assert [s["cause"] for s in context["task_state_store"][HISTORY_KEY]] == ["initial", "KILLED"]
    out = capsys.readouterr().out
    assert "Job 101 ended FAILED of signal 9 before its script could end (no exit record of the run)" in out
    assert "resubmitting after KILLED (1 of 1)" in out


@pytest.mark.parametrize("case", ["record-of-the-run", "script-writes-none", "no-signal", "budget-used-up",
                                  "killed-for-its-memory"])
def test_a_failure_that_is_not_a_kill_from_outside_fails_for_good(case: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    ended = _status("101", SlurmState.FAILED, exit_code=0 if case != "no-signal" else 1,
                    signal=9 if case != "no-signal" else 0)
    cluster = _cluster(monkeypatch, ended)
    context = _context(1, "101")
    if case == "record-of-the-run":  # the script ended on its own and said so
        cluster.table.files[_record_path(context, "101")] = "job=101 restart=0 exit=137 end=1764218000 requeued=0\n"
    if case == "killed-for-its-memory":  # Slurm's own memory enforcement killed the whole job
        cluster.table.files[naming.log_path(_operator(), context, "101", stream="err")] = (
            "slurmstepd: error: Exceeded job memory limit\n")
    budgets = {"KILLED": 0 if case == "budget-used-up" else 1}
    with pytest.raises(AirflowFailException, match="ended FAILED"):
        _operator(writes_end_record=case != "script-writes-none", resubmit_budgets=budgets).execute_complete(
            context, _event(FINISHED, ended))
    assert cluster.submitted == []


def test_a_job_failed_for_its_nodes_fault_is_resubmitted_leaving_the_node_out_after_a_back_off(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 89 (the script found its container runtime broken) on nid005001, with bad nodes left out
    for an hour: the next job is submitted with --exclude=nid005001 and --begin, and says why."""
    from slurm_provider.cli.sbatch import JobComment

    ours = JobComment(dag="retries", task="train", run=RUN_ID, attempt=1).to_json()
    faulted = _status("101", SlurmState.FAILED, exit_code=89, node_list="nid005001")
    cluster = _cluster(monkeypatch)
    cluster.add("101", NAME, state="FAILED", exit_code=89, node="nid005001", comment=ours)
    cluster.add("99", "someone-elses", state="NODE_FAIL", node="nid005002")  # also this user's: a node failure
    context = _context(1, "101")
    op = _operator(leave_out_bad_nodes_for=timedelta(hours=1), node_fault_exit_codes=(89,),
                   node_fault_first_retry=30, resubmit_budgets={"NODE_FAULT": 1})
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete(context, _event(FINISHED, faulted))
    job = cluster.job(deferred.value.trigger.job_id)
    assert (job.excluded, job.begin) == (("nid005001", "nid005002"), "now+30")
    assert [s["cause"] for s in context["task_state_store"][HISTORY_KEY]] == ["initial", "NODE_FAULT"]
    out = capsys.readouterr().out
    assert "Job 101 failed with exit code 89 on nid005001, which says its node is at fault" in out
    assert "resubmitting after NODE_FAULT (1 of 1)" in out
    assert ("Leaving out nid005001, nid005002 (sbatch --exclude): this project's jobs failed there for the "
            "node's fault in the last 1 h: nid005001 (job 101 ended exit 89 at ") in out
    assert f"Job {job.job_id} may start 30 s from now at the earliest (sbatch --begin)" in out

    # the same end, with bad nodes never left out: the job's own failure, not resubmitted
    cluster.table.jobs.pop(job.job_id)
    with pytest.raises(AirflowFailException, match="ended FAILED"):
        _operator(resubmit_budgets={"NODE_FAULT": 1}, node_fault_exit_codes=(89,)).execute_complete(
            _context(1, "101"), _event(FINISHED, faulted))


def test_a_node_faults_back_off_doubles_per_such_resubmission_and_sbatch_refusing_the_exclusion_runs_anywhere(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    op = _operator(leave_out_bad_nodes_for=3600, node_fault_first_retry=60)
    history = SubmissionHistory([Submission("1", 1, "initial", 1), Submission("2", 2, "NODE_FAIL", 1),
                                 Submission("3", 3, "TIMEOUT", 1), Submission("4", 4, "NODE_FAULT", 1)])
    assert [submission.node_fault_back_off(op, history, cause) for cause in ("NODE_FAULT", "BOOT_FAIL", "TIMEOUT")] == \
        [240, 240, 0]
    assert submission.node_fault_back_off(_operator(node_fault_first_retry=0), history, "NODE_FAIL") == 0
    with pytest.raises(AirflowFailException, match="leave_out_bad_nodes_for"):
        _operator(leave_out_bad_nodes_for=-1).execute(_context())

    # three nodes failed, the newest last; the partition can spare one node for the job, not more
    cluster = _cluster(monkeypatch)
    for job_id, node in (("97", "nid005001"), ("98", "nid005003"), ("99", "nid005002")):
        cluster.add(job_id, "x", state="NODE_FAIL", node=node)
        cluster.table.tick()
    cluster.table.most_left_out = 1
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(_context())
    tried = [a.line for a in cluster.asked if a.verb == "sbatch" and "--exclude=" in a.line]
    asked = [w.split("=", 1)[1] for c in tried for w in c.split() if w.startswith("--exclude=")]
    assert asked == ["nid005002,nid005003,nid005001", "nid005002,nid005003", "nid005002", "nid005002"], tried
    assert ["--test-only" in c for c in tried] == [True, True, True, False]  # asked first, then submitted once
    assert cluster.job(deferred.value.trigger.job_id).excluded == ("nid005002",)  # the newest fault stays out
    assert not [j for j in cluster.table.jobs.values() if j.name == NAME and j.state == "FAILED"]  # no refusal kept
    out = capsys.readouterr().out
    assert f"Slurm cannot place {NAME} leaving out nid005002, nid005003, nid005001 (" in out
    assert "nid005001 goes back in" in out and "nid005003 goes back in" in out

    # where the check could not be made (the connection dropped), the refused submission itself puts
    # nodes back, oldest first
    cluster = _cluster(monkeypatch)
    for job_id, node in (("97", "nid005001"), ("99", "nid005002")):
        cluster.add(job_id, "x", state="NODE_FAIL", node=node)
        cluster.table.tick()
    cluster.table.most_left_out = 1

    def dropped_on_test_only(fake: FakeSlurm) -> None:
        if "--test-only" in fake.asked[-1].line:
            raise TransportUnavailable("connection reset by peer")

    cluster.before_each = dropped_on_test_only
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(_context())
    assert cluster.job(deferred.value.trigger.job_id).excluded == ("nid005002",)
    assert f"sbatch refused {NAME} leaving out nid005002, nid005001 (" in capsys.readouterr().out


def test_the_node_of_the_job_that_just_failed_is_left_out_before_accounting_lists_its_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """slurmdbd may record a job's end seconds after squeue shows it: the fault the task saw counts anyway."""
    faulted = _status("101", SlurmState.FAILED, exit_code=87, node_list="nid005003")
    cluster = _cluster(monkeypatch)
    cluster.add("101", NAME, state="FAILED", exit_code=87, node="nid005003", in_sacct=False)
    with pytest.raises(TaskDeferred) as deferred:
        _operator(leave_out_bad_nodes_for=600, node_fault_exit_codes=(87,), node_fault_first_retry=0,
                  resubmit_budgets={"NODE_FAULT": 1}).execute_complete(_context(1, "101"), _event(FINISHED, faulted))
    job = cluster.job(deferred.value.trigger.job_id)
    assert (job.excluded, job.begin) == (("nid005003",), None)


def test_the_same_node_fault_exit_on_two_nodes_is_the_jobs_environment_and_fails_for_good(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 87 (GPUs missing) on nid005001, then again on nid005002 after leaving the first out: every
    node shows it, so it is the job's environment (a site image without its GPU libraries)."""
    cluster = _cluster(monkeypatch)
    cluster.add("100", NAME, state="FAILED", exit_code=87, node="nid005001")
    cluster.add("101", NAME, state="FAILED", exit_code=87, node="nid005002")
    context = _context(1, "100", "101")
    again = _status("101", SlurmState.FAILED, exit_code=87, node_list="nid005002")
    with pytest.raises(AirflowFailException, match="ended FAILED"):
        _operator(leave_out_bad_nodes_for=3600, node_fault_exit_codes=(87,),
                  resubmit_budgets={"NODE_FAULT": 5}).execute_complete(context, _event(FINISHED, again))
    assert cluster.submitted == []
    assert ("Job 101 failed with exit code 87 on nid005002, as job 100 did on nid005001: not a node's fault but "
            "the job's, not resubmitted") in capsys.readouterr().out
