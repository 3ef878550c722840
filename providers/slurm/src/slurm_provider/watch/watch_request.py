"""What a trigger is asked to watch, as three frozen records: the job, the schedule, the files it follows.

A :class:`~slurm_provider.triggers.SlurmJobTrigger` is stored by Airflow as its ``serialize()``
keywords and built again from them in whichever triggerer picks it up, possibly after an upgrade.
Each record is JSON-safe (``to_json``/``from_json``), checks its values when it is built, and says
which key is unknown or wrong; :func:`from_flat_keywords` reads the flat keywords of a trigger
stored by an earlier version of the provider, which a triggerer still resumes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from slurm_provider.timing import FIRST_POLL_DELAY, MAX_POLL_INTERVAL, POLL_INTERVAL
from slurm_provider.watch.followed_files import FOLLOW_INTERVAL, followed_files
from slurm_provider.watch.job_watch import PENDING_POLICIES
from slurm_provider.watch.outage import DEFAULT_WATCH_DEADLINE, timeout_seconds

UNKNOWN_GRACE_POLLS = 6
"""Polls in a row in which neither squeue nor sacct knows the job before it is reported lost
(accounting reaches slurmdbd with a lag)."""

_Record = TypeVar("_Record", "WatchedJob", "WatchSchedule", "FollowedFiles")


def _from_json(cls: type[_Record], data: Mapping[str, Any] | _Record) -> _Record:
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ValueError(f"{cls.__name__}: expected a mapping, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return cls(**data)


@dataclass(frozen=True)
class WatchedJob:
    """The job to watch: where its output goes, whose it is, and how its waiting is judged."""

    conn_id: str
    job_id: str
    log_path: str | None = None
    """The job's output file; new lines are copied to the task log."""
    log_offset: int = 0
    """Bytes of ``log_path`` already shown."""
    err_log_path: str | None = None
    """The job's error output file, streamed like ``log_path`` with its lines marked ``stderr``."""
    err_log_offset: int = 0
    read_end_record: bool = True
    """Read the job's exit record (``<log_path>.end``) between polls; False: only the polls notice its end."""
    expected_job_name: str | None = None
    """The job's name, checked before a person's gesture cancels anything; None (a job submitted
    elsewhere): never cancelled."""
    adopted_from: str | None = None
    """Who submitted the job when the task only adopted it: a gesture then leaves it running."""
    pending_policy: str = "fail"
    """``fail``: a job that can never start ends the watch; ``warn``: it is said and waited for."""
    release_held: bool = False
    """Release the job once when it is put on user hold (as sites do after a maintenance break)."""

    def __post_init__(self) -> None:
        if not self.conn_id or not str(self.job_id):
            raise ValueError(f"WatchedJob needs a connection and a job id, got {self.conn_id!r} and {self.job_id!r}")
        if self.pending_policy not in PENDING_POLICIES:
            raise ValueError(f"pending_policy {self.pending_policy!r} not allowed (known: {', '.join(PENDING_POLICIES)})")
        object.__setattr__(self, "job_id", str(self.job_id))
        object.__setattr__(self, "log_offset", int(self.log_offset))
        object.__setattr__(self, "err_log_offset", int(self.err_log_offset))
        object.__setattr__(self, "read_end_record", bool(self.read_end_record))
        object.__setattr__(self, "release_held", bool(self.release_held))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | WatchedJob) -> WatchedJob:
        return _from_json(cls, data)


@dataclass(frozen=True)
class WatchSchedule:
    """When the watch asks, and how long it waits for something outside the job."""

    poll_interval: float = POLL_INTERVAL
    """First interval between status queries, seconds."""
    max_poll_interval: float = MAX_POLL_INTERVAL
    """Cap of the interval, which grows while nothing changes."""
    first_poll_delay: float = FIRST_POLL_DELAY
    """Wait before the first query (keep >= 10 s in deployments: an event within seconds of the
    deferral can race the scheduler)."""
    unknown_grace_polls: int = UNKNOWN_GRACE_POLLS
    watch_deadline: float = DEFAULT_WATCH_DEADLINE.total_seconds()
    """Seconds the watch waits for a login node that does not answer, or for teammates' jobs that
    hold the allocation the job pends on, before it gives up."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "poll_interval", float(self.poll_interval))
        object.__setattr__(self, "max_poll_interval", float(self.max_poll_interval))
        object.__setattr__(self, "first_poll_delay", float(self.first_poll_delay))
        object.__setattr__(self, "unknown_grace_polls", int(self.unknown_grace_polls))
        object.__setattr__(self, "watch_deadline", timeout_seconds(self.watch_deadline))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | WatchSchedule) -> WatchSchedule:
        return _from_json(cls, data)


@dataclass(frozen=True)
class FollowedFiles:
    """More files of the job to read as they grow (see :mod:`slurm_provider.watch.followed_files`)."""

    files: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    """Each ``{"path", "fold", "offset"}``: the file, the import path of the function folding its new
    lines into a small state, and the bytes already read."""
    interval: float = FOLLOW_INTERVAL
    """Least seconds between two size checks of the files."""

    def __post_init__(self) -> None:
        specs = tuple({"path": f.path, "fold": f.fold, "offset": f.offset} for f in followed_files(self.files))
        object.__setattr__(self, "files", specs)
        object.__setattr__(self, "interval", float(self.interval))

    def to_json(self) -> dict[str, Any]:
        return {"files": [dict(f) for f in self.files], "interval": self.interval}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | FollowedFiles) -> FollowedFiles:
        if isinstance(data, Mapping) and "files" in data:
            data = {**data, "files": tuple(data["files"] or ())}
        return _from_json(cls, data)


_JOB_KEYS = {f.name for f in dataclasses.fields(WatchedJob)}
_SCHEDULE_KEYS = {f.name for f in dataclasses.fields(WatchSchedule)}


def from_flat_keywords(flat: Mapping[str, Any]) -> tuple[WatchedJob, WatchSchedule, FollowedFiles, dict[str, Any]]:
    """The records (and the carried data) of a trigger given as flat keywords: one stored by an
    earlier version of the provider, or built by hand with :meth:`SlurmJobTrigger.watching`."""
    rest = dict(flat)
    carry = dict(rest.pop("carry", None) or {})
    follow = FollowedFiles(tuple(rest.pop("follow", None) or ()), rest.pop("follow_interval", FOLLOW_INTERVAL))
    job = {k: rest.pop(k) for k in list(rest) if k in _JOB_KEYS}
    schedule = {k: rest.pop(k) for k in list(rest) if k in _SCHEDULE_KEYS}
    if rest:
        raise TypeError(f"unknown watch argument(s) {', '.join(sorted(rest))} (known: "
                        f"{', '.join(sorted(_JOB_KEYS | _SCHEDULE_KEYS | {'carry', 'follow', 'follow_interval'}))})")
    if "conn_id" not in job or "job_id" not in job:
        raise TypeError("a watch needs conn_id and job_id")
    return WatchedJob(**job), WatchSchedule(**schedule), follow, carry
