"""A real Airflow deployment for tests: what every one has, how one is configured, and the local one.

A test deployment is a :class:`Deployment`: the URL its API server answers on (``base``), the
environment of an ``airflow`` command against its metadata database (``env``), Airflow's REST API
signed in as the test user (``api()``, a :class:`RestClient`) and the log of each of its components
(``log_tail(name)``). Two kinds run here:

- :class:`LocalDeployment`: ``airflow api-server``, ``scheduler`` (LocalExecutor), ``dag-processor``
  and ``triggerer``, each a process the test owns (started and ended by :mod:`support.processes`),
  on one Airflow home, port and SQLite file; a component can be stopped, frozen and started again.
  :func:`deployment_with_dag` is one migrated and running, its DAG parsed and unpaused.
- ``support.celery_hosts.CeleryDeployment``: docker-compose.yaml's Celery topology (PostgreSQL,
  Redis, workers and triggerers on hosts of their own).

:func:`airflow_env` configures a local deployment (and ``support.concurrent_deployments``' homes)
the way ``include/demo.sh`` configures ``airflow dags test``: this checkout's ``dags/``, ``plugins/``
and Slurm provider source (first on ``PYTHONPATH``, so it wins over any installed copy), the local
cluster's connections from the environment, and one known user of the simple auth manager. Like
docker-compose.yaml's deployment it has the cluster policy and, once :func:`migrate` ran, the
cluster pools. :func:`airflow`, :func:`run_cli` and :func:`dag_run_records` run commands against
such a deployment's database.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cryptography.fernet import Fernet

from support import migrated_db, processes
from support.localcluster import poll_until

REPO = Path(__file__).resolve().parents[2]
USER, PASSWORD = "admin", "vcloud-admin-pw"


# --------------------------------------------------------------------------- configuration and commands


def airflow_env(home: Path, port: int, project_dir: str, *, schedule: str = "none",
                first_poll_delay: float = 1, short_job_wait: float | None = None) -> dict[str, str]:
    """Environment of every Airflow command of one test deployment.

    ``project_dir`` replaces the local profile's ``paths.base``, so the run's data, code and outputs
    collide with no other test. ``schedule`` is the DAG's retraining schedule
    (``VCLOUD_TRAINING_SCHEDULE``); DAGs start paused. Keep ``first_poll_delay`` >= 10 s wherever a
    real triggerer runs the triggers (Airflow 3.3's scheduler loses an event that arrives within
    ~5 s of the deferral); 1 s is fine for ``airflow dags test``, which runs them inline.
    ``short_job_wait``: how long a job task watches its job itself before deferring
    (``VCLOUD_SHORT_JOB_WAIT``; None: as shipped); 0 has every job task defer at once, for a test
    whose gesture needs the tiny config's seconds-long stages watched by a trigger.
    """
    env = dict(os.environ)
    # include/airflow: the deployment's cluster policy (airflow_local_settings), as docker-compose.yaml
    # installs it: each run's job tasks wait in the pool of its cluster connection.
    pythonpath = os.pathsep.join([str(REPO / "providers" / "slurm" / "src"), str(REPO / "plugins"),
                                  str(REPO / "trainer" / "src"), str(REPO), str(REPO / "include" / "airflow")])
    env.update({
        "PYTHONPATH": pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__LOGGING__NAMESPACE_LEVELS": "asyncssh=WARNING paramiko=WARNING",
        "VCLOUD_PROFILE_OVERRIDES": json.dumps({"local": {"paths.base": project_dir}}),
        "VCLOUD_POLL_INTERVAL": "2",
        "VCLOUD_MAX_POLL_INTERVAL": "5",
        "VCLOUD_FIRST_POLL_DELAY": str(first_poll_delay),
        "VCLOUD_TRAINING_SCHEDULE": schedule,
        # A task lost with its worker (or a step that found the login node down) is tried again after
        # 15 s, not the shipped 2 minutes: what the retry does is the same, sooner.
        "VCLOUD_RETRY_DELAY": "15",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        # an `airflow ...` found on PATH (a command a component or a test starts) is this interpreter's
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": "tests.support.sqlite_settings.CONNECT_ARGS",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__LAZY_LOAD_PLUGINS": "False",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        # The DAG file does not change while a test runs: parsed once at start (and again every 10
        # minutes), not every 30 s (a second of CPU each time, in every deployment of the suite).
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
        # The secrets every component of the deployment shares, as docker-compose.yaml hands them in
        # (otherwise each component would make up its own in an airflow.cfg of its home).
        "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
    })
    if short_job_wait is not None:
        env["VCLOUD_SHORT_JOB_WAIT"] = str(short_job_wait)
    else:
        env.pop("VCLOUD_SHORT_JOB_WAIT", None)
    (home / "passwords.json").write_text(json.dumps({USER: PASSWORD}))
    return env


def run_cli(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run an ``airflow`` (or python) command; fail with its stderr tail."""
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(argv[:4])} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc


def airflow(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_cli([sys.executable, "-m", "airflow", *args], env, timeout)


POOL_SLOTS = 8
"""Jobs a test deployment may have in flight per cluster connection: enough for tests that run a few
runs at once on the one local cluster."""


CONFIG_NOTE = "# Each component's settings come from its environment (support.deployment.airflow_env).\n"


def migrate(env: dict[str, str], pool_slots: int = POOL_SLOTS) -> None:
    """Migrate the deployment's database and create the pool of each profile's cluster connection,
    as docker-compose.yaml's airflow-init does (``python -m vcloud_pipeline.dag.pools --create``).

    The home also gets the ``airflow.cfg`` an ``airflow db migrate`` there would have written (empty:
    the environment says everything): without one, the components started next would each write
    their own at once."""
    config = Path(env["AIRFLOW_HOME"]) / "airflow.cfg"
    if not config.exists():
        config.write_text(CONFIG_NOTE)
    migrated_db.migrate(env)
    run_cli([sys.executable, "-m", "vcloud_pipeline.dag.pools", "--create", "--slots", str(pool_slots)], env, 300)


RECORDS_SCRIPT = """\
import json, sys
from airflow.models.dagrun import DagRun
from airflow.models.taskinstance import TaskInstance
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
dag_id = sys.argv[1]
with create_session() as s:
    runs = s.query(DagRun).filter_by(dag_id=dag_id).all()
    out = []
    for run in runs:
        tis = s.query(TaskInstance).filter_by(dag_id=dag_id, run_id=run.run_id).all()
        rows = s.query(XComModel).filter_by(dag_id=dag_id, run_id=run.run_id, key="return_value").all()
        out.append(dict(run_id=run.run_id, state=getattr(run.state, "value", run.state), conf=run.conf,
                        run_type=getattr(run.run_type, "value", run.run_type),
                        logical_date=run.logical_date.isoformat() if run.logical_date else None,
                        task_states={ti.task_id: getattr(ti.state, "value", ti.state) for ti in tis},
                        values={r.task_id: XComModel.deserialize_value(r) for r in rows}))
print(json.dumps(out))
"""


def dag_run_records(dag_id: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """Every run of ``dag_id`` in the deployment's database: state, type, conf, task states, XComs."""
    out = run_cli([sys.executable, "-c", RECORDS_SCRIPT, dag_id], env, 120).stdout
    return json.loads(out.strip().splitlines()[-1])


# --------------------------------------------------------------------------- the REST API


def wait_for_api(base: str, *, timeout: float, gone: Callable[[], str | None],
                 where: Callable[[], str]) -> None:
    """Until the API server at ``base`` answers its health check. ``gone`` says why waiting is pointless
    (a process that exited early, and where to read why) or None; ``where`` says, at a timeout, where to read on."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        reason = gone()
        assert reason is None, reason
        assert time.monotonic() < deadline, f"API server not up within {timeout:.0f} s; {where()}"
        time.sleep(1)


class RestClient:
    """Airflow's public REST API as the test user (a JWT from the simple auth manager)."""

    def __init__(self, base: str) -> None:
        self.base = base
        body = json.dumps({"username": USER, "password": PASSWORD}).encode()
        request = urllib.request.Request(f"{base}/auth/token", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            self.token = json.load(resp)["access_token"]

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.base}{path}", data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
            "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def trigger(self, dag_id: str, run_id: str, conf: dict[str, Any]) -> str:
        """Start a run of ``dag_id`` as the UI's trigger form does; returns its run id."""
        status, body = self.call("POST", f"/api/v2/dags/{dag_id}/dagRuns",
                                 {"dag_run_id": run_id, "logical_date": None, "conf": conf})
        assert status == 200, f"triggering {dag_id}: {status} {body}"
        return run_id

    def get(self, path: str) -> Any:
        status, body = self.call("GET", path)
        assert status == 200, f"GET {path}: {status} {body}"
        return body


# --------------------------------------------------------------------------- deployments


class Deployment(Protocol):
    """What a test reads of any running deployment, whatever runs its components."""

    @property
    def base(self) -> str:
        """The API server's URL (``AIRFLOW__API__BASE_URL``)."""
        ...

    @property
    def env(self) -> dict[str, str]:
        """The environment of an ``airflow`` command (or a script) against the deployment's metadata
        database."""
        ...

    def api(self) -> RestClient:
        """The REST API, signed in as :data:`USER`."""
        ...

    def log_tail(self, name: str, chars: int = 3000) -> str:
        """The end of component (or host) ``name``'s log, headed by the log's path."""
        ...


def file_tail(path: Path, chars: int = 3000) -> str:
    """The last ``chars`` of a log file, headed by its path (``(none)`` where it is missing)."""
    text = path.read_text(errors="replace")[-chars:] if path.exists() else "(none)"
    return f"--- {path} ---\n{text}"


COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


class LocalDeployment:
    """The four components on one Airflow home, each a process of its own; ``stop``/``start`` restart one.

    ``airflow api-server``, ``scheduler`` (LocalExecutor), ``dag-processor`` and ``triggerer`` each
    run in their own session (so a component and its children can be stopped together), configured
    by :func:`airflow_env`, with their output in ``<home>/<name>.log`` (a restarted component appends
    to its log). As a context manager it starts the four, waits for the API server and, at the end,
    stops whatever of them still runs (a frozen one is thawed first).
    """

    def __init__(self, env: dict[str, str], home: Path) -> None:
        self.env = {**env, "AIRFLOW__CORE__EXECUTOR": "LocalExecutor"}
        self.home = home
        self.base = env["AIRFLOW__API__BASE_URL"]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def api(self) -> RestClient:
        return RestClient(self.base)

    def start(self, name: str, command: str | None = None) -> subprocess.Popen[bytes]:
        """Start ``airflow <command>`` (default: ``name``) as the component called ``name``."""
        assert name not in self.procs or self.procs[name].poll() is not None, f"{name} is running"
        self.procs[name] = processes.start_logged([sys.executable, "-m", "airflow", command or name],
                                                  self.env, self.home / f"{name}.log")
        return self.procs[name]

    def send(self, name: str, sig: int) -> None:
        """Send ``sig`` to the component's whole process group (e.g. SIGSTOP/SIGCONT to freeze it)."""
        os.killpg(self.procs[name].pid, sig)

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 120) -> int | None:
        """Send ``sig`` to the component (SIGKILL: to its whole process group, as a crash takes its
        children with it); after ``timeout`` seconds, or once it ended, whatever of its group is left ends too."""
        return processes.stop(self.procs[name], sig, grace=timeout, whole_group=sig == signal.SIGKILL)

    def wait_until_up(self, timeout: float = 300) -> None:
        def gone() -> str | None:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            return f"{dead} exited early; see {self.log_tail(dead[0])}" if dead else None

        wait_for_api(self.base, timeout=timeout, gone=gone, where=lambda: f"\n{self.log_tail('api-server')}")

    def log_tail(self, name: str, chars: int = 3000) -> str:
        return file_tail(self.home / f"{name}.log", chars)

    def __enter__(self) -> LocalDeployment:
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
                        pool_slots: int | None = None) -> Iterator[tuple[LocalDeployment, RestClient]]:
    """A migrated, running deployment whose DAG processor has parsed ``dag_id``, unpaused; its cluster
    pools have ``pool_slots`` slots (default :data:`POOL_SLOTS`)."""
    migrate(env, pool_slots or POOL_SLOTS)
    with LocalDeployment(env, home) as deployment:
        api = deployment.api()
        poll_until(lambda: api.call("GET", f"/api/v2/dags/{dag_id}")[0] == 200, timeout=300, interval=2,
                   what=f"the DAG processor to parse {dag_id}")
        status, body = api.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
        assert status == 200, body
        yield deployment, api


if TYPE_CHECKING:
    def _conforms(deployment: LocalDeployment) -> Deployment:
        return deployment
