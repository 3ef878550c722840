"""Curriculum: thin_only -> mixed -> all as a pure function of the epoch."""

from __future__ import annotations

import pytest

from vcloud.data.curriculum import CurriculumSchedule, cloud_types_for_epoch, phase_for_epoch


def test_production_schedule_in_epochs() -> None:
    schedule = CurriculumSchedule(total_epochs=100, mixed_from=30, all_from=90)
    phases = [phase_for_epoch(e, schedule) for e in range(100)]
    assert phases[:30] == ["thin_only"] * 30
    assert phases[30:90] == ["mixed"] * 60
    assert phases[90:] == ["all"] * 10


def test_fractions_give_the_same_production_schedule() -> None:
    by_fraction = CurriculumSchedule(total_epochs=100, mixed_from=0.3, all_from=0.9)
    by_epoch = CurriculumSchedule(total_epochs=100, mixed_from=30, all_from=90)
    for epoch in range(100):
        assert phase_for_epoch(epoch, by_fraction) == phase_for_epoch(epoch, by_epoch)


def test_tiny_run_with_fractions_visits_every_phase() -> None:
    schedule = {"total_epochs": 10, "mixed_from": 0.3, "all_from": 0.9}
    assert [phase_for_epoch(e, schedule) for e in range(10)] == ["thin_only"] * 3 + ["mixed"] * 6 + ["all"]


def test_cloud_types_grow_with_the_phase() -> None:
    schedule = CurriculumSchedule(total_epochs=100, mixed_from=30, all_from=90)
    assert cloud_types_for_epoch(0, schedule) == frozenset({"thin"})
    assert cloud_types_for_epoch(30, schedule) == frozenset({"thin", "thick"})
    assert cloud_types_for_epoch(99, schedule) == frozenset({"thin", "thick", "opaque"})
    assert cloud_types_for_epoch(150, schedule) == frozenset({"thin", "thick", "opaque"})
    assert cloud_types_for_epoch(0, None) == frozenset({"thin", "thick", "opaque"})


@pytest.mark.parametrize("kwargs, message", [
    ({"total_epochs": 0}, "total_epochs must be >= 1"),
    ({"total_epochs": 10, "mixed_from": 1.5}, "mixed_from=1.5 is a fraction"),
    ({"total_epochs": 10, "mixed_from": 8, "all_from": 5}, "must not come after all_from"),
    ({"total_epochs": 10, "all_from": "late"}, "all_from must be an epoch"),
    ({"total_epochs": 10, "mixed_from": -1}, "mixed_from=-1 must be >= 0"),
])
def test_invalid_schedules_name_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CurriculumSchedule(**kwargs)


def test_unknown_keys_are_listed() -> None:
    with pytest.raises(ValueError, match=r"unknown curriculum keys \['thin_until'\] \(valid: total_epochs"):
        CurriculumSchedule.from_dict({"total_epochs": 10, "thin_until": 3})
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        phase_for_epoch(-1, None)
