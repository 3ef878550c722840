"""A real Airflow deployment run as its separate components, each a process the test owns.

``airflow standalone`` starts the same four components but never restarts one, and hides their
process ids. Here ``airflow api-server``, ``scheduler`` (LocalExecutor), ``dag-processor`` and
``triggerer`` each run in their own session (so a component and its children can be stopped
together), configured by :func:`standalone.airflow_env`, with their output in ``<home>/<name>.log``
(a restarted component appends to its log).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from support import processes

if TYPE_CHECKING:
    from support.standalone import RestClient

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


class Deployment:
    """The four components on one Airflow home; ``stop``/``start`` restart one of them."""

    def __init__(self, env: dict[str, str], home: Path) -> None:
        self.env = {**env, "AIRFLOW__CORE__EXECUTOR": "LocalExecutor"}
        self.home = home
        self.base = env["AIRFLOW__API__BASE_URL"]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, command: str | None = None) -> subprocess.Popen[bytes]:
        """Start ``airflow <command>`` (default: ``name``) as the component called ``name``."""
        assert name not in self.procs or self.procs[name].poll() is not None, f"{name} is running"
        self.procs[name] = processes.start_logged([sys.executable, "-m", "airflow", command or name], self.env,
                                        self.home / f"{name}.log")
        return self.procs[name]

    def send(self, name: str, sig: int) -> None:
        """Send ``sig`` to the component's whole process group (e.g. SIGSTOP/SIGCONT to freeze it)."""
        os.killpg(self.procs[name].pid, sig)

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 120) -> int | None:
        """Send ``sig`` to the component (SIGKILL: to its whole process group, as a crash takes its
        children with it); after ``timeout`` seconds, or once it ended, whatever of its group is left ends too."""
        return processes.stop(self.procs[name], sig, grace=timeout, whole_group=sig == signal.SIGKILL)

    def wait_until_up(self, timeout: float = 300) -> None:
        from support.standalone import wait_for_api

        def gone() -> str | None:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            return f"{dead} exited early; see {self.log_tail(dead[0])}" if dead else None

        wait_for_api(self.base, timeout=timeout, gone=gone, where=lambda: f"\n{self.log_tail('api-server')}")

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.home / f"{name}.log"
        text = path.read_text(errors="replace")[-chars:] if path.exists() else "(none)"
        return f"--- {path} ---\n{text}"

    def __enter__(self) -> Deployment:
        for name in COMPONENTS:
            self.start(name)
        try:
            self.wait_until_up()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for name in reversed(list(self.procs)):
            if self.procs[name].poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self.send(name, signal.SIGCONT)  # a frozen component could not stop
            self.stop(name, signal.SIGTERM, timeout=60)


@contextlib.contextmanager
def deployment_with_dag(env: dict[str, str], home: Path, dag_id: str,
                        pool_slots: int | None = None) -> Iterator[tuple[Deployment, RestClient]]:
    """A migrated, running deployment whose DAG processor has parsed ``dag_id``, unpaused; its cluster
    pools have ``pool_slots`` slots (default :data:`standalone.POOL_SLOTS`)."""
    from support.localcluster import poll_until
    from support.standalone import POOL_SLOTS, RestClient, migrate

    migrate(env, pool_slots or POOL_SLOTS)
    with Deployment(env, home) as components:
        api = RestClient(components.base)
        poll_until(lambda: api.call("GET", f"/api/v2/dags/{dag_id}")[0] == 200, timeout=300, interval=2,
                   what=f"the DAG processor to parse {dag_id}")
        status, body = api.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
        assert status == 200, body
        yield components, api
