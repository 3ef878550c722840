"""A job the operator gives up on is cancelled, with the reason logged, unless it is kept for a person.

Unit tests of the decision with the real hook on the fake Slurm of tests/support (the real cluster runs are in
test_operator_lifecycle.py): which jobs are still in Slurm's queue when the task fails, what is
done with them, and what the failure message says.
"""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from slurm_provider.hooks import SlurmHook
from slurm_provider.operators import HISTORY_KEY, SlurmSubmitOperator, job_name_for
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.job_status import JobStatus
from slurm_provider.transport import TransportUnavailable
from slurm_provider.triggers import FINISHED, NEVER_STARTS
from support.fake_slurm import FakeSlurm
from support.task_context import StateStore, TaskTry, task_context

RUN_ID = "manual__give_up"
NAME = job_name_for("give_up", "train", RUN_ID)


def context() -> dict[str, Any]:
    return {"ti": TaskTry(RUN_ID, dag_id="give_up", task_id="train")}


def cluster(now: JobStatus | None, *, cancel_fails: bool = False,
            accounted: JobStatus | None = None) -> FakeSlurm:
    """The fake Slurm with job 42 as squeue shows it ``now``; ``accounted``: the run that ended, as
    sacct holds it, when Slurm has requeued the job since (it is pending again, and slurmdbd has no
    row of the new run yet)."""
    fake = FakeSlurm()
    if now is not None:
        fake.add(now.job_id, now.name or NAME, state=now.state.value, reason=now.reason,
                 exit_code=now.exit_code or 0)
    if accounted is not None and now is not None:
        fake.add(now.job_id, now.name or NAME, state="RUNNING")
        fake.requeue(now.job_id, reason=now.reason or "BeginTime", ended=accounted.state.value)
        fake.job(now.job_id).current_in_sacct = False
    if cancel_fails:
        fake.failing["scancel"] = TransportUnavailable("connection reset by peer")
    return fake


def cancelled(fake: FakeSlurm) -> list[str]:
    """The jobs scancel cancelled."""
    return [asked.line.split()[-1] for asked in fake.asked if asked.verb == "scancel"]


def waited_for_accounting(fake: FakeSlurm) -> bool:
    """Whether the operator read the job's runs: an sacct not asked by a status query (which asks
    squeue first, then right after it sacct for a job that ended)."""
    verbs = fake.verbs
    return any(verb == "sacct" and (i == 0 or verbs[i - 1] != "squeue") for i, verb in enumerate(verbs))


def hooked(op: SlurmSubmitOperator, fake: FakeSlurm) -> SlurmSubmitOperator:
    op._hook = lambda: SlurmHook("cluster", runner=fake)  # type: ignore[method-assign]
    return op


def job(state: SlurmState, reason: str | None = None, name: str = NAME) -> JobStatus:
    return JobStatus(job_id="42", state=state, raw_state=state.value, reason=reason, name=name, source="squeue")


def event(kind: str, status: JobStatus, message: str = "") -> dict[str, Any]:
    history = [{"job_id": "42", "number": 1, "cause": "initial", "try_number": 1}]
    return {"kind": kind, "job_id": "42", "status": status.to_event(), "message": message,
            "carry": {"history": history}}


def finish(slurm: FakeSlurm, payload: dict[str, Any], **kwargs: Any) -> str:
    op = hooked(SlurmSubmitOperator(task_id="train", conn_id="cluster", script="#!/bin/bash\ntrue\n",
                                    log_dir="/logs", **kwargs), slurm)
    with pytest.raises(AirflowFailException) as failed:
        op.execute_complete(context(), payload)
    return str(failed.value)


BUDGET_GONE = "job 42 will not start: AssocGrpBillingMinutes: What is left of the billing-minutes limit ..."


def test_a_job_that_can_never_start_is_cancelled_and_the_failure_says_so(capfd: pytest.CaptureFixture) -> None:
    pending = job(SlurmState.PENDING, "AssocGrpBillingMinutes")
    slurm = cluster(pending)
    message = finish(slurm, event(NEVER_STARTS, pending, BUDGET_GONE))
    assert cancelled(slurm) == ["42"]
    assert message.startswith(BUDGET_GONE)
    assert "Job 42 was cancelled (PENDING, reason AssocGrpBillingMinutes)" in message
    assert "keep_job_on_give_up=True keeps such a job" in message
    logged = capfd.readouterr().out
    assert "Cancelled job 42 (PENDING, reason AssocGrpBillingMinutes): the task gives up on it: job 42 will not " \
           "start" in logged


def test_keep_job_on_give_up_leaves_it_for_a_person_and_says_how_to_end_it() -> None:
    pending = job(SlurmState.PENDING, "AssocGrpBillingMinutes")
    slurm = cluster(pending)
    message = finish(slurm, event(NEVER_STARTS, pending, BUDGET_GONE), keep_job_on_give_up=True)
    assert cancelled(slurm) == [] and "scancel" not in slurm.verbs
    assert "Job 42 was kept in the queue (PENDING, reason AssocGrpBillingMinutes) because keep_job_on_give_up=True" \
        in message
    assert "scontrol release 42" in message and "scancel 42" in message


def test_a_job_held_after_special_exit_is_cancelled_without_waiting_for_accounting() -> None:
    held = job(SlurmState.SPECIAL_EXIT, "job requeued in held state")
    slurm = cluster(held)
    message = finish(slurm, event(FINISHED, held))
    assert "Slurm job 42 ended SPECIAL_EXIT" in message
    assert "Job 42 was cancelled (SPECIAL_EXIT, reason job requeued in held state)" in message
    assert cancelled(slurm) == ["42"] and not waited_for_accounting(slurm)


def test_a_job_that_is_gone_is_not_cancelled_and_the_failure_says_nothing_of_it() -> None:
    failed = JobStatus(job_id="42", state=SlurmState.FAILED, raw_state="FAILED", exit_code=3, name=NAME,
                       source="sacct")
    slurm = cluster(failed)
    message = finish(slurm, event(FINISHED, failed))
    assert "Slurm job 42 ended FAILED" in message and "Exit code 3." in message
    assert "scancel" not in slurm.verbs and "kept in the queue" not in message and "was cancelled" not in message


def test_a_requeued_job_the_policy_does_not_resubmit_is_cancelled() -> None:
    # The node failed; Slurm requeued the job (it is pending again), but the task's budget for
    # NODE_FAIL is spent, so the task fails: the requeued job must not run on unwatched.
    ended = JobStatus(job_id="42", state=SlurmState.NODE_FAIL, raw_state="NODE_FAIL", name=NAME, source="sacct")
    slurm = cluster(job(SlurmState.PENDING, "BeginTime"), accounted=ended)
    message = finish(slurm, event(FINISHED, ended), resubmit_budgets={"NODE_FAIL": 0})
    assert "Not resubmitted: resubmission budget for NODE_FAIL used up (0 of 0)" in message
    assert "Job 42 was cancelled (PENDING, reason BeginTime)" in message and cancelled(slurm) == ["42"]


def test_a_resubmission_refused_by_check_before_resubmit_cancels_a_requeued_job() -> None:
    class Refusing(SlurmSubmitOperator):
        def check_before_resubmit(self, context: Any, hook: Any) -> None:
            raise AirflowFailException("the allocation cannot pay for another run")

    ended = JobStatus(job_id="42", state=SlurmState.PREEMPTED, raw_state="PREEMPTED", name=NAME, source="sacct")
    slurm = cluster(job(SlurmState.PENDING, "Priority"), accounted=ended)
    op = Refusing(task_id="train", conn_id="cluster", script="#!/bin/bash\ntrue\n", log_dir="/logs")
    hooked(op, slurm)
    with pytest.raises(AirflowFailException, match=r"(?s)cannot pay for another run\nJob 42 was cancelled "
                                                   r"\(PENDING, reason Priority\)"):
        op.execute_complete(context(), event(FINISHED, ended))
    assert cancelled(slurm) == ["42"]


def test_a_recycled_job_id_of_another_job_is_left_alone() -> None:
    someone_else = job(SlurmState.PENDING, "AssocGrpBillingMinutes", name="another-job")
    slurm = cluster(someone_else)
    message = finish(slurm, event(NEVER_STARTS, job(SlurmState.PENDING, "AssocGrpBillingMinutes"), BUDGET_GONE))
    assert cancelled(slurm) == [] and "was cancelled" not in message


def test_a_cancel_that_fails_tells_the_person_to_do_it() -> None:
    pending = job(SlurmState.PENDING, "AssocGrpBillingMinutes")
    message = finish(cluster(pending, cancel_fails=True), event(NEVER_STARTS, pending, BUDGET_GONE))
    assert "Job 42 (PENDING, reason AssocGrpBillingMinutes) could not be cancelled (connection reset by peer): " \
           "cancel it with `scancel 42`" in message


def test_a_retry_that_finds_its_job_held_after_special_exit_cancels_it() -> None:
    # The watch was lost (a worker died); meanwhile the job asked for a person and Slurm holds it.
    store = StateStore()
    store.set(HISTORY_KEY, [{"job_id": "42", "number": 1, "cause": "initial", "try_number": 1}])
    slurm = cluster(job(SlurmState.SPECIAL_EXIT, "job requeued in held state"))
    op = SlurmSubmitOperator(task_id="train", conn_id="cluster", script="#!/bin/bash\ntrue\n", log_dir="/logs")
    hooked(op, slurm)
    with pytest.raises(AirflowFailException) as failed:
        op.execute(task_context(RUN_ID, store, dag_id="give_up", task_id="train", try_number=2))
    assert "Slurm job 42 ended SPECIAL_EXIT" in str(failed.value)
    assert "Job 42 was cancelled (SPECIAL_EXIT, reason job requeued in held state)" in str(failed.value)
    assert cancelled(slurm) == ["42"] and not waited_for_accounting(slurm)


def test_a_job_the_task_only_adopted_is_left_running_when_it_gives_up(capfd: pytest.CaptureFixture) -> None:
    # Another deployment submitted job 42 and watches it; this task watched it too instead of
    # submitting a second writer. Giving up here must not take the job from the task that owns it.
    pending = job(SlurmState.PENDING, "AssocGrpBillingMinutes", name="vcloud.stage0.elsewhere")
    payload = event(NEVER_STARTS, pending, BUDGET_GONE)
    payload["carry"]["history"] = [{"job_id": "42", "number": 1, "cause": "adopted", "try_number": 1,
                                    "name": "vcloud.stage0.elsewhere",
                                    "submitted_by": "user ana, DAG vcloud_training, run r7, task stage0"}]
    slurm = cluster(pending)
    message = finish(slurm, payload)
    assert cancelled(slurm) == [] and "scancel" not in slurm.verbs
    assert ("Job 42 (PENDING, reason AssocGrpBillingMinutes) was left running: it was submitted by user ana, "
            "DAG vcloud_training, run r7, task stage0, and this task only watched it.") in message
    assert "not by this task, which only watched it: left running" in capfd.readouterr().out
