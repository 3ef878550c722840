"""What an outage of the login node says and when its wait ends (pure)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from slurm_provider.watch.outage import (
    Outage,
    clock,
    command_failed_line,
    gave_up_line,
    reachable_again_line,
    span,
    still_failing_line,
    timeout_seconds,
    unreachable_line,
)

NOW = datetime(2026, 5, 1, 16, 30, tzinfo=timezone.utc).timestamp()
SINCE = datetime(2026, 5, 1, 14, 2, tzinfo=timezone.utc).timestamp()
OUTAGE = Outage(SINCE, "cannot reach vcloud@lumi:22 (connection 'lumi'): ConnectionRefusedError", 64.0)


@pytest.mark.parametrize(("seconds", "said"), [(0, "0 s"), (40.4, "40 s"), (60, "1 min"), (12 * 60 + 59, "12 min"),
                                               (3 * 3600 + 5 * 60, "3 h 05 min"), (24 * 3600, "24 h"),
                                               (52 * 3600, "2 d 4 h"), (72 * 3600, "3 d"), (-3, "0 s")])
def test_durations_read_as_people_say_them(seconds: float, said: str) -> None:
    assert span(seconds) == said


def test_a_moment_of_another_day_names_its_date() -> None:
    assert clock(SINCE, now=NOW) == "14:02 UTC"
    assert clock(SINCE, now=NOW + 86400) == "2026-05-01 14:02 UTC"


def test_the_deadline_counts_from_the_first_failed_try() -> None:
    assert OUTAGE.deadline(3600) == SINCE + 3600
    assert not OUTAGE.is_past(3 * 3600, now=NOW)
    assert OUTAGE.is_past(2 * 3600, now=NOW)


def test_the_lines_of_an_outage() -> None:
    assert unreachable_line("lumi", OUTAGE, 86400, job_id="123", last_state="RUNNING", now=NOW) == (
        "login node of lumi unreachable since 14:02 UTC (cannot reach vcloud@lumi:22 (connection 'lumi'): "
        "ConnectionRefusedError); job 123 last seen RUNNING; waiting up to 24 h, until 2026-05-02 14:02 UTC, "
        "trying again with a growing interval")
    assert "job 5 not seen yet" in unreachable_line("lumi", OUTAGE, 60, job_id="5", now=NOW)
    assert "; job" not in unreachable_line("lumi", OUTAGE, 60, now=NOW)
    assert reachable_again_line("lumi", SINCE, now=SINCE + 12 * 60 + 5) == "login node of lumi reachable again after 12 min"
    assert gave_up_line("lumi", OUTAGE, 7200, job_id="123", last_state="RUNNING", now=NOW) == (
        "login node of lumi unreachable since 14:02 UTC, longer than watch_deadline (2 h); last error: "
        "cannot reach vcloud@lumi:22 (connection 'lumi'): ConnectionRefusedError; job 123 last seen RUNNING, "
        "it may still run")


def test_the_lines_of_a_step_whose_command_ran_and_failed() -> None:
    assert command_failed_line("lumi", "squeue exited 1", 7200, now=NOW) == (
        "a command on the login node of lumi failed (squeue exited 1); asking scontrol ping and trying again "
        "with a growing interval, up to 3 times while the login node answers and at most 2 h, until 18:30 UTC")
    assert still_failing_line("lumi", 3, "squeue exited 1") == (
        "the login node of lumi answers scontrol ping, but this step failed 3 times in a row right after it "
        "did; last error: squeue exited 1")


def test_a_timeout_is_a_timedelta_or_positive_seconds() -> None:
    assert timeout_seconds(timedelta(hours=24)) == 86400.0
    assert timeout_seconds(90) == 90.0
    for bad in (0, -1, True, "24h", timedelta(0)):
        with pytest.raises(ValueError, match="watch_deadline must be a positive number"):
            timeout_seconds(bad)
