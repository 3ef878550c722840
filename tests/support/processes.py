"""Processes a test starts and must end: each in a session of its own, stopped by pid, never by name.

A deployment's component (an API server, a scheduler, a Celery worker on a host of its own,
PostgreSQL, Chromium) forks children; ending only the process the test started leaves them running
for the rest of the suite. Every such process starts as the leader of its own session (so its
process group holds what it forks), and :func:`stop` ends the leader gracefully and then whatever of
its group and its descendants is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it counts as ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # no such process, or it ended while we looked
        return False


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, found by their parent pids (a child's children after it)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:  # ``pid`` itself has ended: its orphans now belong to init
        return []


def start_logged(argv: list[str], env: Mapping[str, str], log: Path, **popen: Any) -> subprocess.Popen[bytes]:
    """``argv`` as the leader of a new session, its output appended to ``log`` after a line naming the
    start (a restarted component appends to the same log)."""
    with open(log, "ab") as out:
        out.write(f"\n===== {time.strftime('%H:%M:%S')} {' '.join(argv[:8])}\n".encode())
        out.flush()
        return subprocess.Popen(argv, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, **popen)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, every process below it and its process group: a machine that dies."""
    for proc in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, *, grace: float = 60,
         whole_group: bool = False, leftover_grace: float = 10) -> int | None:
    """End a process started by :func:`start_logged` (or with ``start_new_session``) and its session.

    ``sig`` goes to the leader, which stops its own children (PostgreSQL's fast shutdown is
    SIGINT), or to its whole group with ``whole_group`` (a crash takes the component's children with
    it). After ``grace`` seconds the leader and everything below it get SIGKILL. Whatever of the
    group outlives the leader (a child that was not stopped, or one orphaned by the SIGKILL) gets
    SIGTERM, then SIGKILL after ``leftover_grace`` seconds. Returns the leader's exit status.
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            if whole_group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait(timeout=30)
    end_group(proc.pid, leftover_grace)
    return proc.returncode


def end_group(group: int, grace: float = 10) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds, to what is left of the process group ``group``."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.5)
