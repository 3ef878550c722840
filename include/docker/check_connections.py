"""Refuse cluster connections that would log in without checking the login node's host key.

Run by the ``airflow-init`` service of docker-compose.yaml on the connections file the secrets
backend reads (``LocalFilesystemBackend``, JSON ``{conn_id: {conn_type, host, login, extra}}``),
before any Airflow service starts: every SSH or Slurm connection must pin the host key (``host_key``
extra) or use the openssh transport with an ssh_config that checks a known_hosts file, and
``no_host_key_check`` must not be true. Key files named in the connections must exist and be
private (mode 600 or stricter).

    python include/docker/check_connections.py /opt/airflow/secrets/connections.json
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


LOGIN_TYPES = ("ssh", "slurm")
"""Connection types that log in over SSH (the Slurm provider's own type reads the same extras)."""


def problems_of(conn_id: str, conn: dict[str, Any]) -> list[str]:
    """What is wrong with one connection (empty: fine)."""
    if str(conn.get("conn_type", "")).lower() not in LOGIN_TYPES:
        return []
    extra = conn.get("extra") or {}
    if isinstance(extra, str):
        extra = json.loads(extra or "{}")
    found = []
    if _truthy(extra.get("no_host_key_check", False)):
        found.append(f"{conn_id}: no_host_key_check is true; pin the login node's key with the host_key extra")
    transport = str(extra.get("transport", "paramiko")).lower()
    if transport == "openssh":
        config = extra.get("ssh_config_file")
        if not extra.get("host_key") and not config:
            found.append(f"{conn_id}: openssh transport without host_key or ssh_config_file; the user's "
                         "default ssh config is not part of the deployment")
        elif config and not Path(config).is_file():
            found.append(f"{conn_id}: ssh_config_file {config} does not exist (mount the secrets directory)")
    elif not extra.get("host_key"):
        found.append(f"{conn_id}: no host_key extra; copy the login node's key "
                     "(ssh-keyscan, then check its fingerprint) into the connection")
    key_file = extra.get("key_file")
    if key_file:
        path = Path(key_file)
        if not path.is_file():
            found.append(f"{conn_id}: key_file {key_file} does not exist (mount the secrets directory)")
        elif stat.S_IMODE(os.stat(path).st_mode) & 0o077:
            found.append(f"{conn_id}: key_file {key_file} is readable by others; chmod 600 it")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} CONNECTIONS_JSON", file=sys.stderr)
        return 2
    path = Path(argv[1])
    if not path.is_file():
        print(f"no connections file at {path}: the DAGs cannot reach a cluster until it exists "
              "(see README, Deploying)", file=sys.stderr)
        return 0
    connections = json.loads(path.read_text())
    found = [p for conn_id, conn in connections.items() for p in problems_of(conn_id, conn)]
    for problem in found:
        print(f"connection check: {problem}", file=sys.stderr)
    if not found:
        print(f"connection check: {len(connections)} connection(s) in {path} pin their host keys")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
