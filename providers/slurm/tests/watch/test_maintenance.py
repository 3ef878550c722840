"""Which maintenance windows a waiting job waits out, and how the task log and the jobs view say it."""

from __future__ import annotations

import pytest

from slurm_provider.cli.scontrol import parse_scontrol_show_reservations
from slurm_provider.watch.maintenance import (
    Window,
    maintenance_line,
    maintenance_windows,
    maintenance_words,
    waits_for_maintenance,
)
from slurm_provider.watch.pending_words import waiting_line
from providers.slurm.tests.cli.captured_output import raw

MAINT = Window(start="2026-11-30T22:05:22", end="2026-12-01T02:05:22", name="maint-test", nodes="nid001001")


def test_only_the_maintenance_reservations_count_earliest_first() -> None:
    records = parse_scontrol_show_reservations(raw("scontrol_show_reservation.txt"))
    assert maintenance_windows(records) == (MAINT,), "team-demo is no maintenance"
    later = {"ReservationName": "lumi-maint", "StartTime": "2026-12-09T08:00:00",
             "EndTime": "2026-12-09T20:00:00", "Nodes": "nid[005001-005003]", "Flags": "maint,ignore_jobs"}
    assert [w.name for w in maintenance_windows([later, *records])] == ["maint-test", "lumi-maint"]


@pytest.mark.parametrize(("reason", "expected"), [
    ("ReqNodeNotAvail, Reserved for maintenance", True),
    ("(ReqNodeNotAvail, Reserved for maintenance)", True),
    ("ReqNodeNotAvail,_Reserved_for_maintenance", True),  # scontrol's spelling
    ("ReqNodeNotAvail, UnavailableNodes:nid005001", False),
    ("Reservation", False),
    ("Resources", False),
    (None, False),
])
def test_the_pending_reason_that_means_a_maintenance_window(reason: str | None, expected: bool) -> None:
    assert waits_for_maintenance(reason) is expected


def test_the_window_is_named_with_its_times_and_nodes_in_the_log_and_the_view() -> None:
    assert maintenance_words(()) is None and maintenance_line("7", ()) is None
    words = maintenance_words([MAINT])
    assert words == ("waits out the maintenance window 'maint-test' from 2026-11-30 22:05 to 2026-12-01 02:05 "
                     "on nid001001 (the cluster's local time)")
    line = maintenance_line("7", [MAINT])
    assert line is not None and line.startswith(f"Job 7 {words}: its time limit reaches into the window")
    assert "--time-min" in line
    assert waiting_line("ReqNodeNotAvail, Reserved for maintenance", "2026-12-01T02:05:22", words) == (
        "waiting for nodes that are unavailable (down, drained or reserved) (ReqNodeNotAvail, Reserved for "
        f"maintenance); {words}; expected to start 2026-12-01 02:05")


def test_many_windows_are_counted_past_the_first_two() -> None:
    windows = [Window(f"2026-12-0{i}T08:00:00", f"2026-12-0{i}T20:00:00", f"m{i}", "nid001001") for i in range(1, 5)]
    words = maintenance_words(windows)
    assert words is not None and "windows 'm1'" in words and "'m2'" in words and "'m3'" not in words
    assert "and 2 more" in words
