"""The numbers of every schedule (``slurm_provider.timing``): first delay, growth and cap, pinned
with the draw at both ends of its jitter; and the watches using them by default."""

from __future__ import annotations

import inspect

import pytest

from slurm_provider.backoff import Backoff
from slurm_provider.login_wait import SlurmLoginTrigger
from slurm_provider.operators import SlurmSubmitOperator
from slurm_provider.watch.poller import JobPoller
from slurm_provider.sensors import SlurmJobSensor
from slurm_provider.timing import (
    CONFIRM_RETRY,
    FIRST_POLL_DELAY,
    LOGIN_PROBES,
    LOOKUP_RETRY,
    MAX_POLL_INTERVAL,
    POLL_INTERVAL,
    POLLS,
    SLURM_THROTTLE,
    TRANSPORT_RETRY,
)
from slurm_provider.watch.watch_request import WatchSchedule


def lowest(low: float, high: float) -> float:
    return low


def highest(low: float, high: float) -> float:
    return high


def delays(schedule: Backoff, attempts: range) -> list[tuple[float, float]]:
    """``(shortest, longest)`` delay of each attempt."""
    return [(round(schedule.delay(n, lowest), 3), round(schedule.delay(n, highest), 3)) for n in attempts]


@pytest.mark.parametrize(("schedule", "attempts", "expected"), [
    # the polls: 15 s a tenth either side, x1.5 while nothing changes, up to 300 s
    (POLLS, range(3), [(13.5, 16.5), (20.25, 24.75), (30.375, 37.125)]),
    (POLLS, range(9, 11), [(270.0, 330.0), (270.0, 330.0)]),
    # a task waiting for its login node: 15 s, doubling, up to a fifth shorter, up to 300 s
    (LOGIN_PROBES, range(3), [(12.0, 15.0), (24.0, 30.0), (48.0, 60.0)]),
    (LOGIN_PROBES, range(5, 7), [(240.0, 300.0), (240.0, 300.0)]),
    # a poll the cluster did not answer, from try 1: up to 2 s, doubling, at least half, up to 300 s
    (TRANSPORT_RETRY, range(1, 4), [(1.0, 2.0), (2.0, 4.0), (4.0, 8.0)]),
    (TRANSPORT_RETRY, range(9, 11), [(150.0, 300.0), (150.0, 300.0)]),
    # an end Slurm does not confirm yet: 1 s, doubling, up to 300 s
    (CONFIRM_RETRY, range(3), [(1.0, 1.0), (2.0, 2.0), (4.0, 4.0)]),
    (CONFIRM_RETRY, range(8, 10), [(256.0, 256.0), (300.0, 300.0)]),
    # a task's lookup of its own job that failed: 1 s, doubling, up to 30 s
    (LOOKUP_RETRY, range(7), [(1.0, 1.0), (2.0, 2.0), (4.0, 4.0), (8.0, 8.0), (16.0, 16.0), (30.0, 30.0),
                              (30.0, 30.0)]),
])
def test_each_schedule_starts_grows_and_stops_where_it_did(schedule: Backoff, attempts: range,
                                                           expected: list[tuple[float, float]]) -> None:
    assert delays(schedule, attempts) == expected


@pytest.mark.parametrize(("last", "interval", "expected"), [
    (0.0, 15.0, 30.0),  # the first "not now": twice the interval of the moment
    (30.0, 15.0, 60.0),  # then twice the last slow-down
    (0.0, 200.0, 300.0),  # never more than 300 s
    (240.0, 15.0, 300.0),
])
def test_slurms_not_now_doubles_the_wait_up_to_300_s(last: float, interval: float, expected: float) -> None:
    assert SLURM_THROTTLE.after(max(last, interval)) == expected
    assert SLURM_THROTTLE.jitter == (1.0, 1.0)


def test_the_watches_use_the_schedules_of_timing_by_default() -> None:
    assert SlurmLoginTrigger(conn_id="lumi", since=0.0).probes == LOGIN_PROBES
    assert JobPoller("c", lambda: None).schedule.polls == POLLS  # type: ignore[arg-type]


def test_the_pollers_growth_and_jitter_stay_overridable() -> None:
    polls = JobPoller("c", lambda: None, growth=2.0, jitter=0.0).schedule.polls  # type: ignore[arg-type]
    assert (polls.factor, polls.jitter) == (2.0, (1.0, 1.0))


@pytest.mark.parametrize("watch", [SlurmSubmitOperator, SlurmJobSensor, WatchSchedule, SlurmLoginTrigger])
def test_every_watch_polls_on_the_one_set_of_defaults(watch: type) -> None:
    parameters = inspect.signature(watch.__init__).parameters
    assert parameters["poll_interval"].default == POLL_INTERVAL
    assert parameters["max_poll_interval"].default == MAX_POLL_INTERVAL
    if "first_poll_delay" in parameters:
        assert parameters["first_poll_delay"].default == FIRST_POLL_DELAY
