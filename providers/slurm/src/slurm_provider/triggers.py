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

A job whose script leaves an exit record next to its output (:mod:`slurm_provider.watch.end_records`) is
seen to end within seconds: the poller reads the record between its polls and asks Slurm once to
confirm. The event says what noticed the end (``noticed_by``: ``end_record`` or ``poll``).

A watch may follow more files of its job (``follow``: a metrics log, say; see
:mod:`slurm_provider.watch.followed_files`): the poller reads what they grew by at most every
``follow_interval`` seconds, in a command it runs anyway, and the trigger folds their new lines into
a small state it keeps as an XCom of the task try, for a UI to show while the job runs.

A job pending on its account's allocation (``AssocGrpBillingMinutes``) is judged on the account's
figures, which the poller reads for it (:mod:`slurm_provider.watch.allocation`): when the usage alone
leaves too little the job never starts and the watch ends at once; when teammates' running jobs hold
the rest it waits, saying whose jobs hold how much, for at most ``watch_deadline`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from slurm_provider.watch.end_records import end_record_path
from slurm_provider.watch.followed_files import FOLLOW_INTERVAL, FollowedFile, followed_files
from slurm_provider.watch.outage import DEFAULT_WATCH_DEADLINE, timeout_seconds
from slurm_provider.watch.poller import JobPoller, shared_poller
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.timing import FIRST_POLL_DELAY, MAX_POLL_INTERVAL, POLL_INTERVAL
from slurm_provider.watch.events import ERROR, FINISHED, LOST, NEVER_STARTS, WatchEvent
from slurm_provider.watch.job_watch import (
    PENDING_POLICIES,
    End,
    JobWatch,
    KeepFollowed,
    Release,
    Remember,
    Say,
)
from slurm_provider.watch.notes import (
    TaskKey,
    WatchNote,
    ended_by_a_person,
    recall_followed,
    recall_watch,
    remember_followed,
    remember_watch,
    task_state,
)

__all__ = ["ERROR", "FINISHED", "LOST", "NEVER_STARTS", "SlurmJobTrigger"]

log = logging.getLogger(__name__)



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
        :mod:`slurm_provider.watch.followed_files`); the offsets and states are kept in the XCom
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
        self._followed: dict[str, FollowedFile] = {}  # the watch's followed files, as far as they were read

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

    def _event(self, end: End) -> TriggerEvent:
        return TriggerEvent(WatchEvent(
            kind=end.kind, conn_id=self.conn_id, job_id=self.job_id, message=end.message, status=end.status,
            log_path=self.log_path, log_offset=self.log_offset, err_log_path=self.err_log_path,
            err_log_offset=self.err_log_offset, carry=self.carry, noticed_by=end.noticed_by,
            follow=tuple({"path": f.path, "fold": f.fold, "offset": f.offset} for f in self._followed.values())
            or tuple(self.follow)).to_json())

    def _watch(self) -> JobWatch:
        return JobWatch(self.conn_id, self.job_id, pending_policy=self.pending_policy,
                        expected_job_name=self.expected_job_name, unknown_grace_polls=self.unknown_grace_polls,
                        watch_deadline=self.watch_deadline, release_held=self.release_held,
                        log_offset=self.log_offset, err_offset=self.err_log_offset,
                        followed={f.path: f for f in followed_files(self.follow)})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Subscribe to the connection's poller, step the watch with each update, carry out its answer."""
        poller = shared_poller(self.conn_id, _hook_factory(self.conn_id))
        task = TaskKey.of(self.task_instance)
        watch = self._watch()
        watch.resume(await self._recalled(task), await self._recall_followed(task, watch))
        self._followed = watch.followed
        self.log_offset, self.err_log_offset = watch.log_offset, watch.err_offset
        async with poller.subscribe(self.job_id, poll_interval=self.poll_interval,
                                    max_poll_interval=self.max_poll_interval, log_path=self.log_path,
                                    log_offset=self.log_offset, err_path=self.err_log_path,
                                    err_offset=self.err_log_offset,
                                    first_poll_delay=self.first_poll_delay,
                                    end_record_path=self._end_record_path(),
                                    follows={f.path: f.offset for f in watch.followed.values() if not f.problem},
                                    follow_interval=self.follow_interval) as updates:
            while True:
                actions = watch.step(await updates.get(), time.time())
                while actions:
                    action = actions.pop(0)
                    self.log_offset, self.err_log_offset = watch.log_offset, watch.err_offset
                    if isinstance(action, Say):
                        self.log.log(action.level, "%s", action.text)
                    elif isinstance(action, Remember):
                        await self._remember(task, action.note)
                    elif isinstance(action, KeepFollowed):
                        await self._keep_followed(task, action.files)
                    elif isinstance(action, Release):
                        actions[:0] = watch.released(await self._release(poller))
                    else:
                        yield self._event(action)
                        return

    async def _release(self, poller: JobPoller) -> str | None:
        """Release the job from its user hold; what failed, or None."""
        try:
            source = await poller.source()
            await asyncio.wait_for(source.release(self.job_id), timeout=60)
        except Exception as exc:  # the watch goes on; a person can release it
            return str(exc)
        return None

    async def _recall_followed(self, task: TaskKey | None, watch: JobWatch) -> list[dict[str, Any]]:
        """The followed files as this task try's earlier triggers left them (a restart reads on from there)."""
        if task is None or not watch.followed:
            return []
        try:
            return await asyncio.wait_for(recall_followed(task, self.job_id), timeout=30)
        except Exception as exc:  # the files are read again from their offsets in the arguments
            self.log.warning("Could not read how far job %s's followed files were read (%s)", self.job_id, exc)
            return []

    async def _keep_followed(self, task: TaskKey | None, files: tuple[dict[str, Any], ...]) -> None:
        """Keep the followed files' states in the try's XCom, for a UI."""
        if task is None:
            return
        try:
            await asyncio.wait_for(remember_followed(task, self.job_id, list(files)), timeout=30)
        except Exception as exc:  # a UI shows an older state; the next read tries again
            self.log.warning("Could not keep what job %s's followed files hold (%s)", self.job_id, exc)

    def _end_record_path(self) -> str | None:
        return end_record_path(self.log_path) if self.read_end_record and self.log_path else None

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

    async def _remember(self, task: TaskKey | None, note: WatchNote) -> None:
        if task is None:
            return
        try:
            await asyncio.wait_for(remember_watch(task, self.job_id, self.log_path, note), timeout=30)
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

