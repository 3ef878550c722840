"""``SlurmJobTrigger``: waits in the triggerer for one Slurm job to end, without a worker slot.

Every trigger of one connection subscribes to the connection's shared :class:`JobPoller`, so a
triggerer watching hundreds of jobs still makes one status query per interval. The trigger streams
new lines of the job's output file and of its error output (each line marked ``stderr``) into the
task log, fires exactly one event, and carries
everything the operator needs to resume in that event (``airflow dags test`` drops ``defer()``
kwargs), including an opaque ``carry`` dict the operator hands in. While the login waits for a
person (an OTP ControlMaster that lapsed), the trigger logs what to do once and keeps waiting: the
job runs on regardless, and the watch picks up when the master is back. While the login node does
not answer at all (maintenance), the trigger says so once ("login node of mycluster unreachable since
14:02 ...; job 123 last seen RUNNING; waiting up to 24 h ...") and waits up to
``watch_deadline``; when the node answers again it says after how long and goes on (a job that
ended meanwhile is read from ``sacct``); past the deadline it fires an ``error`` event, a lost watch.

A job whose script leaves an exit record next to its output (:mod:`slurm_provider.end_records`) is
seen to end within seconds: the poller reads the record between its polls and asks Slurm once to
confirm. The event says what noticed the end (``noticed_by``: ``end_record`` or ``poll``).

A watch may follow more files of its job (``follow``: a metrics log, say; see
:mod:`slurm_provider.followed_files`): the poller reads what they grew by at most every
``follow_interval`` seconds, in a command it runs anyway, and the trigger folds their new lines into
a small state it keeps as an XCom of the task try, for a UI to show while the job runs.

A job pending on its account's allocation (``AssocGrpBillingMinutes``) is judged on the account's
figures, which the poller reads for it (:mod:`slurm_provider.allocation`): when the usage alone
leaves too little the job never starts and the watch ends at once; when teammates' running jobs hold
the rest it waits, saying whose jobs hold how much, for at most ``watch_deadline`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from slurm_provider.timing import POLL_INTERVAL, MAX_POLL_INTERVAL, FIRST_POLL_DELAY
from slurm_provider.outage import (
    DEFAULT_WATCH_DEADLINE,
    Outage,
    gave_up_line,
    reachable_again_line,
    timeout_seconds,
    unreachable_line,
)
from slurm_provider.allocation import AccountReading, deadline_message, judge
from slurm_provider.cli.values import format_duration
from slurm_provider.end_records import end_record_path
from slurm_provider.followed_files import FOLLOW_INTERVAL, FollowedFile, advance, followed_files, load_fold
from slurm_provider.maintenance import Window, maintenance_line, maintenance_words
from slurm_provider.pending_words import waiting_line
from slurm_provider.poller import JobPoller, shared_poller
from slurm_provider.state_vocabulary import (
    ReasonKind,
    SlurmState,
    StateCategory,
    classify_pending_reason,
    split_reason,
)
from slurm_provider.job_status import JobStatus
from slurm_provider.watch_state import (
    NOTE_REFRESH_S,
    TaskKey,
    WatchNote,
    ended_by_a_person,
    recall_followed,
    recall_watch,
    remember_followed,
    remember_watch,
    task_state,
)

log = logging.getLogger(__name__)

# Event kinds: the job ended (any terminal state), will never start, vanished, or could not be watched.
FINISHED, NEVER_STARTS, LOST, ERROR = "finished", "never_starts", "lost", "error"
PENDING_POLICIES = ("fail", "warn")
USER_HOLD = "JobHeldUser"
"""The pending reason of a job on user hold, which its owner may release (an administrator's hold,
``JobHeldAdmin``, only an administrator)."""


def _hook_factory(conn_id: str):
    def make():
        from slurm_provider.hooks import SlurmAsyncHook

        return SlurmAsyncHook(conn_id)

    return make


class SlurmJobTrigger(BaseTrigger):
    """Fires one event when Slurm job ``job_id`` ends (or will never start, or cannot be found).

    :param conn_id: Airflow SSH connection of the cluster's login node.
    :param job_id: the Slurm job id to watch.
    :param poll_interval: first interval between status queries, seconds.
    :param max_poll_interval: cap of the interval, which grows while nothing changes.
    :param first_poll_delay: wait before the first query (keep >= 10 s in deployments: a trigger
        firing within seconds of deferral can race the scheduler).
    :param log_path: the job's output file on the cluster; new lines are copied to the task log.
    :param log_offset: bytes of ``log_path`` already shown. In a triggerer the trigger also notes its
        progress (offsets, last state announced, the time of the last answered poll) as an XCom of the
        task try, so a restarted triggerer goes on where the last one stopped instead of showing lines
        again, and a UI can show the job as of that poll.
    :param err_log_path: the job's error output file (``sbatch --error``), streamed like ``log_path``
        with its lines marked ``stderr``.
    :param err_log_offset: bytes of ``err_log_path`` already shown.
    :param pending_policy: ``fail`` ends the wait when the pending reason means the job can never
        start (e.g. the allocation is spent), or when it waited ``watch_deadline`` for the allocation
        in vain; ``warn`` logs it and keeps waiting, without a deadline.
    :param expected_job_name: the job's name, checked before ``on_kill`` cancels anything, so a
        recycled job id of someone else's job is never cancelled. None (a sensor watching a job
        submitted elsewhere): ``on_kill`` never cancels.
    :param unknown_grace_polls: consecutive polls in which neither squeue nor sacct knows the job
        before it is reported lost (accounting reaches slurmdbd with a lag).
    :param carry: opaque JSON-safe data returned unchanged in the event.
    :param adopted_from: who submitted the job when the task only adopted it (another clear, run,
        deployment): ``on_kill`` then leaves it running, whatever its name, and says so.
    :param watch_deadline: seconds the watch may wait for something outside the job before it gives
        up: a login node that does not answer (counted from the first failed try, kept across
        triggerer restarts in the watch note; then an ``error`` event: the job runs on and a task
        retry adopts it), or running jobs of the account that hold the allocation the job pends on.
    :param read_end_record: read the job's exit record (``<log_path>.end``) between polls, so its end
        is noticed within seconds; False: only the polls notice it.
    :param follow: files of the job to follow as they grow, each ``{"path", "fold"}`` (the import path
        of a pure function folding new lines into a small JSON-safe state, see
        :mod:`slurm_provider.followed_files`); the offsets and states are kept in the XCom
        ``slurm_followed`` of the task try, and the event carries the offsets.
    :param follow_interval: least seconds between two size checks of the followed files.
    :param release_held: release the job once when it is put on user hold (``JobHeldUser``), as some sites
        do to queued jobs after a maintenance break, and say so; only a job named
        ``expected_job_name``. False: the task log says that it waits for a release and how to give it.
    """

    def __init__(self, *, conn_id: str, job_id: str, poll_interval: float = POLL_INTERVAL,
                 max_poll_interval: float = MAX_POLL_INTERVAL, first_poll_delay: float = FIRST_POLL_DELAY,
                 log_path: str | None = None, log_offset: int = 0, pending_policy: str = "fail",
                 expected_job_name: str | None = None, unknown_grace_polls: int = 6,
                 carry: dict[str, Any] | None = None, err_log_path: str | None = None,
                 err_log_offset: int = 0, adopted_from: str | None = None,
                 watch_deadline: float = DEFAULT_WATCH_DEADLINE.total_seconds(),
                 read_end_record: bool = True, follow: list[dict[str, Any]] | None = None,
                 follow_interval: float = FOLLOW_INTERVAL, release_held: bool = False) -> None:
        super().__init__()
        if pending_policy not in PENDING_POLICIES:
            raise ValueError(f"pending_policy {pending_policy!r} not allowed (known: {', '.join(PENDING_POLICIES)})")
        self.conn_id = conn_id
        self.job_id = str(job_id)
        self.poll_interval = float(poll_interval)
        self.max_poll_interval = float(max_poll_interval)
        self.first_poll_delay = float(first_poll_delay)
        self.log_path = log_path
        self.log_offset = int(log_offset)
        self.err_log_path = err_log_path
        self.err_log_offset = int(err_log_offset)
        self.pending_policy = pending_policy
        self.expected_job_name = expected_job_name
        self.unknown_grace_polls = int(unknown_grace_polls)
        self.carry = dict(carry or {})
        self.adopted_from = adopted_from
        self.watch_deadline = timeout_seconds(watch_deadline)
        self.read_end_record = bool(read_end_record)
        self.follow = [{"path": f.path, "fold": f.fold, "offset": f.offset} for f in followed_files(follow)]
        self.follow_interval = float(follow_interval)
        self.release_held = bool(release_held)
        self._held = False  # the job is on user hold, and the watch said so
        self._released = 0  # holds this watch released
        self._followed: dict[str, FollowedFile] = {}
        self._allocation_since: float | None = None
        self._allocation_said: tuple[Any, ...] | None = None
        self._waiting: tuple[str | None, str | None] = (None, None)  # (reason, expected start) while pending
        self._windows: tuple[Window, ...] = ()  # the maintenance windows the pending job waits out
        self._polled_at: float | None = None  # the last poll the cluster answered (epoch seconds)
        self._noted_at = 0.0  # when the watch note was last written (epoch seconds)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "conn_id": self.conn_id,
                "job_id": self.job_id,
                "poll_interval": self.poll_interval,
                "max_poll_interval": self.max_poll_interval,
                "first_poll_delay": self.first_poll_delay,
                "log_path": self.log_path,
                "log_offset": self.log_offset,
                "err_log_path": self.err_log_path,
                "err_log_offset": self.err_log_offset,
                "pending_policy": self.pending_policy,
                "expected_job_name": self.expected_job_name,
                "unknown_grace_polls": self.unknown_grace_polls,
                "carry": self.carry,
                "adopted_from": self.adopted_from,
                "watch_deadline": self.watch_deadline,
                "read_end_record": self.read_end_record,
                "follow": self.follow,
                "follow_interval": self.follow_interval,
                "release_held": self.release_held,
            },
        )

    def _event(self, kind: str, status: JobStatus | None, message: str,
               noticed_by: str | None = None) -> TriggerEvent:
        return TriggerEvent({
            "kind": kind,
            "conn_id": self.conn_id,
            "job_id": self.job_id,
            "status": status.to_event() if status is not None else None,
            "log_path": self.log_path,
            "log_offset": self.log_offset,
            "err_log_path": self.err_log_path,
            "err_log_offset": self.err_log_offset,
            "message": message,
            "carry": self.carry,
            "noticed_by": noticed_by,
            "follow": [{"path": f.path, "fold": f.fold, "offset": f.offset} for f in self._followed.values()]
                      or self.follow,
        })

    async def run(self) -> AsyncIterator[TriggerEvent]:
        poller = shared_poller(self.conn_id, _hook_factory(self.conn_id))
        task = TaskKey.of(self.task_instance)
        note = await self._recalled(task)
        self.log_offset = max(self.log_offset, note.log_offset)
        self.err_log_offset = max(self.err_log_offset, note.err_offset)
        self._allocation_since = note.allocation_since
        self._polled_at = note.polled_at
        last_state = SlurmState(note.state) if note.state in SlurmState.__members__ else None
        warned_reason: str | None = None
        last_reason: str | None = None  # the pending reason last told in the task log
        waiting_for: str | None = None
        slowed = False  # Slurm asked for fewer calls; told once in the task log
        unreachable_since = note.unreachable_since  # an earlier trigger of this try met the same outage
        announced = False  # the outage was told in the task log by this trigger
        unknown_polls = 0
        await self._recall_followed(task)
        async with poller.subscribe(self.job_id, poll_interval=self.poll_interval,
                                    max_poll_interval=self.max_poll_interval, log_path=self.log_path,
                                    log_offset=self.log_offset, err_path=self.err_log_path,
                                    err_offset=self.err_log_offset,
                                    first_poll_delay=self.first_poll_delay,
                                    end_record_path=self._end_record_path(),
                                    follows={f.path: f.offset for f in self._followed.values() if not f.problem},
                                    follow_interval=self.follow_interval) as updates:
            while True:
                update = await updates.get()
                if update.error is not None:
                    yield self._event(ERROR, None, f"cannot watch job {self.job_id} on {self.conn_id}: "
                                                   f"{update.error}")
                    return
                if update.followed:
                    await self._fold_followed(task, update.followed)
                if update.only_followed:
                    continue
                if update.waiting is not None:  # the job keeps running; only our view of it paused
                    if update.waiting != waiting_for:
                        self.log.warning("Cannot see job %s right now, still waiting: %s", self.job_id,
                                         update.waiting)
                        waiting_for = update.waiting
                    continue
                if update.throttled is not None:  # Slurm is busy or limits us: ask less often, never give up
                    if not slowed:
                        self.log.warning("%s; job %s is still watched", update.throttled, self.job_id)
                        slowed = True
                    continue
                if update.unreachable is not None:  # the job runs on; wait for the login node
                    outage = Outage(unreachable_since or update.unreachable.since, update.unreachable.cause,
                                    update.unreachable.retry_in)
                    state = last_state.value if last_state is not None else None
                    if outage.is_past(self.watch_deadline):
                        message = gave_up_line(self.conn_id, outage, self.watch_deadline,
                                               job_id=self.job_id, last_state=state)
                        self.log.error("%s", message)
                        yield self._event(ERROR, None, message)
                        return
                    if not announced:
                        self.log.warning("%s", unreachable_line(self.conn_id, outage, self.watch_deadline,
                                                                job_id=self.job_id, last_state=state))
                        announced = True
                    if unreachable_since is None:
                        unreachable_since = outage.since
                        await self._remember(task, last_state, unreachable_since)
                    continue
                if unreachable_since is not None:
                    self.log.warning("%s; watching job %s again", reachable_again_line(self.conn_id,
                                                                                      unreachable_since),
                                     self.job_id)
                    unreachable_since, announced = None, False
                    await self._remember(task, last_state)
                if waiting_for is not None or slowed:
                    self.log.info("Watching job %s again on %s", self.job_id, self.conn_id)
                    waiting_for, slowed = None, False
                self.log_offset, self.err_log_offset = update.log_offset, update.err_offset
                for line in update.new_log_text.splitlines():
                    self.log.info("[job %s] %s", self.job_id, line)
                for line in update.new_err_text.splitlines():
                    self.log.info("[job %s stderr] %s", self.job_id, line)
                shown = bool(update.new_log_text or update.new_err_text)
                status = update.status
                if status is None or status.state is SlurmState.UNKNOWN:
                    if shown:
                        await self._remember(task, last_state)
                    unknown_polls += 1
                    if unknown_polls >= self.unknown_grace_polls:
                        yield self._event(LOST, status, f"job {self.job_id} is known neither to squeue nor to "
                                                        f"sacct after {unknown_polls} polls")
                        return
                    continue
                unknown_polls = 0
                self._polled_at = time.time()
                self._waiting = ((status.reason, status.expected_start) if status.state is SlurmState.PENDING
                                 else (None, None))
                if status.state is not last_state or (status.state is SlurmState.PENDING
                                                      and status.reason != last_reason):
                    self.log.info("Job %s %s", self.job_id, _describe(status))
                    last_state, last_reason, shown = status.state, status.reason, True
                if update.maintenance != self._windows:
                    self._windows, shown = update.maintenance, True
                    if (window_line := maintenance_line(self.job_id, self._windows)) is not None:
                        self.log.warning("%s", window_line)
                if shown or self._polled_at - self._noted_at >= NOTE_REFRESH_S:
                    await self._remember(task, last_state)
                if status.state.is_terminal:
                    noticed_by = "end_record" if update.end_record is not None else "poll"
                    yield self._event(FINISHED, status, _describe(status), noticed_by)
                    return
                if status.state.has_started and self._allocation_since is not None:
                    self._allocation_since, self._allocation_said = None, None
                    await self._remember(task, last_state)
                held = status.state is SlurmState.PENDING and split_reason(status.reason)[0] == USER_HOLD
                if held and not self._held:  # a new hold: a job still held after a release was held again
                    self._held = not await self._on_user_hold(poller, status)
                elif not held:
                    self._held = False
                if status.state is SlurmState.PENDING and status.reason:
                    reason = classify_pending_reason(status.reason)
                    if reason.kind is ReasonKind.ALLOCATION:
                        event = await self._waited_for_allocation(task, last_state, status, update.allocation)
                        if event is not None:
                            yield event
                            return
                    elif reason.blocks_forever:
                        text = f"job {self.job_id} will not start: {status.reason}: {reason.explanation}"
                        if self.pending_policy == "fail":
                            yield self._event(NEVER_STARTS, status, text)
                            return
                        if warned_reason != status.reason:
                            self.log.warning("%s (still waiting: pending_policy=warn)", text)
                            warned_reason = status.reason

    async def _on_user_hold(self, poller: JobPoller, status: JobStatus) -> bool:
        """The job was just put on user hold: release it once (``release_held``, our job only), or say
        that it waits for a release and how to give it. Returns whether it was released."""
        ours = bool(self.expected_job_name) and status.name == self.expected_job_name
        if not (self.release_held and ours and not self._released):
            self.log.warning("%s", held_line(self.job_id, self.conn_id, released=self._released,
                                             allowed=self.release_held))
            return False
        try:
            source = await poller.source()
            await asyncio.wait_for(source.release(self.job_id), timeout=60)
        except Exception as exc:  # the watch goes on; a person can release it
            self.log.warning("Job %s is on user hold (JobHeldUser) and releasing it failed (%s): run "
                             "'scontrol release %s' on the login node of %s", self.job_id, exc, self.job_id,
                             self.conn_id)
            return False
        self._released += 1
        self.log.warning("Job %s was put on user hold (JobHeldUser), as a site does to queued jobs after a "
                         "maintenance break: released it (release_held). Held again, it stays held",
                         self.job_id)
        return True

    async def _recall_followed(self, task: TaskKey | None) -> None:
        """The followed files as this task try's earlier triggers left them (a restart reads on from there)."""
        self._followed = {f.path: f for f in followed_files(self.follow)}
        if task is None or not self._followed:
            return
        try:
            kept = await asyncio.wait_for(recall_followed(task, self.job_id), timeout=30)
        except Exception as exc:  # the files are read again from their offsets in the arguments
            self.log.warning("Could not read how far job %s's followed files were read (%s)", self.job_id, exc)
            return
        for data in kept:
            try:
                file = FollowedFile.from_json(data)
            except ValueError:
                continue
            if file.path in self._followed:
                self._followed[file.path] = replace(file, fold=self._followed[file.path].fold)

    async def _fold_followed(self, task: TaskKey | None, grown: tuple[tuple[str, str, int], ...]) -> None:
        """Fold what the followed files grew by into their states and keep them in the try's XCom."""
        now = time.time()
        for path, text, offset in grown:
            file = self._followed.get(path)
            if file is None:
                continue
            try:
                fold = load_fold(file.fold)
            except ValueError as exc:
                self._followed[path] = replace(file, offset=offset, problem=str(exc))
            else:
                self._followed[path] = advance(file, text, offset, now, fold)
            if self._followed[path].problem and not file.problem:
                self.log.warning("No longer following %s: %s", path, self._followed[path].problem)
        if task is None:
            return
        files = [f.to_json() for f in self._followed.values()]
        try:
            await asyncio.wait_for(remember_followed(task, self.job_id, files), timeout=30)
        except Exception as exc:  # a UI shows an older state; the next read tries again
            self.log.warning("Could not keep what job %s's followed files hold (%s)", self.job_id, exc)

    def _end_record_path(self) -> str | None:
        return end_record_path(self.log_path) if self.read_end_record and self.log_path else None

    async def _waited_for_allocation(self, task: TaskKey | None, last_state: SlurmState | None,
                                     status: JobStatus, reading: AccountReading | None) -> TriggerEvent | None:
        """The job pends on its account's allocation: the event that ends the watch (the usage alone
        leaves too little, or ``watch_deadline`` passed), or None to wait on, logging whose running
        jobs hold the allocation whenever that changes."""
        now = time.time()
        first = self._allocation_since is None
        if first:
            self._allocation_since = now
            await self._remember(task, last_state)
        verdict = judge(status, status.reason or "", reading.figures) if reading and reading.figures else None
        if verdict is not None and verdict.spent:
            if self.pending_policy == "fail":
                return self._event(NEVER_STARTS, status, verdict.spent_message())
            said: tuple[Any, ...] = ("spent",)
            text = f"{verdict.spent_message()} (still waiting: pending_policy=warn)"
        elif verdict is not None:
            said = ("waiting", verdict.judged, tuple(user for user, _ in verdict.figures.holders))
            text = verdict.waiting()
        else:
            problem = reading.problem if reading is not None else "the allocation was not read"
            said = ("unread", problem)
            text = (f"Job {self.job_id} pends with {status.reason}, but its account's allocation cannot be read "
                    f"({problem}): waiting")
        waited = now - (self._allocation_since or now)
        if self.pending_policy == "fail" and waited > self.watch_deadline:
            return self._event(NEVER_STARTS, status, deadline_message(self.job_id, status.reason or "", waited,
                                                                      self.watch_deadline, text))
        if said != self._allocation_said:
            if first and self.pending_policy == "fail":
                text += f" (for at most {format_duration(self.watch_deadline)}: watch_deadline)"
            if said[0] == "spent":
                self.log.warning("%s", text)
            else:
                self.log.info("%s", text)
            self._allocation_said = said
        return None

    async def _recalled(self, task: TaskKey | None) -> WatchNote:
        """What an earlier trigger of this task try showed already (a triggerer restart loses nothing)."""
        if task is None:
            return WatchNote(self.log_offset, err_offset=self.err_log_offset)
        try:
            return await asyncio.wait_for(recall_watch(task, self.job_id, self.log_path), timeout=30)
        except Exception as exc:  # never fail the watch over it: at worst lines are shown twice
            self.log.warning("Could not read how far the watch of job %s got (%s); showing %s from byte %d",
                             self.job_id, exc, self.log_path, self.log_offset)
            return WatchNote(self.log_offset)

    async def _remember(self, task: TaskKey | None, state: SlurmState | None,
                        unreachable_since: float | None = None) -> None:
        if task is None:
            return
        note = WatchNote(self.log_offset, state.value if state is not None else None, self.err_log_offset,
                         unreachable_since=unreachable_since, allocation_since=self._allocation_since,
                         reason=self._waiting[0], expected_start=self._waiting[1], polled_at=self._polled_at,
                         maintenance=maintenance_words(self._windows))
        try:
            await asyncio.wait_for(remember_watch(task, self.job_id, self.log_path, note), timeout=30)
            self._noted_at = time.time()
        except Exception as exc:
            self.log.warning("Could not note how far the watch of job %s got (%s); a restarted triggerer may "
                             "show some lines again", self.job_id, exc)

    async def on_kill(self) -> None:
        """Airflow stopped this watch because of something done to the task: cancel the job when a
        person ended the task (marked it failed, success or skipped) and it is still our job, one this
        task submitted (an adopted job is left to the task that submitted it).

        Airflow 3.3 calls this whenever the trigger leaves a running triggerer, which also happens
        when the task was cleared (its next try adopts the job) or the trigger moved to another
        triggerer (the task is still deferred): the task's state tells them apart. A triggerer that
        shuts down or restarts never calls it.
        """
        if not self.expected_job_name:
            self.log.info("Watch of job %s stopped; the job was submitted elsewhere, so it is left running",
                          self.job_id)
            return
        if self.adopted_from:
            self.log.warning("Watch of job %s stopped. The job was submitted by %s, not by this task, which only "
                             "watched it: it is left running", self.job_id, self.adopted_from)
            return
        task = TaskKey.of(self.task_instance)
        if task is not None:
            try:
                state = await asyncio.wait_for(task_state(task), timeout=20)
            except Exception as exc:
                self.log.warning("Watch of job %s stopped, but the task's state could not be read (%s): not "
                                 "cancelling it; run `scancel %s` on the cluster if it should stop",
                                 self.job_id, exc, self.job_id)
                return
            if not ended_by_a_person(state):
                self.log.info("Watch of job %s stopped while the task is %s (cleared or moved to another "
                              "triggerer): the job keeps running for the task to adopt", self.job_id, state)
                return
        from slurm_provider.hooks import SlurmAsyncHook

        hook = SlurmAsyncHook(self.conn_id)
        try:
            statuses = await asyncio.wait_for(hook.statuses([self.job_id]), timeout=20)
            status = statuses.get(self.job_id)
            if status is None or status.state.is_terminal or status.state is SlurmState.UNKNOWN:
                self.log.info("Task stopped; job %s has already ended, nothing to cancel", self.job_id)
                return
            if status.name != self.expected_job_name:
                self.log.warning("Task stopped, but job %s is now named %r, not %r: not cancelling it",
                                 self.job_id, status.name, self.expected_job_name)
                return
            await asyncio.wait_for(hook.cancel(self.job_id), timeout=20)
            self.log.info("Task stopped by a user: cancelled job %s", self.job_id)
        finally:
            await hook.close()


def held_line(job_id: str, conn_id: str, *, released: int, allowed: bool) -> str:
    """What the task log says about a job on user hold the watch does not release."""
    why = ("it was held again after this watch released it once" if released else
           "release_held is off" if not allowed else "it is not this task's job")
    return (f"Job {job_id} is on user hold (JobHeldUser) and waits for a release ({why}): run "
            f"'scontrol release {job_id}' on the login node of {conn_id} to let it start")


def _describe(status: JobStatus) -> str:
    """One line for people: state, why it waits and when it may start (pending), or node list and
    exit code."""
    if status.state is SlurmState.PENDING:
        return f"{status.state.value}: {waiting_line(status.reason, status.expected_start)}"
    parts = [status.state.value]
    if status.state.category is StateCategory.WAITING and status.reason and status.reason != "None":
        parts.append(f"({status.reason})")
    if status.node_list and status.state.has_started:
        parts.append(f"on {status.node_list}")
    if status.state.is_terminal and status.exit_code is not None:
        parts.append(f"exit code {status.exit_code}")
    if status.restarts:
        parts.append(f"after {status.restarts} restart(s)")
    return " ".join(parts)
