"""Maintenance windows: which of the site's reservations a waiting job waits out, in words. Pure.

Sites announce maintenance as reservations with the ``MAINT`` flag, days or weeks ahead. A job whose
time limit reaches into one does not start before the window ends, and Slurm says only
``ReqNodeNotAvail, Reserved for maintenance``: the watch reads the reservations
(``scontrol show reservation``) while a job waits so, and names the window (which one, when it starts
and ends, on which nodes) in the task log and the jobs view.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from slurm_provider.cli.values import slurm_minutes
from slurm_provider.pending_reasons import split_reason

MAINTENANCE_FLAG = "MAINT"
_MAINTENANCE_DETAIL = "reserved for maintenance"
_SHOWN = 2  # windows named in one line; more are counted


@dataclass(frozen=True, order=True)
class Window:
    """One maintenance reservation, in the cluster's local time as Slurm prints it."""

    start: str
    end: str
    name: str
    nodes: str

    def words(self) -> str:
        """``'site-maint' from 2026-12-01 08:00 to 2026-12-01 20:00 on nid[005001-005003]``."""
        start, end = slurm_minutes(self.start) or self.start or "?", slurm_minutes(self.end) or self.end or "?"
        return f"{self.name!r} from {start} to {end} on {self.nodes or 'its nodes'}"


def maintenance_windows(reservations: Iterable[Mapping[str, str]]) -> tuple[Window, ...]:
    """The ``MAINT`` reservations of ``scontrol show reservation -o`` records, earliest first (Slurm
    lists only those that have not ended)."""
    windows = []
    for record in reservations:
        flags = {flag.strip().upper() for flag in record.get("Flags", "").split(",")}
        if MAINTENANCE_FLAG in flags:
            windows.append(Window(start=record.get("StartTime", ""), end=record.get("EndTime", ""),
                                  name=record.get("ReservationName", ""), nodes=record.get("Nodes", "")))
    return tuple(sorted(windows))


def waits_for_maintenance(reason: str | None) -> bool:
    """Whether Slurm's pending reason says a maintenance reservation keeps the job from starting
    (``ReqNodeNotAvail, Reserved for maintenance``)."""
    code, detail = split_reason(reason)
    return code == "ReqNodeNotAvail" and _MAINTENANCE_DETAIL in detail.lower().replace("_", " ")


def maintenance_words(windows: Iterable[Window]) -> str | None:
    """The windows a job waits out, in one phrase for a log line or a table cell; None without any.

    ``waits out the maintenance window 'site-maint' from 2026-12-01 08:00 to 2026-12-01 20:00 on
    nid[005001-005003] (the cluster's local time)``."""
    listed = list(windows)
    if not listed:
        return None
    shown = "; ".join(window.words() for window in listed[:_SHOWN])
    more = f" and {len(listed) - _SHOWN} more" if len(listed) > _SHOWN else ""
    noun = "window" if len(listed) == 1 else "windows"
    return f"waits out the maintenance {noun} {shown}{more} (the cluster's local time)"


def maintenance_line(job_id: str, windows: Iterable[Window]) -> str | None:
    """The task log's sentence about the windows a pending job waits out; None without any."""
    words = maintenance_words(windows)
    if words is None:
        return None
    return (f"Job {job_id} {words}: its time limit reaches into the window, so it starts when the window "
            "ends, or before it where its --time-min lets Slurm shorten the limit to end in time")
