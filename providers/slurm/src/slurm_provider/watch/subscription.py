"""What a watch subscribes to and what each poll cycle tells it: the cluster connection the poller
reads (:class:`StatusSource`, :class:`FileSource`), one watched job's subscription, and the
:class:`PollUpdate` a cycle hands each subscriber (what :class:`~slurm_provider.watch.job_watch.JobWatch`
steps with)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from slurm_provider.watch.allocation import AccountReading
from slurm_provider.watch.end_records import EndRecord
from slurm_provider.watch.followed_files import FOLLOW_INTERVAL
from slurm_provider.cli.sshare import TresMinutes
from slurm_provider.job_status import JobStatus
from slurm_provider.watch.maintenance import Window
from slurm_provider.watch.outage import Outage
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.watch.end_confirmation import EndConfirmation, confirm_schedule


class StatusSource(Protocol):
    """What the poller needs from a cluster connection (``SlurmAsyncHook`` provides it)."""

    async def statuses(self, job_ids: list[str]) -> dict[str, JobStatus]: ...

    async def read_log(self, path: str, offset: int) -> tuple[str, int]: ...

    async def file_sizes(self, paths: list[str]) -> dict[str, int]: ...

    async def account_tres(self, account: str, tres: str = "billing") -> TresMinutes | None: ...

    async def maintenance(self) -> tuple[Window, ...]: ...

    async def release(self, job_id: str) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class FileSource(Protocol):
    """A source that reads log sizes and exit records in one command (``SlurmAsyncHook`` does)."""

    async def poll_files(self, size_paths: list[str],
                         record_paths: list[str]) -> tuple[dict[str, int], dict[str, str]]: ...


@dataclass(frozen=True)
class PollUpdate:
    """What one subscriber learns from one poll cycle."""

    status: JobStatus | None
    new_log_text: str = ""
    log_offset: int = 0
    error: BaseException | None = None
    """The watch cannot go on (a bug, or a transport error that retrying cannot fix)."""
    waiting: str | None = None
    """No status this cycle: the login waits for a person (what to do); the watch goes on."""
    new_err_text: str = ""
    """New text of the job's error output (stderr), when it is a file of its own."""
    err_offset: int = 0
    unreachable: Outage | None = None
    """No status this cycle: the cluster did not answer (since when, why); the watch decides whether
    to wait on."""
    allocation: AccountReading | None = None
    """The job's account allocation, read this cycle because the job pends on it (else None)."""
    throttled: str | None = None
    """No status this cycle: Slurm asked us to call less often (its answer); the watch goes on."""
    end_record: EndRecord | None = None
    """The exit record that made the poller ask Slurm this cycle (None: the regular poll)."""
    followed: tuple[tuple[str, str, int], ...] = ()
    """``(path, new text, offset after it)`` of each followed file that grew, read this cycle."""
    only_followed: bool = False
    """No status this cycle: only followed files were read (between two polls)."""
    maintenance: tuple[Window, ...] = ()
    """The maintenance windows the job waits out, while Slurm says it pends for one (else empty)."""


@dataclass
class Subscription:
    """One watched job of a connection's poller: what to read of it, how far, and its queue of updates."""

    job_id: str
    poll_interval: float
    max_poll_interval: float
    log_path: str | None
    log_offset: int
    err_path: str | None = None
    err_offset: int = 0
    queue: asyncio.Queue[PollUpdate] = field(default_factory=asyncio.Queue)
    last_state: str | None = None
    end_record_path: str | None = None
    restarts: int = 0
    """The restart count Slurm last reported: an older run's exit record is not the end."""
    record_interval: float | None = None
    """How often the poller reads the exit records (the first wait to confirm an end is at most this)."""
    confirmation: EndConfirmation = field(init=False)
    """The record Slurm did not confirm yet, and when to ask again (monotonic)."""
    follows: dict[str, int] = field(default_factory=dict)
    """Followed files of the job (:mod:`slurm_provider.watch.followed_files`) by path: the bytes read so far."""
    follow_interval: float = FOLLOW_INTERVAL
    followed_at: float = float("-inf")
    """When (monotonic) the followed files' sizes were last checked."""

    def __post_init__(self) -> None:
        self.confirmation = EndConfirmation(confirm_schedule(self.max_poll_interval, read_interval=self.record_interval))

    def log_files(self) -> list[str]:
        return [p for p in (self.log_path, self.err_path) if p]

    def follow_due(self, now: float, state: str | None) -> bool:
        """Whether the followed files' sizes are to be checked now: the job has started and the last
        check is ``follow_interval`` old."""
        started = state in SlurmState.__members__ and SlurmState(state).has_started
        return bool(self.follows) and started and now - self.followed_at >= self.follow_interval
