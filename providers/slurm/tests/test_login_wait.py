"""SlurmLoginTrigger driven directly: one event, when the login node answers or the wait must end.

The probe is the real ``scontrol ping`` of the hook on the fake Slurm of tests/support (fast); providers/slurm/tests/test_operator_outage.py runs the trigger
against a private login sshd of the local cluster that is stopped and started again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import structlog.testing

from slurm_provider.login_wait import REACHABLE, SlurmLoginTrigger
from slurm_provider.transport import AuthenticationFailed, TransportError, TransportUnavailable
from slurm_provider.triggers import ERROR
from support.fake_slurm import FakeSlurm, install

FAST = {"poll_interval": 0.01, "max_poll_interval": 0.02}


CONTROLLER_DOWN = "controller down"
"""A probe step: the login node answers, but ``scontrol ping`` finds no slurmctld up."""


def _probes(monkeypatch: pytest.MonkeyPatch, *script: TransportError | str | None) -> FakeSlurm:
    """The fake Slurm under the trigger's hooks: before each command the next scripted step holds
    (an error: the login node is down with it; ``CONTROLLER_DOWN``; None: all up); the last one stays."""
    steps = list(script)

    def next_step(fake: FakeSlurm) -> None:
        step = steps.pop(0) if len(steps) > 1 else steps[0]
        fake.down = step if isinstance(step, TransportError) else None
        fake.table.controller_up = step != CONTROLLER_DOWN

    fake = install(monkeypatch)
    fake.before_each = next_step
    return fake


def _pings(fake: FakeSlurm) -> int:
    return fake.verbs.count("scontrol")


def _event(trigger: SlurmLoginTrigger) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("no event")

    return asyncio.run(asyncio.wait_for(first(), 30))


def test_serialize_round_trips() -> None:
    trigger = SlurmLoginTrigger(conn_id="lumi", since=1_777_600_000.5, cause="refused", watch_deadline=3600,
                                poll_interval=15, max_poll_interval=300, tries=4, carry={"k": 1})
    classpath, kwargs = trigger.serialize()
    assert classpath == "slurm_provider.login_wait.SlurmLoginTrigger"
    assert kwargs == {"conn_id": "lumi", "since": 1_777_600_000.5, "cause": "refused", "watch_deadline": 3600.0,
                      "poll_interval": 15.0, "max_poll_interval": 300.0, "tries": 4, "carry": {"k": 1}}
    assert SlurmLoginTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_the_node_answering_again_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    down = TransportUnavailable("cannot reach lumi: ConnectionRefusedError")
    probes = _probes(monkeypatch, down, CONTROLLER_DOWN, down, None)
    since = time.time() - 600
    with structlog.testing.capture_logs() as logs:
        payload = _event(SlurmLoginTrigger(conn_id="lumi", since=since, carry={"k": 1}, **FAST))
    assert payload == {"kind": REACHABLE, "conn_id": "lumi", "since": since, "tries": 4,
                       "message": "login node of lumi reachable again after 10 min", "carry": {"k": 1}}
    assert _pings(probes) == 4 and probes.closed == 4, "one connection per probe, always closed"
    assert all(asked.line == "scontrol ping" for asked in probes.asked)
    assert [e["event"] for e in logs if e["log_level"] in ("warning", "error")] == [payload["message"]]


def test_past_the_deadline_the_wait_ends_with_an_error_event(monkeypatch: pytest.MonkeyPatch) -> None:
    _probes(monkeypatch, TransportUnavailable("cannot reach lumi: timed out"))
    payload = _event(SlurmLoginTrigger(conn_id="lumi", since=time.time(), watch_deadline=0.5, **FAST))
    assert payload["kind"] == ERROR and payload["tries"] >= 1
    assert "longer than watch_deadline (0 s); last error: cannot reach lumi: timed out" in payload["message"]


def test_a_failure_only_a_person_can_fix_ends_the_wait_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    probes = _probes(monkeypatch, AuthenticationFailed("authentication to lumi failed (publickey)"))
    payload = _event(SlurmLoginTrigger(conn_id="lumi", since=time.time(), **FAST))
    assert (payload["kind"], _pings(probes)) == (ERROR, 1)
    assert payload["message"] == "cannot log in to lumi: authentication to lumi failed (publickey)"


def test_probes_slow_down_from_the_tasks_poll_interval_to_its_cap() -> None:
    probes = SlurmLoginTrigger(conn_id="lumi", since=0.0, poll_interval=10.0, max_poll_interval=600.0).probes
    delays = [probes.delay(tries) for tries in range(12)]
    assert 8 <= delays[0] <= 10 and 16 <= delays[1] <= 20
    assert all(480 <= d <= 600 for d in delays[6:])
    assert 480 <= probes.delay(10_000) <= 600  # days of probes: the exponent stops growing
