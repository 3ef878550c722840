"""The shared poller's retry policy, on a scripted status source (fast; the real proof, a ControlMaster
closed and reopened under a running watch, is in test_triggers.py).

A login that waits for a person is waited out without a limit and announced to every watcher; so
is a login node that does not answer, with the outage (since when, why, next try in) handed to every
watcher, whose own deadline ends its wait (test_triggers.py); anything that cannot heal ends every
watch with the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterable
from dataclasses import replace

import pytest

from slurm_provider.backoff import NO_JITTER
from slurm_provider.cli.sshare import TresMinutes
from slurm_provider.hooks import SlurmCommandFailed, SlurmRateLimited, SlurmUnavailable
from slurm_provider.timing import POLLS
from slurm_provider.watch.poll_schedule import Asked, PollSchedule
from slurm_provider.watch.poller import JobPoller
from slurm_provider.watch.subscription import PollUpdate
from slurm_provider.state_vocabulary import SlurmState
from slurm_provider.job_status import JobStatus
from slurm_provider.watch.maintenance import Window
from slurm_provider.transport import ControlMasterNotRunning, HostKeyRejected, TransportUnavailable

FAST = {"poll_interval": 0.01, "max_poll_interval": 0.02}


class ScriptedSource:
    """Answers each ``statuses`` call with the next scripted exception or state."""

    opened = 0

    def __init__(self, script: list[BaseException | SlurmState]) -> None:
        self.script = script
        ScriptedSource.opened += 1

    async def statuses(self, job_ids: Iterable[str]) -> dict[str, JobStatus]:
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(step, BaseException):
            raise step
        return {job_id: JobStatus(job_id=job_id, state=step) for job_id in job_ids}

    async def read_log(self, path: str, offset: int) -> tuple[str, int]:
        return "", offset

    async def file_sizes(self, paths: list[str]) -> dict[str, int]:
        return {}

    async def close(self) -> None:
        pass


def watch(script: list[BaseException | SlurmState], jobs: tuple[str, ...] = ("1", "2"),
          **poller_kwargs: int) -> dict[str, list[PollUpdate]]:
    """Every update each job's watcher sees until its job ends or an error arrives."""
    shared = list(script)
    ScriptedSource.opened = 0
    poller = JobPoller("c", lambda: ScriptedSource(shared), **poller_kwargs)

    async def one(job_id: str) -> list[PollUpdate]:
        seen = []
        async with poller.subscribe(job_id, **FAST) as updates:
            while True:
                update = await asyncio.wait_for(updates.get(), 10)
                seen.append(update)
                if update.error is not None or (update.status is not None and update.status.is_terminal):
                    return seen

    async def all_jobs() -> list[list[PollUpdate]]:
        return await asyncio.gather(*(one(job_id) for job_id in jobs))

    return dict(zip(jobs, asyncio.run(all_jobs())))


def test_a_lapsed_master_pauses_every_watch_without_a_limit_and_they_resume() -> None:
    lapsed = ControlMasterNotRunning("no ControlMaster is running for ssh alias lumi2; Open it again with: "
                                     "ssh -o ControlMaster=auto -fN lumi2")
    script = [SlurmState.RUNNING, *[lapsed] * 12, SlurmState.RUNNING, SlurmState.COMPLETED]
    seen = watch(script)
    for updates in seen.values():
        assert all(u.error is None for u in updates)
        waiting = [u.waiting for u in updates if u.waiting is not None]
        assert len(waiting) == 12 and set(waiting) == {str(lapsed)}
        assert updates[0].status.state is SlurmState.RUNNING
        assert updates[-1].status.state is SlurmState.COMPLETED
    assert ScriptedSource.opened == 13  # a fresh connection after every failed try


def test_an_unreachable_login_node_is_retried_without_a_limit_and_every_watch_resumes() -> None:
    down = TransportUnavailable("cannot reach lumi2: ConnectionRefusedError: [Errno 111] Connection refused")
    tries = 40  # five times what the poller once allowed before it gave up
    seen = watch([SlurmState.RUNNING, *[down] * tries, SlurmState.RUNNING, SlurmState.COMPLETED])
    for updates in seen.values():
        assert all(u.error is None and u.waiting is None for u in updates)
        outages = [u.unreachable for u in updates if u.unreachable is not None]
        assert len(outages) == tries
        assert len({o.since for o in outages}) == 1, "one outage, counted from its first failed try"
        assert {o.cause for o in outages} == {str(down)}
        assert all(0 < o.retry_in <= FAST["max_poll_interval"] for o in outages), "the back-off is capped"
        assert updates[0].status.state is SlurmState.RUNNING
        assert [u.status.state for u in updates[-2:]] == [SlurmState.RUNNING, SlurmState.COMPLETED]
    assert ScriptedSource.opened == tries + 1  # a fresh connection after every failed try


def test_a_second_outage_is_counted_from_its_own_start() -> None:
    down = TransportUnavailable("cannot reach lumi2: timed out")
    seen = watch([down, down, SlurmState.RUNNING, down, SlurmState.COMPLETED], jobs=("1",))
    outages = [u.unreachable for u in seen["1"] if u.unreachable is not None]
    assert len(outages) == 3
    assert outages[0].since == outages[1].since < outages[2].since


def test_slurms_rate_limit_slows_the_poller_down_on_the_same_connection_and_every_watch_goes_on() -> None:
    limited = SlurmRateLimited("squeue exited 1: slurm_load_jobs error: Rate limit exceeded, please retry momentarily")
    refusals = 9
    seen = watch([SlurmState.RUNNING, *[limited] * refusals, SlurmState.RUNNING, SlurmState.COMPLETED])
    for updates in seen.values():
        assert all(u.error is None and u.unreachable is None and u.waiting is None for u in updates)
        throttled = [u.throttled for u in updates if u.throttled is not None]
        assert len(throttled) == refusals and all("asks for fewer calls" in t for t in throttled)
        assert all("Rate limit exceeded" in t for t in throttled)
        assert [u.status.state for u in updates if u.status is not None] == \
            [SlurmState.RUNNING, SlurmState.RUNNING, SlurmState.COMPLETED]
    assert ScriptedSource.opened == 1, "the connection is fine: it is kept"


def test_after_refusals_the_wait_doubles_up_to_the_longest_interval_and_eases_back() -> None:
    schedule = PollSchedule(replace(POLLS, factor=1.5, jitter=NO_JITTER), interval=15.0)
    asked = Asked(15.0, 300.0)
    slower = [schedule.slow_down(asked) for _ in range(6)]
    eased = [schedule.next_wait(asked, changed=False) for _ in range(8)]
    assert slower == [30.0, 60.0, 120.0, 240.0, 300.0, 300.0]
    # the slow-down shrinks by the growth factor per answered poll while the schedule grows back
    assert eased == pytest.approx([300.0, 200.0, 133.33, 88.89, 113.91, 170.86, 256.29, 300.0], abs=0.01)


def test_the_regular_polls_start_at_the_shortest_interval_asked_for_and_a_change_starts_them_again() -> None:
    schedule = PollSchedule(replace(POLLS, factor=2.0, jitter=NO_JITTER))
    asked = Asked.of([(10.0, 60.0), (20.0, 300.0)])
    assert asked == Asked(10.0, 60.0)
    assert [schedule.next_wait(asked, changed=False) for _ in range(4)] == [10.0, 20.0, 40.0, 60.0]
    assert schedule.next_wait(asked, changed=True) == 10.0
    schedule.restart()
    assert schedule.next_wait(asked, changed=False) == 10.0
    assert Asked.of([]) == Asked(1.0, math.inf)


def test_an_error_slurm_keeps_answering_with_ends_every_watch_after_a_few_polls_not_a_day() -> None:
    """squeue answers, with an error, while the login node answers: no outage to wait out for a day.
    Each watcher hears that Slurm is asked again, then the error, with Slurm's own words."""
    refused = SlurmCommandFailed("squeue exited 1: squeue: error: Invalid user: vcloud")
    seen = watch([SlurmState.RUNNING, *[refused] * 10])
    for updates in seen.values():
        assert updates[0].status.state is SlurmState.RUNNING
        waiting = [u.waiting for u in updates if u.waiting is not None]
        assert len(waiting) == 2 and all("Slurm answered with an error" in w and "Invalid user" in w
                                         for w in waiting), waiting
        assert not any(u.unreachable for u in updates), "not taken for an outage"
        error = str(updates[-1].error)
        assert "answered 3 polls in a row with an error while its login node answered" in error, error
        assert "squeue: error: Invalid user: vcloud" in error
    assert ScriptedSource.opened == 3, "a fresh connection for each try"


def test_slurm_away_is_an_outage_waited_out_like_an_unreachable_login_node() -> None:
    away = SlurmUnavailable("sacct exited 1: sacct: error: Problem talking to the database: Connection refused")
    seen = watch([SlurmState.RUNNING, *[away] * 12, SlurmState.RUNNING, SlurmState.COMPLETED])
    for updates in seen.values():
        assert all(u.error is None for u in updates)
        assert len([u for u in updates if u.unreachable is not None]) == 12
        assert updates[-1].status.state is SlurmState.COMPLETED


def test_errors_slurm_answered_count_only_in_a_row() -> None:
    """A hiccup that passes is forgotten: two errors, an answer, two errors again, and the watch goes on."""
    refused = SlurmCommandFailed("squeue printed output that cannot be read: squeue line has 3 fields")
    seen = watch([SlurmState.RUNNING, refused, refused, SlurmState.RUNNING, refused, refused,
                  SlurmState.COMPLETED], jobs=("1",))
    assert all(u.error is None for u in seen["1"])
    assert seen["1"][-1].status.state is SlurmState.COMPLETED


def test_a_failure_no_retry_can_heal_ends_every_watch_at_once() -> None:
    impostor = HostKeyRejected("host key of lumi2 does not match the pinned key")
    seen = watch([SlurmState.RUNNING, impostor])
    assert all(ups[-1].error is impostor for ups in seen.values())


@pytest.mark.parametrize(("attempt", "cap", "most"), [(1, 300.0, 2.0), (5, 300.0, 32.0), (20, 300.0, 300.0),
                                                     (20, 4.0, 4.0), (5000, 600.0, 300.0)])
def test_a_retry_waits_at_most_the_longest_interval_a_watch_allows(attempt: int, cap: float,
                                                                   most: float) -> None:
    delays = [PollSchedule.transport_retry(Asked(cap, cap), attempt) for _ in range(200)]
    assert all(most / 2 <= d <= most for d in delays)


class GrownLog(ScriptedSource):
    """A job whose log grew by ``text`` while nobody looked; each read returns at most four bytes."""

    text = "epoch 1\nepoch 2\nepoch 3\ndone\n"

    async def file_sizes(self, paths: list[str]) -> dict[str, int]:
        return {path: len(self.text) for path in paths}

    async def read_log(self, path: str, offset: int) -> tuple[str, int]:
        chunk = self.text[offset:offset + 4]
        return chunk, offset + len(chunk)


def test_a_log_that_grew_while_nobody_looked_is_shown_whole_before_the_end() -> None:
    poller = JobPoller("c", lambda: GrownLog([SlurmState.COMPLETED]))

    async def first_update() -> PollUpdate:
        async with poller.subscribe("1", log_path="/logs/1.out", **FAST) as updates:
            return await asyncio.wait_for(updates.get(), 10)

    update = asyncio.run(first_update())
    assert update.status.state is SlurmState.COMPLETED
    assert (update.new_log_text, update.log_offset) == (GrownLog.text, len(GrownLog.text))  # 8 reads, one cycle


def watch_to_the_end(source: ScriptedSource, job_ids: Iterable[str]) -> dict[str, list[PollUpdate]]:
    """Every update each job's watcher sees, all jobs watched at once through one poller, until each ends."""
    poller, ids = JobPoller("c", lambda: source), list(job_ids)

    async def one(job_id: str) -> list[PollUpdate]:
        seen = []
        async with poller.subscribe(job_id, **FAST) as updates:
            while not seen or not seen[-1].status.is_terminal:
                seen.append(await asyncio.wait_for(updates.get(), 10))
        return seen

    async def every_job() -> list[list[PollUpdate]]:
        return await asyncio.gather(*(one(job_id) for job_id in ids))

    return dict(zip(ids, asyncio.run(every_job())))


class AllocationSource(ScriptedSource):
    """Jobs pending on their account's allocation until ``pending_cycles`` cycles passed, then done;
    counts the sshare reads (one per account and cycle at most)."""

    def __init__(self, accounts: dict[str, str], pending_cycles: int) -> None:
        super().__init__([SlurmState.PENDING])
        self.accounts, self.pending_cycles = accounts, pending_cycles
        self.cycles = 0
        self.reads: list[tuple[int, str, str]] = []

    async def statuses(self, job_ids: Iterable[str]) -> dict[str, JobStatus]:
        self.cycles += 1
        if self.cycles > self.pending_cycles:
            return {j: JobStatus(job_id=j, state=SlurmState.COMPLETED, account=self.accounts[j]) for j in job_ids}
        return {j: JobStatus(job_id=j, state=SlurmState.PENDING, reason="AssocGrpBillingMinutes",
                             account=self.accounts[j], tres="billing=1", time_limit_s=600) for j in job_ids}

    async def account_tres(self, account: str, tres: str = "billing") -> TresMinutes | None:
        self.reads.append((self.cycles, account, tres))
        if account == "broken":
            raise SlurmCommandFailed("sshare exited 1: Socket timed out")
        return TresMinutes(account=account, tres=tres, limit=100, used=0, running=95, holders=(("bob", 95),))


def test_jobs_pending_on_an_allocation_share_one_sshare_per_account_and_cycle() -> None:
    source = AllocationSource({"1": "proj", "2": "proj", "3": "other", "4": "broken"}, pending_cycles=3)
    seen = watch_to_the_end(source, "1234")
    # Each cycle a job pends: one sshare per account, whatever the number of its jobs; none after.
    per_cycle = {}
    for cycle, account, _ in source.reads:
        per_cycle.setdefault(cycle, []).append(account)
    assert all(sorted(accounts) == ["broken", "other", "proj"] for accounts in per_cycle.values()), per_cycle
    assert max(per_cycle) <= 3
    pending_updates = [u for ups in seen.values() for u in ups if u.status.state is SlurmState.PENDING]
    assert pending_updates and all(u.allocation is not None for u in pending_updates)
    proj = next(u.allocation for u in seen["1"] if u.allocation is not None)
    assert proj.figures.holders == (("bob", 95),) and proj.problem is None
    broken = next(u.allocation for u in seen["4"] if u.allocation is not None)
    assert broken.figures is None and "sshare gave no answer: sshare exited 1: Socket timed out" == broken.problem
    assert all(u.error is None for ups in seen.values() for u in ups)  # a failed sshare ends no watch
    assert all(u.allocation is None for ups in seen.values() for u in ups if u.status.is_terminal)


class MaintenanceSource(ScriptedSource):
    """Job 1 waits out a maintenance window for ``pending_cycles`` cycles, job 2 waits for nodes; then both
    end. ``fail_first`` makes the first reservation read fail. Every read is counted."""

    WINDOW = Window(start="2026-12-09T08:00:00", end="2026-12-09T20:00:00", name="lumi-maint",
                    nodes="nid[005001-005003]")

    def __init__(self, pending_cycles: int, *, fail_first: bool = False) -> None:
        super().__init__([SlurmState.PENDING])
        self.pending_cycles, self.fail_first = pending_cycles, fail_first
        self.cycles = 0
        self.reads: list[int] = []

    async def statuses(self, job_ids: Iterable[str]) -> dict[str, JobStatus]:
        self.cycles += 1
        if self.cycles > self.pending_cycles:
            return {j: JobStatus(job_id=j, state=SlurmState.COMPLETED) for j in job_ids}
        reasons = {"1": "ReqNodeNotAvail, Reserved for maintenance", "2": "Resources"}
        return {j: JobStatus(job_id=j, state=SlurmState.PENDING, reason=reasons[j]) for j in job_ids}

    async def maintenance(self) -> tuple[Window, ...]:
        self.reads.append(self.cycles)
        if self.fail_first and len(self.reads) == 1:
            raise SlurmCommandFailed("scontrol show reservation exited 1: Socket timed out")
        return (self.WINDOW,)


def test_the_windows_are_read_once_while_a_job_waits_one_out_and_handed_only_to_that_job() -> None:
    source = MaintenanceSource(pending_cycles=5)
    seen = watch_to_the_end(source, "12")
    assert source.reads == [1], "one read for every poll of the interval (timing.MAINTENANCE_READ_INTERVAL)"
    waiting = [u for u in seen["1"] if u.status.state is SlurmState.PENDING]
    assert waiting and all(u.maintenance == (MaintenanceSource.WINDOW,) for u in waiting)
    assert all(u.maintenance == () for u in seen["2"]), "job 2 waits for nodes, not for the window"
    assert seen["1"][-1].maintenance == (), "an ended job waits for nothing"


def test_a_failed_reservation_read_leaves_the_window_unnamed_and_the_watch_going(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("slurm_provider.watch.side_reads.MAINTENANCE_READ_INTERVAL", 0.0)
    source = MaintenanceSource(pending_cycles=4, fail_first=True)
    seen = watch_to_the_end(source, "12")
    assert source.reads[:2] == [1, 2], "read again at the next poll once the interval passed"
    waiting = [u for u in seen["1"] if u.status.state is SlurmState.PENDING]
    assert waiting[0].maintenance == () and waiting[-1].maintenance == (MaintenanceSource.WINDOW,)
    assert all(u.error is None for ups in seen.values() for u in ups)


class GrowingFile:
    """Job 7 runs; its file ``/o/m.jsonl`` grows by a line at every size check. Every call is noted."""

    path = "/o/m.jsonl"

    def __init__(self) -> None:
        self.text = ""
        self.calls: list[str] = []

    def _grow(self, paths: list[str]) -> dict[str, int]:
        if self.path in paths:
            self.text += f'{{"step": {len(self.text.splitlines()) + 1}}}\n'
            return {self.path: len(self.text)}
        return {}

    async def statuses(self, job_ids: Iterable[str]) -> dict[str, JobStatus]:
        self.calls.append("statuses")
        return {j: JobStatus(job_id=j, state=SlurmState.RUNNING) for j in job_ids}

    async def poll_files(self, size_paths: list[str], record_paths: list[str]) -> tuple[dict[str, int], dict[str, str]]:
        self.calls.append("poll_files")
        return self._grow(size_paths), {}

    async def file_sizes(self, paths: list[str]) -> dict[str, int]:
        self.calls.append("file_sizes")
        return self._grow(paths)

    async def read_log(self, path: str, offset: int) -> tuple[str, int]:
        self.calls.append("read_log")
        return self.text[offset:], len(self.text)

    async def close(self) -> None:
        pass


def _followed(source: GrowingFile, seconds: float, **subscribe: float | str) -> list[PollUpdate]:
    poller = JobPoller("c", lambda: source, record_interval=0.02, jitter=0.0)

    async def run() -> list[PollUpdate]:
        seen: list[PollUpdate] = []
        async with poller.subscribe("7", follows={GrowingFile.path: 0}, **subscribe) as updates:
            with contextlib.suppress(asyncio.TimeoutError):
                async with asyncio.timeout(seconds):
                    while True:
                        seen.append(await updates.get())
        return seen

    return asyncio.run(run())


def test_a_followed_file_is_read_between_polls_in_the_record_reads_at_its_own_cadence() -> None:
    source = GrowingFile()
    seen = _followed(source, 1.0, poll_interval=60.0, max_poll_interval=300.0, end_record_path="/o/7.out.end",
                     follow_interval=0.2)
    assert source.calls.count("statuses") == 1  # one poll: every later read rides on a record read
    reads = [u for u in seen if u.followed]
    assert 3 <= len(reads) <= 6, len(reads)  # at most every 0.2 s, though the records are read every 0.02 s
    assert all(u.only_followed and u.status is None for u in reads[1:])
    text = "".join(t for u in reads for _, t, _ in u.followed)
    assert text == source.text[:len(text)] and reads[-1].followed[-1][2] == len(text)  # only what was new


def test_without_record_reads_the_polls_read_a_followed_file() -> None:
    source = GrowingFile()
    seen = _followed(source, 0.3, poll_interval=0.01, max_poll_interval=0.02, follow_interval=0.0)
    assert "poll_files" not in source.calls
    assert all(u.status is not None and not u.only_followed for u in seen)
    assert sum(1 for u in seen if u.followed) == len(seen) > 3


def test_a_followed_file_of_a_job_that_has_not_started_is_not_read() -> None:
    class Pending(GrowingFile):
        async def statuses(self, job_ids: Iterable[str]) -> dict[str, JobStatus]:
            return {j: JobStatus(job_id=j, state=SlurmState.PENDING) for j in job_ids}

    source = Pending()
    seen = _followed(source, 0.3, poll_interval=0.01, max_poll_interval=0.02, end_record_path="/o/7.out.end",
                     follow_interval=0.0)
    assert seen and not any(u.followed for u in seen) and source.text == ""
