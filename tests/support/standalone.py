"""``airflow standalone`` as a test deployment, on a home configured by :func:`deployment.airflow_env`.

``airflow standalone`` starts the API server, the scheduler (LocalExecutor), the DAG processor and
the triggerer, the components a deployment runs, in one process tree whose output is
``home/standalone.log``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from support import processes
from support.deployment import wait_for_api


@contextmanager
def standalone(env: dict[str, str], home: Path, *, timeout: float = 300) -> Iterator[str]:
    """``airflow standalone`` until the block ends; yields its base URL once the API answers.

    Stopped with SIGINT (SIGTERM would orphan its children); its output goes to
    ``home/standalone.log``. It runs in a session of its own, and whatever of that session outlives
    the stop (a scheduler or API server whose ``standalone`` was killed after the grace period, with
    its executor's workers) is ended with it: a finished test leaves no deployment polling its database.
    """
    base = env["AIRFLOW__API__BASE_URL"]
    with open(home / "standalone.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "airflow", "standalone"], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for_api(base, timeout=timeout, where=lambda: f"see {log.name}",
                         gone=lambda: None if proc.poll() is None else f"airflow standalone exited early; see {log.name}")
            yield base
        finally:
            processes.stop(proc, signal.SIGINT)


def log_tail(home: Path, chars: int = 4000) -> str:
    path = home / "standalone.log"
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no standalone.log)"
