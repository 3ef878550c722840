"""The one way tests end the processes they start: the leader gracefully, then what is left of its session."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from support import processes
from support.localcluster import poll_until

# A leader that ends on SIGTERM and leaves a child behind that ignores SIGTERM (as a component's
# worker can), the way a killed ``airflow standalone`` once left its scheduler running.
STUBBORN_CHILD = 'sh -c \'trap "" TERM; while :; do sleep 0.2; done\' & trap "exit 0" TERM; while :; do sleep 0.2; done'


def _started(tmp_path: Path) -> tuple[subprocess.Popen[bytes], list[int]]:
    proc = processes.start_logged(["sh", "-c", STUBBORN_CHILD], {"PATH": "/usr/bin:/bin"}, tmp_path / "x.log")
    poll_until(lambda: len(processes.descendants(proc.pid)) >= 1, timeout=20, what="the child to start")
    return proc, processes.descendants(proc.pid)


def test_a_stopped_leader_takes_the_child_that_ignored_sigterm_with_it(tmp_path: Path) -> None:
    proc, below = _started(tmp_path)
    assert os.getpgid(proc.pid) == proc.pid  # a session of its own: the test's group is never signalled
    assert processes.stop(proc, grace=10, leftover_grace=1) == 0  # the leader stopped on SIGTERM itself
    poll_until(lambda: not any(processes.alive(pid) for pid in below), timeout=20, what="the child to end")
    assert (tmp_path / "x.log").read_text().startswith("\n===== ")  # the start is named in the log


def test_a_leader_that_ignores_its_signal_is_killed_after_the_grace_with_everything_below(tmp_path: Path) -> None:
    proc, below = _started(tmp_path)
    started = time.monotonic()
    assert processes.stop(proc, signal.SIGCONT, grace=1, leftover_grace=1) == -signal.SIGKILL
    assert time.monotonic() - started < 30
    poll_until(lambda: not any(processes.alive(pid) for pid in [proc.pid, *below]), timeout=20, what="the tree to end")


def test_kill_tree_kills_the_whole_group_at_once(tmp_path: Path) -> None:
    proc, below = _started(tmp_path)
    processes.kill_tree(proc.pid)
    assert proc.wait(timeout=20) == -signal.SIGKILL
    poll_until(lambda: not any(processes.alive(pid) for pid in below), timeout=20, what="the child to end")
