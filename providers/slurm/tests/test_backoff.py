"""``Backoff``: the delays of one schedule as tables of attempt and expected delay (no sleeping,
no chance: the random draw is passed in)."""

from __future__ import annotations

import math
import random

import pytest

from slurm_provider.backoff import NO_JITTER, Backoff, spread

DOUBLING = Backoff(base=15.0, factor=2.0, cap=300.0)


def lowest(low: float, high: float) -> float:
    return low


def highest(low: float, high: float) -> float:
    return high


@pytest.mark.parametrize(("schedule", "attempt", "expected"), [
    (DOUBLING, 0, 15.0),
    (DOUBLING, 1, 30.0),
    (DOUBLING, 4, 240.0),
    (DOUBLING, 5, 300.0),  # 480 capped
    (DOUBLING, -3, 15.0),  # no attempt before the first
    (DOUBLING, 10_000, 300.0),  # days of tries: the growth passes any float, the cap holds
    (DOUBLING, 10**400, 300.0),
    (Backoff(base=1.0, factor=1.5), 2, 2.25),  # uncapped
    (Backoff(base=1.0, factor=2.0), 5000, math.inf),
    (Backoff(base=7.0, factor=1.0, cap=300.0), 10**400, 7.0),  # constant
    (Backoff(base=0.0, factor=2.0, cap=300.0), 10_000, 0.0),
    (Backoff(base=400.0, factor=2.0, cap=300.0), 0, 300.0),  # the cap holds from the first try
])
def test_the_scheduled_delay_grows_per_attempt_up_to_the_cap(schedule: Backoff, attempt: int,
                                                            expected: float) -> None:
    assert schedule.scheduled(attempt) == expected


@pytest.mark.parametrize(("jitter", "attempt", "low", "high"), [
    (NO_JITTER, 0, 15.0, 15.0),
    ((0.8, 1.0), 0, 12.0, 15.0),  # up to a fifth shorter
    ((0.5, 1.0), 3, 60.0, 120.0),  # up to half shorter
    (spread(0.1), 2, 54.0, 66.0),  # a tenth either side
    (spread(0.1), 99, 270.0, 330.0),  # around the cap
])
def test_a_delay_lies_within_its_jitter(jitter: tuple[float, float], attempt: int, low: float,
                                        high: float) -> None:
    schedule = Backoff(base=15.0, factor=2.0, cap=300.0, jitter=jitter)
    assert schedule.delay(attempt, lowest) == pytest.approx(low)
    assert schedule.delay(attempt, highest) == pytest.approx(high)
    seeded = random.Random(20260101)
    delays = [schedule.delay(attempt, seeded.uniform) for _ in range(500)]
    assert all(low - 1e-9 <= d <= high + 1e-9 for d in delays)
    if low < high:  # the draw spreads the delays over the range, not one value
        assert max(delays) - min(delays) > (high - low) / 2


def test_a_seeded_draw_repeats_its_delays() -> None:
    schedule = Backoff(base=1.0, factor=2.0, cap=300.0, jitter=(0.5, 1.0))
    first, again = random.Random(7), random.Random(7)
    assert [schedule.delay(n, first.uniform) for n in range(12)] == \
        [schedule.delay(n, again.uniform) for n in range(12)]


def test_without_jitter_nothing_is_drawn() -> None:
    def no_draw(low: float, high: float) -> float:
        raise AssertionError("drawn")

    assert DOUBLING.delay(2, no_draw) == 60.0


@pytest.mark.parametrize(("schedule", "current", "expected"), [
    (DOUBLING, 15.0, 30.0),
    (DOUBLING, 200.0, 300.0),  # capped
    (DOUBLING, 0.0, 15.0),  # nothing before: the base
    (DOUBLING, 5.0, 15.0),  # never below the base
    (Backoff(base=15.0, factor=1.5, cap=300.0), 100.0, 150.0),
    (Backoff(base=0.0, factor=2.0, cap=300.0), 0.0, 0.0),
])
def test_the_wait_after_another_grows_by_the_factor_up_to_the_cap(schedule: Backoff, current: float,
                                                                  expected: float) -> None:
    assert schedule.after(current) == expected


@pytest.mark.parametrize(("most", "cap"), [(4.0, 4.0), (300.0, 300.0), (600.0, 300.0), (math.inf, 300.0)])
def test_a_callers_limit_only_shortens_the_cap(most: float, cap: float) -> None:
    assert DOUBLING.capped_at(most) == Backoff(base=15.0, factor=2.0, cap=cap)


@pytest.mark.parametrize("fields", [
    {"base": -1.0},
    {"base": 1.0, "factor": 0.5},
    {"base": 1.0, "cap": -1.0},
    {"base": 1.0, "jitter": (1.0, 0.5)},
    {"base": 1.0, "jitter": spread(1.5)},
])
def test_a_schedule_that_would_shrink_or_go_negative_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="not a back-off"):
        Backoff(**fields)  # type: ignore[arg-type]
