"""The local Slurm cluster as the tests see it: its files, its SSH login and a few root-side verbs.

Jobs and user-side Slurm commands go through the real SSH login as the unprivileged cluster user.
Fault injection (draining a node, requeueing a job) runs as root on this machine, never over SSH.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from support.processes import alive

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = REPO / "include" / "local_cluster" / "cluster.sh"
SSH_ALIAS = "vcloud-local"
T = TypeVar("T")


def poll_until(check: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.5) -> T:
    """Call `check` until it returns something truthy (Slurm accounting reaches slurmdbd with a lag)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def new_key_pair(directory: Path, name: str, passphrase: str = "") -> tuple[Path, str]:
    """A fresh ed25519 key pair: the private key's path and the public key line (``ssh-ed25519 AAAA...``)."""
    path = directory / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path)], check=True)
    return path, " ".join(path.with_suffix(".pub").read_text().split()[:2])


class ClusterUnavailable(RuntimeError):
    """The local cluster could not be brought up; the message says what `cluster.sh up` printed."""


def otp_host_block(alias: str, host: str, port: int | str, user: str, known_hosts: Path | str,
                   control_path: Path | str) -> str:
    """An ssh_config ``Host`` block that logs in only through its ControlMaster, like an OTP login:
    no key, no password in BatchMode, host key pinned."""
    return (f"Host {alias}\n"
            f"    HostName {host}\n"
            f"    Port {port}\n"
            f"    User {user}\n"
            f"    UserKnownHostsFile {known_hosts}\n"
            "    StrictHostKeyChecking yes\n"
            "    PubkeyAuthentication no\n"
            "    PasswordAuthentication no\n"
            "    KbdInteractiveAuthentication no\n"
            "    BatchMode yes\n"
            "    ControlMaster no\n"
            f"    ControlPath {control_path}\n")


def _master_pid(check_answer: str) -> int | None:
    """The pid in ``ssh -O check``'s ``Master running (pid=N)``."""
    match = re.search(r"Master running \(pid=(\d+)\)", check_answer)
    return int(match.group(1)) if match else None


def _exited(pid: int) -> bool:
    """Gone, or a zombie: its exit (and whatever it removed on the way) has happened."""
    return not alive(pid)


@dataclass(frozen=True)
class LocalCluster:
    state_dir: Path
    user: str
    scratch: Path
    account: str
    conn_id: str
    teammate: str = "vcloud2"
    """A second member of the project (same Slurm account and group, own key and connection)."""

    @property
    def teammate_conn_id(self) -> str:
        return f"{self.conn_id}_{self.teammate}"

    @property
    def ssh_config(self) -> Path:
        return self.state_dir / "ssh" / "config"

    @property
    def key_file(self) -> Path:
        return self.state_dir / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "ssh" / "known_hosts"

    @property
    def ssh_port(self) -> int:
        return int(self.connection()["port"])

    def connection(self, conn_id: str | None = None) -> dict:
        """The Airflow connection (as a dict) that cluster-up wrote for this cluster."""
        conns = json.loads((self.state_dir / "airflow_conn.json").read_text())
        return conns[conn_id or self.conn_id]

    def connection_env(self) -> dict[str, str]:
        """`AIRFLOW_CONN_*` variables for every connection cluster-up wrote."""
        conns = json.loads((self.state_dir / "airflow_conn.json").read_text())
        return {f"AIRFLOW_CONN_{cid.upper()}": json.dumps(c) for cid, c in conns.items()}

    def key_only_connection(self, conn_id: str | None = None) -> dict:
        """The key-based connection with its key as ``private_key`` content instead of a key file."""
        conn = self.connection(conn_id)
        extra = {k: v for k, v in conn["extra"].items() if k != "key_file"}
        return {**conn, "extra": {**extra, "private_key": self.key_file.read_text()}}

    def jobs_writing(self, directory: str) -> list[str]:
        """Ids of every job (any state, name or user) whose comment names ``directory`` as the one it
        writes (``exclusive_dir``), from accounting, which has a job's comment once the job ended."""
        from slurm_provider.cli.exclusive_submit import exclusive_dir_marker

        marker = f'"xdir":"{exclusive_dir_marker(directory)}"'
        out = self.root("sacct", "-X", "-n", "-P", "-a", "-S", "now-1days", "--format=JobIDRaw,Comment").stdout
        return sorted({line.split("|", 1)[0] for line in out.splitlines() if marker in line})

    def ssh_config_copy(self, directory: Path, control_path: Path, **options: str) -> Path:
        """The cluster's ssh_config with a ControlMaster socket of its own (and ``options`` replaced).

        A master already up on the shared socket would carry commands without checking anything
        again, e.g. a host key a test has just changed.
        """
        lines = []
        for line in self.ssh_config.read_text().splitlines():
            key = line.strip().split(" ", 1)[0]
            if key == "ControlPath":
                line = f"    ControlPath {control_path}"
            elif key in options:
                line = f"    {key} {options[key]}"
            lines.append(line)
        path = directory / "ssh_config"
        path.write_text("\n".join(lines) + "\n")
        return path

    def otp_ssh_config(self, directory: Path, control_path: Path) -> Path:
        """An ssh_config alias that logs in like an OTP login: only through its ControlMaster.

        The alias itself offers no key (``PubkeyAuthentication no``, no password in BatchMode), so
        without a master every login fails as an OTP login does when nobody types the code;
        :meth:`open_master` stands in for the person who does.
        """
        path = directory / "otp_ssh_config"
        path.write_text(otp_host_block(SSH_ALIAS, "127.0.0.1", self.ssh_port, self.user, self.known_hosts,
                                       control_path))
        return path

    def open_master(self, config: Path) -> None:
        """Open the alias's ControlMaster as a person would after typing the code (here: with the key)."""
        # The master keeps ssh's stdio: a pipe would never reach EOF, so its messages go to a file.
        with tempfile.TemporaryFile() as messages:
            argv = ["ssh", "-F", str(config), "-o", "ControlMaster=auto", "-o", "PubkeyAuthentication=yes",
                    "-o", "IdentitiesOnly=yes", "-i", str(self.key_file), "-fN", SSH_ALIAS]
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=messages,
                                  timeout=60)
            if proc.returncode != 0:
                messages.seek(0)
                raise AssertionError(f"opening the master failed: {messages.read().decode(errors='replace')}")

    def close_master(self, config: Path) -> None:
        """``ssh -O exit``: the master ends (as when ControlPersist runs out) and its socket goes.

        The master answers the exit request before it leaves and removes its socket: this returns
        once its process is gone, so the socket is too."""
        check = subprocess.run(["ssh", "-F", str(config), "-O", "check", SSH_ALIAS], capture_output=True,
                               text=True, timeout=30)
        pid = _master_pid(check.stderr) if check.returncode == 0 else None
        subprocess.run(["ssh", "-F", str(config), "-O", "exit", SSH_ALIAS], capture_output=True, timeout=30)
        if pid is not None:
            poll_until(lambda: _exited(pid) or None, timeout=30, interval=0.05,
                       what=f"the ControlMaster (pid {pid}) to exit")

    def ssh_argv(self, *options: str) -> list[str]:
        return ["ssh", "-F", str(self.ssh_config), *options, SSH_ALIAS]

    def ssh(self, command: str, *, input: str | None = None, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a shell command on the login node as the cluster user."""
        proc = subprocess.run([*self.ssh_argv(), command], input=input, capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"ssh {command!r} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def root(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command as root on this machine (fault injection, inspection)."""
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def sbatch(self, script: str, *options: str) -> int:
        """Submit a batch script (sent on stdin over SSH); returns the job id."""
        opts = " ".join(shlex.quote(o) for o in ("--parsable", *options))
        out = self.ssh(f"sbatch {opts}", input=script).stdout.strip()
        return int(out.split(";")[0])

    def test_dir(self) -> str:
        """A fresh directory on the cluster's project filesystem, owned by the cluster user."""
        path = f"{self.scratch}/tests/{uuid.uuid4().hex[:12]}"
        self.ssh(f"mkdir -p {shlex.quote(path)}")
        return path

    def cancel_jobs_under(self, directory: str) -> None:
        """Cancel every queued or running job whose output goes under ``directory`` (a test's project
        directory): a test that ends early must not leave a job holding a node for the rest of the suite."""
        out = self.root("squeue", "-h", "-O", "JobID:20,STDOUT:400", check=False).stdout
        for line in out.splitlines():
            fields = line.split(None, 1)
            if len(fields) == 2 and fields[1].startswith(f"{directory}/"):
                self.root("scancel", fields[0], check=False)

    def sacct_runs(self, job_id: int) -> list[dict[str, str]]:
        """One dict per run of the job (`sacct -D`), oldest first."""
        fields = "JobIDRaw,JobName,State,ExitCode,Comment"
        out = self.root("sacct", "-D", "-X", "-n", "-P", "-S", "now-2days", "-j", str(job_id),
                        f"--format={fields}").stdout
        return [dict(zip(fields.split(","), line.split("|", 4))) for line in out.splitlines() if line]

    def wait_for_state(self, job_id: int, states: Iterable[str], timeout: float = 120) -> str:
        """Poll until the job's newest state (squeue, then sacct) is one of `states`."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        state = "UNKNOWN"
        while time.monotonic() < deadline:
            state = self.current_state(job_id)
            if state in wanted:
                return state
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} stayed {state}, wanted one of {sorted(wanted)} within {timeout}s")

    def accounting_caught_up(self, timeout: float = 120) -> None:
        """Wait for evidence that accounting holds every job submitted until now: submit a marker job
        and wait until sacct lists it (slurmctld hands job records to slurmdbd in order)."""
        marker = self.sbatch("#!/bin/bash\ntrue\n", "--job-name=accounting-marker", "--partition=debug",
                             "--time=1", "--output=/dev/null")
        poll_until(lambda: self.root("sacct", "-X", "-n", "-P", "-a", "-j", str(marker),
                                     "--format=JobIDRaw").stdout.strip(),
                   timeout=timeout, what=f"the marker job {marker} in sacct")

    def current_state(self, job_id: int) -> str:
        out = self.root("squeue", "-h", "-j", str(job_id), "-o", "%T", check=False).stdout.strip()
        if out:
            return out.split()[0]
        runs = self.sacct_runs(job_id)
        return runs[-1]["State"].split()[0] if runs else "UNKNOWN"

    # --- a stage job caught at its first epoch --------------------------------------------------

    def progress(self, stage_dir: str) -> dict:
        """The stage's ``progress.json`` ({} before its first checkpoint), read on this machine: the
        project filesystem is local, so it is seen the moment the trainer renames it into place."""
        try:
            return json.loads((Path(stage_dir) / "progress.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def job_at_first_epoch(self, stage_dir: str, find_job: Callable[[], T | None], *, timeout: float,
                           what: str, interval: float = 0.05) -> T:
        """The job writing ``stage_dir`` (as ``find_job`` finds it in squeue) once its ``progress.json``
        counts a completed epoch, returned within about ``interval`` seconds of that checkpoint however
        fast the epochs go. While waiting, the job is looked for (then checked to be still live) once a
        second: it must not end before its first epoch."""
        deadline, check_at = time.monotonic() + timeout, 0.0
        job: T | None = None
        while self.progress(stage_dir).get("epoch", 0) < 1:
            now = time.monotonic()
            if now >= check_at:
                if job is None:
                    job = find_job()
                else:
                    state = self.current_state(int(str(job)))
                    assert state in {"PENDING", "CONFIGURING", "RUNNING"}, \
                        f"job {job} is {state} before its first epoch was seen ({what})"
                check_at = now + 1
            if now > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(interval)
        job = job or find_job()
        assert job, f"no live job writes {stage_dir} at its first epoch ({what}): {self.progress(stage_dir)}"
        return job

    def suspend_training(self, job: int | str, stage_dir: str) -> None:
        """``scontrol suspend`` the job while it trains ``stage_dir``: it stays live (to Slurm and to the
        provider) and trains no further until ``scontrol resume``. Fails if the job ended first."""
        suspended = self.root("scontrol", "suspend", str(job), check=False)
        progress = self.progress(stage_dir)
        epochs = f"epoch {progress.get('epoch')} of {progress.get('epochs_total')}"
        try:
            assert suspended.returncode == 0, \
                f"job {job} ({self.current_state(int(job))}, {epochs}) could not be suspended: {suspended.stderr}"
            assert progress.get("status") == "running", f"job {job} was suspended after its training: {progress}"
            self.wait_for_state(int(job), {"SUSPENDED"}, timeout=60)
        except BaseException:
            self.root("scontrol", "resume", str(job), check=False)
            raise

    # --- the allocation as Slurm holds it (GrpTRESMins=billing on the account) -------------------

    def billing_minutes(self) -> tuple[int | None, int, int]:
        """(limit, used, held by running jobs) of the account's billing TRES, in billing-minutes."""
        out = self.root("sshare", "-n", "-P", f"--accounts={self.account}",
                        "--format=Account,User,GrpTRESMins,GrpTRESRaw,TRESRunMins").stdout

        def billing(tres: str) -> int | None:
            values = dict(item.split("=", 1) for item in tres.split(",") if "=" in item)
            return int(values["billing"]) if values.get("billing", "").isdigit() else None

        for line in out.splitlines():
            account, user, limit, used, running = line.strip().split("|")
            if account == self.account and not user:
                return billing(limit), billing(used) or 0, billing(running) or 0
        raise AssertionError(f"sshare lists no association for account {self.account}: {out!r}")

    def set_billing_limit(self, minutes: int) -> None:
        """Set GrpTRESMins=billing on the account (cluster-wide: only in exclusive_cluster tests)."""
        self.root("sacctmgr", "-i", "modify", "account", self.account, "where", "cluster=vcloud-local",
                  "set", f"GrpTRESMins=billing={minutes}")
        poll_until(lambda: self.billing_minutes()[0] == minutes, timeout=30,
                   what=f"slurmctld to hold GrpTRESMins=billing={minutes}")

    @contextmanager
    def billing_limit(self, minutes: int | None = None) -> Iterator[None]:
        """The account's billing limit set to ``minutes`` inside the block (or changed by the block
        itself when ``minutes`` is None), and restored after it whatever happened."""
        before = self.billing_minutes()[0]
        try:
            if minutes is not None:
                self.set_billing_limit(minutes)
            yield
        finally:
            if before is None:
                self.root("sacctmgr", "-i", "modify", "account", self.account, "where", "cluster=vcloud-local",
                          "set", "GrpTRESMins=billing=-1")
            else:
                self.set_billing_limit(before)

    def show_config(self) -> dict[str, str]:
        """``scontrol show config`` as root on this machine, by name."""
        from slurm_provider.cli.scontrol import parse_scontrol_show_config

        return parse_scontrol_show_config(self.root("scontrol", "show", "config").stdout)

    @contextmanager
    def slurm_settings(self, **settings: str | None) -> Iterator[None]:
        """slurm.conf with ``settings`` set (None: the line removed) and ``scontrol reconfigure``d
        inside the block; the file and the controller's settings restored after it, whatever happened
        (cluster-wide: only in exclusive_cluster tests)."""
        conf = Path("/etc/slurm/slurm.conf")
        original = conf.read_text()
        kept = [line for line in original.splitlines() if line.split("=", 1)[0].strip() not in settings]
        added = [f"{name}={value}" for name, value in settings.items() if value is not None]
        expected = {name: value or "(null)" for name, value in settings.items()}

        def listed(wanted: dict[str, str]) -> bool:
            config = self.show_config()
            return all(config.get(name, "(null)") in (value, "none" if value == "(null)" else value)
                       for name, value in wanted.items())

        before = {name: self.show_config().get(name, "(null)") for name in settings}
        try:
            conf.write_text("\n".join(kept + added) + "\n")
            self.root("scontrol", "reconfigure")
            poll_until(lambda: listed(expected), timeout=60, what=f"slurmctld to list {expected}")
            yield
        finally:
            conf.write_text(original)
            self.root("scontrol", "reconfigure")
            poll_until(lambda: listed(before), timeout=60, what=f"slurmctld to list {before} again")

    @contextmanager
    def private_account(self, billing_minutes: int) -> Iterator["PrivateAccount"]:
        """A Slurm account of the test's own with ``GrpTRESMins=billing=<billing_minutes>``, open to the
        cluster user and root, so a test can spend or hold an allocation without touching the shared
        account's. Its jobs are cancelled and it is removed after the block, whatever happened."""
        account = PrivateAccount(self, f"vct_{uuid.uuid4().hex[:10]}")
        cluster = "cluster=vcloud-local"
        self.root("sacctmgr", "-i", "-Q", "add", "account", account.name, cluster,
                  "description=test allocation", "organization=vcloud")
        try:
            self.root("sacctmgr", "-i", "-Q", "add", "user", f"{self.user},root", f"account={account.name}", cluster)
            account.set_limit(billing_minutes)
            yield account
        finally:
            self.root("scancel", f"--account={account.name}", check=False)
            poll_until(lambda: not self.root("squeue", "-h", f"--account={account.name}").stdout.strip(),
                       timeout=120, what=f"the jobs of account {account.name} to end")
            self.root("sacctmgr", "-i", "-Q", "remove", "user", f"{self.user},root", f"account={account.name}",
                      cluster, check=False)
            self.root("sacctmgr", "-i", "-Q", "remove", "account", account.name, check=False)  # not per cluster

    def daemon_pids(self) -> dict[str, int]:
        """Each daemon's pid by name; the compute nodes' as ``slurmd-<node>``."""
        run = self.state_dir / "run"
        files = [("munged", run / "munge" / "munged.pid"), ("mariadb", run / "mariadb.pid"),
                 ("slurmdbd", run / "slurmdbd.pid"), ("slurmctld", run / "slurmctld.pid"),
                 ("sshd", run / "sshd.pid")]
        files += [(pidfile.stem, pidfile) for pidfile in sorted(run.glob("slurmd-*.pid"))]
        return {name: int(pidfile.read_text().strip()) for name, pidfile in files if pidfile.exists()}

    def node_of(self, job_id: int | str) -> str:
        """The (first) node a running job is on."""
        nodes = self.ssh(f"squeue -h -j {int(job_id)} -o %N").stdout.strip()
        return self.ssh(f"scontrol show hostnames {nodes}").stdout.split()[0]

    def on_node(self, node: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command as root on compute node ``node``: in its slurmd's network, UTS and mount
        namespaces (what `scontrol listpids` needs to find the node's slurmstepd)."""
        pid = (self.state_dir / "run" / f"slurmd-{node}.pid").read_text().strip()
        return self.root("nsenter", "-t", pid, "-n", "-u", "-m", "--", *argv, check=check)

    def hang_job(self, job_id: int | str) -> list[str]:
        """Stop (SIGSTOP) every process of a running job on each of its nodes, as hung nodes would
        stop it; returns the pids. Slurm is not told: the job stays RUNNING, and when a node is set
        DOWN slurmd continues and kills the processes as for any node failure. (``scontrol suspend``
        would tell Slurm, and a job suspended by an administrator comes back held when requeued.)

        Listed again until no new process shows: a child started between listing and stopping is
        stopped in the next round (its parent is stopped by then)."""
        nodes = self.root("squeue", "-h", "-j", str(int(job_id)), "-o", "%N").stdout.strip()
        hosts = self.root("scontrol", "show", "hostnames", nodes).stdout.split()
        assert hosts, f"job {job_id} runs on no node"
        stopped: set[str] = set()
        while True:
            listed = {line.split()[0] for host in hosts
                      for line in self.on_node(host, "scontrol", "listpids", str(int(job_id))).stdout.splitlines()
                      if line.split() and line.split()[0].isdigit()}
            new = sorted(listed - stopped)
            if not new:
                return sorted(stopped, key=int)
            self.root("kill", "-STOP", *new, check=False)  # one that ended meanwhile is no matter
            stopped.update(new)

    def nodes(self, partition: str | None = None) -> list[str]:
        """The compute nodes (of ``partition``), as Slurm names them."""
        where = f" -p {partition}" if partition else ""
        return sorted(set(self.ssh(f"sinfo -h -N{where} -o '%N'").stdout.split()))


def cluster_up(timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """``cluster.sh up``, one at a time across test workers (each worker's session starts with one,
    and some tests run it again while others use the cluster)."""
    with Path("/tmp/vcloud-localcluster.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.run(["bash", str(CLUSTER_SCRIPT), "up"], capture_output=True, text=True,
                              timeout=timeout)


def bring_up() -> LocalCluster:
    """Start the cluster if needed (idempotent, serialised across test workers)."""
    state_dir = Path(os.environ.get("VCLOUD_CLUSTER_DIR", "/var/lib/vcloud-localcluster"))
    if os.geteuid() != 0:
        raise ClusterUnavailable("the local cluster needs root: run `make test` as root on Debian 12")
    proc = cluster_up()
    if proc.returncode != 0:
        raise ClusterUnavailable(f"`cluster.sh up` failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return LocalCluster(
        state_dir=state_dir,
        user=os.environ.get("VCLOUD_CLUSTER_USER", "vcloud"),
        scratch=Path(os.environ.get("VCLOUD_SCRATCH", "/srv/vcloud/scratch/vcloud")),
        account="vcloud_local",
        conn_id="vcloud_local_cluster",
        teammate=os.environ.get("VCLOUD_CLUSTER_TEAMMATE", "vcloud2"),
    )


@dataclass(frozen=True)
class PrivateAccount:
    """A test's own Slurm account (:meth:`LocalCluster.private_account`)."""

    cluster: LocalCluster
    name: str

    def billing(self) -> tuple[int | None, int, int, dict[str, int]]:
        """(limit, used, held by running jobs, held per user) of the account's billing TRES, in
        billing-minutes, as slurmctld holds them (``sshare --all``, as root)."""
        out = self.cluster.root("sshare", "-n", "-P", "-a", f"--accounts={self.name}",
                                "--format=Account,User,GrpTRESMins,GrpTRESRaw,TRESRunMins").stdout

        def billing(tres: str) -> int | None:
            values = dict(item.split("=", 1) for item in tres.split(",") if "=" in item)
            return int(values["billing"]) if values.get("billing", "").isdigit() else None

        own, users = None, {}
        for line in out.splitlines():
            account, user, limit, used, running = line.strip().split("|")
            if account == self.name and not user:
                own = (billing(limit), billing(used) or 0, billing(running) or 0)
            elif user:
                users[user] = billing(running) or 0
        assert own is not None, f"sshare lists no association for account {self.name}: {out!r}"
        return (*own, users)

    def set_limit(self, minutes: int) -> None:
        self.cluster.root("sacctmgr", "-i", "-Q", "modify", "account", self.name, "where", "cluster=vcloud-local",
                          "set", f"GrpTRESMins=billing={minutes}")
        poll_until(lambda: self.billing()[0] == minutes, timeout=30,
                   what=f"slurmctld to hold GrpTRESMins=billing={minutes} on {self.name}")
