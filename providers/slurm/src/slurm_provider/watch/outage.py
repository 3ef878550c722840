"""A login node that does not answer, as the watches and the operator time it and describe it. Pure.

Login nodes go away for hours (a site's maintenance breaks) while the jobs on the compute nodes run
on: only our view of them pauses. The watch of a job and the operator's own steps therefore wait
for the login node with a capped back-off, up to ``watch_deadline`` (24 hours unless the task
says otherwise), and say so once in the task log, with when the node was last seen; when it
answers again they pick up where they were. Only past the deadline does the wait end, and then as
a lost watch (a task retry adopts the job), never as a failed job.

Times are Unix epoch seconds: they travel in trigger arguments, events and the watch note (JSON),
and a restarted triggerer goes on counting from the same moment.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

DEFAULT_WATCH_DEADLINE = timedelta(hours=24)
"""How long a watch or a task waits for something outside its job (a login node that does not
answer, teammates' running jobs that hold the account's allocation), unless told otherwise."""


def timeout_seconds(value: timedelta | float | int, name: str = "watch_deadline") -> float:
    """``value`` (a timedelta or seconds) in seconds; refuses zero, negative and non-numbers."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ValueError(f"{name} must be a positive number of seconds or a timedelta, e.g. "
                         f"timedelta(hours=24), got {value!r}")
    return float(seconds)


STEP_FAILURES_WHILE_REACHABLE = 3
"""How often a step may fail with a command that ran (``squeue`` busy, output that cannot be read)
right after the login node answered ``scontrol ping`` again, before the task stops waiting and
fails with the error: a failure that outlives the node's answers is not an outage, and waiting out
``watch_deadline`` would hide it for a day."""


@dataclass(frozen=True)
class Outage:
    """The cluster has not answered since ``since``: what one failed try of the poller tells a watch."""

    since: float
    """When the first try of this outage failed (epoch seconds)."""
    cause: str
    """What the last try met (``cannot reach ...: ConnectionRefusedError ...``)."""
    retry_in: float = 0.0
    """Seconds until the next try (the capped back-off)."""

    def deadline(self, timeout: float) -> float:
        return self.since + timeout

    def is_past(self, timeout: float, now: float | None = None) -> bool:
        """True once the outage has lasted ``timeout`` seconds."""
        return (time.time() if now is None else now) >= self.deadline(timeout)


def clock(epoch: float, now: float | None = None) -> str:
    """``14:02 UTC`` for a moment of the same UTC day as ``now``, ``2026-05-01 14:02 UTC`` otherwise."""
    moment = datetime.fromtimestamp(epoch, timezone.utc)
    today = datetime.fromtimestamp(time.time() if now is None else now, timezone.utc).date()
    return moment.strftime("%H:%M UTC" if moment.date() == today else "%Y-%m-%d %H:%M UTC")


def span(seconds: float) -> str:
    """A duration for people: ``40 s``, ``12 min``, ``3 h 05 min``, ``24 h``, ``2 d 4 h``."""
    total = max(0, int(round(seconds)))
    if total < 60:
        return f"{total} s"
    minutes = total // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def _job(job_id: str | None, last_state: str | None) -> str:
    if job_id is None:
        return ""
    return f"job {job_id} last seen {last_state}" if last_state else f"job {job_id} not seen yet"


def unreachable_line(conn_id: str, outage: Outage, timeout: float, *, job_id: str | None = None,
                     last_state: str | None = None, now: float | None = None) -> str:
    """What a wait says once when it starts: since when, about which job, until when it waits."""
    parts = [f"login node of {conn_id} unreachable since {clock(outage.since, now)} ({outage.cause})"]
    if job_id is not None:
        parts.append(_job(job_id, last_state))
    parts.append(f"waiting up to {span(timeout)}, until {clock(outage.deadline(timeout), now)}, "
                 "trying again with a growing interval")
    return "; ".join(parts)


def command_failed_line(conn_id: str, cause: str, timeout: float, now: float | None = None) -> str:
    """What a wait says once when a command of the step ran and failed (not a connection that broke)."""
    until = clock((time.time() if now is None else now) + timeout, now)
    return (f"a command on the login node of {conn_id} failed ({cause}); asking scontrol ping and trying "
            f"again with a growing interval, up to {STEP_FAILURES_WHILE_REACHABLE} times while the login "
            f"node answers and at most {span(timeout)}, until {until}")


def still_failing_line(conn_id: str, failures: int, cause: str) -> str:
    """Why a wait ended although the login node answers: the step itself keeps failing."""
    return (f"the login node of {conn_id} answers scontrol ping, but this step failed {failures} times in a "
            f"row right after it did; last error: {cause}")


def slurm_error_line(conn_id: str, errors: int, cause: str) -> str:
    """Why a watch stopped while the login node answered: Slurm kept answering its polls with an error."""
    return (f"Slurm on {conn_id} answered {errors} polls in a row with an error while its login node answered, "
            f"which is no outage to wait out; last error: {cause}. Run the same command on the login node to "
            "see it (a Slurm client refusing an option after an upgrade, accounting that lost this user)")


def reachable_again_line(conn_id: str, since: float, now: float | None = None) -> str:
    """What a wait says when the login node answers again."""
    now = time.time() if now is None else now
    return f"login node of {conn_id} reachable again after {span(now - since)}"


def gave_up_line(conn_id: str, outage: Outage, timeout: float, *, job_id: str | None = None,
                 last_state: str | None = None, now: float | None = None) -> str:
    """Why a wait ended past its deadline, and what that means for the job."""
    parts = [f"login node of {conn_id} unreachable since {clock(outage.since, now)}, longer than "
             f"watch_deadline ({span(timeout)}); last error: {outage.cause}"]
    if job_id is not None:
        parts.append(f"{_job(job_id, last_state)}, it may still run")
    return "; ".join(parts)
