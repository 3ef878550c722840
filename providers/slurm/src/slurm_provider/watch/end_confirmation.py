"""An end an exit record tells and Slurm does not confirm yet: when to ask Slurm again. Pure.

A job's batch script writes its exit record in its last instant, so a read landing there finds Slurm
a moment behind (the job still completing, its epilog running, its end being recorded). The watch
asks Slurm again after a doubling wait (``timing.CONFIRM_RETRY``), from a second up to the watch's
longest poll interval, and starts from a second again for another record. The connection's poller
keeps one per watched job; a task watching the job it just submitted keeps one too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from slurm_provider.backoff import Backoff
from slurm_provider.watch.end_records import EndRecord
from slurm_provider.timing import CONFIRM_RETRY


def confirm_schedule(max_poll_interval: float, *, read_interval: float | None = None) -> Backoff:
    """``timing.CONFIRM_RETRY`` up to ``max_poll_interval``; its first wait at most ``read_interval``
    (how often the records are read: a question may not wait longer than the next read)."""
    base = CONFIRM_RETRY.base if read_interval is None else min(CONFIRM_RETRY.base, read_interval)
    return replace(CONFIRM_RETRY, base=base, cap=max_poll_interval)


@dataclass
class EndConfirmation:
    """The record Slurm last did not confirm, and when to ask about it again (on the caller's clock)."""

    schedule: Backoff
    record: EndRecord | None = None
    ask_at: float = 0.0
    wait: float = 0.0

    def due(self, record: EndRecord, now: float) -> bool:
        """Whether to ask Slurm about ``record`` now: a record not asked about yet, or its wait is over."""
        return record != self.record or now >= self.ask_at

    def not_confirmed(self, record: EndRecord, now: float) -> None:
        """Slurm does not call the job ended yet: ask again after a doubling wait (a new record starts
        the schedule again)."""
        if record != self.record:
            self.wait = 0.0
        self.wait = self.schedule.after(self.wait)
        self.record, self.ask_at = record, now + self.wait

    def forget(self) -> None:
        """No record to ask about (none written, or a requeued run's old one)."""
        self.record = None

    @property
    def pending(self) -> bool:
        return self.record is not None
