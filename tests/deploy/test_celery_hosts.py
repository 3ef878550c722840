"""The compose file's topology, run: Celery workers and triggerers on hosts of their own.

``tests/support/celery_hosts.py`` starts PostgreSQL, Redis, the API server, the scheduler and the DAG
processor here, and two Celery workers and two triggerers each on a host of its own (network
namespace on the local cluster's bridge, own hostname and files), with docker-compose.yaml's
settings. The cluster connection is an OpenSSH one whose login needs a person (``require_control_master``;
the alias offers no key): its ControlMaster socket is on one worker host and one triggerer host only,
and the local profile's ``connection.queue`` routes its tasks and triggers there.

Through REST a tiny ``vcloud_training`` run goes end to end; the worker host running a stage task is
killed (every process on it) while the task runs, and the triggerer host while it holds a stage's
trigger. Both come back as a rebooted machine does (its person opens the master again, its
component starts); the other worker and triggerer, which hold no socket, never take the
connection's work. The run succeeds with one Slurm job per job task, and the HPC view, signed in
through this API server with headless Chromium, shows the run's jobs and budget.

Failover: with a key-based connection every host can use (the local cluster's default way) and
everything on the default queue, the worker host running a stage task and the triggerer host
watching a stage's job die and stay dead; the surviving worker runs the task's next try, the
surviving triggerer takes the watch over, and the run still ends with one Slurm job per job task.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.celery_hosts import (
    BRIDGE_ADDR,
    COMPOSE,
    PASSWORD,
    SERVICES,
    USER,
    Addresses,
    CeleryDeployment,
    celery_deployment,
    compose_command,
    component_env,
    new_secrets,
)
from support.localcluster import LocalCluster, poll_until

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "vcloud_training"
QUEUE = "cluster_login"
JOB_TASKS = ["prepare_data", "preflight_imports", "stage0", "stage1", "stage2", "stage3", "export"]
CLUSTER_TASKS = ["sync_code", "preflight_checks", "provision_env", *JOB_TASKS, "summary"]
STAGES = ["stage0", "stage1", "stage2", "stage3"]
HOSTS = {"worker-login": ("worker", QUEUE), "worker-plain": ("worker", "default"),
         "triggerer-login": ("triggerer", QUEUE), "triggerer-plain": ("triggerer", "default")}
"""Host -> (component, queues). Only the ``-login`` hosts hold the connection's ControlMaster socket."""
SETTINGS = {
    # A killed worker's task is failed (and retried) after this long without a heartbeat (300 s by default).
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
}
"""What the test shortens of Airflow's timeouts; the triggerer health threshold stays Airflow's 30 s."""
FAILOVER_HOSTS = {"worker-a": ("worker", "default"), "worker-b": ("worker", "default"),
                  "triggerer-a": ("triggerer", "default"), "triggerer-b": ("triggerer", "default")}
"""Every host serves the default queue and holds the cluster's key: any of them can take the work."""


# --------------------------------------------------------------------------- the settings agree


def test_every_component_gets_the_compose_files_settings_with_local_addresses(tmp_path: Path) -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    variables = {**new_secrets(), "VCLOUD_QUEUES": "default"}
    where = Addresses(5432, 6379, 8080, 8974, "/srv/x", {})
    envs = {c: component_env(compose, c, variables, where, tmp_path / c, secrets_file=tmp_path / "conn.json",
                             base={"PATH": "/usr/bin"})
            for c in SERVICES}
    for component, env in envs.items():
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", component
        assert env["AIRFLOW__TRIGGERER__QUEUES_ENABLED"] == "true", component
        assert env["AIRFLOW__CORE__FERNET_KEY"] == variables["AIRFLOW_FERNET_KEY"], component
        assert env["AIRFLOW__CELERY__BROKER_URL"] == f"redis://:{variables['REDIS_PASSWORD']}@{BRIDGE_ADDR}:6379/0"
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith(
            f"postgresql+psycopg2://airflow:{variables['POSTGRES_PASSWORD']}@{BRIDGE_ADDR}:5432/")
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == f"http://{BRIDGE_ADDR}:8080/execution/"
    # Which component gets which secret: the compose file's, kept as it is.
    for component, env in envs.items():
        holds_credentials = "AIRFLOW__WORKERS__SECRETS_BACKEND" in env
        assert holds_credentials == (component in ("worker", "triggerer")), component
        assert ("AIRFLOW__API_AUTH__JWT_SECRET" in env) == (component in ("api-server", "scheduler")), component
        if holds_credentials:
            assert env["AIRFLOW__WORKERS__SECRETS_BACKEND"] == "airflow.secrets.local_filesystem.LocalFilesystemBackend"
            assert json.loads(env["AIRFLOW__WORKERS__SECRETS_BACKEND_KWARGS"]) == {
                "connections_file_path": str(tmp_path / "conn.json")}
        assert not [k for k in env if k.startswith("AIRFLOW_CONN_")], component
    assert envs["api-server"]["AIRFLOW__API_AUTH__JWT_SECRET"] == variables["AIRFLOW_JWT_SECRET"]
    # The commands are the compose file's, the queues from VCLOUD_QUEUES.
    assert compose_command(compose, "worker", variables) == ["celery", "worker", "--queues", "default"]
    assert compose_command(compose, "triggerer", {**variables, "VCLOUD_QUEUES": "a,b"}) == \
        ["triggerer", "--queues", "a,b"]
    # A secret missing from .env stops the component as it stops docker-compose, naming it.
    with pytest.raises(KeyError, match="set POSTGRES_PASSWORD in .env"):
        component_env(compose, "dag-processor", {}, where, tmp_path / "none")


# --------------------------------------------------------------------------- the run


@pytest.fixture
def deployment(local_cluster: LocalCluster) -> Iterator[CeleryDeployment]:
    with celery_deployment(local_cluster, HOSTS, queue=QUEUE, settings=SETTINGS) as running:
        print(f"\nCelery deployment healthy after {running.startup_seconds:.1f} s "
              f"(PostgreSQL, Redis, migration, pools, API server, scheduler, DAG processor, "
              f"2 workers and 2 triggerers on their hosts)", file=sys.stderr)
        yield running


def _tries(deployment: CeleryDeployment, run_id: str) -> list[tuple[str, int, str | None, str | None, str]]:
    """(task, try, hostname, state, queue) of every try of the run's tasks, earlier tries included."""
    sql = ("SELECT task_id, try_number, hostname, state, queue FROM task_instance WHERE run_id = %s "
           "UNION ALL SELECT task_id, try_number, hostname, state, queue FROM task_instance_history "
           "WHERE run_id = %s")
    return [(r[0], r[1], r[2] or None, r[3], r[4]) for r in deployment.postgres.query(sql, run_id, run_id)]


def _triggers(deployment: CeleryDeployment, run_id: str) -> list[tuple[int, str, str | None, str | None]]:
    """(trigger id, task, queue, hostname of the triggerer running it) of the run's live triggers."""
    sql = ("SELECT t.id, ti.task_id, t.queue, j.hostname FROM trigger t JOIN task_instance ti ON ti.trigger_id = t.id "
           "LEFT JOIN job j ON j.id = t.triggerer_id WHERE ti.run_id = %s")
    return [(r[0], r[1], r[2], r[3]) for r in deployment.postgres.query(sql, run_id)]


def _trigger_tiny_run(api: Any, prefix: str) -> str:
    """Unpause the training DAG once the DAG processor has it, and trigger a tiny run through REST."""
    poll_until(lambda: api.call("GET", f"/api/v2/dags/{DAG_ID}")[0] == 200, timeout=300, interval=2,
               what=f"the DAG processor to parse {DAG_ID}")
    assert api.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})[0] == 200
    run_name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    # Two epochs a stage: the hosts die at task and trigger boundaries, which every stage has at any length.
    return api.trigger(DAG_ID, f"celery-hosts-{run_name}",
                       {"profile": "local", "config": "tiny", "run_name": run_name, "max_epochs": 2})


class Watch:
    """Samples the run's triggers and task tries while it runs: who ran what, and when."""

    def __init__(self, deployment: CeleryDeployment, run_id: str) -> None:
        self.deployment, self.run_id = deployment, run_id
        self.triggers: dict[tuple[int, str], set[str | None]] = {}
        self.trigger_queues: set[str | None] = set()

    def sample(self) -> None:
        for trigger_id, task, queue, hostname in _triggers(self.deployment, self.run_id):
            self.triggers.setdefault((trigger_id, task), set()).add(hostname)
            self.trigger_queues.add(queue)

    def until(self, check: Any, *, timeout: float, what: str, interval: float = 0.5) -> Any:
        def sampled() -> Any:
            self.sample()
            return check()

        try:
            return poll_until(sampled, timeout=timeout, interval=interval, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.deployment.diagnose()}") from None


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_run_survives_its_worker_and_triggerer_hosts_dying_and_runs_only_where_the_socket_is(
        deployment: CeleryDeployment, local_cluster: LocalCluster) -> None:
    from benchmarks.stage_overhead import run_jobs
    api = deployment.api()
    run_id = _trigger_tiny_run(api, "celery")
    watch = Watch(deployment, run_id)
    worker, triggerer = deployment.hosts["worker-login"], deployment.hosts["triggerer-login"]

    # 1. A stage task running on the worker host: the host dies.
    def stage_running() -> tuple[str, int] | None:
        for task, attempt, hostname, state, _ in _tries(deployment, run_id):
            if task in STAGES and state == "running" and hostname == worker.name:
                return task, attempt
        return None

    killed_task, killed_try = watch.until(stage_running, timeout=1500, interval=0.3,
                                          what="a stage task running on the worker host")
    worker.kill()
    print(f"killed host {worker.name} while {killed_task} (try {killed_try}) ran on it", file=sys.stderr)

    def task_left(task: str, attempt: int) -> bool:
        rows = {(t, a): s for t, a, _, s, _ in _tries(deployment, run_id)}
        return rows.get((task, attempt)) not in ("running", None) or (task, attempt + 1) in rows

    watch.until(lambda: task_left(killed_task, killed_try), timeout=600, interval=2,
                what=f"the scheduler to give up on {killed_task}'s lost try")
    deployment.reboot(worker)

    # 2. A later stage's trigger held by the triggerer host: the host dies.
    def trigger_held() -> str | None:
        for _, task, _, hostname in _triggers(deployment, run_id):
            if task in STAGES and task != killed_task and hostname == triggerer.name:
                return task
        return None

    watched = watch.until(trigger_held, timeout=1500, interval=1, what="a stage's trigger on the triggerer host")
    triggerer.kill()
    print(f"killed host {triggerer.name} while it watched {watched}'s job", file=sys.stderr)
    deployment.reboot(triggerer)

    final = watch.until(lambda: (s := api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")["state"])
                        in ("success", "failed") and s, timeout=2400, interval=3, what="the run to end")
    tries = _tries(deployment, run_id)
    assert final == "success", sorted(tries)

    # Only the host with the socket ran the connection's tasks, every try of them; the others none.
    ran = {(task, attempt): hostname for task, attempt, hostname, _, _ in tries}
    on_cluster = {key: host for key, host in ran.items() if key[0] in CLUSTER_TASKS and host}
    assert set(on_cluster.values()) == {worker.name}, on_cluster
    assert {t for t, _ in on_cluster} == set(CLUSTER_TASKS)
    assert {q for t, _, _, _, q in tries if t in CLUSTER_TASKS} == {QUEUE}
    assert {ran[(t, a)] for t, a in ran if t in ("plan", "verdict")} == {"worker-plain"}
    assert (killed_task, killed_try + 1) in ran, f"{killed_task} was not tried again: {sorted(ran)}"
    # ... and every trigger of the run, before and after the triggerer host died, ran on that host.
    held = {host for hosts in watch.triggers.values() for host in hosts if host}
    assert held == {triggerer.name}, watch.triggers
    assert watch.trigger_queues == {QUEUE}, watch.trigger_queues
    assert {task for _, task in watch.triggers} >= {watched}
    plain_logs = deployment.hosts["triggerer-plain"].directory / "airflow" / "logs"
    assert not list(plain_logs.rglob("*.trigger.*.log")), "the triggerer without the socket ran a trigger"

    # One Slurm job per job task (none for a stage skipped as not earning its GPU-hours): the lost try
    # adopted its job, the lost watch was taken up again.
    skipped = {t for t, _, _, state, _ in tries if state == "skipped"}
    jobs = run_jobs(local_cluster, run_id)
    assert {task: len(found) for task, found in jobs.items()} == \
        {task: 0 if task in skipped else 1 for task in JOB_TASKS}, jobs
    assert {found[0].state for found in jobs.values() if found} == {"COMPLETED"}, jobs
    print("sacct: " + ", ".join(f"{task} {found[0].job_id} {found[0].state}" for task, found in jobs.items() if found),
          file=sys.stderr)

    _the_hpc_view_shows_the_run(deployment, api, run_id,
                                {task: found[0].job_id for task, found in jobs.items() if found})


def _the_hpc_view_shows_the_run(deployment: CeleryDeployment, api: Any, run_id: str, job_ids: dict[str, str]) -> None:
    """Signed in through this API server with headless Chromium: the run's jobs and the budget."""
    from support.cdp import CHROMIUM, Browser
    from deploy.test_hpc_view_browser import PAGE_JS

    assert CHROMIUM is not None, "chromium is missing: run include/test_deps.sh (make test does)"
    browser = Browser()
    try:
        browser.navigate(f"{deployment.base}/hpc-view/?dag_id={DAG_ID}")
        browser.wait_for("location.pathname.includes('/auth/login') && !!document.querySelector('input[type=password]')",
                         what="Airflow's login page")
        browser.type_into("input:not([type=password])", USER)
        browser.type_into("input[type=password]", PASSWORD)
        browser.press_enter()
        shown = json.loads(browser.wait_for(
            "location.pathname.startsWith('/hpc-view') && document.body.dataset.loaded === 'true'"
            f" && document.querySelectorAll('section.profile').length > 0 && {PAGE_JS}",
            what="the HPC view after signing in", timeout=120))
    finally:
        browser.close()
    [local] = [p for p in shown["profiles"] if p["profile"] == "local"]
    rows = {row["task_id"]: row for row in local["jobs"] if row["run_id"] == run_id}
    assert sorted(rows) == sorted(job_ids), local["jobs"]
    assert {task: row["job_id"] for task, row in rows.items()} == job_ids
    assert {row["state"] for row in rows.values()} == {"COMPLETED"}
    assert local["source"] == "slurm", local["source_text"]
    assert local["allocation"] and local["used"] and local["left"], local
    assert float(local["used"].replace(",", "")) > 0


# --------------------------------------------------------------------------- failover


@pytest.fixture
def failover_deployment(local_cluster: LocalCluster) -> Iterator[CeleryDeployment]:
    with celery_deployment(local_cluster, FAILOVER_HOSTS, queue="default", conn_id="vcloud_celery_key",
                           settings=SETTINGS, key_login=True) as running:
        print(f"\nCelery deployment (key login on every host) healthy after {running.startup_seconds:.1f} s",
              file=sys.stderr)
        yield running


def _trigger_logged(host_dir: Path, task: str, attempt: int) -> bool:
    """The host's triggerer wrote a trigger log for ``task``'s try ``attempt``."""
    logs = host_dir / "airflow" / "logs"
    return any(f"task_id={task}" in str(path.parent) for path in logs.rglob(f"attempt={attempt}.log.trigger.*.log"))


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_run_fails_over_to_the_surviving_worker_and_triggerer_when_their_hosts_die_for_good(
        failover_deployment: CeleryDeployment, local_cluster: LocalCluster) -> None:
    from benchmarks.stage_overhead import run_jobs
    deployment = failover_deployment
    api = deployment.api()
    run_id = _trigger_tiny_run(api, "failover")
    watch = Watch(deployment, run_id)
    workers = {n for n, (c, _) in FAILOVER_HOSTS.items() if c == "worker"}
    triggerers = {n for n, (c, _) in FAILOVER_HOSTS.items() if c == "triggerer"}

    # 1. A stage task running on a worker host: that host dies and stays dead.
    def stage_running() -> tuple[str, int, str] | None:
        for task, attempt, hostname, state, _ in _tries(deployment, run_id):
            if task in STAGES and state == "running" and hostname in workers:
                return task, attempt, hostname
        return None

    killed_task, killed_try, dead_worker = watch.until(stage_running, timeout=1500, interval=0.3,
                                                       what="a stage task running on a worker host")
    deployment.hosts[dead_worker].kill()
    [live_worker] = workers - {dead_worker}
    print(f"killed host {dead_worker} for good while {killed_task} (try {killed_try}) ran on it", file=sys.stderr)

    # 2. A stage's trigger held by a triggerer host: that host dies and stays dead.
    def trigger_held() -> tuple[int, str, str] | None:
        for trigger_id, task, _, hostname in _triggers(deployment, run_id):
            if task in STAGES and hostname in triggerers:
                return trigger_id, task, hostname
        return None

    trigger_id, watched, dead_triggerer = watch.until(trigger_held, timeout=1500, interval=0.3,
                                                      what="a stage's trigger on a triggerer host")
    [watched_try] = [a for t, a, _, s, _ in _tries(deployment, run_id) if t == watched and s == "deferred"] or [0]
    deployment.hosts[dead_triggerer].kill()
    [live_triggerer] = triggerers - {dead_triggerer}
    print(f"killed host {dead_triggerer} for good while it watched {watched}'s job (trigger {trigger_id}, "
          f"try {watched_try})", file=sys.stderr)

    # The surviving triggerer takes the watch: the trigger is assigned to it, or it logged the try's trigger.
    def taken_over() -> bool:
        held = {host for (_, task), hosts in watch.triggers.items() if task == watched for host in hosts}
        return live_triggerer in held or _trigger_logged(deployment.hosts[live_triggerer].directory, watched,
                                                         watched_try)

    watch.until(taken_over, timeout=900, interval=0.3, what=f"{live_triggerer} to take {watched}'s watch over")

    final = watch.until(lambda: (s := api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")["state"])
                        in ("success", "failed") and s, timeout=2400, interval=1, what="the run to end")
    tries = _tries(deployment, run_id)
    assert final == "success", sorted(tries)

    ran = {(task, attempt): hostname for task, attempt, hostname, _, _ in tries}
    assert ran.get((killed_task, killed_try + 1)) == live_worker, \
        f"{killed_task}'s next try did not run on {live_worker}: {sorted(tries)}"
    # After the kill nothing more ran on the dead worker: its tries are the ones before.
    assert all(ran[(killed_task, a)] == live_worker for t, a in ran if t == killed_task and a > killed_try)
    took = {host for (_, task), hosts in watch.triggers.items() if task == watched for host in hosts}
    assert dead_triggerer in took, watch.triggers
    assert live_triggerer in took or _trigger_logged(deployment.hosts[live_triggerer].directory, watched,
                                                     watched_try), watch.triggers
    assert watch.trigger_queues <= {"default"}, watch.trigger_queues

    # One job per job task that submitted; a stage that does not earn its GPU-hours (stage 3 of the
    # tiny config: no unlabeled domain) is skipped without one.
    skipped = {t for t, _, _, state, _ in tries if state == "skipped"}
    jobs = run_jobs(local_cluster, run_id)
    assert {task: len(found) for task, found in jobs.items()} == \
        {task: 0 if task in skipped else 1 for task in JOB_TASKS}, jobs
    assert killed_task not in skipped and watched not in skipped, sorted(tries)
    assert {found[0].state for found in jobs.values() if found} == {"COMPLETED"}, jobs
    print(f"{killed_task}: " + ", ".join(f"try {a} on {ran[(t, a)]}" for t, a in sorted(ran) if t == killed_task),
          file=sys.stderr)
    print(f"{watched}'s triggers: " + ", ".join(f"{tid} on {sorted(h for h in hosts if h)}"
                                             for (tid, task), hosts in sorted(watch.triggers.items())
                                             if task == watched), file=sys.stderr)
    print("sacct: " + ", ".join(f"{task} {found[0].job_id} {found[0].state}" if found else f"{task} none (skipped)"
                                for task, found in jobs.items()), file=sys.stderr)
