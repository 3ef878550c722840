"""What people and failures do to a job task in a running deployment, checked against ``sacct``.

One deployment for the module (``support.deployment.LocalDeployment``): ``airflow api-server``,
``scheduler`` (LocalExecutor), ``dag-processor`` and ``triggerer`` as separate processes on a fresh
home, so a test can stop, freeze and restart one and knows which process is which, with the local
profile moved to a fresh project directory. Each test starts a run of the ``slurm_gestures`` DAG
(tests/dag_fixtures: one ``SlurmSubmitOperator`` with its default retries, polling every 30 s)
through the REST API, does to it what a person or a failure would, and counts the run's jobs in
``sacct``.

Which process to kill: while a job task is deferred no worker process exists for it (the wait is a
trigger in the triggerer); the task has a process only while it submits (or adopts) and defers,
and again when it resumes to read the end. The fixture holds the task between submitting and
deferring, so the kill lands in the window that used to leave a running job nobody watched.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from support.deployment import RestClient, airflow_env, deployment_with_dag
from support.localcluster import LocalCluster, poll_until
from support.ports import free_port
from slurm_provider.operators import job_name_for
from slurm_provider.watch.notes import WATCH_XCOM_KEY

DAG_ID, TASK_ID = "slurm_gestures", "job"
POLL_INTERVAL_S = 30.0  # the fixture task's poll interval

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400), pytest.mark.xdist_group("slurm-gestures")]


@pytest.fixture(scope="module")
def deployment(local_cluster: LocalCluster, cluster_connection: str,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("gestures-home")
    env = airflow_env(home, free_port(), local_cluster.test_dir(), first_poll_delay=10)
    with deployment_with_dag(env, home, DAG_ID) as (components, api):
        yield {"components": components, "api": api, "home": home}


# --- helpers ------------------------------------------------------------------------------------------


def _start_run(api: RestClient, **conf: Any) -> str:
    run_id = f"gesture-{uuid.uuid4().hex[:10]}"
    status, body = api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
                            {"dag_run_id": run_id, "logical_date": None, "conf": conf})
    assert status == 200, body
    return run_id


def _ti(api: RestClient, run_id: str) -> dict[str, Any]:
    return api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{TASK_ID}")


def _wait_ti(deployment: dict[str, Any], run_id: str, done: Any, what: str,
             timeout: float = 600) -> dict[str, Any]:
    api, components = deployment["api"], deployment["components"]
    try:
        return poll_until(lambda: (ti := _ti(api, run_id)) and done(ti) and ti, timeout=timeout, interval=2,
                          what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; task: {_ti(api, run_id)}\n{_task_log_text(api, run_id)[-4000:]}\n"
                             f"{components.log_tail('scheduler')}\n"
                             f"{components.log_tail('triggerer')}") from None


def _wait_log_line(deployment: dict[str, Any], run_id: str, wanted: Callable[[str], bool], what: str,
                   timeout: float = 120) -> None:
    """Wait for a line of the task's log; on timeout, say what the log, the scheduler and the
    triggerer showed instead."""
    api, components = deployment["api"], deployment["components"]
    try:
        poll_until(lambda: any(wanted(line) for line in _task_log(api, run_id)), timeout=timeout, interval=2,
                   what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; task: {_ti(api, run_id)}\n{_task_log_text(api, run_id)[-4000:]}\n"
                             f"{components.log_tail('scheduler')}\n"
                             f"{components.log_tail('triggerer', 6000)}") from None


def _wait_trigger_started(deployment: dict[str, Any], run_id: str) -> None:
    """Wait until a triggerer runs the deferred task's trigger. A task marked failed in the instant
    between its deferral and a triggerer picking its trigger up ends without any trigger code
    running (Airflow drops the unassigned trigger), so a gesture meant for the trigger waits for it."""
    _wait_log_line(deployment, run_id, lambda line: line.startswith("trigger ") and line.endswith(" starting"),
                   "a triggerer to start the task's trigger")


def _noted_log_offset(api: RestClient, run_id: str) -> int:
    """How much of the job's output the trigger has recorded as shown (its ``slurm_watch`` XCom)."""
    status, body = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{TASK_ID}"
                                   f"/xcomEntries/{WATCH_XCOM_KEY}?deserialize=true")
    if status != 200 or not isinstance(body, dict):
        return 0
    value = body.get("value")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return 0
    return int(value.get("log_offset") or 0) if isinstance(value, dict) else 0


def _task_log(api: RestClient, run_id: str, try_number: int = 1) -> list[str]:
    """The task try's log as the UI shows it (the worker's and the triggerer's lines): one line per
    entry, its message followed by the text of any exception it carries."""
    body = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{TASK_ID}/logs/{try_number}"
                   "?full_content=true")
    lines = []
    for entry in body["content"]:
        if not isinstance(entry, dict):
            lines.append(str(entry))
            continue
        errors = [str(e.get("exc_value", "")) for e in entry.get("error_detail") or [] if isinstance(e, dict)]
        lines.append(" ".join([str(entry.get("event", "")), *errors]))
    return lines


def _task_log_text(api: RestClient, run_id: str) -> str:
    tries = int(_ti(api, run_id).get("try_number") or 1)
    return "\n".join(f"--- try {n} ---\n" + "\n".join(_task_log(api, run_id, n)) for n in range(1, tries + 1))


def _jobs(cluster: LocalCluster, run_id: str, expect: int = 1) -> list[dict[str, str]]:
    """Every job accounting knows under the task's deterministic name in this run (JobIDRaw, State)."""
    name = job_name_for(DAG_ID, TASK_ID, run_id)

    def read() -> list[dict[str, str]]:
        out = cluster.root("sacct", "-X", "-n", "-P", "-S", "now-1days", f"--name={name}",
                           "--format=JobIDRaw,State").stdout
        rows = [line.split("|") for line in out.splitlines() if line]
        # State as Slurm words it, without "by <uid>" ("CANCELLED by 1001").
        return [{"job_id": job_id, "state": state.split()[0]} for job_id, state in rows]

    poll_until(lambda: len(read()) >= expect, timeout=120, what=f"{expect} job(s) named {name} in sacct")
    cluster.accounting_caught_up()  # a duplicate submitted earlier is in accounting by now too
    return read()


def _waiting_script(cluster: LocalCluster, *gates: str) -> tuple[str, list[str]]:
    """A job that prints ``step 0``, then ``step k`` once the test opens gate k (a file on the cluster)."""
    gate_dir = cluster.test_dir()
    paths = [f"{gate_dir}/{gate}" for gate in gates]
    lines = ["#!/bin/bash", "echo step 0"]
    for k, path in enumerate(paths, start=1):
        lines += [f"until [ -e {shlex.quote(path)} ]; do sleep 1; done", f"echo step {k}"]
    return "\n".join(lines) + "\n", paths


def _open(cluster: LocalCluster, gate: str) -> None:
    cluster.ssh(f"touch {shlex.quote(gate)}")


def _trigger_logs(home: Path, run_id: str) -> list[Path]:
    """The trigger log files of the run's task try (one per triggerer that ran its trigger)."""
    return sorted((home / "logs").glob(f"dag_id={DAG_ID}/run_id={run_id}/task_id={TASK_ID}/attempt=1.log.trigger.*.log"))


def _job_lines(log: list[str], job_id: str) -> list[str]:
    return [line for line in log if line.startswith(f"[job {job_id}] ")]


# --- the gestures -----------------------------------------------------------------------------------


def test_a_killed_task_process_is_retried_and_the_retry_adopts_the_running_job(
        deployment: dict[str, Any], local_cluster: LocalCluster, tmp_path: Path) -> None:
    api = deployment["api"]
    script, [gate] = _waiting_script(local_cluster, "finish")
    hold = tmp_path / "hold"
    run_id = _start_run(api, script=script, log_dir=local_cluster.test_dir(), hold_file=str(hold))

    holding = Path(f"{hold}.holding")
    poll_until(holding.exists, timeout=600, interval=1, what="the task to submit its job and hold")
    held = json.loads(holding.read_text())
    job_id, pid = held["job_id"], held["pid"]
    ti = _ti(api, run_id)
    assert ti["state"] == "running" and ti["try_number"] == 1 and ti["pid"] == pid, ti
    assert local_cluster.wait_for_state(int(job_id), {"RUNNING", "PENDING"}, timeout=120)

    os.kill(pid, signal.SIGKILL)  # what the OOM killer or a lost node does to a worker's task
    _wait_ti(deployment, run_id, lambda t: t["state"] == "up_for_retry" or t["try_number"] >= 2,
                       "the killed try to be retried")
    hold.touch()  # the retry defers without holding

    _wait_ti(deployment, run_id, lambda t: t["try_number"] == 2 and t["state"] == "deferred",
             "the retry to defer")
    assert local_cluster.current_state(int(job_id)) == "RUNNING", "the job ran on while nobody watched"
    _open(local_cluster, gate)
    final = _wait_ti(deployment, run_id, lambda t: t["state"] in ("success", "failed"), "the run to finish")
    assert final["state"] == "success" and final["try_number"] == 2, (final, _task_log_text(api, run_id))

    second_try = _task_log(api, run_id, 2)
    assert any(f"Adopting job {job_id}" in line for line in second_try), second_try
    assert not any(line.startswith("Submitted job") for line in second_try), second_try
    summary = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{TASK_ID}/xcomEntries/"
                      "return_value?deserialize=true")["value"]
    assert summary["job_ids"] == [job_id] and summary["state"] == "COMPLETED", summary
    assert _jobs(local_cluster, run_id) == [{"job_id": job_id, "state": "COMPLETED"}]


def test_a_job_that_fails_fails_its_task_without_a_retry(deployment: dict[str, Any],
                                                         local_cluster: LocalCluster) -> None:
    api = deployment["api"]
    run_id = _start_run(api, script="#!/bin/bash\necho about to fail\nexit 3\n",
                        log_dir=local_cluster.test_dir())
    # "failed" on the first of three tries is Airflow's final word: a retry would pass "up_for_retry".
    final = _wait_ti(deployment, run_id, lambda t: t["state"] in ("success", "failed"), "the task to fail")
    assert final["state"] == "failed" and final["try_number"] == 1 and final["max_tries"] == 2, final
    [job] = _jobs(local_cluster, run_id)
    assert job["state"] == "FAILED", job
    log = _task_log(api, run_id)
    said = f"Slurm job {job['job_id']} ended FAILED"
    assert any(said in line and "Exit code 3." in line for line in log), log
    # The worker loaded the deployment's plugins: the HPC view took the provider's extra link.
    links = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{TASK_ID}/links")
    expected = f"{api.base}/hpc-view/?dag_id={DAG_ID}&run_id={run_id}&task_id={TASK_ID}#job-{job['job_id']}"
    assert links["extra_links"]["Slurm job"] == expected, links


def test_marking_a_deferred_task_failed_cancels_its_job(deployment: dict[str, Any],
                                                        local_cluster: LocalCluster) -> None:
    api = deployment["api"]
    script, _ = _waiting_script(local_cluster, "never")
    run_id = _start_run(api, script=script, log_dir=local_cluster.test_dir())
    _wait_ti(deployment, run_id, lambda t: t["state"] == "deferred", "the task to defer")
    _wait_trigger_started(deployment, run_id)
    [job] = _jobs(local_cluster, run_id)
    job_id = job["job_id"]
    local_cluster.wait_for_state(int(job_id), {"RUNNING"}, timeout=120)

    # The UI's "Mark as failed" on the task instance.
    status, body = api.call("PATCH", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{TASK_ID}",
                            {"new_state": "failed"})
    assert status == 200, body
    marked = time.monotonic()
    state = local_cluster.wait_for_state(int(job_id), {"CANCELLED", "COMPLETED", "FAILED"},
                                         timeout=2 * POLL_INTERVAL_S)
    took = time.monotonic() - marked
    print(f"job {job_id} CANCELLED {took:.1f} s after the task was marked failed")
    assert state == "CANCELLED"
    _wait_log_line(deployment, run_id, lambda line: f"cancelled job {job_id}" in line,
                   "the triggerer's cancel line in the task log", timeout=60)
    assert _jobs(local_cluster, run_id) == [{"job_id": job_id, "state": "CANCELLED"}]
    ti = _ti(api, run_id)
    assert ti["state"] == "failed" and ti["try_number"] == 1, ti


def test_marking_a_task_failed_that_only_watches_another_runs_job_leaves_the_job_running(
        deployment: dict[str, Any], local_cluster: LocalCluster) -> None:
    api = deployment["api"]
    script, [gate] = _waiting_script(local_cluster, "finish")
    log_dir = local_cluster.test_dir()
    writes = f"{log_dir}/outputs"
    owner = _start_run(api, script=script, log_dir=log_dir, exclusive_dir=writes)
    _wait_ti(deployment, owner, lambda t: t["state"] == "deferred", "the first run's task to defer")
    [job] = _jobs(local_cluster, owner)
    job_id = job["job_id"]
    local_cluster.wait_for_state(int(job_id), {"RUNNING"}, timeout=120)

    # A second run for the same directory watches the first run's job instead of submitting another.
    watcher = _start_run(api, script=script, log_dir=log_dir, exclusive_dir=writes)
    _wait_ti(deployment, watcher, lambda t: t["state"] == "deferred", "the second run's task to defer")
    _wait_trigger_started(deployment, watcher)
    assert any(f"Job {job_id} (DAG {DAG_ID}, run {owner}, task {TASK_ID}" in line
               and "watching it instead of submitting a second job" in line for line in _task_log(api, watcher))

    # The UI's "Mark as failed" on the watching task: the job is not its to cancel.
    status, body = api.call("PATCH", f"/api/v2/dags/{DAG_ID}/dagRuns/{watcher}/taskInstances/{TASK_ID}",
                            {"new_state": "failed"})
    assert status == 200, body
    left = (f"Watch of job {job_id} stopped. The job was submitted by user {local_cluster.user}, DAG {DAG_ID}, "
            f"run {owner}, task {TASK_ID}, not by this task, which only watched it: it is left running")
    _wait_log_line(deployment, watcher, lambda line: line.startswith(left),
                   "the watching trigger to stop and say it leaves the job")
    assert local_cluster.current_state(int(job_id)) == "RUNNING"
    assert _ti(api, owner)["state"] == "deferred", "the run that submitted it still watches it"

    _open(local_cluster, gate)
    final = _wait_ti(deployment, owner, lambda t: t["state"] in ("success", "failed"), "the first run to finish")
    assert final["state"] == "success", (final, _task_log_text(api, owner))
    assert local_cluster.jobs_writing(writes) == [job_id]
    assert _jobs(local_cluster, owner) == [{"job_id": job_id, "state": "COMPLETED"}]
    assert _ti(api, watcher)["state"] == "failed"


def test_restarting_the_triggerer_cancels_nothing_and_repeats_no_log_line(deployment: dict[str, Any],
                                                                         local_cluster: LocalCluster) -> None:
    api, components = deployment["api"], deployment["components"]
    script, gates = _waiting_script(local_cluster, "after-graceful-restart", "after-crash")
    run_id = _start_run(api, script=script, log_dir=local_cluster.test_dir())
    _wait_ti(deployment, run_id, lambda t: t["state"] == "deferred", "the task to defer")
    [job] = _jobs(local_cluster, run_id)
    job_id = job["job_id"]

    def shown(step: int) -> bool:
        return f"[job {job_id}] step {step}" in _task_log(api, run_id)

    poll_until(lambda: shown(0), timeout=300, interval=2, what="the job's first line in the task log")
    # What the trigger showed is recorded a moment after it is shown; a stop in that instant would
    # show it once more. Stop the triggerer once the line is recorded.
    noted = poll_until(lambda: _noted_log_offset(api, run_id), timeout=120, interval=1,
                       what="the trigger to record the first line as shown")

    # A graceful restart (deploy, `systemctl restart`): the triggerer stops its triggers itself.
    assert components.stop("triggerer", signal.SIGTERM) is not None
    components.start("triggerer")
    _open(local_cluster, gates[0])
    poll_until(lambda: shown(1), timeout=300, interval=2, what="the restarted triggerer to show step 1")
    poll_until(lambda: _noted_log_offset(api, run_id) > noted, timeout=120, interval=1,
               what="the restarted trigger to record step 1 as shown")

    # A crash: the triggerer and its trigger runner die at once; the next triggerer takes over the
    # trigger once the dead one's heartbeat is old.
    components.stop("triggerer", signal.SIGKILL)
    components.start("triggerer")
    _open(local_cluster, gates[1])
    final = _wait_ti(deployment, run_id, lambda t: t["state"] in ("success", "failed"), "the run to finish")
    assert final["state"] == "success" and final["try_number"] == 1, (final, _task_log_text(api, run_id))

    assert _jobs(local_cluster, run_id) == [{"job_id": job_id, "state": "COMPLETED"}]
    log = _task_log(api, run_id)
    assert _job_lines(log, job_id) == [f"[job {job_id}] step {k}" for k in range(3)], log
    announced = [line for line in log if re.match(rf"Job {job_id} [A-Z_]+\b", line)]  # state changes
    assert len(announced) == len(set(announced)), announced
    running = [line for line in announced if " RUNNING " in line]
    assert len(running) == 1 and re.fullmatch(rf"Job {job_id} RUNNING on nid00500[1-3]", running[0]), announced
    node = running[0].rsplit(" ", 1)[1]
    assert announced[-1] == f"Job {job_id} COMPLETED on {node} exit code 0", announced
    assert not any("cancelled job" in line or "Task stopped" in line for line in log), log


def test_a_trigger_moved_to_another_triggerer_keeps_its_job(deployment: dict[str, Any],
                                                           local_cluster: LocalCluster) -> None:
    # With two triggerers, one whose heartbeat lapses (frozen here) loses its triggers to the other;
    # when it wakes, Airflow 3.3 stops its copy of the trigger as if a person had acted on the task.
    api, components = deployment["api"], deployment["components"]
    script, [gate] = _waiting_script(local_cluster, "finish")
    run_id = _start_run(api, script=script, log_dir=local_cluster.test_dir())
    _wait_ti(deployment, run_id, lambda t: t["state"] == "deferred", "the task to defer")
    [job] = _jobs(local_cluster, run_id)
    job_id = job["job_id"]

    def starts() -> int:
        log = _task_log(api, run_id)
        return sum(1 for line in log if line.startswith("trigger ") and line.endswith(" starting"))

    poll_until(lambda: f"[job {job_id}] step 0" in _task_log(api, run_id), timeout=300, interval=2,
               what="the job's first line in the task log")
    assert starts() == 1
    [first_trigger_log] = _trigger_logs(deployment["home"], run_id)
    assert f"[job {job_id}] step 0" in first_trigger_log.read_text(errors="replace")
    components.start("second-triggerer", "triggerer")
    components.send("triggerer", signal.SIGSTOP)
    try:
        # The second triggerer takes the trigger once the frozen one's heartbeat is older than
        # [triggerer] triggerer_health_check_threshold (30 s).
        poll_until(lambda: starts() == 2, timeout=300, interval=2,
                   what="the second triggerer to take the trigger")
    finally:
        components.send("triggerer", signal.SIGCONT)
    stop_lines = (f"Watch of job {job_id} stopped", f"Task stopped by a user: cancelled job {job_id}")
    poll_until(lambda: any(line.startswith(stop_lines) for line in _task_log(api, run_id)), timeout=300,
               interval=2, what="the woken triggerer to stop its copy of the trigger")
    log = _task_log(api, run_id)
    kept = f"Watch of job {job_id} stopped while the task is deferred"
    assert any(line.startswith(kept) for line in log), log
    assert local_cluster.current_state(int(job_id)) == "RUNNING"

    _open(local_cluster, gate)
    final = _wait_ti(deployment, run_id, lambda t: t["state"] in ("success", "failed"), "the run to finish")
    assert final["state"] == "success" and final["try_number"] == 1, (final, _task_log_text(api, run_id))
    assert _jobs(local_cluster, run_id) == [{"job_id": job_id, "state": "COMPLETED"}]
    lines = _job_lines(_task_log(api, run_id), job_id)
    if lines == [f"[job {job_id}] step 1"]:
        # Airflow 3.3's triggerer opens a trigger's log file with "wb" whenever it makes that trigger's
        # logger (jobs/triggerer_job_runner.py, TriggerLoggingFactory): the woken triggerer, handling
        # the trigger again, emptied its own file, and with it the line it had relayed. The relay
        # wrote it (asserted above); what is asserted here is that Airflow's file lost it.
        assert f"[job {job_id}] step 0" not in first_trigger_log.read_text(errors="replace"), lines
    else:
        assert lines == [f"[job {job_id}] step {k}" for k in range(2)]
