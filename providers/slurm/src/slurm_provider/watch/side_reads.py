"""What a poll cycle reads beside the statuses: grown logs and followed files, the allocation a
pending job waits for, the maintenance window it waits behind, and an exit record that ends a run.

Each read goes through the poller's shared connection (:class:`~slurm_provider.watch.subscription.StatusSource`);
a failure Slurm answered with is the reading's problem (the watches go on without it), a dropped
connection is the poll's (raised, and retried as a poll).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable

from slurm_provider.job_status import JobStatus
from slurm_provider.pending_reasons import classify_pending_reason
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.timing import MAINTENANCE_READ_INTERVAL
from slurm_provider.transport import TransportError
from slurm_provider.watch.allocation import AccountReading
from slurm_provider.watch.end_records import EndRecord, parse_end_record
from slurm_provider.watch.maintenance import Window, waits_for_maintenance
from slurm_provider.watch.subscription import StatusSource, Subscription

log = logging.getLogger(__name__)

MAX_LOG_READS_PER_CYCLE = 16
"""Reads of one log per cycle (each up to 64 KiB): a megabyte of output catches up in one cycle."""


async def read_grown(source: StatusSource, path: str, offset: int, size: int) -> tuple[str, int]:
    """What ``path`` grew by from ``offset`` to ``size``, in as many reads as that takes (at most
    ``MAX_LOG_READS_PER_CYCLE``): a job that wrote a lot while nobody could look (an outage of the login
    node) has its output shown before its end is announced."""
    parts = []
    for _ in range(MAX_LOG_READS_PER_CYCLE):
        text, new_offset = await source.read_log(path, offset)
        parts.append(text)
        moved_on, offset = new_offset > offset, new_offset
        if not moved_on or offset >= size:  # caught up, or the file was rewritten and read from 0
            break
    return "".join(parts), offset


async def read_followed(source: StatusSource, sub: Subscription, sizes: dict[str, int],
                        now: float) -> tuple[tuple[str, str, int], ...]:
    """What the followed files of ``sub`` grew by, given their ``sizes`` just read."""
    sub.followed_at = now
    grown = []
    for path, offset in sub.follows.items():
        if sizes.get(path, 0) > offset:
            text, sub.follows[path] = await read_grown(source, path, offset, sizes[path])
            grown.append((path, text, sub.follows[path]))
    return tuple(grown)


def allocation_key(status: JobStatus | None) -> tuple[str, str] | None:
    """``(account, TRES)`` whose allocation a pending job waits for, or None."""
    if status is None or status.state is not SlurmState.PENDING or not status.account:
        return None
    tres = classify_pending_reason(status.reason).allocation_tres if status.reason else None
    return (status.account, tres) if tres else None


async def read_allocations(source: StatusSource,
                           statuses: Iterable[JobStatus | None]) -> dict[tuple[str, str], AccountReading]:
    """One ``sshare`` per account (and TRES) that watched jobs pend on; none when no job does."""
    from slurm_provider.hooks import SlurmCommandFailed

    readings: dict[tuple[str, str], AccountReading] = {}
    for account, tres in sorted({key for status in statuses if (key := allocation_key(status)) is not None}):
        try:
            figures = await source.account_tres(account, tres)
        except SlurmCommandFailed as exc:
            readings[(account, tres)] = AccountReading(account, tres, None, f"sshare gave no answer: {exc}")
            continue
        except TransportError:
            raise
        except Exception as exc:  # unreadable answer or a refused account name: the watch goes on
            readings[(account, tres)] = AccountReading(account, tres, None, f"sshare failed: {exc}")
            continue
        problem = None if figures is not None else f"sshare lists no association for account {account}"
        readings[(account, tres)] = AccountReading(account, tres, figures, problem)
    return readings


class MaintenanceReads:
    """The site's maintenance windows, read (``scontrol show reservation``) while a watched job pends
    for one, at most every ``timing.MAINTENANCE_READ_INTERVAL`` seconds; none when no job does."""

    def __init__(self) -> None:
        self.windows: tuple[Window, ...] = ()
        self.read_at = -math.inf  # monotonic
        self.reads = 0

    async def read(self, source: StatusSource, statuses: Iterable[JobStatus | None]) -> tuple[Window, ...]:
        """The windows for this cycle. A failed read leaves them unnamed (the pending reason still says
        maintenance); a dropped connection is the poll's problem."""
        from slurm_provider.hooks import SlurmCommandFailed

        if not any(status is not None and status.state is SlurmState.PENDING and waits_for_maintenance(status.reason)
                   for status in statuses):
            return ()
        now = time.monotonic()
        if now - self.read_at < MAINTENANCE_READ_INTERVAL:
            return self.windows
        self.read_at = now
        self.reads += 1
        try:
            self.windows = await source.maintenance()
        except (SlurmCommandFailed, ValueError) as exc:  # Slurm answered, unusably: the reason still says it
            log.warning("Could not read the maintenance reservations (%s); the jobs waiting for one are "
                        "told without its name", exc)
            self.windows = ()
        except TransportError:  # the connection dropped: the poll's problem, retried as a poll
            raise
        return self.windows


def record_of(sub: Subscription, records: dict[str, str]) -> EndRecord | None:
    """The exit record read for ``sub`` when it says the watched run ended, else None."""
    text = records.get(sub.end_record_path) if sub.end_record_path else None
    record = parse_end_record(text) if text else None
    return record if record is not None and record.ends(sub.job_id, sub.restarts) else None
