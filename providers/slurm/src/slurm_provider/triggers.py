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
from dataclasses import replace
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from slurm_provider.watch.end_records import end_record_path
from slurm_provider.watch.followed_files import FollowedFile, followed_files
from slurm_provider.watch.poller import JobPoller, shared_poller
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.watch.events import ERROR, FINISHED, LOST, NEVER_STARTS, WatchEvent
from slurm_provider.watch.job_watch import (
    End,
    JobWatch,
    KeepFollowed,
    Release,
    Remember,
    Say,
)
from slurm_provider.watch.watch_request import FollowedFiles, WatchedJob, WatchSchedule, from_flat_keywords
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
    """Fires one event when Slurm job ``job.job_id`` ends (or will never start, or cannot be found).

    :param job: what to watch (:class:`~slurm_provider.watch.watch_request.WatchedJob`, or its JSON):
        the connection and job id, its output and error output files (new lines go to the task log
        from the given offsets; in a triggerer the trigger also notes its progress as an XCom of the
        task try, so a restarted triggerer goes on where the last one stopped), whether its exit
        record is read between polls, whose job it is (a person's gesture cancels only a job this task
        submitted and still named as expected), how a job that cannot start is judged and whether a
        job put on user hold is released.
    :param schedule: when to ask and how long to wait for something outside the job
        (:class:`~slurm_provider.watch.watch_request.WatchSchedule`): the first and the longest poll
        interval, the delay before the first poll, the polls in which Slurm may not know the job yet,
        and the deadline for a login node that does not answer or an allocation teammates hold.
    :param follow: more files of the job to read as they grow
        (:class:`~slurm_provider.watch.watch_request.FollowedFiles`); their states are kept in the XCom
        ``slurm_followed`` of the task try, and the event carries their offsets.
    :param carry: opaque JSON-safe data returned unchanged in the event.
    :param earlier: the flat keywords of a trigger stored by an earlier version of the provider
        (``conn_id=..., job_id=..., poll_interval=...``), which a triggerer still resumes.
    """

    def __init__(self, *, job: WatchedJob | dict[str, Any] | None = None,
                 schedule: WatchSchedule | dict[str, Any] | None = None,
                 follow: FollowedFiles | dict[str, Any] | list[dict[str, Any]] | None = None,
                 carry: dict[str, Any] | None = None, **earlier: Any) -> None:
        super().__init__()
        if job is None:  # flat keywords: ``follow`` is then the list of files, as it was stored
            flat = {**earlier, "carry": carry} if follow is None else {**earlier, "carry": carry, "follow": follow}
            self.job, self.schedule, self.follow, self.carry = from_flat_keywords(flat)
        elif earlier:
            raise TypeError(f"unknown SlurmJobTrigger argument(s) {', '.join(sorted(earlier))}: give them in "
                            "job, schedule or follow")
        else:
            self.job = WatchedJob.from_json(job)
            self.schedule = WatchSchedule.from_json(schedule or {})
            if isinstance(follow, list):
                raise TypeError("follow: give a FollowedFiles (or its JSON) beside job; a list of files goes with "
                                "flat keywords (SlurmJobTrigger.watching)")
            self.follow = FollowedFiles.from_json(follow or {})
            self.carry = dict(carry or {})
        self.log_offset, self.err_log_offset = self.job.log_offset, self.job.err_log_offset  # as far as shown
        self._followed: dict[str, FollowedFile] = {}  # the watch's followed files, as far as they were read

    @classmethod
    def watching(cls, conn_id: str, job_id: str, **options: Any) -> SlurmJobTrigger:
        """A trigger from flat options (``log_path=..., poll_interval=..., follow=[...]``), each put in its record."""
        return cls(**{"conn_id": conn_id, "job_id": job_id, **options})

    @property
    def job_id(self) -> str:
        return self.job.job_id

    @property
    def conn_id(self) -> str:
        return self.job.conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"job": replace(self.job, log_offset=self.log_offset, err_log_offset=self.err_log_offset).to_json(),
             "schedule": self.schedule.to_json(), "follow": self.follow.to_json(), "carry": self.carry},
        )

    def _event(self, end: End) -> TriggerEvent:
        return TriggerEvent(WatchEvent(
            kind=end.kind, conn_id=self.conn_id, job_id=self.job_id, message=end.message, status=end.status,
            log_path=self.job.log_path, log_offset=self.log_offset, err_log_path=self.job.err_log_path,
            err_log_offset=self.err_log_offset, carry=self.carry, noticed_by=end.noticed_by,
            follow=tuple({"path": f.path, "fold": f.fold, "offset": f.offset} for f in self._followed.values())
            or self.follow.files).to_json())

    def _watch(self) -> JobWatch:
        job, schedule = self.job, self.schedule
        return JobWatch(self.conn_id, self.job_id, pending_policy=job.pending_policy,
                        expected_job_name=job.expected_job_name, unknown_grace_polls=schedule.unknown_grace_polls,
                        watch_deadline=schedule.watch_deadline, release_held=job.release_held,
                        log_offset=self.log_offset, err_offset=self.err_log_offset,
                        followed={f.path: f for f in followed_files(self.follow.files)})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Subscribe to the connection's poller, step the watch with each update, carry out its answer."""
        poller = shared_poller(self.conn_id, _hook_factory(self.conn_id))
        task = TaskKey.of(self.task_instance)
        watch = self._watch()
        watch.resume(await self._recalled(task), await self._recall_followed(task, watch))
        self._followed = watch.followed
        self.log_offset, self.err_log_offset = watch.log_offset, watch.err_offset
        schedule = self.schedule
        async with poller.subscribe(self.job_id, poll_interval=schedule.poll_interval,
                                    max_poll_interval=schedule.max_poll_interval, log_path=self.job.log_path,
                                    log_offset=self.log_offset, err_path=self.job.err_log_path,
                                    err_offset=self.err_log_offset,
                                    first_poll_delay=schedule.first_poll_delay,
                                    end_record_path=self._end_record_path(),
                                    follows={f.path: f.offset for f in watch.followed.values() if not f.problem},
                                    follow_interval=self.follow.interval) as updates:
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
        log_path = self.job.log_path
        return end_record_path(log_path) if self.job.read_end_record and log_path else None

    async def _recalled(self, task: TaskKey | None) -> WatchNote:
        """What an earlier trigger of this task try showed already (a triggerer restart loses nothing)."""
        if task is None:
            return WatchNote(self.log_offset, err_offset=self.err_log_offset)
        try:
            return await asyncio.wait_for(recall_watch(task, self.job_id, self.job.log_path), timeout=30)
        except Exception as exc:  # never fail the watch over it: at worst lines are shown twice
            self.log.warning("Could not read how far the watch of job %s got (%s); showing %s from byte %d",
                             self.job_id, exc, self.job.log_path, self.log_offset)
            return WatchNote(self.log_offset)

    async def _remember(self, task: TaskKey | None, note: WatchNote) -> None:
        if task is None:
            return
        try:
            await asyncio.wait_for(remember_watch(task, self.job_id, self.job.log_path, note), timeout=30)
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
        expected = self.job.expected_job_name
        if not expected:
            self.log.info("Watch of job %s stopped; the job was submitted elsewhere, so it is left running",
                          self.job_id)
            return
        if self.job.adopted_from:
            self.log.warning("Watch of job %s stopped. The job was submitted by %s, not by this task, which only "
                             "watched it: it is left running", self.job_id, self.job.adopted_from)
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
            if status.name != expected:
                self.log.warning("Task stopped, but job %s is now named %r, not %r: not cancelling it",
                                 self.job_id, status.name, expected)
                return
            await asyncio.wait_for(hook.cancel(self.job_id), timeout=20)
            self.log.info("Task stopped by a user: cancelled job %s", self.job_id)
        finally:
            await hook.close()

