"""Exit records on the local cluster: real jobs whose scripts carry ``end_record_shell``, watched by a
real ``SlurmJobTrigger`` through the shared poller and a real ``SlurmAsyncHook``.

The regular poll is set 120 s apart, longer than any of these jobs runs: an end the trigger hands on
after a single regular poll was noticed through the record. Proof is the sequence of commands (the
poller's counts, the connection's scheduler-call tally), never a timing.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import structlog.testing

from support.localcluster import LocalCluster, poll_until
from slurm_provider import hooks, triggers
from slurm_provider.watch import poller
from slurm_provider.watch.end_records import end_record_shell, parse_end_record
from slurm_provider.hooks import SlurmHook
from slurm_provider.scheduler_calls import calls_of, forget_calls
from slurm_provider.triggers import FINISHED, SlurmJobTrigger

SLOW_POLLS = {"poll_interval": 120.0, "max_poll_interval": 300.0, "first_poll_delay": 0.0}


def _submit(cluster: LocalCluster, conn_id: str, body: str, *extra: str) -> tuple[str, str]:
    """Submit a job whose script leaves an exit record; returns its id and output file."""
    name = f"endrec-{uuid.uuid4().hex[:10]}"
    output = f"{cluster.test_dir()}/{name}.%j.out"
    script = f"#!/bin/bash\n{end_record_shell(output)}\n{body}\n"
    job_id = str(SlurmHook(conn_id).submit(script, job_name=name, output=output, time_limit="3",
                                           extra_options=list(extra)).job_id)
    return job_id, output.replace("%j", job_id)


class Watch:
    """One trigger run to its event, keeping the poller and hook it used."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.hooks: list[hooks.SlurmAsyncHook] = []
        self.pollers: list[poller.JobPoller] = []

        def factory(conn_id: str) -> Any:
            def make() -> hooks.SlurmAsyncHook:
                self.hooks.append(hooks.SlurmAsyncHook(conn_id))
                return self.hooks[-1]
            return make

        def recording(conn_id: str, source_factory: Any, **kwargs: Any) -> poller.JobPoller:
            self.pollers.append(poller.shared_poller(conn_id, source_factory, **kwargs))
            return self.pollers[-1]

        monkeypatch.setattr(triggers, "_hook_factory", factory)
        monkeypatch.setattr(triggers, "shared_poller", recording)

    def run(self, trigger: SlurmJobTrigger, timeout: float = 240) -> dict[str, Any]:
        async def first_event() -> dict[str, Any]:
            async for event in trigger.run():
                return event.payload
            raise AssertionError("trigger ended without an event")

        with structlog.testing.capture_logs():
            return asyncio.run(asyncio.wait_for(first_event(), timeout))

    @property
    def poller(self) -> poller.JobPoller:
        return self.pollers[0]


def test_an_ended_job_is_noticed_through_its_record_before_the_next_poll_at_no_extra_scheduler_call(
        local_cluster: LocalCluster, cluster_connection: str, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id, log_path = _submit(local_cluster, cluster_connection, "echo working; sleep 4; exit 3")
    forget_calls(cluster_connection)
    watch = Watch(monkeypatch)
    payload = watch.run(SlurmJobTrigger.watching(conn_id=cluster_connection, job_id=job_id, log_path=log_path,
                                        **SLOW_POLLS))
    assert payload["kind"] == FINISHED and payload["status"]["state"] == "FAILED"
    assert payload["status"]["exit_code"] == 3
    assert payload["noticed_by"] == "end_record"
    polled = watch.poller
    assert polled.cycles == 1, "one regular poll: the end came from the record before the second"
    assert polled.record_reads >= 1 and polled.confirmations >= 1
    hook = watch.hooks[0]
    assert hook.command_counts["poll_files"] == polled.record_reads + polled.cycles
    # Only the regular poll and the confirmations asked Slurm; reading the records asked it nothing.
    tally = calls_of(cluster_connection)
    assert tally.by_verb["squeue"] == polled.cycles + polled.confirmations
    assert tally.total == hook.command_counts["squeue"] + hook.command_counts["sacct"]
    record = parse_end_record(local_cluster.ssh(f"cat {log_path}.end").stdout)
    assert record is not None and (record.job_id, record.exit_code, record.requeued) == (job_id, 3, False)


def test_a_requeued_runs_record_is_not_taken_for_the_end(
        local_cluster: LocalCluster, cluster_connection: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The first run requeues its job as the pipeline's script does after a pre-timeout signal, leaving
    # its record (kept aside as .first for this test) before Slurm ends it; the second run completes.
    body = """if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
    echo "first run"
    requeued=1
    write_end_record 0
    cp "$END_RECORD" "$END_RECORD.first"
    scontrol requeue "$SLURM_JOB_ID"
    sleep 60
fi
echo "run ${SLURM_RESTART_COUNT}"
sleep 2"""
    job_id, log_path = _submit(local_cluster, cluster_connection, body, "--requeue", "--open-mode=append")
    watch = Watch(monkeypatch)
    payload = watch.run(SlurmJobTrigger.watching(conn_id=cluster_connection, job_id=job_id, log_path=log_path,
                                        **SLOW_POLLS))
    first = parse_end_record(local_cluster.ssh(f"cat {log_path}.end.first").stdout)
    assert first is not None and (first.restart, first.requeued) == (0, True)
    assert payload["status"]["state"] == "COMPLETED" and payload["status"]["restarts"] >= 1
    assert payload["noticed_by"] == "end_record"
    assert watch.poller.record_reads >= 2
    assert watch.poller.unconfirmed == 0, "the requeued run's record never made the poller ask Slurm"
    last = parse_end_record(local_cluster.ssh(f"cat {log_path}.end").stdout)
    assert last is not None and last.restart >= 1 and not last.requeued


def test_a_job_killed_before_its_script_could_leave_a_record_is_noticed_by_the_poll(
        local_cluster: LocalCluster, cluster_connection: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A node that fails takes the batch shell with it, trap and all: the stand-in is a SIGKILL of the
    # shell itself (scancel --signal=KILL sends TERM first, which runs the trap). The script names its
    # own process id.
    job_id, log_path = _submit(local_cluster, cluster_connection, 'echo "pid $$"; sleep 300')
    local_cluster.wait_for_state(int(job_id), {"RUNNING"}, timeout=120)
    pid = poll_until(lambda: _named_pid(local_cluster, log_path), timeout=60, what="the job's shell names its pid")
    watch = Watch(monkeypatch)
    trigger = SlurmJobTrigger.watching(conn_id=cluster_connection, job_id=job_id, log_path=log_path, poll_interval=2.0,
                              max_poll_interval=4.0, first_poll_delay=0.0)

    async def kill_then_watch() -> dict[str, Any]:
        await asyncio.to_thread(local_cluster.root, "kill", "-KILL", pid)
        async for event in trigger.run():
            return event.payload
        raise AssertionError("no event")

    with structlog.testing.capture_logs():
        payload = asyncio.run(asyncio.wait_for(kill_then_watch(), 180))
    assert payload["kind"] == FINISHED and payload["status"]["state"] == "FAILED"
    assert payload["noticed_by"] == "poll"
    assert local_cluster.ssh(f"test -e {log_path}.end", check=False).returncode != 0, "SIGKILL leaves no record"
    assert watch.poller.confirmations == 0


def _named_pid(cluster: LocalCluster, log_path: str) -> str | None:
    text = cluster.ssh(f"cat {log_path}", check=False).stdout
    return next((line.split()[1] for line in text.splitlines() if line.startswith("pid ")), None)
