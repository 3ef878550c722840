"""A login node that does not answer while the operator itself talks to the cluster.

The task defers on ``SlurmLoginTrigger`` instead of failing (no retry spent, no worker slot held),
starts its step over when the node answers and adopts what it submitted; past ``watch_deadline``
it fails retryably. The fast tests run the real ``SlurmHook`` on the fake Slurm of
tests/support/fake_slurm.py; the last one stops a
private login sshd of the local cluster under a real task and its real job.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from airflow.exceptions import TaskDeferred
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from slurm_provider.hooks import SlurmCommandFailed, SlurmUnavailable, SubmitLockBusy
from slurm_provider.job_status import JobStatus
from slurm_provider.login_wait import REACHABLE, SlurmLoginTrigger
from slurm_provider.operators import SlurmSubmitOperator
from slurm_provider.watch.outage import STEP_FAILURES_WHILE_REACHABLE
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.transport import HostKeyRejected, TransportTimeout, TransportUnavailable
from slurm_provider.triggers import ERROR, FINISHED, SlurmJobTrigger
from providers.slurm.tests.test_operator_retries import _cluster, _context, _event, _operator, _status
from support.fake_slurm import FakeSlurm, install

DOWN = TransportUnavailable("cannot reach vcloud@lumi:22 (connection 'c'): ConnectionRefusedError")


def _down_cluster(monkeypatch: pytest.MonkeyPatch, *statuses: JobStatus,
                  down: BaseException | None = DOWN) -> FakeSlurm:
    """The fake Slurm holding a job for each status, whose every command fails with ``down`` while it is set."""
    cluster = _cluster(monkeypatch, *statuses)
    cluster.down = down
    return cluster


def _lookups(cluster: FakeSlurm) -> int:
    """How often the operator looked for its job by name (one squeue by name each, answered or not)."""
    return sum(1 for asked in cluster.asked if asked.verb == "squeue" and "--name=" in asked.line)


def _deferred_on_login_wait(call: Any) -> SlurmLoginTrigger:
    with pytest.raises(TaskDeferred) as deferred:
        call()
    assert deferred.value.method_name == "execute_after_outage"
    assert isinstance(deferred.value.trigger, SlurmLoginTrigger)
    return deferred.value.trigger


def _reachable(trigger: SlurmLoginTrigger, tries: int = 3) -> dict[str, Any]:
    return {"kind": REACHABLE, "conn_id": trigger.conn_id, "since": trigger.since, "tries": tries,
            "message": "login node of c reachable again after 40 min", "carry": {}}


def test_a_retry_that_meets_the_outage_waits_for_the_login_node_and_then_adopts_its_job(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = _down_cluster(monkeypatch, _status("101", SlurmState.RUNNING))
    context = _context(2, "101")
    before = time.time()
    wait = _deferred_on_login_wait(lambda: _operator(watch_deadline=timedelta(hours=6)).execute(context))
    assert before <= wait.since <= time.time()
    assert (wait.conn_id, wait.cause, wait.watch_deadline, wait.tries) == ("c", str(DOWN), 6 * 3600.0, 0)
    assert cluster.submitted == []

    cluster.down = None  # maintenance over: a fresh operator resumes, as Airflow resumes a deferred task
    with pytest.raises(TaskDeferred) as watching:
        _operator().execute_after_outage(context, _reachable(wait))
    assert isinstance(watching.value.trigger, SlurmJobTrigger) and watching.value.trigger.job_id == "101"
    assert cluster.submitted == []


def test_the_first_try_submits_once_the_login_node_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = _down_cluster(monkeypatch)
    context = _context(1)
    wait = _deferred_on_login_wait(lambda: _operator().execute(context))
    cluster.down = None
    with pytest.raises(TaskDeferred) as watching:
        _operator().execute_after_outage(context, _reachable(wait))
    assert cluster.submitted == [watching.value.trigger.job_id]


def test_a_submit_whose_answer_was_lost_adopts_the_job_after_the_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurm_provider.operators.time.sleep", lambda seconds: None)
    cluster = install(monkeypatch, FakeSlurm(first_id=555))
    # sbatch accepts the job, then the login node goes away before its answer arrives
    cluster.lose_submit_answers(TransportTimeout("command on vcloud@lumi:22 did not finish within the timeout"),
                                then_down=DOWN)
    context = _context(1)
    wait = _deferred_on_login_wait(lambda: _operator().execute(context))
    assert _lookups(cluster) == 1 + 5  # one look before sbatch, five after its answer was lost, then the wait
    cluster.down = None
    with pytest.raises(TaskDeferred) as watching:
        _operator().execute_after_outage(context, _reachable(wait))
    assert watching.value.trigger.job_id == "555" and cluster.submitted == ["555"], "adopted, not submitted twice"
    assert cluster.verbs.count("sbatch") == 1


def test_reading_how_the_job_ended_waits_for_the_login_node_too(monkeypatch: pytest.MonkeyPatch) -> None:
    done = _status("101", SlurmState.COMPLETED, exit_code=0)
    cluster = _down_cluster(monkeypatch, done)
    context = _context(1, "101")
    wait = _deferred_on_login_wait(lambda: _operator().execute_complete(context, _event(FINISHED, done)))
    cluster.down = None
    summary = _operator().execute_after_outage(context, _reachable(wait))
    assert (summary["job_id"], summary["state"], summary["job_ids"]) == ("101", "COMPLETED", ["101"])


def test_an_outage_that_outlasts_the_deadline_fails_the_try_retryably(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = _down_cluster(monkeypatch, _status("101", SlurmState.RUNNING))
    context = _context(2, "101")
    # the login wait's own end: its event says why
    with pytest.raises(AirflowException) as ended:
        _operator().execute_after_outage(context, {"kind": ERROR, "message": "login node of c unreachable since "
                                                   "14:02 UTC, longer than watch_deadline (24 h)"})
    assert not isinstance(ended.value, AirflowFailException)
    assert "A retry of this task adopts any job it submitted" in str(ended.value)
    # ... and a node that answered the probe but not the step, with the deadline gone meanwhile
    since = time.time() - 7200
    with pytest.raises(AirflowException) as late:
        _operator(watch_deadline=3600).execute_after_outage(
            context, {"kind": REACHABLE, "since": since, "tries": 9, "message": "reachable again"})
    assert not isinstance(late.value, AirflowFailException)
    assert "longer than watch_deadline (1 h)" in str(late.value)


def test_a_wait_that_meets_the_outage_again_keeps_its_start_and_its_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    _down_cluster(monkeypatch, _status("101", SlurmState.RUNNING),
                                                        down=SlurmCommandFailed("sacct exited 1: slurmdbd down"))
    since = time.time() - 600
    again = _deferred_on_login_wait(lambda: _operator().execute_after_outage(
        _context(2, "101"), {"kind": REACHABLE, "since": since, "tries": 7, "message": "reachable again"}))
    assert (again.since, again.tries) == (since, 7)


def test_a_step_that_keeps_failing_while_the_login_node_answers_fails_the_try_instead_of_waiting_a_day(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A command that runs and fails (a file the login user may not read, output that cannot be parsed)
    is not an outage: after the login node answered scontrol ping, the step gets
    STEP_FAILURES_WHILE_REACHABLE tries, then the task fails with the error, long before watch_deadline."""
    cause = SlurmCommandFailed("file size check printed '0 '")
    _down_cluster(monkeypatch, down=cause)
    context = _context(1)
    wait = _deferred_on_login_wait(lambda: _operator().execute(context))
    assert wait.carry == {"failures_while_reachable": 0}
    assert "a command on the login node of c failed (file size check printed '0 ')" in capsys.readouterr().out
    counts = []
    for _ in range(STEP_FAILURES_WHILE_REACHABLE - 1):
        wait = _deferred_on_login_wait(lambda: _operator().execute_after_outage(
            context, {**_reachable(wait), "carry": wait.carry}))
        counts.append(wait.carry["failures_while_reachable"])
    assert counts == list(range(1, STEP_FAILURES_WHILE_REACHABLE))
    with pytest.raises(AirflowException) as failed:
        _operator().execute_after_outage(context, {**_reachable(wait), "carry": wait.carry})
    assert not isinstance(failed.value, AirflowFailException)
    assert (f"answers scontrol ping, but this step failed {STEP_FAILURES_WHILE_REACHABLE} times in a row right "
            "after it did; last error: file size check printed '0 '") in str(failed.value)


@pytest.mark.parametrize("down", [
    DOWN,
    # slurmdbd restarting: sacct cannot answer though scontrol ping does. Slurm is away, not wrong.
    SlurmUnavailable("sacct exited 1: sacct: error: Problem talking to the database: Connection refused"),
], ids=["connection-breaks", "accounting-away"])
def test_what_breaks_again_after_the_node_answered_is_still_an_outage_however_often(
        down: BaseException, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never counted as a step failing while the login node answers: waited out up to the deadline."""
    _down_cluster(monkeypatch, down=down)
    context = _context(1)
    wait = _deferred_on_login_wait(lambda: _operator().execute(context))
    for _ in range(STEP_FAILURES_WHILE_REACHABLE + 2):
        wait = _deferred_on_login_wait(lambda: _operator().execute_after_outage(
            context, {**_reachable(wait), "carry": wait.carry}))
    assert wait.carry == {"failures_while_reachable": 0}


def test_a_host_key_or_login_problem_is_not_waited_for_but_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = _down_cluster(monkeypatch, _status("101", SlurmState.RUNNING), down=HostKeyRejected("host key of lumi changed"))
    with pytest.raises(AirflowException) as raised:
        _operator().execute(_context(2, "101"))
    assert not isinstance(raised.value, (AirflowFailException, TaskDeferred))
    assert "cannot use the cluster connection c: host key of lumi changed" in str(raised.value)


def test_a_busy_submit_lock_is_retried_by_airflow_and_submits_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurm_provider.operators.time.sleep", lambda seconds: None)
    busy = SubmitLockBusy("another submit holds /scratch/run/stage0/.slurm-submit.lock: nothing was submitted")
    cluster = _down_cluster(monkeypatch, down=None)
    cluster.fail_submits(busy)
    with pytest.raises(AirflowException) as raised:
        _operator().execute(_context(1))
    assert not isinstance(raised.value, AirflowFailException)
    assert "a retry of this task submits it again" in str(raised.value) and cluster.submitted == []


def test_the_watch_gets_the_tasks_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    _down_cluster(monkeypatch, _status("101", SlurmState.RUNNING), down=None)
    with pytest.raises(TaskDeferred) as watching:
        _operator(watch_deadline=timedelta(hours=3)).execute(_context(2, "101"))
    assert watching.value.trigger.serialize()[1]["schedule"]["watch_deadline"] == 3 * 3600.0


# --- the real thing: a private login sshd of the local cluster stopped under a task and its job ------


@pytest.fixture
def private_login(local_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from support.private_login import PrivateLogin

    login = PrivateLogin(local_cluster, tmp_path)
    for key, value in login.connection_env().items():
        monkeypatch.setenv(key, value)
    login.start()
    try:
        yield login
    finally:
        login.stop()


def test_a_task_that_meets_a_stopped_login_node_waits_for_it_and_adopts_its_job(
        local_cluster: Any, private_login: Any) -> None:
    from support.task_context import StateStore, task_context

    log_dir = local_cluster.test_dir()
    run_id = f"manual__outage_{uuid.uuid4().hex[:8]}"

    def operator() -> SlurmSubmitOperator:
        return SlurmSubmitOperator(task_id="train", conn_id=private_login.conn_id, log_dir=log_dir,
                                   script="#!/bin/bash\nsleep 300\n", time_limit="10", poll_interval=1,
                                   max_poll_interval=2, first_poll_delay=0)

    store = StateStore()
    with pytest.raises(TaskDeferred) as submitted:
        operator().execute(task_context(run_id, store, dag_id="outage", task_id="train"))
    job_id = submitted.value.trigger.job_id
    try:
        private_login.stop()
        # the worker was lost meanwhile: the retry finds the login node down
        retry = task_context(run_id, store, dag_id="outage", task_id="train", try_number=2)
        wait = _deferred_on_login_wait(lambda: operator().execute(retry))
        assert wait.cause.startswith(f"cannot reach vcloud@127.0.0.1:{private_login.port} ")

        async def wait_then_come_back() -> dict[str, Any]:
            waiting = asyncio.ensure_future(_first_event(wait))
            while wait.tries < 2:  # the trigger has found the node down, twice
                assert not waiting.done(), waiting.result()
                await asyncio.sleep(0.2)
            await asyncio.to_thread(private_login.start)
            return await asyncio.wait_for(waiting, 60)

        event = asyncio.run(asyncio.wait_for(wait_then_come_back(), 120))
        assert event["kind"] == REACHABLE and event["message"].startswith(
            f"login node of {private_login.conn_id} reachable again after ")
        with pytest.raises(TaskDeferred) as watching:
            operator().execute_after_outage(retry, event)
        assert watching.value.trigger.job_id == job_id, "the job submitted before the outage is adopted"
        assert [s["job_id"] for s in store.data["slurm_submissions"]] == [job_id]
    finally:
        private_login.start()
        local_cluster.ssh(f"scancel {job_id}", check=False)


async def _first_event(trigger: SlurmLoginTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return event.payload
    raise AssertionError("the login wait ended without an event")


# --- a controller that limits our calls: Debian's Slurm 22.05 has no rate limiter, so a squeue
# stand-in on the login node (first on the PATH of a private login sshd) refuses for a while --------

RATE_LIMITED_SQUEUE = """#!/bin/sh
# squeue as a rate-limited slurmctld answers it while ../refusals counts down; then the real one.
here=$(dirname "$0")/..
n=$(cat "$here/refusals" 2>/dev/null || echo 0)
if [ "$n" -gt 0 ]; then
    echo $((n - 1)) > "$here/refusals"
    echo "squeue: error: slurm_load_jobs error: Rate limit exceeded, please retry momentarily" >&2
    exit 1
fi
exec /usr/bin/squeue "$@"
"""


def test_slurms_rate_limit_slows_the_watch_down_and_the_task_still_succeeds_with_one_job(
        local_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import structlog.testing

    from support.private_login import PrivateLogin
    from slurm_provider.scheduler_calls import calls_of, forget_calls
    from support.task_context import StateStore, task_context

    work = local_cluster.test_dir()
    local_cluster.ssh(f"mkdir -p {work}/bin && cat > {work}/bin/squeue && chmod +x {work}/bin/squeue",
                      input=RATE_LIMITED_SQUEUE)
    ceiling = 0.5
    login = PrivateLogin(local_cluster, tmp_path, "vcloud_rate_limited", path_first=f"{work}/bin",
                         extra={"min_call_interval": ceiling})
    for key, value in login.connection_env().items():
        monkeypatch.setenv(key, value)
    login.start()
    run_id = f"manual__ratelimit_{uuid.uuid4().hex[:8]}"
    store = StateStore()
    refusals = 6

    def operator() -> SlurmSubmitOperator:
        return SlurmSubmitOperator(task_id="train", conn_id=login.conn_id, log_dir=work,
                                   script="#!/bin/bash\necho started; sleep 4; echo done\n", time_limit="5",
                                   poll_interval=1, max_poll_interval=4, first_poll_delay=0)

    def context() -> dict[str, Any]:
        return task_context(run_id, store, dag_id="ratelimit", task_id="train")

    job_id = None
    try:
        with pytest.raises(TaskDeferred) as submitted:
            operator().execute(context())
        trigger = submitted.value.trigger
        job_id = trigger.job_id
        local_cluster.ssh(f"echo {refusals} > {work}/refusals")  # from now on slurmctld refuses a while
        forget_calls(login.conn_id)

        async def watch() -> dict[str, Any]:
            async for event in trigger.run():
                return event.payload
            raise AssertionError("the watch ended without an event")

        with structlog.testing.capture_logs() as logs:
            event = asyncio.run(asyncio.wait_for(watch(), 300))
        calls = calls_of(login.conn_id)
        watched = list(calls.times)
        assert calls.rate_limited == refusals and calls.by_verb["squeue"] > refusals, calls.snapshot()
        summary = operator().execute_complete(context(), event)
    finally:
        login.stop()
        if job_id is not None:
            local_cluster.ssh(f"scancel {job_id}", check=False)

    assert (event["kind"], event["status"]["state"]) == (FINISHED, "COMPLETED")
    assert summary["state"] == "COMPLETED" and summary["job_id"] == job_id
    assert local_cluster.ssh(f"cat {work}/refusals").stdout.strip() == "0", "every refusal was met"
    told = [str(e["event"]) for e in logs if "asks for fewer calls" in str(e.get("event", ""))]
    assert len(told) == 1 and "Rate limit exceeded" in told[0] and told[0].endswith(f"job {job_id} is still watched")
    assert any(e.get("event") == f"Watching job {job_id} again on {login.conn_id}" for e in logs)
    assert all(later - earlier >= ceiling - 0.002 for earlier, later in zip(watched, watched[1:])), \
        "the connection's min_call_interval is kept"
    name = event["status"]["name"]
    jobs = local_cluster.root("sacct", "-X", "-n", "-P", "-o", "JobID", "-S", "now-1hour", f"--name={name}").stdout
    assert jobs.split() == [job_id], "one job: the refusals made nothing submit again"


def test_a_short_job_watch_that_meets_the_outage_hands_the_job_to_its_trigger(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurm_provider.operators.time.sleep", lambda seconds: None)
    cluster = _down_cluster(monkeypatch, down=None)
    cluster.go_down_after_submit(DOWN)  # sbatch answers, then the login node goes away while the task reads
    with pytest.raises(TaskDeferred) as watching:
        _operator(short_job_wait=30).execute(_context(1))
    assert isinstance(watching.value.trigger, SlurmJobTrigger), "the job's own trigger, not the login wait"
    assert [watching.value.trigger.job_id] == cluster.submitted

