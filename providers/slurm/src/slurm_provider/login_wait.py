"""``SlurmLoginTrigger``: wait in the triggerer for a login node that does not answer.

A task whose own steps (adopting or submitting a job, reading how it ended) meet a login node that
does not answer defers on this trigger instead of failing: the wait holds no worker slot and spends
no task retry, however long the maintenance lasts. It asks ``scontrol ping`` (the login node and a
``slurmctld`` must answer) on an interval that starts at the task's poll interval and doubles up to
its cap, and fires exactly one event: ``reachable`` when both answer, ``error`` past the deadline
or when the failure is one that waiting cannot heal (host key, authentication). Everything the task
needs to go on (since when it waited, how many tries) travels in the event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from slurm_provider.backoff import Backoff
from slurm_provider.timing import LOGIN_PROBES, MAX_POLL_INTERVAL, POLL_INTERVAL
from slurm_provider.watch.outage import DEFAULT_WATCH_DEADLINE, timeout_seconds
from slurm_provider.transport import TransportError
from slurm_provider.watch.events import ERROR, REACHABLE, LoginEvent
from slurm_provider.watch.job_watch import LoginWatch

__all__ = ["ERROR", "REACHABLE", "SlurmLoginTrigger"]


class SlurmLoginTrigger(BaseTrigger):
    """Fires one event when the login node of ``conn_id`` answers again (or the wait must end).

    :param conn_id: Airflow connection of the cluster's login node.
    :param since: when the login node stopped answering (epoch seconds).
    :param cause: the last error met, for the messages.
    :param watch_deadline: seconds after ``since`` at which the wait ends with an ``error`` event.
    :param poll_interval: seconds before the first probe; the interval doubles from there.
    :param max_poll_interval: cap of the interval between probes.
    :param tries: probes already made in this outage (by earlier waits of the same task try).
    :param carry: opaque JSON-safe data returned unchanged in the event.
    """

    def __init__(self, *, conn_id: str, since: float, cause: str = "",
                 watch_deadline: float = DEFAULT_WATCH_DEADLINE.total_seconds(),
                 poll_interval: float = POLL_INTERVAL, max_poll_interval: float = MAX_POLL_INTERVAL, tries: int = 0,
                 carry: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.conn_id = conn_id
        self.since = float(since)
        self.cause = cause
        self.watch_deadline = timeout_seconds(watch_deadline)
        self.poll_interval = timeout_seconds(poll_interval, "poll_interval")
        self.max_poll_interval = max(self.poll_interval, float(max_poll_interval))
        self.tries = int(tries)
        self.carry = dict(carry or {})

    @property
    def probes(self) -> Backoff:
        """The schedule of the probes (``timing.LOGIN_PROBES``) from this task's poll interval to its cap."""
        return replace(LOGIN_PROBES, base=self.poll_interval, cap=self.max_poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "conn_id": self.conn_id,
                "since": self.since,
                "cause": self.cause,
                "watch_deadline": self.watch_deadline,
                "poll_interval": self.poll_interval,
                "max_poll_interval": self.max_poll_interval,
                "tries": self.tries,
                "carry": self.carry,
            },
        )

    def _event(self, kind: str, message: str) -> TriggerEvent:
        return TriggerEvent(LoginEvent(kind, self.conn_id, self.since, self.tries, message, self.carry).to_json())

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Probe on the schedule until the wait ends (:class:`~slurm_provider.watch.job_watch.LoginWatch`)."""
        wait = LoginWatch(self.conn_id, self.since, self.cause, self.watch_deadline, self.probes, self.tries)
        while True:
            await asyncio.sleep(wait.next_wait(time.time()))
            try:
                await self._probe()
            except TransportError as exc:
                end = wait.failed(str(exc), retryable=exc.retryable, now=time.time())
                self.tries, self.cause = wait.tries, wait.cause
                if end is None:
                    self.log.debug("Login node of %s still unreachable after %d tries: %s", self.conn_id,
                                   self.tries, exc)
                    continue
            else:
                end = wait.answered(time.time())
                self.tries = wait.tries
                self.log.warning("%s", end.message)
            yield self._event(end.kind, end.message)
            return

    async def _probe(self) -> None:
        from slurm_provider.hooks import SlurmAsyncHook

        hook = SlurmAsyncHook(self.conn_id)
        try:
            await hook.ping()
        finally:
            try:
                await hook.close()
            except Exception:  # closing a connection that never opened, or already broke
                pass
