"""Asking Slurm again about an end it does not confirm yet: a doubling wait per record, capped."""

from __future__ import annotations

from slurm_provider.watch.end_records import EndRecord
from slurm_provider.watch.end_confirmation import EndConfirmation, confirm_schedule

RECORD = EndRecord("7", 0, 0, 1_800_000_000, False)
REQUEUED_RUN = EndRecord("7", 1, 0, 1_800_000_100, False)


def test_an_unconfirmed_end_is_asked_about_after_one_then_two_then_four_seconds_up_to_the_cap() -> None:
    confirmation = EndConfirmation(confirm_schedule(6.0))
    assert confirmation.due(RECORD, 0.0) and not confirmation.pending
    asked = []
    now = 0.0
    for _ in range(5):
        confirmation.not_confirmed(RECORD, now)
        asked.append(confirmation.ask_at - now)
        assert not confirmation.due(RECORD, now + asked[-1] - 0.01) and confirmation.due(RECORD, confirmation.ask_at)
        now = confirmation.ask_at
    assert asked == [1.0, 2.0, 4.0, 6.0, 6.0]


def test_another_record_is_asked_about_at_once_and_starts_the_schedule_again() -> None:
    confirmation = EndConfirmation(confirm_schedule(300.0))
    for now in (0.0, 1.0, 3.0):
        confirmation.not_confirmed(RECORD, now)
    assert confirmation.due(REQUEUED_RUN, 3.5)
    confirmation.not_confirmed(REQUEUED_RUN, 3.5)
    assert confirmation.ask_at == 4.5
    confirmation.forget()
    assert not confirmation.pending and confirmation.due(REQUEUED_RUN, 3.6)


def test_the_first_wait_is_never_longer_than_the_records_are_read() -> None:
    assert confirm_schedule(300.0, read_interval=0.25).scheduled(0) == 0.25
    assert confirm_schedule(300.0, read_interval=5.0).scheduled(0) == 1.0
