"""What a watch's trigger fires, as typed records: the job watch's :class:`WatchEvent` and the login
wait's :class:`LoginEvent`. Pure.

Airflow carries a trigger event as a JSON-safe dict (and ``airflow dags test`` drops ``defer()``
kwargs, so the event carries everything the task needs to go on). ``to_json`` writes that dict;
``from_json`` reads it back or raises ``ValueError`` saying which key is missing or wrong, so the task
reads fields, never keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurm_provider.job_status import JobStatus

FINISHED, NEVER_STARTS, LOST, ERROR = "finished", "never_starts", "lost", "error"
"""A job watch's ends: the job ended (any terminal state), will never start, vanished, or could not be
watched (a lost watch: the job may still run)."""
REACHABLE = "reachable"
"""The login node and a controller answer again: the waiting task goes on (a login wait's end; it
ends with ``ERROR`` past its deadline or at a failure only a person can fix)."""
WATCH_KINDS = (FINISHED, NEVER_STARTS, LOST, ERROR)
LOGIN_KINDS = (REACHABLE, ERROR)


def _required(payload: Mapping[str, Any] | None, what: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(payload, Mapping):
        raise ValueError(f"{what} is not a mapping: {payload!r}")
    missing = [key for key in keys if key not in payload]
    if missing:
        raise ValueError(f"{what} lacks {missing}: {dict(payload)!r}")
    return payload


@dataclass(frozen=True)
class WatchEvent:
    """The end of one job's watch, with everything the task needs to conclude or resume."""

    kind: str
    conn_id: str
    job_id: str
    message: str
    status: JobStatus | None = None
    """The job's last status (a ``FINISHED`` event always has one)."""
    log_path: str | None = None
    log_offset: int = 0
    """Bytes of the job's output already shown in the task log."""
    err_log_path: str | None = None
    err_log_offset: int = 0
    carry: dict[str, Any] = field(default_factory=dict)
    """The opaque data the task handed the trigger, unchanged."""
    noticed_by: str | None = None
    """What noticed a finished job's end: ``end_record`` or ``poll``."""
    follow: tuple[dict[str, Any], ...] = ()
    """The followed files, with how far they were read."""

    def __post_init__(self) -> None:
        if self.kind not in WATCH_KINDS:
            raise ValueError(f"unknown watch event kind {self.kind!r} (known: {', '.join(WATCH_KINDS)})")
        if self.kind == FINISHED and self.status is None:
            raise ValueError(f"a finished watch of job {self.job_id} carries no job status")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "conn_id": self.conn_id, "job_id": self.job_id,
                "status": self.status.to_event() if self.status is not None else None,
                "log_path": self.log_path, "log_offset": self.log_offset, "err_log_path": self.err_log_path,
                "err_log_offset": self.err_log_offset, "message": self.message, "carry": self.carry,
                "noticed_by": self.noticed_by, "follow": [dict(f) for f in self.follow]}

    @classmethod
    def from_json(cls, payload: Mapping[str, Any] | None) -> WatchEvent:
        """Read back :meth:`to_json`; ``ValueError`` naming what is missing or wrong."""
        data = _required(payload, "trigger event", ("kind", "job_id", "status", "message", "carry"))
        status = data["status"]
        return cls(kind=str(data["kind"]), conn_id=str(data.get("conn_id") or ""), job_id=str(data["job_id"]),
                   message=str(data["message"]),
                   status=JobStatus.from_event(status) if status else None,
                   log_path=data.get("log_path"), log_offset=int(data.get("log_offset") or 0),
                   err_log_path=data.get("err_log_path"), err_log_offset=int(data.get("err_log_offset") or 0),
                   carry=dict(data["carry"] or {}), noticed_by=data.get("noticed_by"),
                   follow=tuple(dict(f) for f in data.get("follow") or ()))


@dataclass(frozen=True)
class LoginEvent:
    """The end of a task's wait for its login node."""

    kind: str
    conn_id: str
    since: float
    """When the login node stopped answering (epoch seconds)."""
    tries: int
    """Probes made in this outage."""
    message: str
    carry: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in LOGIN_KINDS:
            raise ValueError(f"unknown login wait event kind {self.kind!r} (known: {', '.join(LOGIN_KINDS)})")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "conn_id": self.conn_id, "since": self.since, "tries": self.tries,
                "message": self.message, "carry": self.carry}

    @classmethod
    def from_json(cls, payload: Mapping[str, Any] | None) -> LoginEvent:
        """Read back :meth:`to_json`; ``ValueError`` naming what is missing or wrong."""
        data = _required(payload, "login wait event", ("kind", "since", "message"))
        return cls(kind=str(data["kind"]), conn_id=str(data.get("conn_id") or ""), since=float(data["since"]),
                   tries=int(data.get("tries") or 0), message=str(data["message"]), carry=dict(data.get("carry") or {}))
