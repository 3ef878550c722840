"""Which remote command lines are scheduler calls, the per-connection tally, the site's ceiling, and
Slurm's "not now" answers (pure, plus the async hook on a recording runner)."""

from __future__ import annotations

import asyncio

import pytest

from slurm_provider.cli import exclusive_submit, job_files, sacct, sbatch, scancel, scontrol, sinfo, squeue, sshare
from slurm_provider.cli.sbatch import JobComment, SubmitOptions
from slurm_provider.cli.exclusive_submit import exclusive_dir_marker
from slurm_provider.hooks import SlurmAsyncHook, SlurmCommandFailed, SlurmHook, SlurmRateLimited, SlurmUnavailable
from slurm_provider.scheduler_calls import (
    MIN_CALL_INTERVAL_EXTRA,
    SchedulerCalls,
    calls_of,
    forget_calls,
    is_rate_limited,
    min_call_interval,
    slurm_verbs,
)
from slurm_provider.transport import CommandResult

OPTIONS = SubmitOptions.of(None, job_name="x", output="/l/%x_%j.out")
XDIR = "/scratch/my project/run 1"


def test_every_command_the_provider_builds_is_counted_as_the_slurm_clients_it_runs() -> None:
    exclusive = SubmitOptions.of(None, job_name="x", output="/l/%x.out",
                                 comment=JobComment(dag="d", task="t", run="r", attempt=1,
                                                    xdir=exclusive_dir_marker(XDIR)))
    assert slurm_verbs(squeue.build_squeue(["1", "2"])) == ("squeue",)
    assert slurm_verbs(squeue.build_squeue_account_jobs("vcloud_local")) == ("squeue", "squeue")
    assert slurm_verbs(sacct.build_sacct(["1"])) == ("sacct",)
    assert slurm_verbs(sbatch.build_sbatch_submit(OPTIONS)) == ("sbatch",)
    assert slurm_verbs(sbatch.build_sbatch_test_only(OPTIONS)) == ("sbatch",)
    assert slurm_verbs(exclusive_submit.build_exclusive_sbatch_submit(exclusive_dir=XDIR, live_account="acc",
                                                                      **exclusive.as_kwargs())) == ("squeue", "sbatch")
    assert slurm_verbs(scontrol.build_scontrol_show_job(1)) == ("scontrol",)
    assert slurm_verbs(scontrol.build_scontrol_ping()) == ("scontrol",)
    assert slurm_verbs(sshare.build_sshare_account("acc")) == ("sshare",)
    assert slurm_verbs(scancel.build_scancel(["1"])) == ("scancel",)
    assert slurm_verbs(sinfo.build_sinfo_unavailable_nodes(None)) == ("sinfo",)


def test_reading_files_is_not_a_scheduler_call_even_when_their_names_say_squeue() -> None:
    assert slurm_verbs(job_files.build_read_log("/x/squeue.out", 0, 100)) == ()
    assert slurm_verbs(job_files.build_file_sizes(["/x/sacct y.out", "/l/it's sbatch.err"])) == ()
    assert slurm_verbs(job_files.build_file_stamps(["/x/sacct y.out", "/l/it's sbatch.err"])) == ()
    assert slurm_verbs("cat /p/squeue.log; echo sbatch") == ()


@pytest.mark.parametrize(("line", "verbs"), [
    ("sh -c 'squeue -h && sacct -X'", ("squeue", "sacct")),
    ("n=$(squeue --me | wc -l)", ("squeue",)),
    ("if squeue -j 1; then /usr/bin/scontrol show job 1; fi", ("squeue", "scontrol")),
    ("SLURM_TIME_FORMAT=standard timeout 10 sinfo", ("sinfo",)),
    ("echo 'unbalanced", ()),
])
def test_shell_forms_around_a_client(line: str, verbs: tuple[str, ...]) -> None:
    assert slurm_verbs(line) == verbs


@pytest.mark.parametrize(("stderr", "limited"), [
    ("squeue: error: slurm_load_jobs error: Rate limit exceeded, please retry momentarily", True),
    ("slurm_load_jobs error: Socket timed out on send/recv operation", True),
    ("sacct: error: Unable to contact slurm controller (connect failure)", False),
    ("slurm_load_jobs error: Invalid job id specified", False),
    ("", False),
    (None, False),
])
def test_slurms_not_now_answers(stderr: str | None, limited: bool) -> None:
    assert is_rate_limited(stderr) is limited


@pytest.mark.parametrize(("extra", "seconds"), [({}, 0.0), ({MIN_CALL_INTERVAL_EXTRA: ""}, 0.0),
                                                ({MIN_CALL_INTERVAL_EXTRA: 15}, 15.0),
                                                ({MIN_CALL_INTERVAL_EXTRA: "7.5"}, 7.5)])
def test_the_ceiling_comes_from_the_connection_extra(extra: dict, seconds: float) -> None:
    assert min_call_interval(extra) == seconds


@pytest.mark.parametrize("bad", ["fast", -1, "nan"])
def test_an_unusable_ceiling_is_refused_naming_the_extra(bad: object) -> None:
    with pytest.raises(ValueError, match="connection extra min_call_interval=.* must be a number of seconds"):
        min_call_interval({MIN_CALL_INTERVAL_EXTRA: bad})


def test_turns_are_taken_one_after_the_other_whatever_the_number_of_callers() -> None:
    calls = SchedulerCalls("c")
    waits = [calls.reserve(15.0, now=100.0) for _ in range(4)]
    assert waits == [0.0, 15.0, 30.0, 45.0]
    assert calls.reserve(15.0, now=200.0) == 0.0, "a quiet connection calls at once"
    assert SchedulerCalls("d").reserve(0.0, now=5.0) == 0.0


def test_a_call_starts_a_full_gap_after_the_last_real_start_even_when_its_turn_came() -> None:
    calls = SchedulerCalls("e")
    assert calls.claim(15.0, now=100.0) == 0.0
    assert calls.claim(15.0, now=110.0) == 5.0, "the previous call started late: wait out its gap"
    assert calls.claim(15.0, now=115.0) == 0.0
    assert calls.claim(15.0, now=129.0) == 1.0


def test_calls_per_minute_count_the_window() -> None:
    calls = SchedulerCalls("c")
    for t in (0.0, 10.0, 70.0, 100.0, 130.0):
        calls.record(("squeue",), now=t)
    assert calls.per_minute(60.0, 180.0) == 1.5
    assert calls.total == 5 and calls.snapshot()["by_verb"] == {"squeue": 5}


class RecordingRunner:
    """Answers every command at once; squeue with ``squeue_stderr`` (exit 1) when it is set."""

    def __init__(self, squeue_stderr: str = "") -> None:
        self.lines: list[str] = []
        self.squeue_stderr = squeue_stderr

    async def run(self, command: str, *, stdin: object = None, timeout: float) -> CommandResult:
        self.lines.append(command)
        if "squeue" in command and self.squeue_stderr:
            return CommandResult(command, 1, "", self.squeue_stderr)
        return CommandResult(command, 0, "", "")

    async def close(self) -> None:
        pass


def test_the_async_hook_tallies_scheduler_calls_of_its_connection_and_not_file_reads() -> None:
    forget_calls("tally")
    hook = SlurmAsyncHook("tally", runner=RecordingRunner(), min_call_interval=0)

    async def poll() -> None:
        await hook.statuses(["11", "12"])  # squeue lists neither: sacct is asked too
        await hook.file_sizes(["/l/a.out"])
        await hook.account_tres("acc")

    asyncio.run(poll())
    assert calls_of("tally").by_verb == {"squeue": 1, "sacct": 1, "sshare": 1}
    assert hook.commands_issued == 4
    forget_calls("tally")


def test_the_ceiling_spaces_the_calls_of_every_hook_of_one_connection() -> None:
    forget_calls("paced")
    gap = 0.05
    hooks = [SlurmAsyncHook("paced", runner=RecordingRunner(), min_call_interval=gap) for _ in range(3)]

    async def many_watchers() -> None:
        await asyncio.gather(*(hook.cancel(str(n)) for n, hook in enumerate(hooks, start=1) for _ in range(2)))

    asyncio.run(many_watchers())
    times = calls_of("paced").times
    assert len(times) == 6
    assert all(later - earlier >= gap - 0.002 for earlier, later in zip(times, times[1:])), times
    forget_calls("paced")


def test_a_rate_limit_answer_is_its_own_retryable_failure_and_is_tallied() -> None:
    forget_calls("limited")
    runner = RecordingRunner("squeue: error: slurm_load_jobs error: Rate limit exceeded, please retry momentarily")
    hook = SlurmAsyncHook("limited", runner=runner, min_call_interval=0)
    with pytest.raises(SlurmRateLimited, match="Rate limit exceeded") as refused:
        asyncio.run(hook.statuses(["5", "6"]))
    assert isinstance(refused.value, SlurmCommandFailed) and refused.value.retryable
    assert calls_of("limited").rate_limited == 1 and calls_of("limited").total == 1
    forget_calls("limited")


@pytest.mark.parametrize(("stderr", "kind"), [
    ("squeue: error: slurm_load_jobs error: Rate limit exceeded, please retry momentarily", SlurmRateLimited),
    ("squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation", SlurmRateLimited),
    ("squeue: error: slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
     SlurmUnavailable),
    ("squeue: error: slurm_load_jobs error: Slurm backup controller in standby mode", SlurmUnavailable),
    ("sacct: error: Problem talking to the database: Connection refused", SlurmUnavailable),
    ("sacct: error: slurm_persist_conn_open_without_init: failed to open persistent connection to host:"
     "slurmdbd:6819: Connection refused", SlurmUnavailable),
    ("squeue: error: Invalid user: vcloud", SlurmCommandFailed),
    ("squeue: unrecognized option '--Format=JobArrayID'", SlurmCommandFailed),
    ("bash: line 1: squeue: command not found", SlurmCommandFailed),
], ids=["rate-limit", "busy-controller", "no-controller", "standby", "no-database", "no-database-conn",
        "invalid-user", "refused-option", "no-client"])
def test_a_failed_status_command_says_whether_slurm_is_away_or_answered_with_an_error(
        stderr: str, kind: type[SlurmCommandFailed]) -> None:
    """Away (no controller, no accounting database) is an outage a watch waits out; "not now" slows
    it down; anything else is an error Slurm answered with, which a watch stops on after a few polls."""
    hook = SlurmAsyncHook("classified", runner=RecordingRunner(stderr), min_call_interval=0)
    with pytest.raises(SlurmCommandFailed) as failed:
        asyncio.run(hook.statuses(["5"]))
    assert type(failed.value) is kind, failed.value
    assert failed.value.retryable and stderr in str(failed.value)
    forget_calls("classified")


@pytest.mark.parametrize(("capture", "kind"), [
    ("answer_squeue_no_controller", SlurmUnavailable),
    ("answer_sacct_no_database", SlurmUnavailable),
    ("answer_sacct_bad_time", SlurmCommandFailed),
])
def test_what_the_local_clusters_slurm_printed_is_classified_the_same(capture: str,
                                                                      kind: type[SlurmCommandFailed]) -> None:
    """The error output captured from the local cluster's Slurm with slurmctld, then slurmdbd, stopped
    (golden ``answer_*.stderr.txt``), and of a request Slurm refused."""
    from providers.slurm.tests.cli.captured_output import GOLDEN

    stderr = (GOLDEN / f"{capture}.stderr.txt").read_text()
    hook = SlurmAsyncHook("captured", runner=RecordingRunner(stderr), min_call_interval=0)
    with pytest.raises(SlurmCommandFailed) as failed:
        asyncio.run(hook.statuses(["5"]))
    assert type(failed.value) is kind, failed.value
    forget_calls("captured")


def test_the_blocking_hook_tallies_too() -> None:
    forget_calls("blocking")

    class Runner:
        def run(self, command: str, *, stdin: object = None, timeout: float) -> CommandResult:
            return CommandResult(command, 0, "", "")

        def close(self) -> None:
            pass

    SlurmHook("blocking", runner=Runner()).cancel("3")
    assert calls_of("blocking").by_verb == {"scancel": 1}
    forget_calls("blocking")
