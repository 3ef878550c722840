"""The fake Slurm of tests/support/fake_slurm.py answers what the real hooks ask, in Slurm's formats:
the hooks' own parsers read its answers into the statuses a real cluster gives."""

from __future__ import annotations

import asyncio

import pytest

from slurm_provider.cli.sbatch import JobComment, SbatchRefused
from slurm_provider.hooks import SlurmAsyncHook, SlurmHook
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.transport import TransportUnavailable
from support.fake_slurm import FakeSlurm, UnknownCommand

SCRIPT = "#!/bin/bash\necho hello\n"
COMMENT = JobComment(dag="d", task="t", run="r", attempt=1)


def test_a_submitted_job_is_pending_then_running_then_completed(fake_slurm: FakeSlurm) -> None:
    hook = SlurmHook("c")
    job_id = hook.submit(SCRIPT, job_name="fake-one", output="/logs/%x.%j.out", comment=COMMENT,
                         partition="small-g", time_limit="10").job_id
    assert fake_slurm.submitted == [job_id]
    pending = hook.statuses([job_id])[job_id]
    assert (pending.state, pending.name, pending.partition, pending.time_limit_s, pending.source) == (
        SlurmState.PENDING, "fake-one", "small-g", 600, "squeue")
    assert pending.comment == COMMENT.to_json()
    fake_slurm.start(job_id)
    running = hook.statuses([job_id])[job_id]
    assert running.state is SlurmState.RUNNING and running.node_list == "vcnode1"
    fake_slurm.end(job_id, "FAILED", exit_code=3)
    failed = hook.statuses([job_id])[job_id]
    assert (failed.state, failed.exit_code, failed.reason) == (SlurmState.FAILED, 3, "NonZeroExitCode")
    assert fake_slurm.verbs == ["sbatch", "squeue", "squeue", "squeue", "sacct"]


def test_a_job_squeue_forgot_is_known_to_sacct_and_an_unknown_one_is_unknown(fake_slurm: FakeSlurm) -> None:
    fake_slurm.add(101, "gone", state="COMPLETED")
    fake_slurm.vanish(101)
    hook = SlurmHook("c")
    statuses = hook.statuses(["101", "102"])
    assert statuses["101"].state is SlurmState.COMPLETED and statuses["101"].source == "sacct"
    assert statuses["102"].state is SlurmState.UNKNOWN
    assert hook.statuses(["103"])["103"].state is SlurmState.UNKNOWN  # squeue exits 1 for one unknown id


def test_every_run_of_a_requeued_job_and_finding_jobs_by_name(fake_slurm: FakeSlurm) -> None:
    fake_slurm.add(101, "twice", state="RUNNING", comment='{"x":1}')
    fake_slurm.requeue(101)
    fake_slurm.start(101)
    fake_slurm.end(101)
    hook = SlurmHook("c")
    runs = hook.runs(101)
    assert [(r.state, r.restarts) for r in runs] == [(SlurmState.REQUEUED, 0), (SlurmState.COMPLETED, 1)]
    assert [j.job_id for j in hook.find_jobs(name="twice")] == ["101"]
    assert [j.job_id for j in hook.find_jobs(comment_contains='"x":1')] == ["101"]
    assert hook.find_jobs(name="other") == []


def test_cancel_and_signal(fake_slurm: FakeSlurm) -> None:
    fake_slurm.add(101, "long", state="RUNNING")
    hook = SlurmHook("c")
    assert hook.cancel(101, signal="USR1").accepted and fake_slurm.job(101).signals == ["USR1"]
    assert hook.cancel(101).accepted
    cancelled = hook.statuses([101])["101"]
    assert cancelled.state is SlurmState.CANCELLED and cancelled.cancelled_by == "1001"
    assert not hook.cancel(555).accepted


def test_sbatch_refusals_outages_and_lost_answers(fake_slurm: FakeSlurm) -> None:
    hook = SlurmHook("c")
    fake_slurm.refuse_submits("Batch job submission failed: Invalid account or account/partition combination")
    with pytest.raises(SbatchRefused, match="Invalid account"):
        hook.submit(SCRIPT, job_name="x", output="/logs/x.out")
    down = TransportUnavailable("cannot reach the login node")
    fake_slurm.lose_submit_answers(TransportUnavailable("answer lost"), then_down=down)
    with pytest.raises(TransportUnavailable, match="answer lost"):
        hook.submit(SCRIPT, job_name="lost", output="/logs/x.out")
    assert fake_slurm.down is down and [j.name for j in fake_slurm.table.jobs.values()] == ["lost"]
    with pytest.raises(TransportUnavailable, match="cannot reach"):
        hook.statuses([900])
    fake_slurm.down = None
    assert [j.name for j in hook.find_jobs(name="lost")] == ["lost"]


def test_files_allocations_and_the_async_hook(fake_slurm: FakeSlurm) -> None:
    fake_slurm.table.files["/logs/a.out"] = "hello\nworld\n"
    fake_slurm.allocation("proj", limit=6000, used=1000, running=500)
    hook = SlurmHook("c")
    assert hook.file_sizes(["/logs/a.out", "/logs/missing"]) == {"/logs/a.out": 12}
    assert hook.read_file("/logs/a.out") == "hello\nworld\n" and hook.read_file("/logs/missing") is None
    assert hook.read_log("/logs/a.out", 6) == ("world\n", 12)
    tres = hook.account_tres("proj")
    assert tres is not None and (tres.limit, tres.used, tres.running, tres.left) == (6000, 1000, 500, 4500)
    assert hook.account_tres("other") is None
    assert hook.ping() == {"primary": "UP"}

    async def watch() -> str:
        async_hook = SlurmAsyncHook("c")
        job_id = (await async_hook.submit(SCRIPT, job_name="async", output="/logs/x.out")).job_id
        return (await async_hook.statuses([job_id]))[job_id].state.value

    assert asyncio.run(watch()) == "PENDING"


def test_a_line_the_fake_does_not_know_fails_loudly() -> None:
    fake = FakeSlurm()
    with pytest.raises(UnknownCommand, match="squeue --start"):
        fake.run("squeue --start", timeout=5)
    with pytest.raises(AssertionError, match="rm -rf"):
        fake.run("rm -rf /scratch", timeout=5)
    assert fake.verbs == ["squeue", "rm -rf /scratch"]
