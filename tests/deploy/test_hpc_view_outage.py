"""The HPC view while the login node hangs: the API server answers, and says since when.

A local deployment of separate components (``airflow api-server``, scheduler, DAG processor, triggerer)
runs the ``slurm_lifecycle`` DAG (tests/dag_fixtures: one ``SlurmSubmitOperator``) through a private
login sshd of the local cluster (the shared one on port 2222 serves everyone else's tests). Once the
job runs and the view shows it as its watch saw it, the sshd and every session it serves are frozen
(SIGSTOP): connections stay open but nothing answers, the worst case for a caller that waits. While
it is frozen the API server's health endpoint and the view's JSON answer, the view's row says
"Cluster unreachable since ..." (the trigger's note), and the API server's processes neither start
an ``ssh`` nor hold a connection to the login node (the triggerer does: the check can see one).

Meanwhile a task of a second DAG (``worker_sleeper``, tests/dag_fixtures) runs on a worker, not
deferred, from before the freeze until after it: its task runner heartbeats through the API server's
Execution API, and the test sees the task instance's ``last_heartbeat_at`` (Airflow's metadata
database) move on several times while the login node is frozen, and the task succeed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sqlite3
import time
import urllib.request
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
import pytest

from support.deployment import RestClient, airflow_env, deployment_with_dag
from support.localcluster import LocalCluster, poll_until
from support.ports import free_port
from support.private_login import PrivateLogin
from support.processes import descendants

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
DAG_ID, TASK_ID = "slurm_lifecycle", "job"
SLEEPER_DAG, SLEEPER_TASK = "worker_sleeper", "sleep_until_released"
HEARTBEATS_WHILE_FROZEN = 3
"""Distinct heartbeats of the sleeping task, all after the freeze began, that the test waits to see."""
REQUEST_TIMEOUT_S = 60
"""Generous: an answer is what the test asserts, not how fast it came."""


def get_json(url: str, token: str | None = None) -> Any:
    headers = {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=REQUEST_TIMEOUT_S) as resp:
        assert resp.status == 200, url
        return json.load(resp)


def _row(api: RestClient, run_id: str) -> dict[str, Any] | None:
    view = get_json(f"{api.base}/hpc-view/api/jobs?dag_id={DAG_ID}&run_id={run_id}", api.token)
    rows = [job for profile in view["profiles"] for job in profile["jobs"] if job["task_id"] == TASK_ID]
    return rows[0] if rows else None


def last_heartbeat(home: Path, dag_id: str, run_id: str, task_id: str) -> tuple[str | None, float | None]:
    """The task instance's state and ``last_heartbeat_at`` (epoch seconds), read from the deployment's
    metadata database (the REST API does not show the heartbeat)."""
    with contextlib.closing(sqlite3.connect(f"file:{home / 'airflow.db'}?mode=ro", uri=True, timeout=30)) as db:
        row = db.execute("SELECT state, last_heartbeat_at FROM task_instance WHERE dag_id = ? AND run_id = ? "
                         "AND task_id = ?", (dag_id, run_id, task_id)).fetchone()
    if row is None:
        return None, None
    state, beat = row
    if not beat:
        return state, None
    moment = datetime.fromisoformat(str(beat).replace(" ", "T"))
    return state, (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def cluster_contacts(pid: int, port: int) -> list[str]:
    """What ``pid`` and its descendants do towards the login node on ``port``: ``ssh``/``scp``
    processes, and TCP connections to the port."""
    found: list[str] = []
    for proc in [pid, *descendants(pid)]:
        try:
            process = psutil.Process(proc)
            name, connections = process.name(), process.net_connections(kind="tcp")
        except psutil.Error:  # ended while we looked
            continue
        if name in ("ssh", "scp", "sftp"):
            found.append(f"process {proc} ({name})")
        found += [f"TCP connection {c.laddr.ip}:{c.laddr.port} -> {c.raddr.ip}:{c.raddr.port} ({c.status})"
                  for c in connections if c.raddr and c.raddr.port == port]
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def test_a_frozen_login_node_leaves_the_api_server_answering_and_the_view_says_since_when(
        local_cluster: LocalCluster, cluster_connection: str, tmp_path: Path) -> None:
    login_dir = tmp_path / "login"
    login_dir.mkdir()
    login = PrivateLogin(local_cluster, login_dir)
    home = tmp_path / "home"
    home.mkdir()
    work = local_cluster.test_dir()
    release = f"{work}/release"
    sleeper_release, sleeper_started = tmp_path / "sleeper-release", tmp_path / "sleeper-started"
    local_cluster.ssh(f"mkdir -p {shlex.quote(work)}/logs")
    env = airflow_env(home, free_port(), work, first_poll_delay=10)
    env.update(login.connection_env())
    env["SLURM_LIFECYCLE_CONN_ID"] = login.conn_id
    run_id = f"frozen-{uuid.uuid4().hex[:8]}"
    conf = {"script": f"#!/bin/bash\necho started\nuntil [ -e {shlex.quote(release)} ]; do sleep 1; done\necho done\n",
            "log_dir": f"{work}/logs", "time_limit": "15"}
    frozen: list[int] = []
    login.start()
    try:
        with deployment_with_dag(env, home, DAG_ID) as (components, api):
            api_server = components.procs["api-server"].pid
            api.trigger(DAG_ID, run_id, conf)
            # A task on a worker, not deferred, that runs through the freeze.
            poll_until(lambda: api.call("GET", f"/api/v2/dags/{SLEEPER_DAG}")[0] == 200, timeout=300, interval=2,
                       what=f"the DAG processor to parse {SLEEPER_DAG}")
            status, body = api.call("PATCH", f"/api/v2/dags/{SLEEPER_DAG}", {"is_paused": False})
            assert status == 200, body
            api.trigger(SLEEPER_DAG, run_id, {"release": str(sleeper_release), "started": str(sleeper_started)})

            def seen_running() -> dict[str, Any] | None:
                row = _row(api, run_id)
                return row if row and row["last_seen"] == "RUNNING" else None

            try:
                running = poll_until(seen_running, timeout=600, interval=3, what="the view to show the job RUNNING "
                                                                                  "as its watch saw it")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{components.log_tail('triggerer')}\n"
                                     f"{components.log_tail('scheduler')}") from None
            assert running["state"] is None and running["as_of_s"] is not None
            poll_until(lambda: sleeper_started.exists() and last_heartbeat(home, SLEEPER_DAG, run_id, SLEEPER_TASK)
                       [0] == "running", timeout=600, interval=2, what=f"the {SLEEPER_DAG} task to run on a worker")
            assert running["state_description"].startswith("RUNNING as of ")
            job_id = running["job_id"]
            # The check sees a login connection where there is one: the triggerer's watch holds it.
            assert cluster_contacts(components.procs["triggerer"].pid, login.port), "the triggerer's connection"
            assert cluster_contacts(api_server, login.port) == []

            sshd = login.pid
            assert sshd is not None
            frozen[:] = [sshd, *descendants(sshd)]
            _signal_all(frozen, signal.SIGSTOP)
            frozen_at = time.time()
            answers = 0
            contacts: list[str] = []
            beats: set[float] = set()  # the sleeping task's heartbeats seen since the freeze began

            def heartbeats() -> None:
                state, beat = last_heartbeat(home, SLEEPER_DAG, run_id, SLEEPER_TASK)
                assert state == "running", f"the {SLEEPER_DAG} task is {state} while the login node is frozen"
                if beat is not None and beat > frozen_at:
                    beats.add(beat)

            def view_says_unreachable() -> dict[str, Any] | None:
                nonlocal answers
                health = get_json(f"{api.base}/api/v2/monitor/health")
                assert health["metadatabase"]["status"] == "healthy", health
                row = _row(api, run_id)
                answers += 1
                contacts.extend(cluster_contacts(api_server, login.port))
                heartbeats()
                return row if row and row["unreachable_since"] else None

            try:
                down = poll_until(view_says_unreachable, timeout=600, interval=3,
                                  what="the view to say the cluster is unreachable")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{components.log_tail('triggerer')}") from None
            assert contacts == [], contacts
            assert down["state_description"].startswith("Cluster unreachable since ")
            assert "the job runs on (last seen RUNNING " in down["state_description"]
            since = down["unreachable_since"]
            assert frozen_at - 5 <= _epoch(since) <= time.time(), (since, frozen_at)
            health = get_json(f"{api.base}/api/v2/monitor/health")
            assert health["triggerer"]["status"] == "healthy", health  # its loop is not blocked by the hang
            print(f"login node frozen; the view answered {answers} time(s) and says: {down['state_description']}")

            def heartbeating() -> bool:  # still frozen: SIGCONT comes after this wait
                heartbeats()
                contacts.extend(cluster_contacts(api_server, login.port))
                assert all(_stopped(pid) for pid in frozen[:1]), "the login node's sshd runs again"
                return len(beats) >= HEARTBEATS_WHILE_FROZEN

            poll_until(heartbeating, timeout=600, interval=2,
                       what=f"{HEARTBEATS_WHILE_FROZEN} heartbeats of the {SLEEPER_DAG} task while the node is frozen")
            assert contacts == [], contacts
            print(f"while frozen the {SLEEPER_DAG} task heartbeat {len(beats)} time(s) through the API server, "
                  f"{min(beats) - frozen_at:.0f} s to {max(beats) - frozen_at:.0f} s into the freeze")

            _signal_all(frozen, signal.SIGCONT)
            frozen.clear()
            sleeper_release.touch()
            poll_until(lambda: api.get(f"/api/v2/dags/{SLEEPER_DAG}/dagRuns/{run_id}/taskInstances/{SLEEPER_TASK}")
                       ["state"] in ("success", "failed"), timeout=300, interval=2,
                       what=f"the {SLEEPER_DAG} task to end once released")
            sleeper = api.get(f"/api/v2/dags/{SLEEPER_DAG}/dagRuns/{run_id}/taskInstances/{SLEEPER_TASK}")
            assert (sleeper["state"], sleeper["try_number"]) == ("success", 1), sleeper
            local_cluster.ssh(f"touch {shlex.quote(release)}")
            poll_until(lambda: api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{TASK_ID}")["state"]
                       == "success", timeout=600, interval=3, what="the task to finish once the node answers")
            done = _row(api, run_id)
            assert done is not None and (done["state"], done["unreachable_since"]) == ("COMPLETED", None)
            assert done["job_id"] == job_id
    finally:
        _signal_all(frozen, signal.SIGCONT)
        sleeper_release.touch()
        login.stop()
        local_cluster.ssh(f"touch {shlex.quote(release)}", check=False)


def _stopped(pid: int) -> bool:
    """The process is stopped by a signal (state ``T`` in /proc)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()
