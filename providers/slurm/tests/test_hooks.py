"""SlurmHook and SlurmAsyncHook against the local cluster, through both transports.

Jobs are tiny (`sleep`, `echo`, `--time=1`). Jobs that only need to exist are submitted held
(`--hold`), so they stay PENDING without using the node; every job is cancelled at teardown.
"""

from __future__ import annotations

import asyncio
import gc
import shlex
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from support.localcluster import poll_until

from slurm_provider.cli.sbatch import JobComment, parse_job_comment
from slurm_provider.cli.exclusive_submit import exclusive_dir_marker
from slurm_provider.hooks import SlurmAsyncHook, SlurmCommandFailed, SlurmHook, SubmitLockBusy, SubmitOptions
from slurm_provider.cli.sbatch import SbatchRefused
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.transport import CommandResult, TransportError, runner_for_connection
from slurm_provider.validation import ValidationError

CONN_IDS = ["vcloud_local_cluster", "vcloud_local_cluster_openssh"]
HELD = ["--hold"]
SLEEP = "#!/bin/bash\nsleep 60\n"


@pytest.fixture(params=CONN_IDS)
def conn_id(request: pytest.FixtureRequest, cluster_connection: str) -> str:
    return request.param


@pytest.fixture
def jobs(local_cluster) -> Iterator[list[str]]:
    """Job ids a test submitted; all cancelled afterwards (as root, so a failed test leaves nothing)."""
    submitted: list[str] = []
    yield submitted
    if submitted:
        local_cluster.root("scancel", *submitted, check=False)


@pytest.fixture(scope="module")
def workdir(local_cluster) -> str:
    return local_cluster.test_dir()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _options(workdir: str, name: str, **fields) -> SubmitOptions:
    return SubmitOptions(job_name=name, output=f"{workdir}/%x_%j.out", time_limit="1", **fields)


def _submit(hook: SlurmHook, jobs: list[str], workdir: str, *, script: str = SLEEP, **fields) -> str:
    result = hook.submit(script, _options(workdir, _name("hook"), **fields))
    jobs.append(result.job_id)
    return result.job_id


@pytest.fixture(scope="session")
def forgotten_job(local_cluster) -> tuple[str, str]:
    """(job id, sacct state) of a finished job squeue no longer lists (older than MinJobAge)."""

    def candidates() -> list[tuple[str, str]]:
        out = local_cluster.root("sacct", "-X", "-n", "-P", "-a", "-u", local_cluster.user, "-S", "now-2days",
                                 "-E", "now-3minutes", "-s", "CD,F,CA,TO", "-o", "JobIDRaw,State").stdout
        return [tuple(line.split("|")[:2]) for line in out.splitlines() if line and "_" not in line]

    def forgotten() -> tuple[str, str] | None:
        for job_id, state in reversed(candidates()):
            if not local_cluster.root("squeue", "-h", "-j", job_id, check=False).stdout.strip():
                return job_id, state.split()[0]
        return None

    found = forgotten()
    if found is None:  # a fresh cluster: make one and wait for slurmctld to forget it
        job_id = local_cluster.sbatch("#!/bin/bash\ntrue\n", "--time=1", "--job-name=hook-forgotten")
        local_cluster.wait_for_state(job_id, {"COMPLETED"})
        found = poll_until(forgotten, timeout=300, what=f"squeue to forget job {job_id}", interval=5)
    return found


# --- submit -------------------------------------------------------------------------------------


def test_submit_sends_the_script_on_stdin_and_quotes_paths(local_cluster, conn_id: str, jobs: list[str],
                                                           workdir: str) -> None:
    directory = f"{workdir}/{conn_id} it's a \"quoted\" $dir"
    local_cluster.ssh(f"mkdir -p {shlex.quote(directory)}")
    script = '#!/bin/bash\necho "hello from $SLURM_JOB_ID in $(pwd)"\n'
    with SlurmHook(conn_id) as hook:
        result = hook.submit(script, job_name=_name("quoted"), output=f"{directory}/out %j.log",
                             chdir=directory, time_limit="1")
        jobs.append(result.job_id)
        assert result.job_id.isdigit()
        local_cluster.wait_for_state(int(result.job_id), {"COMPLETED"}, timeout=120)
        text, offset = hook.read_log(f"{directory}/out {result.job_id}.log", 0)
    assert text == f"hello from {result.job_id} in {directory}\n"
    assert offset == len(text.encode())
    assert hook.command_counts == {"sbatch": 1, "read_log": 1}


def test_refused_submission_carries_slurms_message(conn_id: str, cluster_connection: str,
                                                   workdir: str) -> None:
    with SlurmHook(conn_id) as hook, pytest.raises(SbatchRefused, match="invalid partition"):
        hook.submit("#!/bin/bash\ntrue\n", _options(workdir, _name("refused"), partition="nosuch-g"))


def test_test_only_estimates_without_submitting(conn_id: str, cluster_connection: str, workdir: str) -> None:
    name = _name("dry")
    with SlurmHook(conn_id) as hook:
        estimate = hook.test_only("#!/bin/bash\ntrue\n", _options(workdir, name, partition="small-g"))
        assert estimate.partition == "small-g" and estimate.job_id.isdigit()
        assert hook.find_jobs(name=name) == []
        with pytest.raises(SbatchRefused, match="invalid partition"):
            hook.test_only("#!/bin/bash\ntrue\n", _options(workdir, name, partition="nosuch-g"))


# --- statuses -----------------------------------------------------------------------------------


def test_statuses_batch_one_squeue_and_one_sacct(local_cluster, conn_id: str, jobs: list[str], workdir: str,
                                                 forgotten_job: tuple[str, str]) -> None:
    with SlurmHook(conn_id) as sync_hook:
        running = _submit(sync_hook, jobs, workdir)
        held = _submit(sync_hook, jobs, workdir, extra_options=HELD)
    local_cluster.wait_for_state(int(running), {"RUNNING"}, timeout=60)
    forgotten, forgotten_state = forgotten_job
    unknown = "987654321"

    async def poll() -> tuple[dict, dict, SlurmAsyncHook]:
        hook = SlurmAsyncHook(conn_id)
        try:
            everything = await hook.statuses([running, held, forgotten, unknown])
            assert dict(hook.command_counts) == {"squeue": 1, "sacct": 1}
            live_only = await hook.statuses([running, held])
            return everything, live_only, hook
        finally:
            await hook.close()

    everything, live_only, hook = asyncio.run(poll())
    assert list(everything) == [running, held, forgotten, unknown]
    assert (everything[running].state, everything[running].source) == (SlurmState.RUNNING, "squeue")
    assert everything[held].state is SlurmState.PENDING and everything[held].reason == "JobHeldUser"
    assert everything[forgotten].source == "sacct"
    assert everything[forgotten].state.value == forgotten_state
    assert everything[unknown].state is SlurmState.UNKNOWN and not everything[unknown].is_success
    assert live_only[running].state is SlurmState.RUNNING
    # Every id squeue lists as live: no sacct at all. One connection for the hook's lifetime.
    assert dict(hook.command_counts) == {"squeue": 2, "sacct": 1}
    assert hook.connections_opened <= 1 if conn_id.endswith("openssh") else hook.connections_opened == 1


def test_an_id_only_sacct_knows_comes_from_sacct(conn_id: str, cluster_connection: str,
                                                 forgotten_job: tuple[str, str]) -> None:
    job_id, state = forgotten_job
    with SlurmHook(conn_id) as hook:
        status = hook.statuses([job_id])[job_id]
    assert (status.state.value, status.source) == (state, "sacct")
    assert hook.command_counts == {"squeue": 1, "sacct": 1}


def test_an_id_nobody_knows_is_unknown_never_success(conn_id: str, cluster_connection: str) -> None:
    with SlurmHook(conn_id) as hook:
        status = hook.statuses(["987654321"])["987654321"]
    assert status.state is SlurmState.UNKNOWN and status.source == "none"
    assert not status.is_success and not status.is_terminal


def test_cancel(local_cluster, conn_id: str, jobs: list[str], workdir: str) -> None:
    with SlurmHook(conn_id) as hook:
        job_id = _submit(hook, jobs, workdir, extra_options=HELD)
        result = hook.cancel(job_id)
        assert result.accepted and result.job_id == job_id
        local_cluster.wait_for_state(int(job_id), {"CANCELLED"}, timeout=30)
        assert hook.statuses([job_id])[job_id].state is SlurmState.CANCELLED


def test_runs_lists_every_run_of_a_requeued_job(local_cluster, conn_id: str, jobs: list[str],
                                                workdir: str) -> None:
    with SlurmHook(conn_id) as hook:
        job_id = _submit(hook, jobs, workdir, extra_options=["--requeue"])
        local_cluster.wait_for_state(int(job_id), {"RUNNING"}, timeout=60)
        local_cluster.root("scontrol", "requeuehold", job_id)

        def requeued_runs() -> list | None:
            runs = hook.runs(job_id)
            return runs if len(runs) >= 2 else None

        runs = poll_until(requeued_runs, timeout=60, what=f"sacct to show the requeued run of {job_id}")
    assert runs[0].state is SlurmState.REQUEUED and runs[0].restarts == 0
    assert runs[-1].state is SlurmState.PENDING and runs[-1].restarts == len(runs) - 1
    assert {run.job_id for run in runs} == {job_id}


def test_find_jobs_by_name_and_by_comment(conn_id: str, cluster_connection: str, jobs: list[str],
                                          workdir: str) -> None:
    token = uuid.uuid4().hex[:10]
    comment = JobComment(dag="hook_tests", task=f"find_{token}", run="manual__1", attempt=1)
    name = _name("adopt")
    with SlurmHook(conn_id) as hook:
        job_id = hook.submit(SLEEP, _options(workdir, name, comment=comment, extra_options=HELD)).job_id
        jobs.append(job_id)
        by_name = hook.find_jobs(name=name)
        by_comment = hook.find_jobs(comment_contains=f'"task":"find_{token}"')
        nothing = hook.find_jobs(name=f"{name}-other")
    assert [j.job_id for j in by_name] == [job_id]
    assert parse_job_comment(by_name[0].comment) == comment
    assert [j.job_id for j in by_comment] == [job_id]
    assert nothing == []


def test_scontrol_show(conn_id: str, cluster_connection: str, jobs: list[str], workdir: str) -> None:
    with SlurmHook(conn_id) as hook:
        job_id = _submit(hook, jobs, workdir, extra_options=HELD)
        [record] = hook.scontrol_show(job_id)
        assert record["JobId"] == job_id and record["JobState"] == "PENDING"
        assert hook.scontrol_show("987654321") == []


# --- files --------------------------------------------------------------------------------------


def test_read_log_continues_from_byte_offsets(local_cluster, conn_id: str, workdir: str) -> None:
    path = f"{workdir}/{conn_id} log's \"tail\".txt"
    quoted = shlex.quote(path)
    local_cluster.ssh(f"printf 'first \\316\\261\\316\\262\\n' > {quoted}")  # 'first αβ\n': 11 bytes
    with SlurmHook(conn_id) as hook:
        assert hook.read_log(path, 0, max_bytes=7) == ("first ", 6)  # never half a character
        text, offset = hook.read_log(path, 0)
        assert (text, offset) == ("first αβ\n", 11)
        local_cluster.ssh(f"printf 'second\\n' >> {quoted}")
        assert hook.read_log(path, offset) == ("second\n", 18)
        assert hook.read_log(path, 18) == ("", 18)
        local_cluster.ssh(f"printf 'new\\n' > {quoted}")  # rewritten shorter, e.g. after a requeue
        chunk = hook.read_log_chunk(path, 18)
        assert (chunk.truncated, chunk.text, chunk.new_offset) == (True, "new\n", 4)
        assert hook.read_log(f"{workdir}/no such.log", 42) == ("", 42)


def test_read_file_and_file_sizes(local_cluster, conn_id: str, workdir: str) -> None:
    path = f"{workdir}/{conn_id} progress 'x'.json"
    local_cluster.ssh(f"printf '{{\"epoch\": 3}}' > {shlex.quote(path)}")
    missing = f"{workdir}/missing.json"
    with SlurmHook(conn_id) as hook:
        assert hook.read_file(path) == '{"epoch": 3}'
        assert hook.read_file(missing) is None
        assert hook.file_sizes([path, missing]) == {path: 12}


def test_account_tres_reads_the_limit_and_usage_slurm_holds(local_cluster, conn_id: str) -> None:
    # What Slurm itself stores, read as root, against what the hook reads as the cluster user.
    stored = local_cluster.root("sacctmgr", "-n", "-P", "show", "assoc", f"account={local_cluster.account}",
                                "format=User,GrpTRESMins").stdout.splitlines()
    limit = next(line.split("|")[1] for line in stored if line.startswith("|"))
    with SlurmHook(conn_id) as hook:
        billing = hook.account_tres(local_cluster.account)
        unknown = hook.account_tres("no_such_account")
        assert hook.command_counts == {"sshare": 2}
    assert billing is not None and f"billing={billing.limit}" == limit
    assert billing.used >= 0 and billing.running >= 0 and billing.left <= billing.limit
    assert unknown is None

    async def read() -> object:
        async_hook = SlurmAsyncHook(conn_id)
        try:
            return await async_hook.account_tres(local_cluster.account)
        finally:
            await async_hook.close()

    assert asyncio.run(read()).limit == billing.limit


# --- validation happens before anything reaches the cluster -------------------------------------


class RecordingRunner:
    def __init__(self, runner) -> None:
        self.runner = runner
        self.commands: list[str] = []

    def run(self, command: str, *, stdin=None, timeout: float) -> CommandResult:
        self.commands.append(command)
        return self.runner.run(command, stdin=stdin, timeout=timeout)

    def close(self) -> None:
        self.runner.close()


class AsyncRecordingRunner:
    def __init__(self, runner: RecordingRunner) -> None:
        self.recorder = runner

    async def run(self, command: str, *, stdin=None, timeout: float) -> CommandResult:
        return self.recorder.run(command, stdin=stdin, timeout=timeout)

    async def close(self) -> None:
        self.recorder.close()


def test_injection_is_rejected_before_any_command_runs(conn_id: str, cluster_connection: str,
                                                       workdir: str) -> None:
    pwned = Path(f"/tmp/pwned-{uuid.uuid4().hex[:8]}")
    touch = f"touch {pwned}"
    recorder = RecordingRunner(runner_for_connection(conn_id))
    hook = SlurmHook(conn_id, runner=recorder)
    async_hook = SlurmAsyncHook(conn_id, runner=AsyncRecordingRunner(recorder))
    attempts = {
        "partition": lambda h: h.submit(SLEEP, _options(workdir, "x", partition=f"small-g; {touch}")),
        "job_name": lambda h: h.submit(SLEEP, _options(workdir, f"x; {touch}")),
        "extra_sbatch_options": lambda h: h.submit(
            SLEEP, _options(workdir, "x", extra_options=[f"; {touch}"])
        ),
        "job_ids": lambda h: h.statuses([f"1; {touch}"]),
        "job_id": lambda h: h.cancel(f"1 && {touch}"),
        "signal": lambda h: h.cancel("1", signal=f"TERM; {touch}"),
        "log_path": lambda h: h.read_log(f"/tmp/x\n{touch}", 0),
        "since": lambda h: h.find_jobs(name="x", since=f"now; {touch}"),
        "account": lambda h: h.account_tres(f"vcloud_local; {touch}"),
    }
    for field, attempt in attempts.items():
        with pytest.raises(ValidationError) as caught:
            attempt(hook)
        assert caught.value.field == field
        with pytest.raises(ValidationError):
            asyncio.run(attempt(async_hook))
    assert recorder.commands == []
    assert hook.commands_issued == async_hook.commands_issued == 0
    assert not pwned.exists()
    hook.close()


def test_sync_and_async_hooks_issue_the_same_commands(cluster_connection: str, workdir: str) -> None:
    sync_recorder = RecordingRunner(runner_for_connection(cluster_connection))
    async_recorder = RecordingRunner(runner_for_connection(cluster_connection))
    hook = SlurmHook(cluster_connection, runner=sync_recorder)
    async_hook = SlurmAsyncHook(cluster_connection, runner=AsyncRecordingRunner(async_recorder))
    ids = ["987654321", "987654322"]
    path = f"{workdir}/missing file.log"

    async def calls() -> tuple:
        try:
            return (await async_hook.statuses(ids), await async_hook.read_log(path, 5),
                    await async_hook.read_file(path))
        finally:
            await async_hook.close()

    try:
        sync_answers = (hook.statuses(ids), hook.read_log(path, 5), hook.read_file(path))
    finally:
        hook.close()
    assert asyncio.run(calls()) == sync_answers
    assert sync_recorder.commands == async_recorder.commands and len(sync_recorder.commands) == 4


def test_submit_refuses_unknown_options_by_name() -> None:
    recorder = RecordingRunner(None)
    hook = SlurmHook("unused", runner=recorder)
    with pytest.raises(ValidationError, match="valid fields: job_name, output"):
        hook.submit(SLEEP, job_name="x", output="/tmp/x", gpus=8)
    with pytest.raises(ValidationError, match="'#!'"):
        hook.submit("echo no shebang", job_name="x", output="/tmp/x")
    assert recorder.commands == []


def test_a_hook_dropped_without_close_leaves_no_connection_open(cluster_connection: str) -> None:
    def transports() -> int:
        return sum(isinstance(t, paramiko.Transport) and t.is_alive() for t in threading.enumerate())

    gc.collect()
    before = transports()
    for _ in range(3):
        SlurmHook(cluster_connection).statuses(["987654321"])  # never closed, as a poking sensor does
    gc.collect()
    poll_until(lambda: transports() <= before, timeout=10, what="dropped hooks to close their connections")


# --- failures that pass: no controller, a busy submit lock ------------------------------------------


class AnsweringRunner:
    """A login node that answers every command with one canned result (the failures come from there)."""

    def __init__(self, exit_status: int, stdout: str = "", stderr: str = "") -> None:
        self.answer = (exit_status, stdout, stderr)

    def run(self, command: str, *, stdin=None, timeout: float) -> CommandResult:
        return CommandResult(command, *self.answer)

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("exclusive", "exit_status", "stderr", "raised"), [
    (False, 1, "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
     SlurmCommandFailed),
    (False, 1, "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation",
     SlurmCommandFailed),
    (True, 1, "slurm_load_jobs error: Unable to contact slurm controller (connect failure)", SlurmCommandFailed),
    (True, 75, "sbatch: error: another submit holds /p/run/stage0/.slurm-submit.lock", SubmitLockBusy),
    (False, 1, "sbatch: error: invalid partition specified: small-gx", SbatchRefused),
])
def test_a_submit_that_met_no_controller_or_a_busy_lock_may_be_tried_again(
        exclusive: bool, exit_status: int, stderr: str, raised: type[Exception]) -> None:
    hook = SlurmHook("unused", runner=AnsweringRunner(exit_status, "", stderr))
    name = _name("flaky")
    with pytest.raises(raised) as caught:
        if exclusive:
            comment = JobComment(dag="d", task="t", run="r", attempt=1, xdir=exclusive_dir_marker("/p/run/stage0"))
            hook.submit_exclusive(SLEEP, "/p/run/stage0", _options("/p", name, comment=comment))
        else:
            hook.submit(SLEEP, _options("/p", name))
    assert isinstance(caught.value, TransportError) == (raised is not SbatchRefused)
    if raised is SubmitLockBusy:
        assert str(caught.value) == ("another submit holds /p/run/stage0/.slurm-submit.lock: nothing was submitted; "
                                     "try again in a few minutes")


@pytest.mark.parametrize(("stdout", "states"), [
    ("Slurmctld(primary) at vm is UP\n", {"primary": "UP"}),
    ("Slurmctld(primary) at a is DOWN\nSlurmctld(backup) at b is UP\n", {"primary": "DOWN", "backup": "UP"}),
])
def test_ping_says_which_controllers_answer(stdout: str, states: dict[str, str]) -> None:
    assert SlurmHook("unused", runner=AnsweringRunner(0, stdout)).ping() == states


@pytest.mark.parametrize(("exit_status", "stdout"), [
    (1, "Slurmctld(primary) at vm is DOWN\n*****************************************\n"
        "** RESTORE SLURMCTLD DAEMON TO SERVICE **\n*****************************************\n"),
    (127, ""),
])
def test_ping_without_a_controller_is_a_failure_that_passes(exit_status: int, stdout: str) -> None:
    with pytest.raises(SlurmCommandFailed) as caught:
        SlurmHook("unused", runner=AnsweringRunner(exit_status, stdout, "bash: scontrol: not found")).ping()
    assert caught.value.retryable


def test_ping_on_the_cluster(conn_id: str) -> None:
    with SlurmHook(conn_id) as hook:
        assert hook.ping()["primary"] == "UP"
    assert asyncio.run(SlurmAsyncHook(conn_id).ping())["primary"] == "UP"
