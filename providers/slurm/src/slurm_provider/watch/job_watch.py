"""The watch of one Slurm job as a sans-IO state machine, and the wait for a login node.

:class:`JobWatch` takes what the connection's poller learned in one cycle (a
:class:`~slurm_provider.watch.poller.PollUpdate`) and the time, and answers with what to do, in order:
lines for the task log (:class:`Say`), the watch's note to keep (:class:`Remember`), the followed
files' states to keep (:class:`KeepFollowed`), a held job to release (:class:`Release`, whose outcome
is fed back with :meth:`JobWatch.released`), or the end of the watch (:class:`End`). It never sleeps,
reads a clock or calls the cluster: the trigger does, so every decision is tested as a table of
updates and answers.

:class:`LoginWatch` decides the same things for a task whose own step met a login node that does not
answer: how long to wait before the next probe, when the wait is past its deadline, what a failed
probe or an answering one means.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Union

from slurm_provider.watch.allocation import AccountReading, deadline_message, judge
from slurm_provider.backoff import Backoff, Draw
from slurm_provider.cli.values import format_duration
from slurm_provider.watch.followed_files import FollowedFile, advance, load_fold
from slurm_provider.job_status import JobStatus
from slurm_provider.watch.maintenance import Window, maintenance_line, maintenance_words
from slurm_provider.watch.outage import Outage, clock, gave_up_line, reachable_again_line, span, unreachable_line
from slurm_provider.watch.pending_words import waiting_line
from slurm_provider.watch.subscription import PollUpdate
from slurm_provider.state_vocabulary import SlurmState, StateCategory
from slurm_provider.pending_reasons import ReasonKind, classify_pending_reason, split_reason
from slurm_provider.watch.events import ERROR, FINISHED, LOST, NEVER_STARTS, REACHABLE
from slurm_provider.watch.notes import NOTE_REFRESH_S, WatchNote

__all__ = ["ERROR", "FINISHED", "LOST", "NEVER_STARTS", "REACHABLE", "Action", "End", "JobWatch", "KeepFollowed",
           "LoginWatch", "Release", "Remember", "Say"]

PENDING_POLICIES = ("fail", "warn")
USER_HOLD = "JobHeldUser"
"""The pending reason of a job on user hold, which its owner may release (an administrator's hold,
``JobHeldAdmin``, only an administrator)."""


@dataclass(frozen=True)
class Say:
    """A line for the task log."""

    level: int
    text: str


@dataclass(frozen=True)
class Remember:
    """Keep how far the watch got (the task try's watch note)."""

    note: WatchNote


@dataclass(frozen=True)
class KeepFollowed:
    """Keep the followed files' offsets and states (the task try's followed-files note)."""

    files: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class Release:
    """Release the job from its user hold (``scontrol release``); tell :meth:`JobWatch.released` how it went."""

    job_id: str


@dataclass(frozen=True)
class End:
    """The watch ends: fire one event of ``kind``."""

    kind: str
    message: str
    status: JobStatus | None = None
    noticed_by: str | None = None
    """What noticed the end of a finished job: ``end_record`` or ``poll``."""


Action = Union[Say, Remember, KeepFollowed, Release, End]


def describe(status: JobStatus) -> str:
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


def held_line(job_id: str, conn_id: str, *, released: int, allowed: bool) -> str:
    """What the task log says about a job on user hold the watch does not release."""
    why = ("it was held again after this watch released it once" if released else
           "release_held is off" if not allowed else "it is not this task's job")
    return (f"Job {job_id} is on user hold (JobHeldUser) and waits for a release ({why}): run "
            f"'scontrol release {job_id}' on the login node of {conn_id} to let it start")


@dataclass
class JobWatch:
    """What one watch of job ``job_id`` has seen and said, and what it decides next.

    :param pending_policy: ``fail`` ends the watch when the job can never start, or waited
        ``watch_deadline`` for its allocation in vain; ``warn`` says so and waits on.
    :param expected_job_name: the job's name; only a job so named is released from a user hold.
    :param unknown_grace_polls: polls in a row in which Slurm knows no such job before it is lost.
    :param watch_deadline: seconds the watch waits for a login node, or for the allocation held by
        the account's running jobs.
    :param release_held: release the job once when it is put on user hold.
    """

    conn_id: str
    job_id: str
    pending_policy: str = "fail"
    expected_job_name: str | None = None
    unknown_grace_polls: int = 6
    watch_deadline: float = 86400.0
    release_held: bool = False
    log_offset: int = 0
    err_offset: int = 0
    followed: dict[str, FollowedFile] = field(default_factory=dict)
    last_state: SlurmState | None = None
    """The last state announced in the task log."""
    unreachable_since: float | None = None
    """Since when the login node has not answered (an earlier trigger of the try may have begun it)."""
    person_since: float | None = None
    """Since when the login has waited for a person (an OpenSSH master to open again)."""
    allocation_since: float | None = None
    polled_at: float | None = None
    noted_at: float = 0.0
    """When the note was last kept (epoch seconds)."""
    _last_reason: str | None = None
    _warned_reason: str | None = None
    _waiting_for: str | None = None
    _slowed: bool = False
    _announced: bool = False
    _unknown_polls: int = 0
    _waiting: tuple[str | None, str | None] = (None, None)
    _windows: tuple[Window, ...] = ()
    _allocation_said: tuple[Any, ...] | None = None
    _held: bool = False
    _released: int = 0

    def __post_init__(self) -> None:
        if self.pending_policy not in PENDING_POLICIES:
            raise ValueError(f"pending_policy {self.pending_policy!r} not allowed "
                             f"(known: {', '.join(PENDING_POLICIES)})")

    def resume(self, note: WatchNote, kept_followed: Sequence[dict[str, Any]] = ()) -> None:
        """Go on from where an earlier watch of the same task try stopped (a triggerer restart)."""
        self.log_offset = max(self.log_offset, note.log_offset)
        self.err_offset = max(self.err_offset, note.err_offset)
        self.allocation_since = note.allocation_since
        self.polled_at = note.polled_at
        self.unreachable_since = note.unreachable_since
        self.person_since = note.person_since
        self.last_state = SlurmState(note.state) if note.state in SlurmState.__members__ else None
        for data in kept_followed:
            try:
                file = FollowedFile.from_json(data)
            except ValueError:
                continue
            if file.path in self.followed:
                self.followed[file.path] = replace(file, fold=self.followed[file.path].fold)

    def _remember(self, now: float) -> Remember:
        """Keep the note now; one that only moves ``polled_at`` on waits ``NOTE_REFRESH_S`` after it."""
        self.noted_at = now
        return Remember(self.note())

    def note(self) -> WatchNote:
        """How far the watch got, as the task try keeps it."""
        return WatchNote(self.log_offset, self.last_state.value if self.last_state is not None else None,
                         self.err_offset, unreachable_since=self.unreachable_since,
                         allocation_since=self.allocation_since, reason=self._waiting[0],
                         expected_start=self._waiting[1], polled_at=self.polled_at,
                         maintenance=maintenance_words(self._windows), person_since=self.person_since)

    def step(self, update: PollUpdate, now: float) -> list[Action]:
        """What one poll cycle's update means, at ``now`` (epoch seconds)."""
        if update.error is not None:
            return [End(ERROR, f"cannot watch job {self.job_id} on {self.conn_id}: {update.error}")]
        actions: list[Action] = self._fold(update.followed, now) if update.followed else []
        if update.only_followed:
            return actions
        if update.waiting is not None:  # the job keeps running; only our view of it paused
            return actions + self._waiting_for_a_person(update.waiting, now)
        if update.throttled is not None:  # Slurm is busy or limits us: ask less often, never give up
            if not self._slowed:
                actions.append(Say(logging.WARNING, f"{update.throttled}; job {self.job_id} is still watched"))
                self._slowed = True
            return actions
        if update.unreachable is not None:
            return actions + self._unreachable(update.unreachable, now)
        if self.unreachable_since is not None:
            actions.append(Say(logging.WARNING, f"{reachable_again_line(self.conn_id, self.unreachable_since, now)}"
                                                f"; watching job {self.job_id} again"))
            self.unreachable_since, self._announced = None, False
            actions.append(self._remember(now))
        if self._waiting_for is not None or self._slowed:
            actions.append(Say(logging.INFO, f"Watching job {self.job_id} again on {self.conn_id}"))
            self._waiting_for, self._slowed = None, False
        self.log_offset, self.err_offset = update.log_offset, update.err_offset
        actions += [Say(logging.INFO, f"[job {self.job_id}] {line}") for line in update.new_log_text.splitlines()]
        actions += [Say(logging.INFO, f"[job {self.job_id} stderr] {line}")
                    for line in update.new_err_text.splitlines()]
        shown = bool(update.new_log_text or update.new_err_text)
        if self.person_since is not None:  # the login works again: the note forgets the wait
            self.person_since, shown = None, True
        status = update.status
        if status is None or status.state is SlurmState.UNKNOWN:
            if shown:
                actions.append(self._remember(now))
            self._unknown_polls += 1
            if self._unknown_polls >= self.unknown_grace_polls:
                actions.append(End(LOST, f"job {self.job_id} is known neither to squeue nor to sacct after "
                                         f"{self._unknown_polls} polls", status))
            return actions
        return actions + self._answered(update, status, shown, now)

    def released(self, error: str | None) -> list[Action]:
        """How the :class:`Release` went (``error``: what failed; None: released)."""
        if error is not None:  # the watch goes on; a person can release it
            self._held = True
            return [Say(logging.WARNING, f"Job {self.job_id} is on user hold (JobHeldUser) and releasing it "
                                         f"failed ({error}): run 'scontrol release {self.job_id}' on the login "
                                         f"node of {self.conn_id}")]
        self._held = False
        self._released += 1
        return [Say(logging.WARNING, f"Job {self.job_id} was put on user hold (JobHeldUser), as a site does to "
                                     "queued jobs after a maintenance break: released it (release_held). Held "
                                     "again, it stays held")]

    # --- one cycle's parts -----------------------------------------------------------------------

    def _waiting_for_a_person(self, what_to_do: str, now: float) -> list[Action]:
        """The login waits for a person (``what_to_do``): said once per reason, waited for up to
        ``watch_deadline`` from the first such cycle (kept in the note across triggerer restarts); past
        it the watch ends with the same words, and the job runs on for a retry to adopt."""
        actions: list[Action] = []
        started = self.person_since is None
        since = self.person_since = now if self.person_since is None else self.person_since
        if now - since >= self.watch_deadline:
            message = (f"the login to {self.conn_id} has waited for a person since {clock(since, now)}, longer "
                       f"than watch_deadline ({span(self.watch_deadline)}): {what_to_do}. Job {self.job_id} may "
                       "still run: a retry of the task adopts it once the login is open again")
            return [Say(logging.ERROR, message), End(ERROR, message)]
        if what_to_do != self._waiting_for:
            actions.append(Say(logging.WARNING, f"Cannot see job {self.job_id} right now, still waiting (up to "
                                                f"{span(self.watch_deadline)}): {what_to_do}"))
            self._waiting_for = what_to_do
        if started:
            actions.append(self._remember(now))
        return actions

    def _unreachable(self, failed: Outage, now: float) -> list[Action]:
        """The login node did not answer this cycle: the job runs on; wait for it up to the deadline."""
        outage = Outage(self.unreachable_since or failed.since, failed.cause, failed.retry_in)
        state = self.last_state.value if self.last_state is not None else None
        if outage.is_past(self.watch_deadline, now):
            message = gave_up_line(self.conn_id, outage, self.watch_deadline, job_id=self.job_id,
                                   last_state=state, now=now)
            return [Say(logging.ERROR, message), End(ERROR, message)]
        actions: list[Action] = []
        if not self._announced:
            actions.append(Say(logging.WARNING, unreachable_line(self.conn_id, outage, self.watch_deadline,
                                                                 job_id=self.job_id, last_state=state, now=now)))
            self._announced = True
        if self.unreachable_since is None:
            self.unreachable_since = outage.since
            actions.append(self._remember(now))
        return actions

    def _answered(self, update: PollUpdate, status: JobStatus, shown: bool, now: float) -> list[Action]:
        """Slurm answered about the job: announce changes, end on a terminal state, judge a pending one."""
        actions: list[Action] = []
        self._unknown_polls = 0
        self.polled_at = now
        pending = status.state is SlurmState.PENDING
        self._waiting = (status.reason, status.expected_start) if pending else (None, None)
        if status.state is not self.last_state or (pending and status.reason != self._last_reason):
            actions.append(Say(logging.INFO, f"Job {self.job_id} {describe(status)}"))
            self.last_state, self._last_reason, shown = status.state, status.reason, True
        if update.maintenance != self._windows:
            self._windows, shown = update.maintenance, True
            if (window_line := maintenance_line(self.job_id, self._windows)) is not None:
                actions.append(Say(logging.WARNING, window_line))
        if shown or now - self.noted_at >= NOTE_REFRESH_S:
            actions.append(self._remember(now))
        if status.state.is_terminal:
            noticed_by = "end_record" if update.end_record is not None else "poll"
            return actions + [End(FINISHED, describe(status), status, noticed_by)]
        if status.state.has_started and self.allocation_since is not None:
            self.allocation_since, self._allocation_said = None, None
            actions.append(self._remember(now))
        held = pending and split_reason(status.reason)[0] == USER_HOLD
        if held and not self._held:  # a new hold: a job still held after a release was held again
            actions += self._on_user_hold(status)
        elif not held:
            self._held = False
        if pending and status.reason:
            reason = classify_pending_reason(status.reason)
            if reason.kind is ReasonKind.ALLOCATION:
                actions += self._waited_for_allocation(status, update.allocation, now)
            elif reason.blocks_forever:
                text = f"job {self.job_id} will not start: {status.reason}: {reason.explanation}"
                if self.pending_policy == "fail":
                    actions.append(End(NEVER_STARTS, text, status))
                elif self._warned_reason != status.reason:
                    actions.append(Say(logging.WARNING, f"{text} (still waiting: pending_policy=warn)"))
                    self._warned_reason = status.reason
        return actions

    def _on_user_hold(self, status: JobStatus) -> list[Action]:
        """The job was just put on user hold: release it once (``release_held``, our job only), or say
        that it waits for a release and how to give it."""
        ours = bool(self.expected_job_name) and status.name == self.expected_job_name
        self._held = True
        if not (self.release_held and ours and not self._released):
            return [Say(logging.WARNING, held_line(self.job_id, self.conn_id, released=self._released,
                                                   allowed=self.release_held))]
        return [Release(self.job_id)]

    def _waited_for_allocation(self, status: JobStatus, reading: AccountReading | None,
                               now: float) -> list[Action]:
        """The job pends on its account's allocation: end the watch (the usage alone leaves too little,
        or ``watch_deadline`` passed), or wait on, saying whose running jobs hold it whenever that changes."""
        actions: list[Action] = []
        first = self.allocation_since is None
        if first:
            self.allocation_since = now
            actions.append(self._remember(now))
        verdict = judge(status, status.reason or "", reading.figures) if reading and reading.figures else None
        if verdict is not None and verdict.spent:
            if self.pending_policy == "fail":
                return actions + [End(NEVER_STARTS, verdict.spent_message(), status)]
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
        waited = now - (self.allocation_since or now)
        if self.pending_policy == "fail" and waited > self.watch_deadline:
            return actions + [End(NEVER_STARTS, deadline_message(self.job_id, status.reason or "", waited,
                                                                 self.watch_deadline, text), status)]
        if said != self._allocation_said:
            if first and self.pending_policy == "fail":
                text += f" (for at most {format_duration(self.watch_deadline)}: watch_deadline)"
            actions.append(Say(logging.WARNING if said[0] == "spent" else logging.INFO, text))
            self._allocation_said = said
        return actions

    def _fold(self, grown: tuple[tuple[str, str, int], ...], now: float) -> list[Action]:
        """Fold what the followed files grew by into their states; keep them."""
        actions: list[Action] = []
        for path, text, offset in grown:
            file = self.followed.get(path)
            if file is None:
                continue
            try:
                fold = load_fold(file.fold)
            except ValueError as exc:
                self.followed[path] = replace(file, offset=offset, problem=str(exc))
            else:
                self.followed[path] = advance(file, text, offset, now, fold)
            if self.followed[path].problem and not file.problem:
                actions.append(Say(logging.WARNING, f"No longer following {path}: {self.followed[path].problem}"))
        actions.append(KeepFollowed(tuple(f.to_json() for f in self.followed.values())))
        return actions


@dataclass
class LoginWatch:
    """A task's wait for its login node: when to probe next, and what a probe's outcome means.

    :param since: when the login node stopped answering (epoch seconds).
    :param cause: the last error met.
    :param probes: the schedule between probes.
    :param tries: probes already made in this outage (by earlier waits of the same task try).
    """

    conn_id: str
    since: float
    cause: str
    watch_deadline: float
    probes: Backoff
    tries: int = 0

    def next_wait(self, now: float, draw: Draw = random.uniform) -> float:
        """Seconds until the next probe: the schedule's, never past the deadline."""
        outage = Outage(self.since, self.cause)
        return min(self.probes.delay(self.tries, draw), max(0.0, outage.deadline(self.watch_deadline) - now))

    def failed(self, cause: str, *, retryable: bool, now: float) -> End | None:
        """A probe failed: the end of the wait (a failure waiting cannot heal, or past the deadline), or
        None to probe again."""
        self.tries += 1
        self.cause = cause
        if not retryable:
            return End(ERROR, f"cannot log in to {self.conn_id}: {cause}")
        outage = Outage(self.since, self.cause)
        if outage.is_past(self.watch_deadline, now):
            return End(ERROR, gave_up_line(self.conn_id, outage, self.watch_deadline, now=now))
        return None

    def answered(self, now: float) -> End:
        """A probe was answered: the wait ends, the task goes on."""
        self.tries += 1
        return End(REACHABLE, reachable_again_line(self.conn_id, self.since, now))
