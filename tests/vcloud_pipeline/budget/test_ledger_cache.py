"""The ledger read incrementally: the runs that ended kept on the host, sacct asked only for what is new.

The incremental ledger must bill exactly what a read of the whole year bills, whatever happened
between two reads (jobs submitted, started, requeued, ended), while sacct answers only the jobs alive
since the last read."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pytest

from slurm_provider.hooks import SlurmHook
from slurm_provider.job_status import JobStatus
from slurm_provider.state_vocabulary import SlurmState
from benchmarks.ledger_reads import a_year_of_jobs, an_hour_of_work, with_billing
from support.fake_slurm import install
from vcloud_pipeline.budget import ledger_cache
from vcloud_pipeline.budget.ledger_cache import FULL_READ_SECONDS, OVERLAP_SECONDS, LedgerCache, ReadPlan
from vcloud_pipeline.budget.preflight import read_ledger
from vcloud_pipeline.profile import load_profile

LUMI = load_profile("lumi")
YEAR = "now-365days"
DAYS = 365


def status(job_id: str, state: SlurmState, start: str | None = "2026-11-20T10:00:00") -> JobStatus:
    return JobStatus(job_id=job_id, state=state, start=start, source="sacct")


def test_a_read_asks_for_the_year_without_a_fresh_cache_else_for_what_is_new_with_an_overlap() -> None:
    now = 1_800_000_000.0
    assert ledger_cache.plan_read(None, now, DAYS) == ReadPlan(YEAR, full=True)
    kept = LedgerCache(read_at=now - 600, full_at=now - 86400)
    assert ledger_cache.plan_read(kept, now, DAYS) == ReadPlan(f"now-{600 + OVERLAP_SECONDS}seconds", full=False)
    stale = LedgerCache(read_at=now - 600, full_at=now - FULL_READ_SECONDS)
    assert ledger_cache.plan_read(stale, now, DAYS).full
    assert ledger_cache.plan_read(LedgerCache(read_at=now + 60, full_at=now), now, DAYS).full  # the clock went back


def test_every_run_read_replaces_the_kept_one_and_live_jobs_come_first() -> None:
    now = datetime(2026, 11, 20, 12).timestamp()
    first, kept = ledger_cache.merge(None, ReadPlan(YEAR, True),
                                     [status("1", SlurmState.COMPLETED), status("2", SlurmState.RUNNING),
                                      status("3", SlurmState.TIMEOUT, start="2026-11-19T08:00:00")], now, DAYS)
    assert [s.job_id for s in first] == ["2", "1", "3"] and sorted(kept.runs) == [
        "1@2026-11-20T10:00:00", "3@2026-11-19T08:00:00"]
    # job 2 ended, job 3 was requeued and runs again (a new start), job 4 is new
    later, kept = ledger_cache.merge(kept, ReadPlan("now-4000seconds", False),
                                     [status("2", SlurmState.FAILED), status("3", SlurmState.RUNNING),
                                      status("4", SlurmState.PENDING, start=None)], now + 400, DAYS)
    assert [(s.job_id, s.state) for s in later] == [
        ("3", SlurmState.RUNNING), ("4", SlurmState.PENDING), ("1", SlurmState.COMPLETED),
        ("3", SlurmState.TIMEOUT), ("2", SlurmState.FAILED)]
    assert (kept.read_at, kept.full_at) == (now + 400, now)
    again, _ = ledger_cache.merge(kept, ReadPlan(YEAR, True), [status("5", SlurmState.COMPLETED)], now + 500, DAYS)
    assert [s.job_id for s in again] == ["5"]  # a read of the whole year keeps nothing older
    # a kept run that ended more than the window ago is left out, as a read of the whole window leaves it
    old = JobStatus(job_id="6", state=SlurmState.COMPLETED, start="2025-11-01T08:00:00", end="2025-11-01T09:00:00",
                    source="sacct")
    _, with_old = ledger_cache.merge(None, ReadPlan(YEAR, True), [old], now, DAYS)
    assert [s.job_id for s in ledger_cache.merge(with_old, ReadPlan("now-3600seconds", False), [], now, DAYS)[0]] == []
    assert [s.job_id for s in ledger_cache.merge(with_old, ReadPlan("now-3600seconds", False), [], now, 400)[0]] == ["6"]


def test_the_cache_file_round_trips_and_a_broken_one_means_a_whole_read(tmp_path: Path) -> None:
    path = ledger_cache.cache_file("vcloud_lumi", "project_465002500", str(tmp_path))
    assert path.parent == tmp_path / "vcloud-ledger"
    assert ledger_cache.load(path) is None
    kept = LedgerCache(read_at=2.0, full_at=1.0, runs={"1@x": status("1", SlurmState.COMPLETED).to_event()})
    ledger_cache.save(path, kept)
    assert ledger_cache.load(path) == kept
    path.write_text("{not json")
    assert ledger_cache.load(path) is None
    assert ledger_cache.cache_file("vcloud_lumi", "project_2", str(tmp_path)) != path


def test_the_incremental_ledger_bills_what_the_whole_year_bills_and_reads_a_fraction_of_the_rows(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A year of 400 jobs, then a submit every hour for six hours (the benchmark's day, shortened)."""
    fake = install(monkeypatch)
    a_year_of_jobs(fake, 400, LUMI.account)
    hook = SlurmHook(ssh_conn_id="vcloud_lumi")
    reads = []
    for hour in range(6):
        an_hour_of_work(fake, hour, LUMI.account)
        whole = read_ledger(hook, with_billing(LUMI, False))
        kept = read_ledger(hook, with_billing(LUMI, True), now=fake.table.clock.timestamp(), cache_dir=str(tmp_path))
        assert (kept.used, kept.reserved, kept.queued, kept.summary.jobs) == pytest.approx(
            (whole.used, whole.reserved, whole.queued, whole.summary.jobs)), hour
        assert kept.summary.by_stage == pytest.approx(whole.summary.by_stage)
        reads.append([a.line for a in fake.asked if a.verb == "sacct"][-2:])
    assert all("--starttime=now-365days" in whole for whole, _ in reads)
    assert "--starttime=now-365days" in reads[0][1]  # the first read on the host reads the year
    # an hour since the last read (and the seconds the fake's clock ticked meanwhile), plus the overlap
    since = [int(re.search(r"--starttime=now-(\d+)seconds", new)[1]) for _, new in reads[1:]]
    assert all(3600 + OVERLAP_SECONDS <= s < 3600 + OVERLAP_SECONDS + 10 for s in since), since
    assert len(ledger_cache.load(ledger_cache.cache_file(LUMI.connection.conn_id, LUMI.account, str(tmp_path))).runs) > 400
