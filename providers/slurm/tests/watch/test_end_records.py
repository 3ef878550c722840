"""Exit records: what a batch script leaves when it ends (run by real bash), the one command that reads
them with the logs' sizes (run by real sh), and the poller's use of them on a scripted cluster: an end
told by a record is confirmed with one status query and handed on before the next poll, a requeued
run's record or an older run's is never taken for the end. The same on the local cluster is in
test_end_records_cluster.py."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_provider.cli.job_files import build_poll_files, parse_poll_files
from slurm_provider.watch.end_records import EndRecord, end_record_path, end_record_shell, parse_end_record
from slurm_provider.job_status import JobStatus
from slurm_provider.watch.poller import JobPoller
from slurm_provider.watch.subscription import PollUpdate
from slurm_provider.timing import CONFIRM_RETRY
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.watch import end_confirmation


def test_the_record_lies_next_to_the_output_file() -> None:
    assert end_record_path("/logs/run/train.123.out") == "/logs/run/train.123.out.end"


@pytest.mark.parametrize(("text", "record"), [
    ("job=12 restart=1 exit=0 end=1764218000 requeued=0\n", EndRecord("12", 1, 0, 1764218000, False)),
    ("job=12 restart=0 exit=85 end=1764218000 requeued=1", EndRecord("12", 0, 85, 1764218000, True)),
    ("job=12 restart=0 exit=", None),
    ("", None),
    ("garbage", None),
])
def test_records_parse_or_are_not_records(text: str, record: EndRecord | None) -> None:
    assert parse_end_record(text) == record


def test_only_the_watched_jobs_newest_run_that_did_not_requeue_ends_it() -> None:
    record = EndRecord("12", 1, 0, 0, False)
    assert record.ends("12", 1) and record.ends("12", 0)
    assert not record.ends("13", 1), "another job's record"
    assert not record.ends("12", 2), "an older run's record: Slurm already reported a later run"
    assert not EndRecord("12", 1, 0, 0, True).ends("12", 1), "a run that requeued its job"


def test_only_the_job_id_and_name_are_expanded_in_the_records_path() -> None:
    with pytest.raises(ValueError, match="only %j and %x are expanded"):
        end_record_shell("/logs/%A_%a.out")


def _run_script(tmp_path: Path, body: str, *, restart: str = "0", kill: int | None = None) -> Path:
    """Run a bash script with the record lines as a job (id 4711) would; returns the record's path."""
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nset -uo pipefail\n{end_record_shell(str(tmp_path / '%x.%j.out'))}\n{body}\n")
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "4711", "SLURM_JOB_NAME": "job", "SLURM_RESTART_COUNT": restart}
    if kill is None:
        subprocess.run(["bash", str(script)], env=env, check=False, timeout=30)
    else:
        process = subprocess.Popen(["bash", str(script)], env=env)
        time.sleep(0.5)
        process.send_signal(kill)
        process.wait(timeout=30)
    return tmp_path / "job.4711.out.end"


def test_a_script_leaves_its_exit_code_and_run_on_every_way_out(tmp_path: Path) -> None:
    before = int(time.time())
    path = _run_script(tmp_path, "exit 3", restart="2")
    record = parse_end_record(path.read_text())
    assert record is not None and (record.job_id, record.restart, record.exit_code) == ("4711", 2, 3)
    assert before <= record.ended_at <= time.time() and not record.requeued
    assert [p.name for p in tmp_path.iterdir() if ".tmp." in p.name] == [], "the temp file was renamed"


def test_the_records_temp_file_is_mktemps_and_a_planted_link_is_not_followed(tmp_path: Path) -> None:
    """The log directory is group-writable: another member could plant a link at a temp name it can
    foresee (``<record>.tmp.<pid>`` before); the record's temp file is now mktemp's own."""
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    shell = end_record_shell(str(tmp_path / "%x.%j.out"))
    assert "mktemp" in shell and ".tmp.$$" not in shell
    for pid in range(1, 4):  # wherever $$ may land, a link there is not written through
        (tmp_path / f"job.4711.out.end.tmp.{pid}").symlink_to(victim)
    path = _run_script(tmp_path, "exit 0")
    assert parse_end_record(path.read_text()) is not None and not path.is_symlink()
    assert victim.read_text() == "untouched\n"
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)


def test_a_signal_the_script_does_not_trap_still_leaves_a_record(tmp_path: Path) -> None:
    # bash hands its EXIT trap the last command's status, not the signal: Slurm's confirmation says
    # how the job ended, the record only that it did
    record = parse_end_record(_run_script(tmp_path, "sleep 20 & wait", kill=signal.SIGTERM).read_text())
    assert record is not None and record.ends("4711", 0)


def test_a_killed_script_leaves_none(tmp_path: Path) -> None:
    assert not _run_script(tmp_path, "sleep 20 & wait", kill=signal.SIGKILL).exists()


def test_a_run_that_requeues_its_job_says_so(tmp_path: Path) -> None:
    record = parse_end_record(_run_script(tmp_path, "requeued=1\nexit 85").read_text())
    assert record is not None and record.requeued and not record.ends("4711", 0)


def test_one_command_reads_the_sizes_and_records(tmp_path: Path) -> None:
    (tmp_path / "a.out").write_text("12345")
    (tmp_path / "a.out.end").write_text("job=1 restart=0 exit=0 end=5 requeued=0\n")
    (tmp_path / "b.out.end").write_text("")
    sizes_wanted = [str(tmp_path / "a.out"), str(tmp_path / "missing.out")]
    records_wanted = [str(tmp_path / "a.out.end"), str(tmp_path / "missing.out.end"), str(tmp_path / "b.out.end")]
    result = subprocess.run(["sh", "-c", build_poll_files(sizes_wanted, records_wanted)], capture_output=True,
                            text=True, check=True)
    sizes, records = parse_poll_files(result.stdout, sizes_wanted, records_wanted)
    assert sizes == {sizes_wanted[0]: 5}
    assert records == {records_wanted[0]: "job=1 restart=0 exit=0 end=5 requeued=0", records_wanted[2]: ""}


class RecordCluster:
    """Job 7 runs until ``ended``; Slurm calls it COMPLETED after ``completing`` more status queries.
    ``record`` is what its exit record holds. Every call is noted in ``calls``."""

    def __init__(self, record: str | None, *, ended: bool = True, completing: int = 0, restarts: int = 0) -> None:
        self.record, self.ended, self.completing, self.restarts = record, ended, completing, restarts
        self.calls: list[str] = []

    async def statuses(self, job_ids: Iterable[str]) -> dict[str, JobStatus]:
        self.calls.append("statuses")
        done = self.ended and len([c for c in self.calls if c == "statuses"]) > 1 + self.completing
        state = SlurmState.COMPLETED if done else SlurmState.RUNNING
        return {j: JobStatus(job_id=j, state=state, restarts=self.restarts) for j in job_ids}

    async def poll_files(self, size_paths: list[str], record_paths: list[str]) -> tuple[dict[str, int], dict[str, str]]:
        self.calls.append("poll_files")
        return {}, ({p: self.record for p in record_paths} if self.record is not None else {})

    async def read_log(self, path: str, offset: int) -> tuple[str, int]:
        return "", offset

    async def file_sizes(self, paths: list[str]) -> dict[str, int]:
        self.calls.append("file_sizes")
        return {}

    async def close(self) -> None:
        pass


def _watch(cluster: RecordCluster, *, until: float = 2.0) -> tuple[list[PollUpdate], JobPoller]:
    """The updates of job 7 until it ends or ``until`` seconds passed; polls 60 s apart, records read
    every 0.02 s."""
    poller = JobPoller("c", lambda: cluster, record_interval=0.02, jitter=0.0)

    async def run() -> list[PollUpdate]:
        seen: list[PollUpdate] = []
        async with poller.subscribe("7", poll_interval=60.0, max_poll_interval=300.0, log_path="/l/7.out",
                                    end_record_path="/l/7.out.end") as updates:
            try:
                while True:
                    update = await asyncio.wait_for(updates.get(), until)
                    seen.append(update)
                    if update.status is not None and update.status.state.is_terminal:
                        return seen
            except asyncio.TimeoutError:
                return seen

    return asyncio.run(run()), poller


def test_an_end_told_by_the_record_is_confirmed_once_and_handed_on_before_the_next_poll() -> None:
    cluster = RecordCluster("job=7 restart=0 exit=0 end=5 requeued=0")
    seen, poller = _watch(cluster)
    assert [u.status.state for u in seen if u.status] == [SlurmState.RUNNING, SlurmState.COMPLETED]
    assert seen[-1].end_record == EndRecord("7", 0, 0, 5, False)
    # the poll (its file read carries the records), then a record read, Slurm's confirmation and the
    # last look at the log
    assert cluster.calls == ["statuses", "poll_files", "poll_files", "statuses", "file_sizes"]
    assert poller.confirmations == 1 and poller.unconfirmed == 0


def test_an_end_slurm_does_not_confirm_yet_is_asked_about_again_after_a_longer_wait() -> None:
    cluster = RecordCluster("job=7 restart=0 exit=0 end=5 requeued=0", completing=2)
    seen, poller = _watch(cluster)
    assert seen[-1].status is not None and seen[-1].status.state is SlurmState.COMPLETED
    assert poller.confirmations == 3 and poller.unconfirmed == 2
    reads = [n for n, call in enumerate(cluster.calls) if call == "statuses"]
    assert reads[2] - reads[1] < reads[3] - reads[2], "more record reads between later confirmations"


@pytest.mark.parametrize(("record", "restarts"), [
    ("job=7 restart=0 exit=85 end=5 requeued=1", 0),  # the run requeued its job
    ("job=7 restart=0 exit=0 end=5 requeued=0", 1),  # an older run's record: Slurm reported a restart
    ("job=8 restart=0 exit=0 end=5 requeued=0", 0),  # another job's
    ("job=7 restart=0 exit=", 0),  # half a record
])
def test_a_record_that_is_not_the_watched_runs_end_asks_slurm_nothing(record: str, restarts: int) -> None:
    cluster = RecordCluster(record, ended=False, restarts=restarts)
    seen, poller = _watch(cluster, until=0.5)
    assert all(u.status is not None and u.status.state is SlurmState.RUNNING for u in seen)
    assert cluster.calls.count("statuses") == 1 and cluster.calls.count("poll_files") > 5
    assert poller.confirmations == 0


def test_an_end_slurm_still_completes_is_asked_about_again_within_seconds_not_at_the_next_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The record is written in the batch script's last instant: Slurm may list the job a second
    longer. The next question comes after ``CONFIRM_RETRY``'s base (doubling), not a whole
    ``record_interval`` (20 s here) later."""
    monkeypatch.setattr(end_confirmation, "CONFIRM_RETRY", replace(CONFIRM_RETRY, base=0.2))
    cluster = RecordCluster("job=7 restart=0 exit=0 end=5 requeued=0", completing=1)
    poller = JobPoller("c", lambda: cluster, record_interval=20.0, jitter=0.0)

    async def run() -> list[PollUpdate]:
        seen: list[PollUpdate] = []
        async with poller.subscribe("7", poll_interval=60.0, max_poll_interval=300.0, log_path="/l/7.out",
                                    end_record_path="/l/7.out.end") as updates:
            while not (seen and seen[-1].status is not None and seen[-1].status.state.is_terminal):
                seen.append(await asyncio.wait_for(updates.get(), 10.0))
        return seen

    seen = asyncio.run(run())
    assert seen[-1].status is not None and seen[-1].status.state is SlurmState.COMPLETED
    # the poll and its read (the record; Slurm still lists the job), a read and a question 0.2 s later
    # (still completing; the log looked at), another 0.4 s later (completed; the last look at the log)
    assert cluster.calls == ["statuses", "poll_files", "poll_files", "statuses", "file_sizes",
                             "poll_files", "statuses", "file_sizes"]
    assert poller.confirmations == 2 and poller.unconfirmed == 1


def test_without_a_record_path_nothing_is_read_between_polls() -> None:
    cluster = RecordCluster("job=7 restart=0 exit=0 end=5 requeued=0")
    poller = JobPoller("c", lambda: cluster, record_interval=0.02)

    async def run() -> None:
        async with poller.subscribe("7", poll_interval=60.0, max_poll_interval=300.0, log_path="/l/7.out") as updates:
            await updates.get()
            await asyncio.sleep(0.3)

    asyncio.run(run())
    assert "poll_files" not in cluster.calls and cluster.calls.count("statuses") == 1
    assert poller.record_reads == 0


def test_reading_the_records_is_no_scheduler_call() -> None:
    from slurm_provider.scheduler_calls import slurm_verbs

    line = build_poll_files(["/logs/squeue.1.out"], ["/logs/sacct.1.out.end", "/logs/x.2.out.end"])
    assert slurm_verbs(line) == ()


def test_thousands_of_records_are_read_in_as_few_commands_as_a_shell_line_allows() -> None:
    import asyncio as aio

    from slurm_provider.hooks import SlurmAsyncHook
    from slurm_provider.transport import CommandResult

    class Shell:
        """Runs each command with the local sh, as the login node would."""

        lines: list[str] = []

        async def run(self, command: str, *, stdin: object = None, timeout: float) -> CommandResult:
            Shell.lines.append(command)
            done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
            return CommandResult(command, done.returncode, done.stdout, done.stderr)

        async def close(self) -> None:
            pass

    paths = [f"/nonexistent/run-{n:05d}/a-rather-long-job-name-of-a-stage.{n}.out.end" for n in range(3000)]
    paths[1234] = "/etc/hostname"
    hook = SlurmAsyncHook("chunks", runner=Shell(), min_call_interval=0)
    sizes, records = aio.run(hook.poll_files([], paths))
    assert sizes == {} and list(records) == ["/etc/hostname"]
    assert 1 < len(Shell.lines) < 10 and max(map(len, Shell.lines)) < 128 * 1024


def test_the_record_has_its_time_when_no_command_can_be_forked_for_it(tmp_path: Path) -> None:
    """A job that Slurm is ending kills what its exit trap forks; the time must come from bash itself.
    Here ``date`` cannot run at all (it is not on PATH): the record still holds its end time."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("mktemp", "chmod", "mv", "rm"):
        (tools / tool).symlink_to(f"/usr/bin/{tool}" if Path(f"/usr/bin/{tool}").exists() else f"/bin/{tool}")
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nset -uo pipefail\n{end_record_shell(str(tmp_path / '%x.%j.out'))}\nexit 85\n")
    before = int(time.time())
    env = {"PATH": str(tools), "SLURM_JOB_ID": "4711", "SLURM_JOB_NAME": "job", "SLURM_RESTART_COUNT": "0"}
    subprocess.run(["/bin/bash", str(script)], env=env, check=False, timeout=30)
    record = parse_end_record((tmp_path / "job.4711.out.end").read_text())
    assert record is not None and record.exit_code == 85, (tmp_path / "job.4711.out.end").read_text()
    assert before <= record.ended_at <= time.time()
