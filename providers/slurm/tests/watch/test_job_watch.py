"""The watch's decisions, as tables: the sequences of poll answers a real cluster goes through (requeue,
hold, suspend, SPECIAL_EXIT, NODE_FAIL, an outage, Slurm's rate limit, an exit record Slurm does not
confirm yet, a job Slurm does not know) and what the watch says, keeps and ends with at each step.
No asyncio, no clock, no cluster: :class:`JobWatch` is stepped by hand."""

from __future__ import annotations

import logging

import pytest

from slurm_provider.watch.allocation import AccountReading
from slurm_provider.backoff import Backoff
from slurm_provider.cli.sshare import TresMinutes
from slurm_provider.watch.end_records import EndRecord
from slurm_provider.job_status import JobStatus
from slurm_provider.watch.maintenance import Window
from slurm_provider.watch.outage import Outage
from slurm_provider.watch.subscription import PollUpdate
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.watch.job_watch import (
    ERROR,
    FINISHED,
    LOST,
    NEVER_STARTS,
    REACHABLE,
    Action,
    End,
    JobWatch,
    KeepFollowed,
    LoginWatch,
    Release,
    Remember,
    Say,
)
from slurm_provider.watch.notes import WatchNote

T0 = 1_800_000_000.0
"""Every table's clock starts here (epoch seconds)."""


def status(state: str, *, reason: str | None = None, restarts: int = 0, exit_code: int | None = None,
           name: str = "train", **more: object) -> JobStatus:
    return JobStatus("7", SlurmState(state), reason=reason, restarts=restarts, exit_code=exit_code,
                     node_list="n1" if state not in ("PENDING", "REQUEUED") else None, name=name, **more)


def answer(state: str, **fields: object) -> PollUpdate:
    return PollUpdate(status(state, **fields))  # type: ignore[arg-type]


def described(action: Action) -> str:
    """An action in a few words: what the tables compare."""
    if isinstance(action, Say):
        return f"{logging.getLevelName(action.level)} {action.text}"
    if isinstance(action, Remember):
        note = action.note
        since = "" if note.unreachable_since is None else f" unreachable since {note.unreachable_since - T0:+.0f}"
        person = "" if note.person_since is None else f" person since {note.person_since - T0:+.0f}"
        return f"note {note.state} offset {note.log_offset}{since}{person}"
    if isinstance(action, KeepFollowed):
        return f"keep {len(action.files)} followed"
    if isinstance(action, Release):
        return f"release {action.job_id}"
    return f"end {action.kind} ({action.noticed_by}): {action.message}"


def played(watch: JobWatch, steps: list[tuple[float, PollUpdate]]) -> list[list[str]]:
    """Each step's actions, described; a :class:`Release` is answered as released."""
    out = []
    for at, update in steps:
        actions = watch.step(update, T0 + at)
        words = []
        while actions:
            action = actions.pop(0)
            words.append(described(action))
            if isinstance(action, Release):
                actions[:0] = watch.released(None)
        out.append(words)
    return out


def matches(actual: list[list[str]], expected: list[list[str]]) -> bool:
    """Every step's actions begin with the expected words, one for one."""
    return len(actual) == len(expected) and all(
        len(a) == len(e) and all(x.startswith(y) for x, y in zip(a, e)) for a, e in zip(actual, expected))


SEQUENCES: dict[str, tuple[list[tuple[float, PollUpdate]], list[list[str]]]] = {
    "requeued by itself, runs again and completes": (
        [(0, answer("RUNNING")),
         (30, answer("PENDING", reason="BeginTime", restarts=1)),
         (60, answer("RUNNING", restarts=1)),
         (90, answer("COMPLETED", restarts=1, exit_code=0))],
        [["INFO Job 7 RUNNING on n1", "note RUNNING"],
         ["INFO Job 7 PENDING: ", "note PENDING"],
         ["INFO Job 7 RUNNING on n1 after 1 restart(s)", "note RUNNING"],
         ["INFO Job 7 COMPLETED on n1 exit code 0 after 1 restart(s)", "note COMPLETED",
          "end finished (poll): COMPLETED on n1 exit code 0"]],
    ),
    "suspended and resumed: said each time, never an end": (
        [(0, answer("RUNNING")), (30, answer("SUSPENDED")), (60, answer("SUSPENDED")), (90, answer("RUNNING")),
         (120, answer("FAILED", exit_code=1))],
        [["INFO Job 7 RUNNING", "note RUNNING"], ["INFO Job 7 SUSPENDED", "note SUSPENDED"], [],
         ["INFO Job 7 RUNNING", "note RUNNING"],
         ["INFO Job 7 FAILED on n1 exit code 1", "note FAILED", "end finished (poll)"]],
    ),
    "SPECIAL_EXIT is an end the operator judges": (
        [(0, answer("RUNNING")), (30, answer("SPECIAL_EXIT", exit_code=3))],
        [["INFO Job 7 RUNNING", "note RUNNING"],
         ["INFO Job 7 SPECIAL_EXIT", "note SPECIAL_EXIT", "end finished (poll): SPECIAL_EXIT"]],
    ),
    "NODE_FAIL ends the watch; the operator resubmits": (
        [(0, answer("RUNNING")), (30, answer("NODE_FAIL", exit_code=0))],
        [["INFO Job 7 RUNNING", "note RUNNING"], ["INFO Job 7 NODE_FAIL", "note NODE_FAIL", "end finished (poll)"]],
    ),
    "an exit record Slurm does not confirm yet waits for Slurm": (
        [(0, answer("RUNNING")),
         (5, PollUpdate(status("COMPLETING"), end_record=EndRecord("7", 0, 0, int(T0), False))),
         (6, PollUpdate(status("COMPLETED", exit_code=0), end_record=EndRecord("7", 0, 0, int(T0), False)))],
        [["INFO Job 7 RUNNING", "note RUNNING"], ["INFO Job 7 COMPLETING", "note COMPLETING"],
         ["INFO Job 7 COMPLETED", "note COMPLETED", "end finished (end_record)"]],
    ),
    "a job Slurm knows nowhere is lost after the grace polls, not before": (
        [(0, answer("RUNNING"))] + [(30 * i, PollUpdate(None)) for i in range(1, 4)],
        [["INFO Job 7 RUNNING", "note RUNNING"], [], [],
         ["end lost (None): job 7 is known neither to squeue nor to sacct after 3 polls"]],
    ),
    "UNKNOWN counts as not known; an answer in between starts the count again": (
        [(0, answer("UNKNOWN")), (30, answer("UNKNOWN")), (60, answer("RUNNING")), (90, answer("UNKNOWN")),
         (120, answer("UNKNOWN")), (150, answer("UNKNOWN"))],
        [[], [], ["INFO Job 7 RUNNING", "note RUNNING"], [], [], ["end lost"]],
    ),
    "an outage is said once, kept, and ends the watch past the deadline": (
        [(0, answer("RUNNING")),
         (30, PollUpdate(None, unreachable=Outage(T0 + 30, "cannot reach login: refused", 2.0))),
         (40, PollUpdate(None, unreachable=Outage(T0 + 30, "cannot reach login: refused", 4.0))),
         (30 + 3600, PollUpdate(None, unreachable=Outage(T0 + 30, "cannot reach login: timeout", 300.0)))],
        [["INFO Job 7 RUNNING", "note RUNNING"],
         ["WARNING login node of c unreachable since ", "note RUNNING offset 0 unreachable since +30"], [],
         ["ERROR login node of c unreachable since ", "end error (None): login node of c unreachable since "]],
    ),
    "a login node that answers again is said with how long it was away, and the job goes on": (
        [(0, answer("RUNNING")),
         (30, PollUpdate(None, unreachable=Outage(T0 + 30, "refused", 2.0))),
         (630, answer("RUNNING")),
         (660, answer("COMPLETED", exit_code=0))],
        [["INFO Job 7 RUNNING", "note RUNNING"], ["WARNING login node of c unreachable", "note RUNNING"],
         ["WARNING login node of c reachable again after 10 min; watching job 7 again", "note RUNNING"],
         ["INFO Job 7 COMPLETED", "note COMPLETED", "end finished"]],
    ),
    "Slurm's rate limit is said once and never ends the watch": (
        [(0, answer("RUNNING")), (30, PollUpdate(None, throttled="Slurm asks for fewer calls")),
         (60, PollUpdate(None, throttled="Slurm asks for fewer calls")), (120, answer("RUNNING"))],
        [["INFO Job 7 RUNNING", "note RUNNING"],
         ["WARNING Slurm asks for fewer calls; job 7 is still watched"], [],
         ["INFO Watching job 7 again on c", "note RUNNING"]],  # a minute on: the note is renewed
    ),
    "a login waiting for a person is said once per reason, and its start kept in the note": (
        [(0, PollUpdate(None, waiting="open the master")), (30, PollUpdate(None, waiting="open the master")),
         (60, answer("RUNNING"))],
        [["WARNING Cannot see job 7 right now, still waiting (up to 1 h): open the master",
          "note None offset 0 person since +0"], [],
         ["INFO Watching job 7 again on c", "INFO Job 7 RUNNING", "note RUNNING"]],
    ),
    "a login that waits for a person past the deadline ends the watch with what to do": (
        [(0, answer("RUNNING")), (60, PollUpdate(None, waiting="run ssh vcloud-lumi on host w1")),
         (1800, PollUpdate(None, waiting="run ssh vcloud-lumi on host w1")),
         (3660, PollUpdate(None, waiting="run ssh vcloud-lumi on host w1"))],
        [["INFO Job 7 RUNNING", "note RUNNING"],
         ["WARNING Cannot see job 7 right now, still waiting (up to 1 h): run ssh vcloud-lumi on host w1",
          "note RUNNING offset 0 person since +60"], [],
         ["ERROR the login to c has waited for a person since", "end error (None): the login to c has waited for a "
          "person since"]],
    ),
    "the job's new output lines go to the task log, marked by stream": (
        [(0, PollUpdate(status("RUNNING"), new_log_text="epoch 1\nepoch 2\n", log_offset=16,
                        new_err_text="warn\n", err_offset=5)),
         (30, PollUpdate(status("RUNNING"), new_log_text="epoch 3\n", log_offset=24, err_offset=5))],
        [["INFO [job 7] epoch 1", "INFO [job 7] epoch 2", "INFO [job 7 stderr] warn", "INFO Job 7 RUNNING",
          "note RUNNING offset 16"],
         ["INFO [job 7] epoch 3", "note RUNNING offset 24"]],
    ),
    "a job that can never start ends the watch": (
        [(0, answer("PENDING", reason="PartitionTimeLimit"))],
        [["INFO Job 7 PENDING", "note PENDING", "end never_starts (None): job 7 will not start: PartitionTimeLimit"]],
    ),
    "a quiet watch renews its note once a minute, not at every poll": (
        [(0, answer("RUNNING")), (30, answer("RUNNING")), (59, answer("RUNNING")), (61, answer("RUNNING"))],
        [["INFO Job 7 RUNNING", "note RUNNING"], [], [], ["note RUNNING"]],
    ),
    "a maintenance window the job waits out is said when it changes": (
        [(0, PollUpdate(status("PENDING", reason="ReqNodeNotAvail"),
                        maintenance=(Window("2026-12-01T08:00:00", "2026-12-01T20:00:00", "maint", "n[1-3]"),))),
         (30, PollUpdate(status("PENDING", reason="ReqNodeNotAvail"),
                         maintenance=(Window("2026-12-01T08:00:00", "2026-12-01T20:00:00", "maint", "n[1-3]"),)))],
        [["INFO Job 7 PENDING", "WARNING Job 7 waits out the maintenance window 'maint' from 2026-12-01 08:00 to 2026-12-01 20:00 on n[1-3]", "note PENDING"], []],
    ),
}


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_a_sequence_of_answers_is_said_kept_and_ended_as_a_person_expects(name: str) -> None:
    steps, expected = SEQUENCES[name]
    watch = JobWatch("c", "7", unknown_grace_polls=3, watch_deadline=3600.0, expected_job_name="train")
    actual = played(watch, steps)
    assert matches(actual, expected), "\n".join(map(str, actual))


def test_a_job_put_on_user_hold_is_released_once_and_a_second_hold_is_left_to_a_person() -> None:
    watch = JobWatch("c", "7", expected_job_name="train", release_held=True)
    held = answer("PENDING", reason="JobHeldUser")
    actual = played(watch, [(0, held), (30, answer("PENDING", reason="Priority")), (60, held), (90, held)])
    assert matches(actual, [
        ["INFO Job 7 PENDING", "note PENDING", "release 7", "WARNING Job 7 was put on user hold (JobHeldUser)"],
        ["INFO Job 7 PENDING", "note PENDING"],
        ["INFO Job 7 PENDING", "note PENDING", "WARNING Job 7 is on user hold (JobHeldUser) and waits for a "
                                               "release (it was held again after this watch released it once)"],
        [],
    ]), actual


@pytest.mark.parametrize("release_held, name, why", [
    (False, "train", "release_held is off"),
    (True, "someone-else", "it is not this task's job"),
])
def test_a_hold_the_watch_may_not_release_says_how_to_release_it(release_held: bool, name: str, why: str) -> None:
    watch = JobWatch("c", "7", expected_job_name="train", release_held=release_held)
    actions = watch.step(answer("PENDING", reason="JobHeldUser", name=name), T0)
    assert not any(isinstance(a, Release) for a in actions)
    assert f"waits for a release ({why}): run 'scontrol release 7' on the login node of c" in described(actions[-1])


def test_a_release_that_fails_is_said_and_not_tried_again() -> None:
    watch = JobWatch("c", "7", expected_job_name="train", release_held=True)
    held = answer("PENDING", reason="JobHeldUser")
    assert isinstance(watch.step(held, T0)[-1], Release)
    (said,) = watch.released("permission denied")
    assert "releasing it failed (permission denied): run 'scontrol release 7'" in described(said)
    assert watch.step(held, T0 + 30) == []


def test_an_allocation_the_usage_has_spent_ends_the_watch_and_warn_waits_it_out() -> None:
    spent = AccountReading("proj", "billing", TresMinutes("proj", "billing", limit=100, used=90, running=0))
    pends = PollUpdate(status("PENDING", reason="AssocGrpBillingMinutes", account="proj", time_limit_s=1800,
                              tres="cpu=1,mem=1000M,node=1,billing=1,gres/gpu=1"), allocation=spent)
    ended = JobWatch("c", "7").step(pends, T0)
    assert isinstance(ended[-1], End) and ended[-1].kind == NEVER_STARTS
    assert ended[-1].message.startswith("job 7 will never start: AssocGrpBillingMinutes")
    warned = JobWatch("c", "7", pending_policy="warn")
    first = warned.step(pends, T0)
    second = warned.step(pends, T0 + 30)
    assert not any(isinstance(a, End) for a in first + second)
    assert [described(a) for a in first if isinstance(a, Say) and a.level == logging.WARNING] == [
        described(Say(logging.WARNING, ended[-1].message + " (still waiting: pending_policy=warn)"))]
    assert second == []  # said once


def test_an_allocation_held_by_teammates_is_waited_for_until_the_deadline() -> None:
    held = AccountReading("proj", "billing", TresMinutes("proj", "billing", limit=1000, used=10, running=980,
                                                         holders=(("alice", 980),)))
    pends = PollUpdate(status("PENDING", reason="AssocGrpBillingMinutes", account="proj", time_limit_s=1800,
                              tres="cpu=1,mem=1000M,node=1,billing=1,gres/gpu=1"), allocation=held)
    watch = JobWatch("c", "7", watch_deadline=600.0)
    first = [described(a) for a in watch.step(pends, T0)]
    assert first[0].startswith("INFO Job 7 PENDING") and any("alice 980" in w and "for at most" in w for w in first)
    assert watch.allocation_since == T0
    assert not any(isinstance(a, End) for a in watch.step(pends, T0 + 600))
    (end,) = [a for a in watch.step(pends, T0 + 601) if isinstance(a, End)]
    assert end.kind == NEVER_STARTS and "raise watch_deadline to wait longer" in end.message
    started = JobWatch("c", "7", watch_deadline=600.0)
    started.step(pends, T0)
    started.step(answer("RUNNING"), T0 + 30)
    assert started.allocation_since is None and started.note().allocation_since is None


def test_a_watch_resumed_from_its_note_shows_no_line_twice_and_keeps_counting_its_outage() -> None:
    watch = JobWatch("c", "7", log_offset=0, watch_deadline=3600.0)
    watch.resume(WatchNote(log_offset=120, state="RUNNING", err_offset=7, unreachable_since=T0 - 3000))
    assert (watch.log_offset, watch.err_offset, watch.last_state) == (120, 7, SlurmState.RUNNING)
    quiet = watch.step(PollUpdate(None, unreachable=Outage(T0, "refused", 60.0)), T0)
    assert [described(a) for a in quiet][0].startswith("WARNING login node of c unreachable since")
    assert not any(isinstance(a, Remember) for a in quiet)  # the outage's start is kept already
    (said, end) = watch.step(PollUpdate(None, unreachable=Outage(T0, "refused", 60.0)), T0 + 600)
    assert isinstance(end, End) and end.kind == ERROR and "job 7 last seen RUNNING, it may still run" in end.message


def test_an_error_the_poller_cannot_retry_ends_the_watch_at_once() -> None:
    (end,) = JobWatch("c", "7").step(PollUpdate(None, error=RuntimeError("host key changed")), T0)
    assert end == End(ERROR, "cannot watch job 7 on c: host key changed")


def test_followed_files_are_folded_and_kept_even_between_polls() -> None:
    from slurm_provider.watch.followed_files import FollowedFile

    watch = JobWatch("c", "7", followed={"/m.jsonl": FollowedFile("/m.jsonl", f"{__name__}.count_lines")})
    actions = watch.step(PollUpdate(None, followed=(("/m.jsonl", "{}\n", 3),), only_followed=True), T0)
    assert [described(a) for a in actions] == ["keep 1 followed"]
    assert watch.followed["/m.jsonl"].offset == 3


def test_a_pending_policy_outside_the_known_ones_is_refused() -> None:
    with pytest.raises(ValueError, match="pending_policy 'retry' not allowed"):
        JobWatch("c", "7", pending_policy="retry")


def count_lines(state: int | None, lines: list[str]) -> int:
    """A fold: how many lines the file holds."""
    return (state or 0) + len(lines)


LOGIN_PROBES = Backoff(base=10.0, factor=2.0, cap=60.0)


def test_a_login_wait_probes_on_its_schedule_never_past_its_deadline() -> None:
    wait = LoginWatch("c", since=T0, cause="refused", watch_deadline=100.0, probes=LOGIN_PROBES)
    waits = []
    for _ in range(5):
        waits.append(wait.next_wait(T0 + sum(waits)))
        assert wait.failed("refused", retryable=True, now=T0 + sum(waits)) is None or sum(waits) >= 100
    assert waits == [10.0, 20.0, 40.0, 30.0, 0.0]


def test_a_login_wait_ends_when_the_node_answers_past_its_deadline_or_at_a_failure_waiting_cannot_heal() -> None:
    wait = LoginWatch("c", since=T0, cause="refused", watch_deadline=100.0, probes=LOGIN_PROBES, tries=2)
    assert wait.answered(T0 + 90) == End(REACHABLE, "login node of c reachable again after 1 min")
    assert wait.tries == 3
    past = LoginWatch("c", since=T0, cause="refused", watch_deadline=100.0, probes=LOGIN_PROBES)
    end = past.failed("timed out", retryable=True, now=T0 + 100)
    assert end is not None and end.kind == ERROR and "longer than watch_deadline" in end.message
    assert "last error: timed out" in end.message
    key = LoginWatch("c", since=T0, cause="refused", watch_deadline=100.0, probes=LOGIN_PROBES)
    assert key.failed("host key changed", retryable=False, now=T0 + 1) == End(
        ERROR, "cannot log in to c: host key changed")


def test_the_finished_event_names_the_end_in_words() -> None:
    (say, note, end) = JobWatch("c", "7").step(answer("TIMEOUT", exit_code=0), T0)
    assert isinstance(end, End) and end.kind == FINISHED and end.message == "TIMEOUT on n1 exit code 0"
    assert end.status is not None and end.status.state is SlurmState.TIMEOUT
    assert isinstance(note, Remember) and note.note.state == "TIMEOUT" and isinstance(say, Say)
    assert LOST == "lost"
