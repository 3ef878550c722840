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
from slurm_provider.outage import (
    DEFAULT_WATCH_DEADLINE,
    Outage,
    gave_up_line,
    reachable_again_line,
    timeout_seconds,
)
from slurm_provider.transport import TransportError
from slurm_provider.triggers import ERROR

REACHABLE = "reachable"
"""The login node and a controller answer again: the task goes on. (``ERROR``, as for a watch: the
wait ended without an answer, past ``watch_deadline`` or at a failure only a person can fix.)"""


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
        return TriggerEvent({"kind": kind, "conn_id": self.conn_id, "since": self.since, "tries": self.tries,
                             "message": message, "carry": self.carry})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            outage = Outage(self.since, self.cause)
            wait = min(self.probes.delay(self.tries),
                       max(0.0, outage.deadline(self.watch_deadline) - time.time()))
            await asyncio.sleep(wait)
            self.tries += 1
            try:
                await self._probe()
            except TransportError as exc:
                self.cause = str(exc)
                if not exc.retryable:
                    yield self._event(ERROR, f"cannot log in to {self.conn_id}: {exc}")
                    return
                outage = Outage(self.since, self.cause)
                if outage.is_past(self.watch_deadline):
                    yield self._event(ERROR, gave_up_line(self.conn_id, outage, self.watch_deadline))
                    return
                self.log.debug("Login node of %s still unreachable after %d tries: %s", self.conn_id,
                               self.tries, exc)
                continue
            message = reachable_again_line(self.conn_id, self.since)
            self.log.warning("%s", message)
            yield self._event(REACHABLE, message)
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
