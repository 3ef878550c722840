"""A job pending on its account's allocation: spent (the usage alone leaves too little) or waiting for
the running jobs of the account, judged from one sshare. Pure; the watch is in test_triggers.py and
the real cluster's two cases in test_operator_allocation.py."""

from __future__ import annotations

from slurm_provider.watch.allocation import deadline_message, job_need, judge
from slurm_provider.cli.sshare import TresMinutes
from slurm_provider.job_status import JobStatus
from slurm_provider.state_vocabulary import SlurmState

REASON = "AssocGrpBillingMinutes"


def pending(tres: str | None = "cpu=1,mem=1000M,node=1,billing=2,gres/gpu=2", minutes: int = 30) -> JobStatus:
    return JobStatus(job_id="42", state=SlurmState.PENDING, reason=REASON, tres=tres, time_limit_s=minutes * 60,
                     account="proj")


def figures(limit: int | None, used: int, running: int, holders: tuple[tuple[str, int], ...] = ()) -> TresMinutes:
    return TresMinutes(account="proj", tres="billing", limit=limit, used=used, running=running, holders=holders)


def test_the_need_is_the_billing_tres_times_the_whole_time_limit_in_minutes() -> None:
    assert job_need(pending(), "billing") == 60
    started_minute = JobStatus(job_id="1", state=SlurmState.PENDING, tres="billing=3", time_limit_s=61)
    assert job_need(started_minute, "billing") == 6  # a started minute counts
    assert job_need(pending(tres=None), "billing") is None
    assert job_need(pending(tres="cpu=1"), "billing") is None
    assert job_need(JobStatus(job_id="1", state=SlurmState.PENDING, tres="billing=1"), "billing") is None


def test_teammates_running_jobs_holding_the_rest_mean_waiting() -> None:
    # 1000 - 100 used leaves 900 >= 60 needed; 880 held by running jobs leaves 20 now.
    verdict = judge(pending(), REASON, figures(1000, 100, 880, (("alice", 800), ("bob", 80))))
    assert verdict.judged and not verdict.spent
    assert verdict.waiting() == (
        "Job 42 waits for the allocation of account proj: GrpTRESMins billing=1000, used 100 (GrpTRESRaw), "
        "running jobs hold 880 (TRESRunMins: alice 800, bob 80). It needs 60 billing-minutes, the usage leaves "
        "900: it starts once running jobs of the account have released enough")


def test_usage_alone_leaving_too_little_means_spent() -> None:
    verdict = judge(pending(), REASON, figures(1000, 950, 30, (("alice", 30),)))
    assert verdict.spent
    message = verdict.spent_message()
    assert message.startswith("job 42 will never start: AssocGrpBillingMinutes: the allocation of account proj "
                              "is spent for it: GrpTRESMins billing=1000, used 950 (GrpTRESRaw)")
    assert "the usage leaves 50 billing-minutes and the job needs 60 billing-minutes" in message
    assert "raise GrpTRESMins of account proj" in message
    # Exactly what the job needs is enough.
    assert not judge(pending(), REASON, figures(1010, 950, 60)).spent


def test_what_users_sshare_does_not_show_hold_is_named_too() -> None:
    verdict = judge(pending(), REASON, figures(1000, 0, 950, (("me", 50),)))
    assert verdict.holders() == "me 50, users sshare does not show 900"
    assert judge(pending(), REASON, figures(1000, 0, 0)).holders() == "no running job"


def test_without_a_limit_or_a_need_nothing_is_judged_and_the_watch_waits() -> None:
    no_limit = judge(pending(), REASON, figures(None, 10, 5))
    assert not no_limit.judged and not no_limit.spent
    assert "no limit on the account itself" in no_limit.waiting() and "is unknown: waiting" in no_limit.waiting()
    no_need = judge(pending(tres=None), REASON, figures(10, 9, 0))
    assert not no_need.judged and not no_need.spent and "an unknown amount" in no_need.waiting()


def test_the_deadline_message_says_how_long_and_how_to_wait_longer() -> None:
    text = deadline_message("42", REASON, 90000.0, 86400.0, "Job 42 waits for the allocation of account proj")
    assert text == ("job 42 still pends with AssocGrpBillingMinutes after the watch waited 1-01:00:00 for the "
                    "account's running jobs to release its allocation (watch_deadline 1-00:00:00). Last seen: "
                    "Job 42 waits for the allocation of account proj. Giving up; raise watch_deadline to wait longer, or ask whose jobs hold "
                    "the allocation")
