"""docker-compose.yaml's topology as processes on this machine, its workers and triggerers on hosts of their own.

PostgreSQL and Redis (Debian's packages, private instances: own data directory, own port, Redis
with ``requirepass``), the API server, the scheduler and the DAG processor run on this machine; each
Celery worker and each triggerer runs on a :class:`Host`: a network namespace on the local
cluster's bridge (own address), its own hostname (``unshare --uts``, with its own /etc/hosts bound
in a private mount namespace, so Airflow's ``task_instance.hostname`` and the triggerer job's
``hostname`` name it) and its own files (HOME with ``~/.ssh``: ssh config, known_hosts, key,
ControlMaster directory; ``connections.json``; Airflow home and logs). Inside a namespace
127.0.0.1 is the namespace's own loopback, so everything the hosts reach (PostgreSQL, Redis, the
API server's Execution API, the login node's sshd) listens on the bridge address.

Settings come from docker-compose.yaml itself (:func:`compose_settings`: ``x-airflow-common``'s
environment and each service's own, with the secrets filled in as ``.env`` would); only addresses,
ports, paths and the auth manager (the compose file's FAB is not installed here) are replaced.
A host is killed as a machine dies: SIGKILL to every process started in it and all their
descendants; the namespaces and veths created here are removed afterwards, even on failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from support import processes
from support.deployment import PASSWORD, USER, Deployment, RestClient, file_tail, run_cli
from support.localcluster import LocalCluster, otp_host_block, poll_until
from support.ports import free_port
from support.private_login import PrivateLogin

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yaml"
BRIDGE = "vcbr0"
BRIDGE_ADDR = "10.203.0.1"
"""The local cluster's bridge and this machine's address on it (include/local_cluster/cluster.sh)."""
HOST_ADDRS = range(200, 250)
"""Addresses 10.203.0.200-249 for hosts (the cluster's nodes use .11 and up)."""
NS_PREFIX = "vch-"
"""Namespaces of these hosts; never ``vcloud-`` (the local cluster's own nodes)."""
PG_BIN = Path("/usr/lib/postgresql/15/bin")
SERVICES = {"api-server": "airflow-apiserver", "scheduler": "airflow-scheduler",
            "dag-processor": "airflow-dag-processor", "worker": "airflow-worker", "triggerer": "airflow-triggerer"}
"""Component -> its service in docker-compose.yaml."""
SECRET_VARIABLES = ("POSTGRES_PASSWORD", "REDIS_PASSWORD", "AIRFLOW_FERNET_KEY", "AIRFLOW_JWT_SECRET")


# --------------------------------------------------------------------------- settings from the compose file


def interpolate(value: str, variables: Mapping[str, str]) -> str:
    """docker-compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?message}`` with ``variables``
    (``.env``); a required variable that is missing fails with the compose file's own message."""
    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3) or ""
        if variables.get(name):
            return variables[name]
        if op == ":?":
            raise KeyError(f"{name}: {arg}")
        return arg if op == ":-" else ""

    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", one, value).replace("$$", "$")


def compose_settings(compose: Mapping[str, Any], component: str, variables: Mapping[str, str]) -> dict[str, str]:
    """The environment docker-compose gives ``component``'s service, interpolated with ``variables``."""
    service = compose["services"][SERVICES[component]]
    return {key: interpolate(str(value), variables) for key, value in service["environment"].items()}


def compose_command(compose: Mapping[str, Any], component: str, variables: Mapping[str, str]) -> list[str]:
    """The service's ``command`` (the argv after ``airflow``), interpolated."""
    return interpolate(compose["services"][SERVICES[component]]["command"], variables).split()


def new_secrets() -> dict[str, str]:
    """The four secrets ``.env`` must set, made as include/docker/env.example says."""
    from cryptography.fernet import Fernet

    return {"POSTGRES_PASSWORD": secrets.token_hex(24), "REDIS_PASSWORD": secrets.token_hex(24),
            "AIRFLOW_FERNET_KEY": Fernet.generate_key().decode(), "AIRFLOW_JWT_SECRET": secrets.token_hex(32)}


@dataclass
class Addresses:
    """Where the machine's services listen (the bridge address) and the Airflow side's paths."""

    pg_port: int
    redis_port: int
    api_port: int
    scheduler_health_port: int
    project_dir: str
    profile_overrides: dict[str, Any]

    @property
    def base_url(self) -> str:
        return f"http://{BRIDGE_ADDR}:{self.api_port}"


def component_env(compose: Mapping[str, Any], component: str, variables: Mapping[str, str], where: Addresses,
                  home: Path, *, secrets_file: Path | None = None, extra: Mapping[str, str] | None = None,
                  base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of one component: the compose file's for its service, with addresses, ports
    and paths of this machine, ``home`` as its Airflow home, and ``secrets_file`` as the workers'
    connections file where the compose file mounts one."""
    settings = compose_settings(compose, component, variables)
    pw_pg, pw_redis = variables["POSTGRES_PASSWORD"], variables["REDIS_PASSWORD"]
    db = f"airflow:{pw_pg}@{BRIDGE_ADDR}:{where.pg_port}/airflow"
    replaced = {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://{db}",
        "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql+psycopg2://{db}",
        "AIRFLOW__CELERY__BROKER_URL": f"redis://:{pw_redis}@{BRIDGE_ADDR}:{where.redis_port}/0",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{where.base_url}/execution/",
        "AIRFLOW__API__BASE_URL": where.base_url,
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "PYTHONPATH": os.pathsep.join([str(REPO / "providers" / "slurm" / "src"), str(REPO / "plugins"),
                                       str(REPO / "trainer" / "src"), str(REPO), str(REPO / "include" / "airflow")]),
        # FAB (the compose file's auth manager) is not installed here: Airflow's simple one, one user.
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
    }
    for key in replaced:
        assert key in settings, f"docker-compose.yaml no longer sets {key} for {component}"
    settings.update(replaced)
    if "AIRFLOW__WORKERS__SECRETS_BACKEND_KWARGS" in settings:
        assert secrets_file is not None, f"{component} reads a connections file: give it one"
        settings["AIRFLOW__WORKERS__SECRETS_BACKEND_KWARGS"] = json.dumps({"connections_file_path": str(secrets_file)})
        settings["VCLOUD_CONNECTIONS_FILE"] = str(secrets_file)
    settings["VCLOUD_PROFILE_OVERRIDES"] = json.dumps(where.profile_overrides)
    env = {key: value for key, value in (base if base is not None else os.environ).items()
           if not key.startswith(("AIRFLOW", "VCLOUD_")) and key != "PYTHONPATH"}
    env.update(settings)
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "AIRFLOW__API__HOST": BRIDGE_ADDR,
        "AIRFLOW__API__PORT": str(where.api_port),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(where.scheduler_health_port),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__LOGGING__NAMESPACE_LEVELS": "asyncssh=WARNING paramiko=WARNING",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
    })
    env.update(extra or {})
    home.mkdir(parents=True, exist_ok=True)
    (home / "passwords.json").write_text(json.dumps({USER: PASSWORD}))
    return env


# --------------------------------------------------------------------------- processes


class Postgres:
    """A private PostgreSQL cluster: own data directory and port, superuser ``airflow`` with a password."""

    def __init__(self, directory: Path, port: int, password: str) -> None:
        self.directory, self.port, self.password = directory, port, password
        self.data = directory / "data"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        shutil.chown(self.directory, "postgres", "postgres")
        pwfile = self.directory / "pw"
        pwfile.write_text(self.password + "\n")
        shutil.chown(pwfile, "postgres", "postgres")
        subprocess.run([str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "airflow", f"--pwfile={pwfile}",
                        "--auth=scram-sha-256", "-E", "UTF8"], user="postgres", group="postgres", check=True,
                       capture_output=True, timeout=300, cwd=self.directory)
        pwfile.unlink()
        # The hosts on the bridge (and this machine, which is on it too) log in with the password.
        (self.data / "pg_hba.conf").write_text("local all all scram-sha-256\n"
                                               f"host all airflow {BRIDGE_ADDR.rsplit('.', 1)[0]}.0/24 scram-sha-256\n")
        self.proc = processes.start_logged([str(PG_BIN / "postgres"), "-D", str(self.data), "-p", str(self.port),
                            "-c", f"listen_addresses={BRIDGE_ADDR}", "-c", f"unix_socket_directories={self.directory}",
                            "-c", "fsync=off", "-c", "max_connections=200"], {"PATH": "/usr/bin:/bin"},
                           self.directory / "postgres.log", user="postgres", group="postgres", cwd=self.directory)
        poll_until(self._create_database, timeout=120, interval=1, what=f"PostgreSQL on port {self.port}")

    def _create_database(self) -> bool:
        import psycopg2

        assert self.proc is not None and self.proc.poll() is None, file_tail(self.directory / "postgres.log")
        try:
            conn = psycopg2.connect(host=BRIDGE_ADDR, port=self.port, user="airflow", password=self.password,
                                    dbname="postgres", connect_timeout=5)
        except psycopg2.OperationalError:
            return False
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE airflow")
        conn.close()
        return True

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        import psycopg2

        with contextlib.closing(psycopg2.connect(host=BRIDGE_ADDR, port=self.port, user="airflow",
                                                 password=self.password, dbname="airflow")) as conn:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchall()

    def stop(self) -> None:
        if self.proc is not None:
            processes.stop(self.proc, signal.SIGINT)  # fast shutdown


class Redis:
    """A private redis-server: own port and directory, ``requirepass``, nothing saved."""

    def __init__(self, directory: Path, port: int, password: str) -> None:
        self.directory, self.port, self.password = directory, port, password
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "redis.conf"
        config.write_text(f"port {self.port}\nbind {BRIDGE_ADDR}\nrequirepass {self.password}\nsave \"\"\n"
                          f"appendonly no\ndir {self.directory}\ndaemonize no\nprotected-mode yes\n")
        config.chmod(0o600)
        self.proc = processes.start_logged(["/usr/bin/redis-server", str(config)], {"PATH": "/usr/bin:/bin"},
                           self.directory / "redis.log")
        poll_until(self._pong, timeout=60, interval=0.5, what=f"redis-server on port {self.port}")

    def _pong(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, file_tail(self.directory / "redis.log")
        out = subprocess.run(["redis-cli", "-h", BRIDGE_ADDR, "-p", str(self.port), "ping"], capture_output=True,
                             text=True, env={"REDISCLI_AUTH": self.password, "PATH": "/usr/bin:/bin"}, timeout=10)
        return "PONG" in out.stdout

    def stop(self) -> None:
        if self.proc is not None:
            processes.stop(self.proc, grace=30)


@dataclass
class Host:
    """A machine of its own: network namespace with a veth on the bridge, hostname, files."""

    name: str
    address: str
    directory: Path
    namespace: str
    veth: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def home(self) -> Path:
        """HOME: short, as ``~/.ssh/cm/<socket>`` must fit a Unix socket path (108 bytes)."""
        return self.directory

    def create(self) -> None:
        """The namespace, its veth pair on the bridge, its address, its /etc/hosts and HOME."""
        subprocess.run(["ip", "netns", "add", self.namespace], check=True, capture_output=True, timeout=30)
        for argv in (["ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.namespace],
                     ["ip", "link", "set", self.veth, "master", BRIDGE],
                     ["ip", "link", "set", self.veth, "up"],
                     ["ip", "-n", self.namespace, "link", "set", "lo", "up"],
                     ["ip", "-n", self.namespace, "addr", "add", f"{self.address}/24", "dev", "eth0"],
                     ["ip", "-n", self.namespace, "link", "set", "eth0", "up"]):
            subprocess.run(argv, check=True, capture_output=True, timeout=30)
        self.home.mkdir(parents=True, exist_ok=True)
        (self.directory / "hosts").write_text(f"127.0.0.1\tlocalhost\n{self.address}\t{self.name}\n"
                                              f"{BRIDGE_ADDR}\tairflow-services\n")

    def start(self, argv: list[str], env: Mapping[str, str], log_name: str) -> subprocess.Popen[bytes]:
        """``argv`` on this host: its network namespace, its hostname, its /etc/hosts, its HOME."""
        wrapped = ["nsenter", f"--net=/run/netns/{self.namespace}", "unshare", "--uts", "--mount",
                   "--propagation", "private", "--", "sh", "-c",
                   'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"', "host",
                   self.name, str(self.directory / "hosts"), *argv]
        proc = processes.start_logged(wrapped, {**env, "HOME": str(self.home)}, self.directory / f"{log_name}.log")
        self.procs.append(proc)
        return proc

    def run(self, argv: list[str], env: Mapping[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        wrapped = ["nsenter", f"--net=/run/netns/{self.namespace}", "unshare", "--uts", "--", "sh", "-c",
                   'hostname "$1" && shift && exec "$@"', "host", self.name, *argv]
        return subprocess.run(wrapped, env={**env, "HOME": str(self.home)}, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def kill(self) -> None:
        """The machine dies: every process started on it, and all they started, get SIGKILL."""
        for proc in self.procs:
            processes.kill_tree(proc.pid)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        self.procs.clear()

    def remove(self) -> None:
        self.kill()
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True, timeout=30)
        if subprocess.run(["ip", "link", "show", self.veth], capture_output=True, timeout=30).returncode == 0:
            subprocess.run(["ip", "link", "del", self.veth], capture_output=True, timeout=30)


def _addresses_in_use() -> set[str]:
    out = subprocess.run(["ip", "-all", "netns", "exec", "ip", "-4", "-o", "addr"], capture_output=True, text=True,
                         timeout=60).stdout
    out += subprocess.run(["ip", "neigh", "show", "dev", BRIDGE], capture_output=True, text=True, timeout=30).stdout
    return set(re.findall(r"10\.203\.0\.\d+", out))


def new_hosts(names: list[str], directory: Path) -> list[Host]:
    """Hosts with free addresses on the bridge and namespace/veth names of their own."""
    token = secrets.token_hex(3)
    used = _addresses_in_use()
    free = [f"10.203.0.{n}" for n in HOST_ADDRS if f"10.203.0.{n}" not in used]
    offset = int(token, 16) % max(1, len(free) - len(names))
    return [Host(name, free[offset + i], directory / str(i), f"{NS_PREFIX}{token}-{i}", f"vh{token}{i}")
            for i, name in enumerate(names)]


# --------------------------------------------------------------------------- the deployment


class CeleryDeployment:
    """PostgreSQL, Redis, API server, scheduler, DAG processor here; workers and triggerers on hosts.

    A ``support.deployment.Deployment``: ``base``, ``env`` (of an ``airflow`` command against its
    PostgreSQL), ``api()`` and ``log_tail`` of a component here or of a host."""

    def __init__(self, directory: Path, cluster: LocalCluster, *, project_dir: str, conn_id: str,
                 queue: str, connection: Mapping[str, Any], settings: Mapping[str, str],
                 key_login: Mapping[str, Any] | None = None) -> None:
        """``key_login``: a key-based connection every host gets (its key copied to the host's ~/.ssh)
        instead of the OpenSSH one that needs a person's ControlMaster."""
        self.directory = directory
        self.key_login = dict(key_login) if key_login is not None else None
        self.cluster = cluster
        self.compose = yaml.safe_load(COMPOSE.read_text())
        # Job tasks defer at once (VCLOUD_SHORT_JOB_WAIT 0): the tests kill a triggerer host while it
        # watches one of the tiny config's stages, which end within seconds. A worker host's lost task is
        # tried again 15 s after the scheduler gives up on it (VCLOUD_RETRY_DELAY), not 2 minutes.
        self.variables = {**new_secrets(), "VCLOUD_DEFAULT_PROFILE": "local", "VCLOUD_TRAINING_SCHEDULE": "none",
                          "VCLOUD_POLL_INTERVAL": "2", "VCLOUD_MAX_POLL_INTERVAL": "5",
                          "VCLOUD_FIRST_POLL_DELAY": "10", "VCLOUD_SHORT_JOB_WAIT": "0",
                          "VCLOUD_RETRY_DELAY": "15"}
        self.queue = queue
        self.conn_id = conn_id
        self.connection = dict(connection)
        self.settings = dict(settings)
        self.where = Addresses(free_port(), free_port(), free_port(), free_port(), project_dir,
                               {"local": {"paths.base": project_dir, "connection.conn_id": conn_id,
                                          "connection.queue": queue}})
        self.postgres = Postgres(directory / "postgres", self.where.pg_port, self.variables["POSTGRES_PASSWORD"])
        self.redis = Redis(directory / "redis", self.where.redis_port, self.variables["REDIS_PASSWORD"])
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.hosts: dict[str, Host] = {}
        self.host_queues: dict[str, tuple[str, str]] = {}
        """Host name -> (component, queues it consumes)."""
        self.startup_seconds: float | None = None

    @property
    def base(self) -> str:
        return self.where.base_url

    def env_of(self, component: str, home: Path, secrets_file: Path | None = None) -> dict[str, str]:
        """The environment of ``component`` on Airflow home ``home``."""
        return component_env(self.compose, component, self.variables, self.where, home,
                             secrets_file=secrets_file, extra=self.settings)

    @cached_property
    def env(self) -> dict[str, str]:
        """The environment of an ``airflow`` command against this deployment's database: the
        scheduler's, on the home where the database is migrated (``init``)."""
        return self.env_of("scheduler", self.directory / "init")

    def api(self) -> RestClient:
        return RestClient(self.base)

    def log_tail(self, name: str, chars: int = 3000) -> str:
        """The log of component ``name`` on this machine, or of the component on host ``name``."""
        if name in self.hosts:
            return file_tail(self.hosts[name].directory / f"{self.host_queues[name][0]}.log", chars)
        return file_tail(self.directory / name / f"{name}.log", chars)

    # --- hosts

    def _write_host_files(self, host: Host, with_key: bool) -> Path:
        """The host's ~/.ssh (config of the alias, known_hosts pinning the login node, the key where a
        person logs in) and its connections.json."""
        ssh = host.home / ".ssh"
        (ssh / "cm").mkdir(parents=True, exist_ok=True)
        ssh.chmod(0o700)
        host_key = self.connection["host_key"]
        (ssh / "known_hosts").write_text(f"[{BRIDGE_ADDR}]:{self.connection['port']} {host_key}\n")
        (ssh / "config").write_text(otp_host_block(self.connection["alias"], BRIDGE_ADDR, self.connection["port"],
                                                   self.cluster.user, ssh / "known_hosts", ssh / "cm" / "%C"))
        if with_key or self.key_login:  # with_key: the one-time password a person types on this host
            shutil.copy(self.cluster.key_file, ssh / "id_login")
            (ssh / "id_login").chmod(0o600)
        secrets_dir = host.home / "secrets"
        secrets_dir.mkdir(exist_ok=True)
        connections = secrets_dir / "connections.json"
        if self.key_login is not None:  # the key on every host: each can run the connection's work
            conn = {**self.key_login, "extra": {**self.key_login["extra"], "key_file": str(ssh / "id_login")}}
        else:
            conn = {"conn_type": "ssh", "host": self.connection["alias"], "login": self.cluster.user,
                    "extra": {"transport": "openssh", "ssh_alias": self.connection["alias"],
                              "ssh_config_file": str(ssh / "config"), "require_control_master": True}}
        connections.write_text(json.dumps({self.conn_id: conn}))
        return connections

    def open_master(self, host: Host) -> None:
        """A person logs in once on ``host`` (here with the key): the master runs until the host dies.

        ``ControlMaster=auto``, as the lapsed-master message says: it replaces the socket a killed
        master left behind."""
        ssh = host.home / ".ssh"
        host.start(["ssh", "-F", str(ssh / "config"), "-N", "-o", "ControlMaster=auto", "-o", "ControlPersist=no",
                    "-o", "PubkeyAuthentication=yes", "-o", "IdentitiesOnly=yes", "-i", str(ssh / "id_login"),
                    self.connection["alias"]], {"PATH": "/usr/bin:/bin"}, "ssh-master")
        check = ["ssh", "-F", str(ssh / "config"), "-O", "check", self.connection["alias"]]
        poll_until(lambda: host.run(check, {"PATH": "/usr/bin:/bin"}).returncode == 0, timeout=60, interval=0.5,
                   what=f"the ControlMaster on {host.name}")

    def start_on_host(self, host: Host, component: str) -> None:
        """The compose service's command for ``component`` on ``host``, consuming its queues."""
        queues = self.host_queues[host.name][1]
        argv = compose_command(self.compose, component, {**self.variables, "VCLOUD_QUEUES": queues})
        if component == "worker":
            argv += ["--concurrency", "4"]
        env = self.env_of(component, host.directory / "airflow", host.home / "secrets" / "connections.json")
        host.start([sys.executable, "-m", "airflow", *argv], env, component)

    def reboot(self, host: Host) -> None:
        """The host comes back: its person opens the master again (where it holds one), its component starts."""
        component, queues = self.host_queues[host.name]
        if self.key_login is None and self.queue in queues.split(","):
            self.open_master(host)
        self.start_on_host(host, component)

    # --- the whole

    def start(self, hosts: Mapping[str, tuple[str, str]]) -> None:
        """``hosts``: name -> (``worker`` or ``triggerer``, the queues it consumes, comma-separated)."""
        started = time.monotonic()
        self.host_queues = dict(hosts)
        for host in new_hosts(list(hosts), self.directory / "h"):
            self.hosts[host.name] = host
            host.create()
        self.postgres.start()
        self.redis.start()
        run_cli([sys.executable, "-m", "airflow", "db", "migrate"], self.env, 600)
        run_cli([sys.executable, "-m", "vcloud_pipeline.dag.pools", "--create", "--slots", "8"], self.env, 300)
        for component in ("api-server", "scheduler", "dag-processor"):
            home = self.directory / component
            argv = compose_command(self.compose, component, self.variables)
            self.procs[component] = processes.start_logged([sys.executable, "-m", "airflow", *argv],
                                                           self.env_of(component, home),
                                                           home / f"{component}.log")
        for name, (component, queues) in hosts.items():
            host = self.hosts[name]
            self._write_host_files(host, with_key=self.key_login is None and self.queue in queues.split(","))
            self.reboot(host)
        self.wait_healthy(timeout=600)
        self.startup_seconds = time.monotonic() - started

    def wait_healthy(self, timeout: float) -> None:
        """The API server's health (metadatabase, scheduler, triggerer, DAG processor), each triggerer
        host's job alive, and each worker answering Celery's ping (the compose file's healthcheck)."""

        def healthy() -> bool:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            dead += [h.name for h in self.hosts.values() if any(p.poll() is not None for p in h.procs)]
            assert not dead, f"{dead} exited early\n{self.diagnose()}"
            try:
                with urllib.request.urlopen(f"{self.base}/api/v2/monitor/health", timeout=10) as resp:
                    health = json.load(resp)
            except OSError:
                return False
            if any(part.get("status") != "healthy" for part in health.values()):
                return False
            alive = self.alive_triggerer_hosts()
            triggerers = {n for n, (c, _) in self.host_queues.items() if c == "triggerer"}
            if not triggerers <= alive:
                return False
            return all(self.worker_answers(n) for n, (c, _) in self.host_queues.items() if c == "worker")

        poll_until(healthy, timeout=timeout, interval=2, what="every component of the Celery deployment healthy")
        self.api()  # the user can sign in

    def alive_triggerer_hosts(self) -> set[str]:
        rows = self.postgres.query("SELECT hostname FROM job WHERE job_type = 'TriggererJob' AND state = 'running' "
                                   "AND latest_heartbeat > now() - interval '30 seconds'")
        return {row[0] for row in rows}

    def worker_answers(self, name: str) -> bool:
        """The compose file's worker healthcheck: ``celery inspect ping -d celery@<hostname>``."""
        env = self.env_of("worker", self.directory / "probe", self.directory / "probe" / "none.json")
        out = subprocess.run([sys.executable, "-m", "celery", "--app",
                              "airflow.providers.celery.executors.celery_executor.app", "inspect", "ping",
                              "-d", f"celery@{name}", "--timeout", "5"],
                             env=env, capture_output=True, text=True, timeout=120)
        return out.returncode == 0 and "pong" in out.stdout

    def diagnose(self) -> str:
        parts = [self.log_tail(c, 2000) for c in self.procs]
        parts += [file_tail(h.directory / f"{c}.log", 2000) for h in self.hosts.values()
                  for c in ("worker", "triggerer") if (h.directory / f"{c}.log").exists()]
        return "\n".join(parts)

    def stop(self) -> None:
        """Everything this deployment started, by pid; the namespaces and veths it created."""
        for host in self.hosts.values():
            host.remove()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            processes.kill_tree(proc.pid)
        self.redis.stop()
        self.postgres.stop()


@contextlib.contextmanager
def celery_deployment(cluster: LocalCluster, hosts: Mapping[str, tuple[str, str]], *, queue: str,
                      conn_id: str = "vcloud_celery_otp",
                      settings: Mapping[str, str] | None = None,
                      key_login: bool = False) -> Iterator[CeleryDeployment]:
    """A running deployment with a private login sshd on the bridge; everything is removed afterwards.

    ``key_login``: every host logs in with the cluster's key (its default connection's way) instead
    of through a person's ControlMaster."""
    directory = Path(tempfile.mkdtemp(prefix="vch-", dir="/tmp"))  # short: ControlMaster socket paths
    directory.chmod(0o755)  # PostgreSQL (its own user) reaches its directory below
    (directory / "login").mkdir()
    login = PrivateLogin(cluster, directory / "login", listen=BRIDGE_ADDR)
    project_dir = cluster.test_dir()
    deployment = CeleryDeployment(directory, cluster, project_dir=project_dir, conn_id=conn_id, queue=queue,
                                  connection={"alias": "cluster-login", "port": login.port,
                                              "host_key": cluster.connection()["extra"]["host_key"]},
                                  settings=settings or {},
                                  key_login=login.connection() if key_login else None)
    try:
        login.start()
        deployment.start(hosts)
        yield deployment
    finally:
        try:
            deployment.stop()
        finally:
            login.stop()
            if os.environ.get("VCLOUD_KEEP_CELERY_HOSTS"):  # the components' logs, for a failure's reader
                print(f"kept {directory}", file=sys.stderr)
            else:
                shutil.rmtree(directory, ignore_errors=True)


if TYPE_CHECKING:
    def _conforms(deployment: CeleryDeployment) -> Deployment:
        return deployment
