"""A login node of the local cluster that a test may take down: its own sshd on a free port.

The shared login sshd (127.0.0.1:2222) serves every test running on this machine; an outage test
starts a second sshd with the same configuration (``include/local_cluster/templates/sshd_config``
as ``cluster.sh start_sshd`` renders it), the same host key and the same cluster user, on another
port with its own pid file, and points an Airflow connection of its own at it. :meth:`stop` takes it
down as a maintenance break does: the listening sshd and every session it serves end, so open
connections drop and new ones are refused; :meth:`start` brings it back.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

from support.localcluster import REPO, LocalCluster, poll_until
from support.ports import free_port
from support.processes import alive, descendants

TEMPLATE = REPO / "include" / "local_cluster" / "templates" / "sshd_config"


def _answers(port: int, address: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex((address, port)) == 0


class PrivateLogin:
    """A second sshd for the cluster user; ``conn_id`` is its Airflow connection (paramiko transport)."""

    def __init__(self, cluster: LocalCluster, directory: Path, conn_id: str = "vcloud_private_login", *,
                 path_first: str | None = None, extra: dict | None = None, listen: str = "127.0.0.1") -> None:
        """``path_first``: a directory on the login node put first on the sessions' PATH (``SetEnv``), so
        a test's stand-in for a Slurm client answers instead of the real one. ``extra``: more connection
        extras. ``listen``: the address it listens on (the local cluster's bridge address reaches it
        from other network namespaces, where 127.0.0.1 is their own)."""
        self.cluster = cluster
        self.directory = directory
        self.conn_id = conn_id
        self.port = free_port()
        self.listen = listen
        self.config = directory / "sshd_config"
        self.pid_file = directory / "sshd.pid"
        self.log_file = directory / "sshd.log"
        text = TEMPLATE.read_text()
        for key, value in {"@STATE@": str(cluster.state_dir), "@SSH_PORT@": str(self.port),
                           "@SSH_LISTEN@": listen, "@CLUSTER_USER@": cluster.user}.items():
            text = text.replace(key, value)
        lines = [f"PidFile {self.pid_file}" if line.startswith("PidFile ") else line for line in text.splitlines()]
        if path_first is not None:
            lines.append(f"SetEnv PATH={path_first}:/usr/local/bin:/usr/bin:/bin")
        self.extra = dict(extra or {})
        self.config.write_text("\n".join(lines) + "\n")
        self.config.chmod(0o600)
        subprocess.run(["/usr/sbin/sshd", "-t", "-f", str(self.config)], check=True, capture_output=True, timeout=30)

    def connection(self) -> dict:
        """The cluster's key-based connection, logging in through this sshd (same pinned host key)."""
        conn = self.cluster.connection()
        return {**conn, "host": self.listen, "port": self.port, "extra": {**conn.get("extra", {}), **self.extra}}

    def connection_env(self) -> dict[str, str]:
        return {f"AIRFLOW_CONN_{self.conn_id.upper()}": json.dumps(self.connection())}

    @property
    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if alive(pid) else None

    def start(self) -> None:
        if self.pid is None:
            subprocess.run(["/usr/sbin/sshd", "-f", str(self.config), "-E", str(self.log_file)], check=True,
                           capture_output=True, timeout=30)
        poll_until(lambda: _answers(self.port, self.listen), timeout=30, what=f"the private sshd on port {self.port}")

    def stop(self) -> None:
        """SIGTERM the listening sshd and every session process below it, by pid; wait until they are gone."""
        pid = self.pid
        if pid is None:
            return
        sessions = descendants(pid)
        os.kill(pid, signal.SIGTERM)
        for child in sessions:
            try:
                os.kill(child, signal.SIGTERM)
            except ProcessLookupError:
                pass
        poll_until(lambda: not any(alive(p) for p in [pid, *sessions]), timeout=30,
                   what="the private sshd and its sessions to end")
        poll_until(lambda: not _answers(self.port, self.listen), timeout=10, what=f"port {self.port} to refuse connections")
        self.pid_file.unlink(missing_ok=True)

    def close(self) -> None:
        self.stop()

