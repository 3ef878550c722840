"""The allocation paced: the burn rate against the rate that spends what is left by the allocation's end."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from slurm_provider import JobStatus, SlurmState

from vcloud_pipeline.budget.billing import Allocation
from vcloud_pipeline.budget.pacing import pace_of
from vcloud_pipeline.budget.preflight import ledger_from_statuses, ledger_pace
from vcloud_pipeline.profile import load_profile

from tests.vcloud_pipeline.budget.test_preflight import LUMI, job

NOW = dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc)
IN_TEN_WEEKS = (NOW + dt.timedelta(weeks=10)).date() - dt.timedelta(days=1)  # its end: ten weeks from now


@pytest.mark.parametrize(("spent", "days", "left", "verdict", "planned", "said"), [
    (70.0, 7, 1000.0, "under", 100.0,
     "under-spending: 70.0 GPU-hours/week over the last 7 day(s), while 100.0 GPU-hours/week would spend the "
     "1,000.0 left by 2027-02-06; at this rate about 300.0 would go unspent (lost when the allocation ends)"),
    (700.0, 7, 1000.0, "over", 100.0,
     "over-spending: 700.0 GPU-hours/week over the last 7 day(s), while 100.0 GPU-hours/week would spend the "
     "1,000.0 left by 2027-02-06; at this rate nothing is left on 2026-12-09, before the allocation ends"),
    (105.0, 7, 1000.0, "on pace", 100.0, "on pace: 105.0 GPU-hours/week over the last 7 day(s), and 100.0 "
                                         "GPU-hours/week would spend the 1,000.0 left by 2027-02-06 (within 20 %)"),
    (119.0, 7, 1000.0, "on pace", 100.0, "on pace"),
    (121.0, 7, 1000.0, "over", 100.0, "over-spending"),
    (10.0, 30, 1000.0, "under", 100.0, "over the last 7 day(s)"),  # a long history: the last week only
    (10.0, 1, 1000.0, "under", 100.0, "70.0 GPU-hours/week over the last 1 day(s)"),  # a young one: its own
    (1.0, 0.01, 1000.0, "under", 100.0, "7.0 GPU-hours/week over the last 1 day(s)"),  # an hour is not a week
    (0.0, 7, 1000.0, "under", 100.0, "would go unspent"),
    (5.0, 7, -3.0, "over", 0.0, "nothing is left on 2026-11-29"),
], ids=["under", "over", "on-pace", "inside-the-margin", "past-the-margin", "long-history", "young-history",
        "first-hour", "nothing-spent", "overdrawn"])
def test_the_pace_says_over_or_under_spending_beyond_the_margin(spent: float, days: float, left: float, verdict: str,
                                                               planned: float, said: str) -> None:
    pace = pace_of(spent=spent, history_days=days, left=left, ends_on=IN_TEN_WEEKS, now=NOW, margin_percent=20,
                   unit="GPU-hours")
    assert pace.verdict == verdict
    assert pace.planned_per_week == pytest.approx(planned)
    assert said in pace.words, pace.words
    assert pace.to_json()["words"] == pace.words and pace.to_json()["verdict"] == verdict


def test_without_an_end_date_or_an_allocation_the_pace_is_said_not_judged() -> None:
    open_ended = pace_of(spent=70.0, history_days=7, left=1000.0, ends_on=None, now=NOW, margin_percent=20,
                         unit="GPU-hours")
    assert open_ended.verdict is None and open_ended.runs_out_on == dt.date(2027, 3, 9)  # 1000 / 70 weeks
    assert open_ended.words == ("spent 70.0 GPU-hours/week over the last 7 day(s); at this rate what is left "
                                "(1,000.0) lasts until 2027-03-09; the allocation's end is not known (set "
                                "billing.allocation_ends in the profile to pace against it)")
    # A tiny run against a big allocation: no date within a century, never an overflow.
    crawl = pace_of(spent=0.0001, history_days=7, left=1000.0, ends_on=None, now=NOW, margin_percent=20,
                    unit="GPU-hours")
    assert crawl.runs_out_on is None and "lasts beyond a century" in crawl.words
    crawl_to_an_end = pace_of(spent=0.0001, history_days=7, left=1000.0, ends_on=IN_TEN_WEEKS, now=NOW,
                              margin_percent=20, unit="GPU-hours")
    assert crawl_to_an_end.verdict == "under" and crawl_to_an_end.runs_out_on is None
    untracked = pace_of(spent=70.0, history_days=7, left=None, ends_on=IN_TEN_WEEKS, now=NOW, margin_percent=20,
                        unit="GPU-hours")
    assert untracked.verdict is None and untracked.words.endswith("no allocation is tracked to pace against")
    ended = pace_of(spent=70.0, history_days=7, left=10.0, ends_on=dt.date(2026, 11, 1), now=NOW, margin_percent=20,
                    unit="GPU-hours")
    assert ended.verdict is None and ended.words.endswith("the allocation ended on 2026-11-01")


def test_the_ledger_measures_the_runs_of_the_last_week_and_its_own_history() -> None:
    now = dt.datetime(2026, 11, 29, 12, 0)  # the cluster's local time, as Slurm's times are

    def ran(job_id: str, state: SlurmState, hours: int, ended_days_ago: float | None) -> JobStatus:
        status = job(job_id, state, gpus=1, elapsed=hours * 3600)
        end = now - dt.timedelta(days=ended_days_ago) if ended_days_ago is not None else None
        start = (end or now) - dt.timedelta(hours=hours)
        return dataclasses.replace(status, start=start.isoformat(timespec="seconds"),
                                   end=end.isoformat(timespec="seconds") if end else None)

    statuses = [ran("1", SlurmState.COMPLETED, 10, 20), ran("2", SlurmState.COMPLETED, 4, 3),
                ran("3", SlurmState.TIMEOUT, 2, 6.9), ran("4", SlurmState.RUNNING, 1, None)]
    ledger = ledger_from_statuses(LUMI, statuses, now=now)
    assert ledger.used == pytest.approx(17)
    assert ledger.recent == pytest.approx(4 + 2 + 1)  # the run that ended 20 days ago is not this week's
    assert ledger.history_days == pytest.approx(20 + 10 / 24)
    profile = load_profile("lumi", overrides={"billing.allocation_ends": IN_TEN_WEEKS.isoformat(),
                                              "billing.allocation": 1000})
    pace = ledger_pace(profile, ledger, Allocation.from_profile(profile, used=ledger.used, held=0.0), now=NOW)
    assert pace.per_week == pytest.approx(7) and pace.left == pytest.approx(983) and pace.verdict == "under"
