"""SlurmJobTrigger driven directly against the real local cluster (run(), serialize(), on_kill())."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog.testing

from support.fake_slurm import FakeSlurm, install
from support.localcluster import LocalCluster, poll_until
from slurm_provider.cli.sshare import TresMinutes
from slurm_provider.hooks import SlurmHook
from slurm_provider.job_status import JobStatus
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.transport import TransportUnavailable
from slurm_provider.triggers import ERROR, FINISHED, NEVER_STARTS, SlurmJobTrigger
from slurm_provider.watch.watch_request import FollowedFiles, WatchedJob, WatchSchedule
from slurm_provider.watch import job_watch
from slurm_provider.watch.notes import WatchNote

FAST = {"poll_interval": 1.0, "max_poll_interval": 3.0, "first_poll_delay": 0.0}
SCRIPTED = {"poll_interval": 0.05, "max_poll_interval": 0.1, "first_poll_delay": 0.0}
"""Polling a scripted cluster in a test: no reason to wait."""


def _submit(cluster: LocalCluster, conn_id: str, body: str, *extra: str, time_limit: str = "2") -> tuple[str, str, str]:
    name = f"trig-{uuid.uuid4().hex[:10]}"
    out_dir = cluster.test_dir()
    result = SlurmHook(conn_id).submit(f"#!/bin/bash\n{body}\n", job_name=name, output=f"{out_dir}/{name}.%j.out",
                                       time_limit=time_limit, extra_options=list(extra))
    return str(result.job_id), name, f"{out_dir}/{name}.{result.job_id}.out"


def _streamed(logs: list[dict[str, Any]], job_id: str) -> list[str]:
    return [entry["event"] for entry in logs if str(entry.get("event", "")).startswith(f"[job {job_id}]")]


def _run_to_event(trigger: SlurmJobTrigger, timeout: float = 120) -> dict[str, Any]:
    async def first_event() -> dict[str, Any]:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first_event(), timeout))


def test_serialize_round_trips_the_three_records_and_the_carried_data() -> None:
    trigger = SlurmJobTrigger(
        job=WatchedJob(conn_id="c", job_id="12", log_path="/p/x.out", log_offset=7, err_log_path="/p/x.err",
                       err_log_offset=3, expected_job_name="n", adopted_from="user ana, DAG d, run r, task t",
                       pending_policy="warn"),
        schedule=WatchSchedule(watch_deadline=3600, **FAST),
        follow=FollowedFiles(({"path": "/p/m.jsonl", "fold": "mod.fold"},), 7.5),
        carry={"history": [{"job_id": "12"}]})
    classpath, kwargs = trigger.serialize()
    assert classpath == "slurm_provider.triggers.SlurmJobTrigger"
    assert sorted(kwargs) == ["carry", "follow", "job", "schedule"]
    assert kwargs["job"]["err_log_path"] == "/p/x.err" and kwargs["job"]["err_log_offset"] == 3
    assert kwargs["job"]["adopted_from"] == "user ana, DAG d, run r, task t"
    assert kwargs["schedule"]["watch_deadline"] == 3600.0
    assert kwargs["follow"] == {"files": [{"path": "/p/m.jsonl", "fold": "mod.fold", "offset": 0}], "interval": 7.5}
    json.dumps(kwargs)  # what Airflow stores
    again = SlurmJobTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert (again.job, again.schedule, again.follow, again.carry) == \
        (trigger.job, trigger.schedule, trigger.follow, trigger.carry)
    with pytest.raises(ValueError, match=r"WatchSchedule: unknown key\(s\) poll_every"):
        SlurmJobTrigger(job=kwargs["job"], schedule={"poll_every": 3})


def test_a_trigger_stored_with_flat_keywords_by_an_earlier_version_still_resumes() -> None:
    """Triggers deferred before the records (flat keywords), before the error output was streamed,
    before outages had a deadline or before ownership was recorded."""
    flat = {"conn_id": "c", "job_id": "12", "poll_interval": 2.0, "max_poll_interval": 5.0, "first_poll_delay": 0.0,
            "log_path": "/p/x.out", "log_offset": 7, "pending_policy": "warn", "expected_job_name": "n",
            "unknown_grace_polls": 6, "carry": {"history": [{"job_id": "12"}]}, "read_end_record": True,
            "follow": [{"path": "/p/m.jsonl", "fold": "mod.fold", "offset": 4}], "follow_interval": 7.5}
    old = SlurmJobTrigger(**flat)
    assert old.job == WatchedJob(conn_id="c", job_id="12", log_path="/p/x.out", log_offset=7, pending_policy="warn",
                                 expected_job_name="n")
    assert old.job.err_log_path is None and old.job.adopted_from is None, "its own job, as then"
    assert old.schedule == WatchSchedule(poll_interval=2.0, max_poll_interval=5.0, first_poll_delay=0.0)
    assert old.schedule.watch_deadline == 24 * 3600.0
    assert old.follow.files == ({"path": "/p/m.jsonl", "fold": "mod.fold", "offset": 4},)
    assert old.carry == {"history": [{"job_id": "12"}]}
    assert SlurmJobTrigger(**old.serialize()[1]).job == old.job  # stored again as records
    with pytest.raises(TypeError, match="unknown watch argument"):
        SlurmJobTrigger(**{**flat, "poll_every": 3})


@pytest.mark.parametrize("timeout", [0, -5, "1 day"])
def test_an_unusable_watch_deadline_is_refused(timeout: Any) -> None:
    with pytest.raises(ValueError, match="watch_deadline must be a positive number of seconds"):
        SlurmJobTrigger(job=WatchedJob("c", "1"), schedule=WatchSchedule(watch_deadline=timeout))


def test_bad_pending_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="pending_policy 'maybe' not allowed"):
        SlurmJobTrigger(job={"conn_id": "c", "job_id": "1", "pending_policy": "maybe"})
    with pytest.raises(ValueError, match="watch_deadline must be a positive number of seconds"):
        SlurmJobTrigger.watching("c", "1", watch_deadline=0)


def _allocation_cluster(monkeypatch: pytest.MonkeyPatch, figures: TresMinutes, pending: int = 10**6) -> FakeSlurm:
    """The fake Slurm on which job 7 pends on its account's allocation (1 GPU for 30 minutes: 30
    billing-minutes) for ``pending`` polls (squeue calls), then runs and completes; sshare answers ``figures``."""
    fake = install(monkeypatch)
    fake.add(7, "alloc", reason="AssocGrpBillingMinutes", account="proj", time_limit_s=1800,
             tres="cpu=1,mem=1000M,node=1,billing=1,gres/gpu=1")
    fake.allocation(figures.account, limit=figures.limit, used=figures.used, running=figures.running,
                    tres=figures.tres, holders=figures.holders)

    def next_poll(fake: FakeSlurm) -> None:
        polls = _polls(fake)
        if fake.asked[-1].verb != "squeue" or polls <= pending:
            return
        if polls == pending + 1:
            fake.start(7)
        elif not fake.job(7).is_terminal:
            fake.end(7)

    fake.before_each = next_poll
    return fake


def _polls(fake: FakeSlurm) -> int:
    return fake.verbs.count("squeue")


def _reads(fake: FakeSlurm) -> int:
    return fake.verbs.count("sshare")


def _info(logs: list[dict[str, Any]], text: str) -> list[str]:
    return [str(entry["event"]) for entry in logs if text in str(entry.get("event", ""))]


def test_a_job_whose_allocation_the_usage_spent_fails_at_the_first_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    script = _allocation_cluster(monkeypatch, TresMinutes("proj", "billing", limit=1000, used=990, running=5,
                                                          holders=(("bob", 5),)))
    payload = _run_to_event(SlurmJobTrigger.watching(conn_id="c", job_id="7", **SCRIPTED), timeout=30)
    assert payload["kind"] == NEVER_STARTS and _polls(script) == 1 and _reads(script) == 1
    assert payload["message"].startswith("job 7 will never start: AssocGrpBillingMinutes: the allocation of "
                                         "account proj is spent for it")
    assert "the usage leaves 10 billing-minutes and the job needs 30 billing-minutes" in payload["message"]


def test_a_job_waits_while_teammates_hold_the_allocation_and_says_who(monkeypatch: pytest.MonkeyPatch) -> None:
    held = TresMinutes("proj", "billing", limit=1000, used=10, running=980, holders=(("alice", 900), ("bob", 80)))
    script = _allocation_cluster(monkeypatch, held, pending=4)
    with structlog.testing.capture_logs() as logs:
        payload = _run_to_event(SlurmJobTrigger.watching(conn_id="c", job_id="7", **SCRIPTED), timeout=60)
    assert payload["kind"] == FINISHED and payload["status"]["state"] == "COMPLETED"
    assert _reads(script) == 4  # one sshare per poll while it pends, none once it runs
    waiting = _info(logs, "waits for the allocation")
    assert waiting == [  # said once: the holders did not change
        "Job 7 waits for the allocation of account proj: GrpTRESMins billing=1000, used 10 (GrpTRESRaw), running "
        "jobs hold 980 (TRESRunMins: alice 900, bob 80). It needs 30 billing-minutes, the usage leaves 990: it "
        "starts once running jobs of the account have released enough (for at most 1-00:00:00: watch_deadline)"]


def test_a_job_that_waited_for_the_allocation_past_the_deadline_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    held = TresMinutes("proj", "billing", limit=1000, used=10, running=980, holders=(("alice", 980),))
    _allocation_cluster(monkeypatch, held)
    payload = _run_to_event(SlurmJobTrigger.watching(conn_id="c", job_id="7", watch_deadline=0.5, **SCRIPTED), timeout=60)
    assert payload["kind"] == NEVER_STARTS
    assert payload["message"].startswith("job 7 still pends with AssocGrpBillingMinutes after the watch waited "
                                         "00:00:0")
    assert "(watch_deadline 00:00:00)" in payload["message"] and "alice 980" in payload["message"]
    assert "raise watch_deadline to wait longer" in payload["message"]


def test_with_pending_policy_warn_a_spent_allocation_is_waited_out(monkeypatch: pytest.MonkeyPatch) -> None:
    spent = TresMinutes("proj", "billing", limit=100, used=90, running=0)
    _allocation_cluster(monkeypatch, spent, pending=3)
    with structlog.testing.capture_logs() as logs:
        payload = _run_to_event(SlurmJobTrigger.watching(conn_id="c", job_id="7", pending_policy="warn",
                                                watch_deadline=0.001, **SCRIPTED), timeout=60)
    assert payload["kind"] == FINISHED
    assert len(_info(logs, "(still waiting: pending_policy=warn)")) == 1


def test_failed_job_yields_one_event_with_status_and_streams_log(
        local_cluster: LocalCluster, cluster_connection: str) -> None:
    job_id, _, log_path = _submit(local_cluster, cluster_connection, "echo first line; sleep 3; echo last line; exit 3")
    with structlog.testing.capture_logs() as logs:
        payload = _run_to_event(SlurmJobTrigger.watching(conn_id=cluster_connection, job_id=job_id, log_path=log_path, **FAST))
    assert payload["kind"] == FINISHED
    assert payload["status"]["state"] == "FAILED"
    assert payload["status"]["exit_code"] == 3
    assert payload["log_offset"] == len(b"first line\nlast line\n")
    assert _streamed(logs, job_id) == [f"[job {job_id}] first line", f"[job {job_id}] last line"]


def test_never_starting_job_is_reported_not_waited_for(local_cluster: LocalCluster, cluster_connection: str) -> None:
    # small-g allows 3 days: Slurm keeps a 4-day request pending forever (PartitionConfig here).
    job_id, _, _ = _submit(local_cluster, cluster_connection, "true", time_limit="4-00:00:00")
    try:
        payload = _run_to_event(SlurmJobTrigger.watching(conn_id=cluster_connection, job_id=job_id, **FAST), timeout=60)
        assert payload["kind"] == NEVER_STARTS
        assert payload["status"]["reason"].startswith("Partition")
        assert f"job {job_id} will not start: {payload['status']['reason']}" in payload["message"]
    finally:
        SlurmHook(cluster_connection).cancel(job_id)


def test_restarted_trigger_resumes_the_watch_without_repeating_log_lines(
        local_cluster: LocalCluster, cluster_connection: str) -> None:
    # The job holds between its two lines until the test releases it, so the check does not depend on
    # how fast a loaded machine starts the job or streams the first line.
    release = f"{local_cluster.test_dir()}/release-{uuid.uuid4().hex[:8]}"
    job_id, _, log_path = _submit(local_cluster, cluster_connection,
                                  f"echo before; until [ -e {release} ]; do sleep 0.5; done; echo after",
                                  time_limit="5")
    trigger = SlurmJobTrigger.watching(conn_id=cluster_connection, job_id=job_id, log_path=log_path, **FAST)

    async def watch_until_first_line_then_stop() -> None:
        # A triggerer shutdown cancels run(); it must not touch the job (that is on_kill's job only).
        async def consume() -> None:
            async for _ in trigger.run():
                raise AssertionError("the job cannot have ended yet")
        task = asyncio.ensure_future(consume())
        for _ in range(240):
            if trigger.log_offset or task.done():
                break
            await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        with structlog.testing.capture_logs() as first_logs:
            asyncio.run(watch_until_first_line_then_stop())
        assert local_cluster.current_state(int(job_id)) == "RUNNING"
        assert trigger.log_offset == len(b"before\n")
        _, kwargs = trigger.serialize()
    finally:
        local_cluster.ssh(f"touch {release}")

    with structlog.testing.capture_logs() as second_logs:
        payload = _run_to_event(SlurmJobTrigger(**kwargs))
    assert payload["status"]["state"] == "COMPLETED"
    assert _streamed(first_logs, job_id) == [f"[job {job_id}] before"]
    assert _streamed(second_logs, job_id) == [f"[job {job_id}] after"]


def test_on_kill_cancels_our_running_job(local_cluster: LocalCluster, cluster_connection: str) -> None:
    job_id, name, _ = _submit(local_cluster, cluster_connection, "sleep 120")
    local_cluster.wait_for_state(int(job_id), {"RUNNING"}, timeout=60)
    trigger = SlurmJobTrigger.watching(conn_id=cluster_connection, job_id=job_id, expected_job_name=name, **FAST)
    asyncio.run(trigger.on_kill())
    assert local_cluster.wait_for_state(int(job_id), {"CANCELLED"}, timeout=60) == "CANCELLED"


def test_on_kill_never_cancels_a_job_that_is_not_ours(local_cluster: LocalCluster, cluster_connection: str) -> None:
    job_id, _, _ = _submit(local_cluster, cluster_connection, "sleep 120")
    try:
        local_cluster.wait_for_state(int(job_id), {"RUNNING"}, timeout=60)
        trigger = SlurmJobTrigger.watching(conn_id=cluster_connection, job_id=job_id, expected_job_name="someone-else", **FAST)
        asyncio.run(trigger.on_kill())
        assert local_cluster.current_state(int(job_id)) == "RUNNING"
    finally:
        SlurmHook(cluster_connection).cancel(job_id)


def test_on_kill_leaves_an_adopted_job_running_when_a_person_stops_the_watching_task(
        local_cluster: LocalCluster, cluster_connection: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_provider import triggers

    async def marked_failed(key: Any) -> str | None:
        return "failed"

    monkeypatch.setattr(triggers, "task_state", marked_failed)
    job_id, name, _ = _submit(local_cluster, cluster_connection, "sleep 120")
    try:
        local_cluster.wait_for_state(int(job_id), {"RUNNING"}, timeout=60)
        trigger = SlurmJobTrigger.watching(conn_id=cluster_connection, job_id=job_id, expected_job_name=name,
                                  adopted_from="user vcloud, DAG other, run r1, task stage0", **FAST)
        trigger.task_instance = SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=-1)
        with structlog.testing.capture_logs() as logs:
            asyncio.run(trigger.on_kill())
        assert local_cluster.current_state(int(job_id)) == "RUNNING"
        said = [str(entry.get("event")) for entry in logs]
        assert any("submitted by user vcloud, DAG other, run r1, task stage0, not by this task" in line
                   and "left running" in line for line in said), said
        # the same stop of the task that submitted it cancels it
        asyncio.run(SlurmJobTrigger.watching(conn_id=cluster_connection, job_id=job_id, expected_job_name=name,
                                    **FAST).on_kill())
        assert local_cluster.wait_for_state(int(job_id), {"CANCELLED"}, timeout=60) == "CANCELLED"
    finally:
        SlurmHook(cluster_connection).cancel(job_id)


@pytest.mark.parametrize("task_state", [None, "scheduled", "deferred"])
def test_on_kill_leaves_the_job_when_the_task_was_cleared_or_the_trigger_moved(
        task_state: str | None, monkeypatch: pytest.MonkeyPatch, fake_slurm: FakeSlurm) -> None:
    from slurm_provider import triggers

    async def state_of(key: Any) -> str | None:
        return task_state

    monkeypatch.setattr(triggers, "task_state", state_of)
    trigger = SlurmJobTrigger.watching(conn_id="c", job_id="12", expected_job_name="ours", **FAST)
    trigger.task_instance = SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=-1)
    asyncio.run(trigger.on_kill())
    assert fake_slurm.asked == [], "on_kill must not reach the cluster here"


def test_on_kill_leaves_the_job_when_the_task_state_cannot_be_read(monkeypatch: pytest.MonkeyPatch,
                                                                    fake_slurm: FakeSlurm) -> None:
    from slurm_provider import triggers

    async def unreadable(key: Any) -> str | None:
        raise ConnectionError("supervisor gone")

    monkeypatch.setattr(triggers, "task_state", unreadable)
    trigger = SlurmJobTrigger.watching(conn_id="c", job_id="12", expected_job_name="ours", **FAST)
    trigger.task_instance = SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=-1)
    with structlog.testing.capture_logs() as logs:
        asyncio.run(trigger.on_kill())
    assert any("run `scancel 12`" in str(entry.get("event")) for entry in logs), logs
    assert fake_slurm.asked == [], "on_kill must not reach the cluster here"


def test_on_kill_of_a_sensor_watch_never_cancels_a_job_submitted_elsewhere(fake_slurm: FakeSlurm) -> None:
    asyncio.run(SlurmJobTrigger.watching(conn_id="c", job_id="12", expected_job_name=None, **FAST).on_kill())
    assert fake_slurm.asked == [], "on_kill must not reach the cluster here"


def test_triggers_of_one_cluster_share_one_connection_and_one_query_per_cycle(
        local_cluster: LocalCluster, cluster_connection: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_provider import hooks, triggers
    from slurm_provider.watch import poller

    jobs = [_submit(local_cluster, cluster_connection, f"sleep {3 + i}")[0] for i in range(4)]
    hooks_made: list[Any] = []
    pollers_used: list[Any] = []

    def factory(conn_id: str):
        def make():
            hooks_made.append(hooks.SlurmAsyncHook(conn_id))
            return hooks_made[-1]
        return make

    def recording_shared_poller(conn_id: str, source_factory: Any, **kwargs: Any) -> Any:
        pollers_used.append(poller.shared_poller(conn_id, source_factory, **kwargs))
        return pollers_used[-1]

    monkeypatch.setattr(triggers, "_hook_factory", factory)
    monkeypatch.setattr(triggers, "shared_poller", recording_shared_poller)

    async def watch_all() -> list[dict[str, Any]]:
        async def one(job_id: str) -> dict[str, Any]:
            async for event in SlurmJobTrigger.watching(conn_id=cluster_connection, job_id=job_id, **FAST).run():
                return event.payload
            raise AssertionError("no event")
        return await asyncio.gather(*(one(j) for j in jobs))

    payloads = asyncio.run(asyncio.wait_for(watch_all(), 120))
    assert [p["status"]["state"] for p in payloads] == ["COMPLETED"] * 4
    assert len({id(p) for p in pollers_used}) == 1, "all triggers of one connection share one poller"
    assert len(hooks_made) == 1 and hooks_made[0].connections_opened == 1
    cycles = pollers_used[0].cycles
    assert cycles >= 2
    assert hooks_made[0].command_counts["squeue"] == cycles, "one squeue per cycle for all watched jobs"
    assert hooks_made[0].command_counts["sacct"] <= cycles


def test_a_lapsed_control_master_pauses_the_watches_until_a_person_opens_it_again(
        local_cluster: LocalCluster, cluster_connection: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The OTP stand-in: an alias that logs in only through its master, closed under two running watches."""
    from slurm_provider import hooks, triggers

    control_dir = Path(tempfile.mkdtemp(prefix="cm-", dir="/tmp"))  # Unix socket paths are short
    config = local_cluster.otp_ssh_config(tmp_path, control_dir / "master")
    monkeypatch.setenv("AIRFLOW_CONN_OTP_WATCH", json.dumps({"conn_type": "ssh", "extra": {
        "transport": "openssh", "ssh_alias": "vcloud-local", "ssh_config_file": str(config)}}))
    hooks_made: list[Any] = []

    def counting_factory(conn_id: str):
        def make():
            hooks_made.append(hooks.SlurmAsyncHook(conn_id))
            return hooks_made[-1]
        return make

    monkeypatch.setattr(triggers, "_hook_factory", counting_factory)
    release = f"{local_cluster.test_dir()}/release"
    body = f"until [ -e {release} ]; do sleep 0.5; done; exit"
    jobs = {code: _submit(local_cluster, cluster_connection, f"{body} {code}", time_limit="10")[0]
            for code in (0, 3)}
    reopen = f"ssh -F {config} -o ControlMaster=auto -fN vcloud-local"

    async def logged(logs: list[dict[str, Any]], text: str, tasks: list[asyncio.Future]) -> None:
        for _ in range(240):
            if any(text in str(entry.get("event", "")) for entry in logs):
                return
            assert not any(task.done() for task in tasks), [task.result() for task in tasks if task.done()]
            await asyncio.sleep(0.5)
        raise AssertionError(f"never logged: {text}")

    async def watch(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        async def one(job_id: str) -> dict[str, Any]:
            async for event in SlurmJobTrigger.watching(conn_id="otp_watch", job_id=job_id, **FAST).run():
                return event.payload
            raise AssertionError("no event")

        tasks = [asyncio.ensure_future(one(job_id)) for job_id in jobs.values()]
        for job_id in jobs.values():
            await logged(logs, f"Job {job_id} RUNNING", tasks)
        await asyncio.to_thread(local_cluster.close_master, config)  # the master lapses mid-watch
        for job_id in jobs.values():
            await logged(logs, f"Cannot see job {job_id} right now, still waiting (up to 24 h): no ControlMaster "
                               f"is running for ssh alias vcloud-local ({config})", tasks)
        # The jobs end while nobody can see them; the watches keep trying with fresh connections.
        await asyncio.to_thread(local_cluster.ssh, f"touch {release}")
        for job_id in jobs.values():
            await asyncio.to_thread(local_cluster.wait_for_state, int(job_id), {"COMPLETED", "FAILED"}, 120)
        tries = len(hooks_made)
        for _ in range(240):
            if len(hooks_made) >= tries + 2:
                break
            await asyncio.sleep(0.5)
        assert len(hooks_made) >= tries + 2, "the watches stopped trying"
        assert not any(task.done() for task in tasks), "a watch gave up while the master was down"
        await asyncio.to_thread(local_cluster.open_master, config)  # a person logs in again
        return await asyncio.wait_for(asyncio.gather(*tasks), 180)

    local_cluster.open_master(config)
    try:
        local_cluster.wait_for_state(int(jobs[0]), {"RUNNING"}, timeout=120)
        local_cluster.wait_for_state(int(jobs[3]), {"RUNNING"}, timeout=120)
        with structlog.testing.capture_logs() as logs:
            payloads = asyncio.run(watch(logs))
    finally:
        local_cluster.close_master(config)
        local_cluster.ssh(f"touch {release}; scancel {jobs[0]} {jobs[3]}", check=False)
        shutil.rmtree(control_dir, ignore_errors=True)

    assert [(p["kind"], p["status"]["state"], p["status"]["exit_code"]) for p in payloads] == \
        [(FINISHED, "COMPLETED", 0), (FINISHED, "FAILED", 3)]
    warnings = [e["event"] for e in logs if "still waiting" in str(e.get("event", ""))]
    assert len(warnings) == 2, "one message per watch, not one per try"
    assert all(" Open it again on host " in w and w.endswith(f") with: {reopen}") for w in warnings)
    for job_id in jobs.values():
        assert any(e.get("event") == f"Watching job {job_id} again on otp_watch" for e in logs)


def test_a_lapsed_control_master_nobody_opens_again_ends_the_watch_at_its_deadline_saying_what_to_do(
        local_cluster: LocalCluster, cluster_connection: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same stand-in, but nobody opens the master again: past ``watch_deadline`` the watch ends with
    an error event that says which connection waits and how to open it again; the job runs on."""
    control_dir = Path(tempfile.mkdtemp(prefix="cm-", dir="/tmp"))
    config = local_cluster.otp_ssh_config(tmp_path, control_dir / "master")
    monkeypatch.setenv("AIRFLOW_CONN_OTP_DEADLINE", json.dumps({"conn_type": "ssh", "extra": {
        "transport": "openssh", "ssh_alias": "vcloud-local", "ssh_config_file": str(config)}}))
    release = f"{local_cluster.test_dir()}/release"
    job_id, _, _ = _submit(local_cluster, cluster_connection, f"until [ -e {release} ]; do sleep 0.5; done",
                           time_limit="10")

    async def watch(logs: list[dict[str, Any]]) -> dict[str, Any]:
        trigger = SlurmJobTrigger.watching(conn_id="otp_deadline", job_id=job_id, watch_deadline=15, **FAST)
        events = trigger.run()
        waiting = asyncio.ensure_future(events.__anext__())
        while not _events(logs, f"Job {job_id} RUNNING"):
            assert not waiting.done(), waiting.result()
            await asyncio.sleep(0.2)
        started = time.monotonic()
        await asyncio.to_thread(local_cluster.close_master, config)  # ... and nobody opens it again
        event = await asyncio.wait_for(waiting, 120)
        assert time.monotonic() - started >= 15, "ended before its deadline"
        return event.payload

    local_cluster.open_master(config)
    try:
        local_cluster.wait_for_state(int(job_id), {"RUNNING"}, timeout=120)
        with structlog.testing.capture_logs() as logs:
            payload = asyncio.run(watch(logs))
        assert local_cluster.current_state(int(job_id)) == "RUNNING", "the job runs on for a retry to adopt"
    finally:
        local_cluster.close_master(config)
        local_cluster.ssh(f"touch {release}; scancel {job_id}", check=False)
        shutil.rmtree(control_dir, ignore_errors=True)
    assert payload["kind"] == ERROR, payload
    message = payload["message"]
    assert "the login to otp_deadline has waited for a person since" in message, message
    assert "longer than watch_deadline (15 s)" in message and " Open it again on host " in message, message
    assert _events(logs, "the login to otp_deadline has waited for a person since"), "said in the task log too"


# --- a login node that does not answer: a scripted cluster (fast); the real outage, an sshd stopped
# for ten minutes under a training stage, is tests/dags/test_login_outage.py ------------------------

DOWN = TransportUnavailable("cannot reach vcloud@login:22 (connection 'c'): ConnectionRefusedError: [Errno 111] "
                            "Connection refused")
SCRIPTED = {"poll_interval": 0.01, "max_poll_interval": 0.02, "first_poll_delay": 0.0}


def _scripted_cluster(monkeypatch: pytest.MonkeyPatch, script: list[BaseException | SlurmState]) -> FakeSlurm:
    """The fake Slurm with job 7, on which every poll (each squeue) meets the next step of ``script``: the
    login node down with that error, or job 7 in that state (the last step stays)."""
    fake = install(monkeypatch)
    fake.add(7, "scripted")
    steps = list(script)

    def next_poll(fake: FakeSlurm) -> None:
        if fake.asked[-1].verb != "squeue":
            return
        step = steps.pop(0) if len(steps) > 1 else steps[0]
        fake.down = step if isinstance(step, BaseException) else None
        if isinstance(step, SlurmState) and fake.job(7).state != step.value:
            if step is SlurmState.RUNNING:
                fake.start(7)
            else:
                fake.end(7, step.value)

    fake.before_each = next_poll
    return fake


def _events(logs: list[dict[str, Any]], text: str) -> list[str]:
    return [str(e["event"]) for e in logs if text in str(e.get("event", ""))]


def _with_task(trigger: SlurmJobTrigger, monkeypatch: pytest.MonkeyPatch, recalled: WatchNote) -> list[WatchNote]:
    """Attach a task instance whose watch note is ``recalled``; returns the notes the trigger writes."""
    from slurm_provider import triggers

    written: list[WatchNote] = []

    async def recall(task: Any, job_id: str, log_path: str | None) -> WatchNote:
        return recalled

    async def remember(task: Any, job_id: str, log_path: str | None, note: WatchNote) -> None:
        written.append(note)

    monkeypatch.setattr(triggers, "recall_watch", recall)
    monkeypatch.setattr(triggers, "remember_watch", remember)
    trigger.task_instance = SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=-1)
    return written


def test_an_outage_is_told_once_and_the_watch_picks_up_when_the_login_node_answers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted_cluster(monkeypatch, [SlurmState.RUNNING, *[DOWN] * 30, SlurmState.COMPLETED])
    with structlog.testing.capture_logs() as logs:
        payload = _run_to_event(SlurmJobTrigger.watching(conn_id="c", job_id="7", **SCRIPTED), timeout=30)
    assert (payload["kind"], payload["status"]["state"]) == (FINISHED, "COMPLETED")
    told = _events(logs, "unreachable since")
    assert len(told) == 1, "one line for the whole outage, not one per try"
    assert told[0].startswith("login node of c unreachable since ")
    assert f"({DOWN}); job 7 last seen RUNNING; waiting up to 24 h, until " in told[0]
    assert len(_events(logs, "login node of c reachable again after ")) == 1
    assert not _events(logs, "still waiting")  # the words of a ControlMaster that needs a person


def test_past_its_deadline_the_watch_ends_as_a_lost_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted_cluster(monkeypatch, [SlurmState.RUNNING, DOWN])  # the login node never comes back
    with structlog.testing.capture_logs() as logs:
        payload = _run_to_event(SlurmJobTrigger.watching(conn_id="c", job_id="7", watch_deadline=1, **SCRIPTED),
                                timeout=30)
    assert payload["kind"] == ERROR and payload["status"] is None
    assert "longer than watch_deadline (1 s); last error: " in payload["message"]
    assert payload["message"].endswith("job 7 last seen RUNNING, it may still run")
    assert len(_events(logs, "unreachable since")) == 2  # told once, then the end, both in the task log


def test_the_outage_is_noted_for_the_try_and_a_restarted_trigger_counts_from_its_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted_cluster(monkeypatch, [SlurmState.RUNNING, DOWN, DOWN, SlurmState.COMPLETED])
    trigger = SlurmJobTrigger.watching(conn_id="c", job_id="7", **SCRIPTED)
    written = _with_task(trigger, monkeypatch, WatchNote())
    assert _run_to_event(trigger, timeout=30)["kind"] == FINISHED
    since = [n.unreachable_since for n in written if n.unreachable_since is not None]
    assert len(since) == 1 and written[-1].unreachable_since is None, written

    # A triggerer restarted two hours into an outage: the new trigger's deadline is the outage's.
    _scripted_cluster(monkeypatch, [DOWN])
    trigger = SlurmJobTrigger.watching(conn_id="c", job_id="7", watch_deadline=3600, **SCRIPTED)
    _with_task(trigger, monkeypatch, WatchNote(0, "RUNNING", 0, unreachable_since=time.time() - 7200))
    payload = _run_to_event(trigger, timeout=30)
    assert payload["kind"] == ERROR and "longer than watch_deadline (1 h)" in payload["message"]

    # ... and says how long the whole outage lasted when the node answers.
    _scripted_cluster(monkeypatch, [SlurmState.COMPLETED])
    trigger = SlurmJobTrigger.watching(conn_id="c", job_id="7", **SCRIPTED)
    _with_task(trigger, monkeypatch, WatchNote(0, "RUNNING", 0, unreachable_since=time.time() - 750))
    with structlog.testing.capture_logs() as logs:
        assert _run_to_event(trigger, timeout=30)["kind"] == FINISHED
    assert _events(logs, "reachable again after") == [
        "login node of c reachable again after 12 min; watching job 7 again"]


def test_the_note_says_when_the_cluster_last_answered_and_is_renewed_while_nothing_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The HPC view shows a waiting job as of its watch's last poll: the note carries the poll's time,
    written on every change and at least every NOTE_REFRESH_S while the job just runs on."""
    from slurm_provider import triggers

    _scripted_cluster(monkeypatch, [*[SlurmState.RUNNING] * 6, SlurmState.COMPLETED])
    trigger = SlurmJobTrigger.watching(conn_id="c", job_id="7", **SCRIPTED)
    written = _with_task(trigger, monkeypatch, WatchNote())
    before = time.time()
    assert _run_to_event(trigger, timeout=30)["kind"] == FINISHED
    assert [n.state for n in written] == ["RUNNING", "COMPLETED"]  # quiet polls within a minute: no write
    assert all(n.polled_at is not None and before <= n.polled_at <= time.time() for n in written)

    monkeypatch.setattr(job_watch, "NOTE_REFRESH_S", 0.0)
    _scripted_cluster(monkeypatch, [*[SlurmState.RUNNING] * 6, SlurmState.COMPLETED])
    trigger = SlurmJobTrigger.watching(conn_id="c", job_id="7", **SCRIPTED)
    written = _with_task(trigger, monkeypatch, WatchNote())
    assert _run_to_event(trigger, timeout=30)["kind"] == FINISHED
    assert [n.state for n in written].count("RUNNING") >= 6  # every poll renews the note
    polls = [n.polled_at for n in written]
    assert polls == sorted(polls) and polls[0] < polls[-1]

    # An outage keeps the last answered poll's time: the view says how old the last state seen is.
    _scripted_cluster(monkeypatch, [SlurmState.RUNNING, DOWN, DOWN, SlurmState.COMPLETED])
    trigger = SlurmJobTrigger.watching(conn_id="c", job_id="7", **SCRIPTED)
    written = _with_task(trigger, monkeypatch, WatchNote())
    assert _run_to_event(trigger, timeout=30)["kind"] == FINISHED
    [down] = [n for n in written if n.unreachable_since is not None]
    assert down.polled_at is not None and down.polled_at <= down.unreachable_since


@pytest.mark.slow
def test_a_job_that_ends_while_its_login_node_is_down_is_read_from_sacct_when_it_answers(
        local_cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A private login sshd stopped, with its sessions, under a running watch; the job ends and slurmctld
    forgets it while nobody can look; the node comes back and the watch reads the end from sacct."""
    from support.private_login import PrivateLogin

    login = PrivateLogin(local_cluster, tmp_path)
    for key, value in login.connection_env().items():
        monkeypatch.setenv(key, value)
    login.start()
    release = f"{local_cluster.test_dir()}/release"
    job_id, _, log_path = _submit(local_cluster, login.conn_id, f"echo started; until [ -e {release} ]; do sleep 0.5; "
                                                                 "done; echo done", time_limit="5")

    async def watch(logs: list[dict[str, Any]]) -> dict[str, Any]:
        waiting = asyncio.ensure_future(_run_to_event_async(SlurmJobTrigger.watching(
            conn_id=login.conn_id, job_id=job_id, log_path=log_path, **FAST)))
        while not _events(logs, f"Job {job_id} RUNNING") or not _streamed(logs, job_id):
            assert not waiting.done(), waiting.result()
            await asyncio.sleep(0.2)
        await asyncio.to_thread(login.stop)
        while not _events(logs, "unreachable since"):
            assert not waiting.done(), waiting.result()
            await asyncio.sleep(0.2)
        await asyncio.to_thread(local_cluster.ssh, f"touch {release}")  # the job ends during the outage
        await asyncio.to_thread(local_cluster.wait_for_state, int(job_id), {"COMPLETED"}, 120)
        # slurmctld forgets it (MinJobAge): only accounting knows how it ended
        await asyncio.to_thread(poll_until, lambda: not local_cluster.root(
            "squeue", "-h", "-t", "all", "-j", job_id, check=False).stdout.strip(), timeout=300,
            what="squeue to forget the job",
            interval=2)
        assert not waiting.done(), "the watch gave up while the login node was down"
        await asyncio.to_thread(login.start)
        return await asyncio.wait_for(waiting, 120)

    try:
        with structlog.testing.capture_logs() as logs:
            payload = asyncio.run(asyncio.wait_for(watch(logs), 600))
    finally:
        local_cluster.ssh(f"touch {release}; scancel {job_id}", check=False)
        login.close()

    assert (payload["kind"], payload["status"]["state"], payload["status"]["source"]) == (FINISHED, "COMPLETED", "sacct")
    told = _events(logs, "unreachable since")
    assert len(told) == 1 and f"; job {job_id} last seen RUNNING; waiting up to 24 h" in told[0], told
    assert len(_events(logs, "reachable again after")) == 1
    assert _streamed(logs, job_id) == [f"[job {job_id}] started", f"[job {job_id}] done"]


async def _run_to_event_async(trigger: SlurmJobTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return event.payload
    raise AssertionError("trigger ended without an event")


QUEUE_STORY = [("PENDING", "Priority", None), ("PENDING", "Priority", None),
               ("PENDING", "Resources", datetime(2026, 11, 27, 14, 5)), ("COMPLETED", None, None)]
"""A job that waits for priority, then for nodes (with Slurm's estimate), then completes: one step per poll."""


def _queue_story(monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """The fake Slurm whose job 77 follows ``QUEUE_STORY``, a step at each squeue (the last one stays)."""
    fake = install(monkeypatch)
    fake.add(77, "queued")
    steps = list(QUEUE_STORY)

    def next_poll(fake: FakeSlurm) -> None:
        if fake.asked[-1].verb != "squeue":
            return
        state, reason, expected = steps.pop(0) if len(steps) > 1 else steps[0]
        if state == "COMPLETED":
            if not fake.job(77).is_terminal:
                fake.end(77)
            return
        job = fake.job(77)
        job.state, job.reason, job.expected_start = state, reason, expected

    fake.before_each = next_poll
    return fake


def test_a_pending_job_says_why_it_waits_and_when_it_may_start_each_time_the_reason_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _queue_story(monkeypatch)
    with structlog.testing.capture_logs() as logs:
        payload = _run_to_event(SlurmJobTrigger.watching(conn_id="queue", job_id="77", **SCRIPTED), timeout=30)
    assert payload["kind"] == FINISHED
    assert _events(logs, "Job 77 ") == [
        "Job 77 PENDING: waiting for higher-priority jobs (Priority)",
        "Job 77 PENDING: waiting for free nodes (Resources); expected to start 2026-11-27 14:05",
        "Job 77 COMPLETED on vcnode1 exit code 0",
    ]


def test_a_job_waiting_for_its_begin_time_and_then_held_says_so_with_slurms_estimated_start(
        local_cluster: LocalCluster, cluster_connection: str) -> None:
    job_id, _, _ = _submit(local_cluster, cluster_connection, "true", "--begin=now+1hour")

    async def watch(logs: list[dict[str, Any]]) -> dict[str, Any]:
        waiting = asyncio.ensure_future(_run_to_event_async(
            SlurmJobTrigger.watching(conn_id=cluster_connection, job_id=job_id, **FAST)))
        for reason in ("(BeginTime)", "(JobHeldUser)"):
            while not _events(logs, f"Job {job_id} PENDING: ") or reason not in _events(logs, f"Job {job_id} ")[-1]:
                assert not waiting.done(), waiting.result()
                await asyncio.sleep(0.2)
            if reason == "(BeginTime)":
                await asyncio.to_thread(local_cluster.ssh, f"scontrol hold {job_id}")
        await asyncio.to_thread(local_cluster.ssh, f"scancel {job_id}")
        return await asyncio.wait_for(waiting, 60)

    start = local_cluster.root("squeue", "-h", "-j", job_id, "-o", "%S").stdout.strip()
    try:
        with structlog.testing.capture_logs() as logs:
            payload = asyncio.run(asyncio.wait_for(watch(logs), 180))
    finally:
        local_cluster.ssh(f"scancel {job_id}", check=False)
    assert payload["kind"] == FINISHED and payload["status"]["state"] == "CANCELLED"
    said = _events(logs, f"Job {job_id} PENDING")
    assert said[0] == (f"Job {job_id} PENDING: waiting for its start time (--begin) (BeginTime); "
                       f"expected to start {start.replace('T', ' ')[:16]}")
    assert said[1].startswith(f"Job {job_id} PENDING: on user hold until released ('scontrol release <job id>') (JobHeldUser)")
    assert len(said) == 2, "one line per reason, not one per poll"
    assert _events(logs, f"Job {job_id} is on user hold") == [
        f"Job {job_id} is on user hold (JobHeldUser) and waits for a release (release_held is off): run "
        f"'scontrol release {job_id}' on the login node of {cluster_connection} to let it start"]


def test_a_job_put_on_user_hold_is_released_once_by_a_watch_allowed_to_and_a_second_hold_stays(
        local_cluster: LocalCluster, cluster_connection: str) -> None:
    job_id, name, _ = _submit(local_cluster, cluster_connection, "true", "--hold", "--begin=now+1hour")

    def reason() -> str:
        return local_cluster.ssh(f"squeue -h -j {job_id} -o %r").stdout.strip()

    async def watch(logs: list[dict[str, Any]]) -> dict[str, Any]:
        watching = asyncio.ensure_future(_run_to_event_async(SlurmJobTrigger.watching(
            conn_id=cluster_connection, job_id=job_id, expected_job_name=name, release_held=True, **FAST)))
        for told in ("released it (release_held)", "waits for a release (it was held again"):
            while not any(told in line for line in _events(logs, f"Job {job_id} ")):
                assert not watching.done(), watching.result()
                await asyncio.sleep(0.2)
            if told.startswith("released"):
                assert await asyncio.to_thread(reason) in ("None", "BeginTime"), "released: no longer held"
                await asyncio.to_thread(local_cluster.ssh, f"scontrol hold {job_id}")
        assert await asyncio.to_thread(reason) == "JobHeldUser", "the second hold stays"
        await asyncio.to_thread(local_cluster.ssh, f"scancel {job_id}")
        return await asyncio.wait_for(watching, 60)

    try:
        with structlog.testing.capture_logs() as logs:
            payload = asyncio.run(asyncio.wait_for(watch(logs), 180))
    finally:
        local_cluster.ssh(f"scancel {job_id}", check=False)
    assert payload["kind"] == FINISHED and payload["status"]["state"] == "CANCELLED"
    assert len(_events(logs, "released it (release_held)")) == 1
    assert poll_until(lambda: local_cluster.ssh(f"sacct -X -n -P -j {job_id} -o State").stdout.strip(),
                      timeout=30, what="the job in accounting").startswith("CANCELLED")


def test_a_job_waiting_out_a_maintenance_window_is_told_which_and_a_job_with_a_time_min_starts_before_it(
        local_cluster: LocalCluster, cluster_connection: str) -> None:
    # The window starts in two days on the CPU node alone: jobs of other tests (time limits of minutes)
    # still fit before it; these two ask for three days.
    window = f"maint-{uuid.uuid4().hex[:8]}"
    local_cluster.root("scontrol", "create", "reservation", f"ReservationName={window}", "StartTime=now+2days",
                       "Duration=04:00:00", "Nodes=nid001001", "Flags=MAINT,IGNORE_JOBS", "Users=root")
    hook, out_dir = SlurmHook(cluster_connection), local_cluster.test_dir()
    jobs: list[str] = []
    try:
        for name, time_min in (("waits", None), ("fits", "1-00:00:00")):
            submitted = hook.submit("#!/bin/bash\nsleep 600\n", job_name=f"{window}-{name}", partition="small",
                                    output=f"{out_dir}/{name}.%j.out", time_limit="3-00:00:00", time_min=time_min)
            jobs.append(str(submitted.job_id))
        waiting, fitting = jobs

        async def watch(logs: list[dict[str, Any]]) -> None:
            watching = asyncio.ensure_future(_run_to_event_async(
                SlurmJobTrigger.watching(conn_id=cluster_connection, job_id=waiting, **FAST)))
            while not _events(logs, f"Job {waiting} waits out"):
                assert not watching.done(), watching.result()
                await asyncio.sleep(0.2)
            watching.cancel()

        with structlog.testing.capture_logs() as logs:
            asyncio.run(asyncio.wait_for(watch(logs), 120))
        said = _events(logs, f"Job {waiting} ")
        assert said[-2] == (f"Job {waiting} PENDING: waiting for nodes that are unavailable (down, drained or "
                            "reserved) (ReqNodeNotAvail, Reserved for maintenance)"), said
        start, end = local_cluster.root("scontrol", "show", "reservation", window).stdout.split("StartTime=")[1].split(
            " EndTime=")
        assert said[-1].startswith(f"Job {waiting} waits out the maintenance window '{window}' from "
                                   f"{start.replace('T', ' ')[:16]} to {end.split()[0].replace('T', ' ')[:16]} "
                                   "on nid001001 (the cluster's local time): its time limit reaches into the window")
        # The job that allows a shorter limit runs now, with a limit that ends before the window.
        limit = poll_until(lambda: next((row.split()[1] for row in [local_cluster.ssh(
            f"squeue -h -j {fitting} -o '%T %l'").stdout.strip()] if row.startswith("RUNNING")), None),
            timeout=60, what=f"job {fitting} running before the window")
        assert limit == "1-00:00:00", "started with its --time-min, inside the two days left before the window"
        assert hook.statuses([waiting])[waiting].state is SlurmState.PENDING
    finally:
        local_cluster.ssh(f"scancel {' '.join(jobs)}", check=False)
        local_cluster.root("scontrol", "delete", f"ReservationName={window}", check=False)


# --- files the watch follows as they grow (a stage's metrics.jsonl): a scripted cluster --------------------


def count_lines(state: Any, lines: list[str]) -> dict[str, Any]:
    """A fold: how many lines were read, and the last one."""
    return {"lines": (state or {}).get("lines", 0) + len(lines), "last": lines[-1]}


FOLLOWED_PATH = "/o/m.jsonl"
"""A file job 7 writes line by line (a metrics log) that the trigger follows."""
FOLLOW = [{"path": FOLLOWED_PATH, "fold": f"{__name__}.count_lines"}]


def _growing_cluster(monkeypatch: pytest.MonkeyPatch, polls: int, text: str = "") -> FakeSlurm:
    """The fake Slurm on which job 7 runs and its file ``FOLLOWED_PATH`` grows by a line at every size check
    (a file read that asks for its size); the job completes at its ``polls``-th status query (squeue)."""
    fake = install(monkeypatch)
    fake.add(7, "growing", state="RUNNING")
    fake.table.files[FOLLOWED_PATH] = text

    def step(fake: FakeSlurm) -> None:
        asked = fake.asked[-1]
        if asked.verb in ("poll_files", "file_sizes") and FOLLOWED_PATH in asked.line:
            grown = fake.table.files[FOLLOWED_PATH]
            fake.table.files[FOLLOWED_PATH] = grown + f'{{"step": {len(grown.splitlines()) + 1}}}\n'
        elif asked.verb == "squeue" and fake.verbs.count("squeue") >= polls and not fake.job(7).is_terminal:
            fake.end(7)

    fake.before_each = step
    return fake


def _offsets_read(fake: FakeSlurm) -> list[int]:
    """The offsets the watch read ``FOLLOWED_PATH`` from."""
    return [int(re.search(r"; o=(\d+); ", asked.line)[1])  # type: ignore[index]
            for asked in fake.asked if asked.verb == "read_log" and FOLLOWED_PATH in asked.line]


def _following(monkeypatch: pytest.MonkeyPatch, recalled: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The task's ``slurm_followed`` XCom holds ``recalled``; returns what the trigger writes there."""
    from slurm_provider import triggers

    written: list[list[dict[str, Any]]] = []

    async def recall(task: Any, job_id: str) -> list[dict[str, Any]]:
        return recalled

    async def remember(task: Any, job_id: str, files: list[dict[str, Any]]) -> None:
        written.append(json.loads(json.dumps(files)))  # what an XCom keeps: JSON

    monkeypatch.setattr(triggers, "recall_followed", recall)
    monkeypatch.setattr(triggers, "remember_followed", remember)
    return written


def test_a_followed_file_is_folded_as_it_grows_and_kept_for_the_try(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = _growing_cluster(monkeypatch, polls=6)
    written = _following(monkeypatch, [])
    trigger = SlurmJobTrigger.watching(conn_id="c", job_id="7", follow=FOLLOW, follow_interval=0.0, read_end_record=False,
                              **SCRIPTED)
    _with_task(trigger, monkeypatch, WatchNote())
    payload = _run_to_event(trigger, timeout=30)
    assert payload["kind"] == FINISHED
    states = [files[0]["state"] for files in written]
    assert [s["lines"] for s in states] == list(range(1, len(states) + 1)) and len(states) >= 4
    text = cluster.table.files[FOLLOWED_PATH]
    assert states[-1]["last"] == text.splitlines()[len(states) - 1]
    last = written[-1][0]
    assert last["offset"] == len("".join(text.splitlines(keepends=True)[:len(states)]))
    assert last["read_at"] is not None and last["problem"] is None and last["rest"] == ""
    # the event carries how far each file was read (airflow dags test keeps no XCom of the watch)
    assert payload["follow"] == [{"path": FOLLOWED_PATH, "fold": FOLLOW[0]["fold"], "offset": last["offset"]}]


def test_a_restarted_trigger_reads_a_followed_file_on_from_where_the_try_got(monkeypatch: pytest.MonkeyPatch) -> None:
    before = '{"step": 1}\n{"step": 2}\n'
    cluster = _growing_cluster(monkeypatch, polls=3, text=before)
    kept = {"path": FOLLOWED_PATH, "fold": FOLLOW[0]["fold"], "offset": len(before),
            "state": {"lines": 2, "last": '{"step": 2}'}, "rest": "", "read_at": 1.0}
    written = _following(monkeypatch, [kept])
    trigger = SlurmJobTrigger.watching(conn_id="c", job_id="7", follow=FOLLOW, follow_interval=0.0, read_end_record=False,
                              **SCRIPTED)
    _with_task(trigger, monkeypatch, WatchNote())
    assert _run_to_event(trigger, timeout=30)["kind"] == FINISHED
    assert min(_offsets_read(cluster)) == kept["offset"]  # nothing read twice
    assert written[0][0]["state"]["lines"] == 3


def test_a_fold_that_cannot_be_imported_stops_following_and_the_watch_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _growing_cluster(monkeypatch, polls=3)
    written = _following(monkeypatch, [])
    trigger = SlurmJobTrigger.watching(conn_id="c", job_id="7", follow=[{"path": FOLLOWED_PATH, "fold": "nowhere.fold"}],
                              follow_interval=0.0, read_end_record=False, **SCRIPTED)
    _with_task(trigger, monkeypatch, WatchNote())
    with structlog.testing.capture_logs() as logs:
        assert _run_to_event(trigger, timeout=30)["kind"] == FINISHED
    assert "must be importable where the triggerer runs" in written[0][0]["problem"]
    assert len(_events(logs, f"No longer following {FOLLOWED_PATH}")) == 1


def test_serialize_round_trips_the_followed_files() -> None:
    trigger = SlurmJobTrigger.watching(conn_id="c", job_id="12", follow=FOLLOW, follow_interval=30, **FAST)
    classpath, kwargs = trigger.serialize()
    assert kwargs["follow"] == {"files": [{**FOLLOW[0], "offset": 0}], "interval": 30.0}
    assert SlurmJobTrigger(**kwargs).serialize() == (classpath, kwargs)
