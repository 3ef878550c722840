"""Refuse cluster connections that would log in without checking the login node's host key.

Run by the ``airflow-init`` service of docker-compose.yaml on the connections file the secrets
backend reads (``LocalFilesystemBackend``, JSON ``{conn_id: {conn_type, host, login, extra}}``),
before any Airflow service starts: every SSH or Slurm connection must pin the host key (``host_key``
extra) or use the openssh transport with an ssh_config that checks a known_hosts file. What turns
checking off (``no_host_key_check``, ``allow_host_key_change``, ``known_hosts: none``, an ssh_config
with ``StrictHostKeyChecking no``) is decided by the Slurm provider
(``slurm_provider.transport.host_keys``), whose transports refuse the same connections at run time.
Key files named in the connections must exist and be private (mode 600 or stricter).

    python include/docker/check_connections.py /opt/airflow/secrets/connections.json
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurm_provider.transport.base import TransportError
from slurm_provider.transport.host_keys import extra_problems, ssh_config_problems
from slurm_provider.transport.openssh import OpenSSHTarget, parse_ssh_g

LOGIN_TYPES = ("ssh", "slurm")
"""Connection types that log in over SSH (the Slurm provider's own type reads the same extras)."""


def resolve_alias(alias: str, config_file: str) -> dict[str, str]:
    """The alias's settings as the ssh client resolves them from ``config_file`` (``ssh -G``, no network)."""
    argv = OpenSSHTarget(alias=alias, config_file=config_file).config_argv()
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20, check=False)
    if proc.returncode != 0:
        raise ValueError(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.returncode}")
    return parse_ssh_g(proc.stdout)


def problems_of(conn_id: str, conn: dict[str, Any], *,
                resolve: Callable[[str, str], dict[str, str]] = resolve_alias) -> list[str]:
    """What is wrong with one connection (empty: fine). ``resolve`` reads an openssh connection's
    ssh_config for its alias (``ssh -G``)."""
    if str(conn.get("conn_type", "")).lower() not in LOGIN_TYPES:
        return []
    extra = conn.get("extra") or {}
    if isinstance(extra, str):
        extra = json.loads(extra or "{}")
    found = [f"{conn_id}: {problem}" for problem in extra_problems(extra)]
    transport = str(extra.get("transport", "paramiko")).lower()
    if transport == "openssh":
        config = extra.get("ssh_config_file")
        alias = str(extra.get("ssh_alias") or conn.get("host") or "")
        if not extra.get("host_key") and not config:
            found.append(f"{conn_id}: openssh transport without host_key or ssh_config_file; the user's "
                         "default ssh config is not part of the deployment")
        elif config and not Path(config).is_file():
            found.append(f"{conn_id}: ssh_config_file {config} does not exist (mount the secrets directory)")
        elif config:
            try:
                found += [f"{conn_id}: {problem} ({config}, Host {alias})"
                          for problem in ssh_config_problems(resolve(alias, str(config)))]
            except (ValueError, OSError, subprocess.SubprocessError, TransportError) as exc:
                found.append(f"{conn_id}: cannot read ssh_config_file {config} for {alias!r}: {exc}")
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
              "(see docs/operations.md, Deploying)", file=sys.stderr)
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
