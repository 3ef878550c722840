"""One status poller per cluster connection, shared by every trigger in a triggerer process.

A triggerer may watch hundreds of Slurm jobs on the same cluster. Polling each job on its own
costs one SSH round trip per job per interval and hammers slurmctld; instead every
:class:`~slurm_provider.triggers.SlurmJobTrigger` of one connection subscribes to the same
:class:`JobPoller`, which keeps **one** connection open and asks for **all** watched jobs at once
per cycle (one ``squeue``; ``sacct`` only for the jobs ``squeue`` has forgotten). Log files (a job's
output and its error output) that grew since the last cycle are read over the same connection. Only
while a watched job pends on its account's allocation (``AssocGrpBillingMinutes``) does a cycle add
one ``sshare`` per such account (:mod:`slurm_provider.watch.allocation`), shared by every job pending on it.

The interval starts at the smallest interval any subscriber asked for and grows by ``growth``
per quiet cycle (no watched job changed state) up to the smallest cap; any change or a new
subscriber resets it. Only transport errors are retried (with jittered exponential back-off, capped
at the subscribers' longest allowed poll interval, and a fresh connection); anything else is handed
to every subscriber.

A login node that does not answer (refused, reset, timed out), or a Slurm that is away (no controller
or accounting database answers: :class:`~slurm_provider.hooks.SlurmUnavailable`), is retried without
a limit for as long as anyone watches: every failed try hands each subscriber the
:class:`~slurm_provider.watch.outage.Outage` so far (since when, why, next try in), and each watch decides
by its own deadline when it has waited long enough. A failure retrying cannot heal (host key,
authentication, configuration) ends every watch at once, and so does an error Slurm answered with
while the login node answered (an option it refuses, output that cannot be read), once it came
``STEP_FAILURES_WHILE_REACHABLE`` polls in a row (``timing.SLURM_ERROR_RETRY`` apart): it is not an
outage, and waiting out a day's deadline would only hide it.

Slurm's own "not now" answers (its rate limiter, a controller too busy or away to answer:
:class:`~slurm_provider.hooks.SlurmRateLimited`) slow the poller down instead: the same connection
asks again after a doubled wait (up to the subscribers' longest allowed poll interval), every
subscriber hears that its job is still watched, and once Slurm answers the poller eases back to its
schedule. A site's ceiling on calls (the connection's ``min_call_interval`` extra) is kept by the hook
the poller polls through, for every job of the connection at once.

A job's end is noticed between two polls from its exit record (:mod:`slurm_provider.watch.end_records`),
a file its batch script leaves next to its output: every ``record_interval`` seconds (5) one command
reads the records of every watched job over the same connection (no Slurm call; the poll itself reads
them in the command that checks the logs' sizes), and a record that says the watched run ended is
confirmed with one status query for those jobs only. Slurm's answer decides: a job Slurm does not
call ended yet (still completing, requeued) is asked about again after a doubling wait (1 s, 2 s,
4 s, ...: the records are read again then, between the regular reads), and a job
killed before its script could write a record is noticed by the poll as before.

More files a watch follows as they grow (:mod:`slurm_provider.watch.followed_files`) have their sizes
checked in the same commands (the read of the exit records, else the poll), at most every
``follow_interval`` seconds per job once it has started, and only the bytes they grew by are read;
a read between two polls reaches the watch as an update without a status.

A login that waits for a person (an OTP ControlMaster that lapsed overnight) is not a failure of the
watched jobs: they keep running on the cluster. The poller then keeps trying with back-off, without
a retry limit, and tells every subscriber what a person has to do; the watches pick up as soon as
the master is open again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from slurm_provider.backoff import spread
from slurm_provider.job_status import JobStatus
from slurm_provider.timing import POLL_GROWTH, POLL_JITTER, POLLS
from slurm_provider.transport import ControlMasterNotRunning, TransportError
from slurm_provider.watch.end_records import EndRecord
from slurm_provider.watch.followed_files import FOLLOW_INTERVAL
from slurm_provider.watch.maintenance import waits_for_maintenance
from slurm_provider.watch.outage import STEP_FAILURES_WHILE_REACHABLE, Outage, reachable_again_line, slurm_error_line
from slurm_provider.watch.poll_schedule import Asked, PollSchedule
from slurm_provider.watch.side_reads import (
    MaintenanceReads,
    allocation_key,
    read_allocations,
    read_followed,
    read_grown,
    record_of,
)
from slurm_provider.watch.subscription import FileSource, PollUpdate, StatusSource, Subscription

log = logging.getLogger(__name__)

RECORD_INTERVAL = 5.0
"""Seconds between two reads of the watched jobs' exit records (one file read, no Slurm call)."""


class JobPoller:
    """Polls every watched job of one connection in one batched call per cycle."""

    def __init__(self, conn_id: str, source_factory: Callable[[], StatusSource], *,
                 growth: float = POLL_GROWTH, jitter: float = POLL_JITTER, coalesce: float = 1.0,
                 record_interval: float = RECORD_INTERVAL) -> None:
        self.conn_id = conn_id
        self._source_factory = source_factory
        self._source: StatusSource | None = None
        self._subs: dict[int, Subscription] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.schedule = PollSchedule(replace(POLLS, factor=growth, jitter=spread(jitter)))
        self._coalesce = coalesce
        self.cycles = 0
        self.record_interval = record_interval
        self.record_reads = 0  # commands that read exit records between polls
        self.confirmations = 0  # status queries asked because of an exit record
        self.unconfirmed = 0  # ... that Slurm did not confirm (yet)
        self.maintenance = MaintenanceReads()

    # --- subscribing -----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def subscribe(self, job_id: str, *, poll_interval: float, max_poll_interval: float,
                        log_path: str | None = None, log_offset: int = 0,
                        err_path: str | None = None, err_offset: int = 0,
                        first_poll_delay: float = 0.0,
                        end_record_path: str | None = None, follows: dict[str, int] | None = None,
                        follow_interval: float = FOLLOW_INTERVAL) -> AsyncIterator[asyncio.Queue[PollUpdate]]:
        """Watch ``job_id`` until the context exits; updates arrive on the yielded queue each cycle.

        ``log_path``/``err_path``: the job's output and error output files, streamed from the given
        byte offsets once the job has started. ``end_record_path``: the job's exit record, read
        every ``record_interval`` seconds (None: the end is noticed by the poll only). ``follows``:
        more files of the job to read as they grow (path: bytes read so far), their sizes checked in
        the command of a poll or of a read of the exit records, at most every ``follow_interval``
        seconds."""
        sub = Subscription(str(job_id), poll_interval, max(poll_interval, max_poll_interval), log_path,
                            log_offset, err_path, err_offset, end_record_path=end_record_path,
                            follows=dict(follows or {}), follow_interval=follow_interval,
                            record_interval=self.record_interval)
        if first_poll_delay > 0:
            await asyncio.sleep(first_poll_delay)
        self._subs[id(sub)] = sub
        self.schedule.restart()  # a new watcher resets the interval to the smallest requested
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"slurm-poller-{self.conn_id}")
        try:
            yield sub.queue
        finally:
            self._subs.pop(id(sub), None)
            if not self._subs:
                await self._stop()

    async def source(self) -> StatusSource:
        """The shared connection (opened on first use) for one-off verbs such as ``scancel``."""
        if self._source is None:
            self._source = self._source_factory()
        return self._source

    # --- the loop ----------------------------------------------------------------------------------

    async def _run(self) -> None:
        from slurm_provider.hooks import SlurmCommandFailed, SlurmRateLimited

        failures = 0  # tries in a row the cluster did not answer
        errors = 0  # polls in a row a command ran on the login node and Slurm answered it with an error
        waits = 0  # cycles in a row whose login waited for a person
        slowed = 0  # polls in a row Slurm asked us to make less often
        since: float | None = None  # when the cluster stopped answering
        while self._subs:
            try:
                changed = await self._cycle()
                if slowed:
                    log.warning("Cluster %s: Slurm answers again after %d refused poll(s); polling at most every "
                                "%.0fs for a while", self.conn_id, slowed, self.schedule.throttle)
                slowed = 0
                if since is not None:
                    log.warning("Cluster %s: %s; watching %d job(s)", self.conn_id,
                                reachable_again_line(self.conn_id, since), len(self._subs))
                elif waits:
                    log.info("Cluster %s reachable again; watching %d job(s)", self.conn_id, len(self._subs))
                failures = waits = errors = 0
                since = None
            except SlurmRateLimited as exc:
                slowed += 1
                wait = self.schedule.slow_down(self._asked())
                log.warning("Cluster %s: Slurm asks for fewer calls (%s); still watching %d job(s), next poll in "
                            "%.0fs", self.conn_id, exc, len(self._subs), wait)
                self._broadcast_throttled(f"Slurm on {self.conn_id} asks for fewer calls ({exc}); next poll in "
                                          f"{wait:.0f}s")
                await asyncio.sleep(wait)  # a new subscriber does not cut this wait short
                continue
            except ControlMasterNotRunning as exc:
                waits += 1
                await self._drop_source()
                delay = self.schedule.transport_retry(self._asked(), waits)
                log.warning("Cluster %s: %s. Still watching %d job(s); next try in %.0fs", self.conn_id, exc,
                            len(self._subs), delay)
                self._broadcast_waiting(str(exc))
                await self._sleep(delay)
                continue
            except TransportError as exc:
                await self._drop_source()
                if not exc.retryable:
                    self._broadcast_error(exc)
                    return
                if isinstance(exc, SlurmCommandFailed) and not exc.slurm_away:
                    errors += 1
                    if errors >= STEP_FAILURES_WHILE_REACHABLE:
                        stopped = slurm_error_line(self.conn_id, errors, str(exc))
                        log.error("Cluster %s: %s", self.conn_id, stopped)
                        self._broadcast_error(SlurmCommandFailed(stopped, exc.result))
                        return
                    delay = self.schedule.error_retry(self._asked(), errors)
                    log.warning("Cluster %s: Slurm answered with an error (%s); asking again in %.0fs (%d of %d)",
                                self.conn_id, exc, delay, errors, STEP_FAILURES_WHILE_REACHABLE)
                    self._broadcast_waiting(f"Slurm answered with an error ({exc}); asking again in {delay:.0f}s, "
                                            f"{STEP_FAILURES_WHILE_REACHABLE - errors} more time(s) before the "
                                            "watch stops")
                    await self._sleep(delay)
                    continue
                errors = 0
                failures += 1
                if since is None:
                    since = time.time()
                    log.warning("Cluster %s unreachable (%s); still watching %d job(s), trying again with a "
                                "new connection", self.conn_id, exc, len(self._subs))
                delay = self.schedule.transport_retry(self._asked(), failures)
                log.info("Cluster %s still unreachable after %d tries (%s); next try in %.0fs", self.conn_id,
                         failures, exc, delay)
                self._broadcast_unreachable(Outage(since, str(exc), delay))
                await self._sleep(delay)
                continue
            except Exception as exc:  # a bug or an unreadable answer: every watcher must hear of it
                log.exception("Polling cluster %s failed", self.conn_id)
                self._broadcast_error(exc)
                return
            await self._wait_reading_records(self.schedule.next_wait(self._asked(), changed) if self._subs else 0.0)

    async def _wait_reading_records(self, seconds: float) -> None:
        """Wait ``seconds`` for the next poll, reading the exit records every ``record_interval``
        meanwhile; a new subscriber ends the wait early (as :meth:`_sleep` does). A failed read only
        stops the reads until the poll, which deals with the connection."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            reading = self.record_interval > 0 and any(s.end_record_path for s in self._subs.values())
            await self._sleep(min(left, self._until_next_read()) if reading else left)
            if self._wake.is_set() or not reading or deadline - time.monotonic() <= 0:
                return
            try:
                await self._records_cycle()
            except Exception as exc:  # the poll retries the connection and tells the watchers
                log.info("Cluster %s: reading the exit records failed (%s); the next poll goes on", self.conn_id, exc)
                await self._sleep(max(0.0, deadline - time.monotonic()))
                return

    def _until_next_read(self) -> float:
        """Seconds to the next read of the exit records: ``record_interval``, or sooner when an end
        Slurm did not confirm yet is due to be asked about again."""
        now = time.monotonic()
        due = [c.ask_at - now for s in self._subs.values() if (c := s.confirmation).pending]
        shortest = min(0.1, self.record_interval)  # an overdue question is asked now, without spinning
        return max(shortest, min([self.record_interval, *due]))

    async def _records_cycle(self) -> None:
        """Read every watched job's exit record (one command, which also checks the sizes of the
        followed files that are due); confirm the ends the records tell with one status query for
        those jobs, and hand the confirmed ones to their watchers at once."""
        subs = [s for s in self._subs.values() if s.end_record_path]
        source = await self.source()
        if not subs or not isinstance(source, FileSource):
            return
        now = time.monotonic()
        following = [s for s in self._subs.values() if s.follow_due(now, s.last_state)]
        sizes, records = await source.poll_files(sorted({p for s in following for p in s.follows}),
                                                 sorted({s.end_record_path for s in subs if s.end_record_path}))
        self.record_reads += 1
        for sub in following:
            followed = await read_followed(source, sub, sizes, now)
            if followed:
                sub.queue.put_nowait(PollUpdate(status=None, log_offset=sub.log_offset, err_offset=sub.err_offset,
                                                followed=followed, only_followed=True))
        ended: dict[int, EndRecord] = {}
        for sub in subs:
            record = record_of(sub, records)
            if record is None:
                sub.confirmation.forget()  # a requeued run's old record: nothing to ask Slurm about
                continue
            if not sub.confirmation.due(record, now):
                continue
            ended[id(sub)] = record
        if not ended:
            return
        self.confirmations += 1
        _, confirmed = await self._poll([s for s in subs if id(s) in ended], ended)
        for sub in subs:
            if id(sub) in ended and id(sub) not in confirmed:
                self.unconfirmed += 1
                self._not_confirmed(sub, ended[id(sub)])

    def _not_confirmed(self, sub: Subscription, record: EndRecord) -> None:
        """Slurm does not call the job ended yet (completing, requeued): ask again after a doubling wait."""
        sub.confirmation.not_confirmed(record, time.monotonic())

    async def _cycle(self) -> bool:
        """One batched status query (plus reads of grown logs); returns True if any state changed."""
        changed, _ = await self._poll(list(self._subs.values()), None)
        return changed

    async def _poll(self, subs: list[Subscription],
                    records: dict[int, EndRecord] | None) -> tuple[bool, set[int]]:
        """Ask Slurm about ``subs``' jobs and hand each its update: the regular poll (``records`` None),
        or the confirmation of the ends that ``records`` (by subscription) tell. Returns whether any
        state changed, and the subscriptions whose job Slurm says ended."""
        only = records is not None
        if not subs:
            return False, set()
        source = await self.source()
        job_ids = sorted({s.job_id for s in subs})
        statuses = await source.statuses(job_ids)
        if not only:
            self.cycles += 1
        # One size check for every log that may have grown; read only the ones that did. The exit
        # records go along in the same command.
        streaming = [s for s in subs if s.log_files() and (st := statuses.get(s.job_id)) and st.state.has_started]
        now = time.monotonic()
        following = [] if only else [s for s in subs if s.follow_due(now, _state_of(statuses.get(s.job_id)))]
        paths = sorted({p for s in streaming for p in s.log_files()} | {p for s in following for p in s.follows})
        record_paths = [] if only else sorted({s.end_record_path for s in subs if s.end_record_path})
        read: dict[str, str] = {}
        if record_paths and isinstance(source, FileSource):
            sizes, read = await source.poll_files(paths, record_paths)
        else:
            sizes = await source.file_sizes(paths) if paths else {}
        readings = await read_allocations(source, statuses.values())
        windows = await self.maintenance.read(source, statuses.values())
        changed = False
        confirmed: set[int] = set()
        for sub in subs:
            status = statuses.get(sub.job_id)
            state = status.state.value if status is not None else None
            if state != sub.last_state:
                changed = True
                sub.last_state = state
            if status is not None:
                sub.restarts = max(sub.restarts, status.restarts)
            if status is not None and status.state.is_terminal:
                confirmed.add(id(sub))
            elif (record := record_of(sub, read)) is not None:  # this poll's answer: not ended yet
                self._not_confirmed(sub, record)
            elif record_paths:
                sub.confirmation.forget()
            text = err_text = ""
            if sub in streaming:
                if sub.log_path and sizes.get(sub.log_path, 0) > sub.log_offset:
                    text, sub.log_offset = await read_grown(source, sub.log_path, sub.log_offset,
                                                             sizes[sub.log_path])
                if sub.err_path and sizes.get(sub.err_path, 0) > sub.err_offset:
                    err_text, sub.err_offset = await read_grown(source, sub.err_path, sub.err_offset,
                                                                 sizes[sub.err_path])
            followed = await read_followed(source, sub, sizes, now) if sub in following else ()
            reading = readings.get(key) if (key := allocation_key(status)) is not None else None
            sub.queue.put_nowait(PollUpdate(status=status, new_log_text=text, log_offset=sub.log_offset,
                                            new_err_text=err_text, err_offset=sub.err_offset,
                                            allocation=reading,
                                            maintenance=windows if status is not None
                                            and waits_for_maintenance(status.reason) else (),
                                            end_record=records.get(id(sub)) if records else None,
                                            followed=followed))
        return changed, confirmed

    def _asked(self) -> Asked:
        """What the subscribed watches allow between polls."""
        return Asked.of((s.poll_interval, s.max_poll_interval) for s in self._subs.values())

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake early when a new job is subscribed so it gets its first status soon.

        After an early wake it waits a moment more, so a burst of new subscriptions shares one cycle.
        """
        self._wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
            await asyncio.sleep(min(seconds, self._coalesce))

    def _broadcast_error(self, exc: BaseException) -> None:
        for sub in self._subs.values():
            sub.queue.put_nowait(PollUpdate(status=None, error=exc, log_offset=sub.log_offset,
                                            err_offset=sub.err_offset))

    def _broadcast_unreachable(self, outage: Outage) -> None:
        for sub in self._subs.values():
            sub.queue.put_nowait(PollUpdate(status=None, log_offset=sub.log_offset, unreachable=outage,
                                            err_offset=sub.err_offset))

    def _broadcast_throttled(self, answer: str) -> None:
        for sub in self._subs.values():
            sub.queue.put_nowait(PollUpdate(status=None, log_offset=sub.log_offset, throttled=answer,
                                            err_offset=sub.err_offset))

    def _broadcast_waiting(self, what_to_do: str) -> None:
        for sub in self._subs.values():
            sub.queue.put_nowait(PollUpdate(status=None, log_offset=sub.log_offset, waiting=what_to_do,
                                            err_offset=sub.err_offset))

    async def _drop_source(self) -> None:
        source, self._source = self._source, None
        if source is not None:
            with contextlib.suppress(Exception):
                await source.close()

    async def _stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._drop_source()
        _POLLERS.pop((id(asyncio.get_running_loop()), self.conn_id), None)


def _state_of(status: JobStatus | None) -> str | None:
    return status.state.value if status is not None else None


_POLLERS: dict[tuple[int, str], JobPoller] = {}


def shared_poller(conn_id: str, source_factory: Callable[[], StatusSource], **kwargs: Any) -> JobPoller:
    """The poller of ``conn_id`` in the running event loop (the triggerer has one loop for all triggers)."""
    key = (id(asyncio.get_running_loop()), conn_id)
    poller = _POLLERS.get(key)
    if poller is None:
        poller = _POLLERS[key] = JobPoller(conn_id, source_factory, **kwargs)
    return poller
