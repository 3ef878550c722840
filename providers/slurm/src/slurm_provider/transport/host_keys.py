"""Which connection settings turn host-key checking off, in one place. Pure.

A login node whose key is not checked can be impersonated: whoever answers on its address gets
the job scripts, the code sync and, with a ControlMaster, a shell that rides a person's one-time
password login. Every transport refuses such a connection before its first command, and the
deployment's start-up check (``include/docker/check_connections.py``) refuses it before any
Airflow component starts; both ask these functions.

What counts as "off":

- the extras ``no_host_key_check: true`` (or its old name ``ignore_hostkey_verification``: paramiko
  and asyncssh accept any key), ``allow_host_key_change: true``
  (paramiko ignores a changed key), ``known_hosts: none`` (asyncssh checks nothing), and a
  ``host_key`` extra that is present but empty;
- an ssh_config that, as ``ssh -G`` resolves it for the alias, says ``StrictHostKeyChecking``
  ``no``/``off`` (``ssh -G`` prints ``false``) or ``accept-new``, or whose only
  ``UserKnownHostsFile`` is ``/dev/null``.

``accept-new`` is refused too: it trusts whatever key answers the first time a known_hosts file
has no entry for the host, and a container's known_hosts is read-only or fresh, so every start
can be a first time. A pinned ``host_key`` does not make these config settings harmless for an
``openssh`` connection: the ControlMaster that a person opens with ``ssh <alias>`` reads the config
alone, and every command rides that master without checking the key again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurm_provider.transport.base import TransportConfigError

PIN_FIX = ("pin the login node's key with the host_key extra ('<type> <base64>', from ssh-keyscan "
           "after checking its fingerprint)")
CONFIG_FIX = ("set StrictHostKeyChecking yes and UserKnownHostsFile to a file holding the login "
              "node's key")
_TRUE = ("1", "true", "yes", "on")
_UNCHECKED_STRICT = ("false", "no", "off", "accept-new")
_NO_FILE = ("/dev/null", "none", "")


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in _TRUE


def extra_problems(extra: Mapping[str, Any]) -> list[str]:
    """Extras of an SSH or Slurm connection that turn host-key checking off, each with what to set
    instead (empty: the extras keep checking on)."""
    found = []
    for name in ("no_host_key_check", "ignore_hostkey_verification"):  # the latter: SSHHook's old name
        if _truthy(extra.get(name, False)):
            found.append(f"{name} is true; drop it and {PIN_FIX}")
    if _truthy(extra.get("allow_host_key_change", False)):
        found.append("allow_host_key_change is true (a changed login node key would be accepted); drop it, "
                     "and when the key really changed, put the new one in the host_key extra")
    known_hosts = extra.get("known_hosts")
    if known_hosts is not None and str(known_hosts).strip().lower() == "none":
        found.append(f"known_hosts is none (no key is checked); drop it and {PIN_FIX}")
    host_key = extra.get("host_key")
    if host_key is not None and not str(host_key).strip():
        found.append(f"host_key is empty; {PIN_FIX}")
    return found


def ssh_config_problems(resolved: Mapping[str, str]) -> list[str]:
    """Settings of an ssh_config alias, as ``ssh -G`` prints them (lower-case keys), that turn
    host-key checking off, each with what to set instead (empty: the config keeps checking on)."""
    found = []
    strict = resolved.get("stricthostkeychecking", "").strip().lower()
    if strict in _UNCHECKED_STRICT:
        said = "accept-new" if strict == "accept-new" else "no"
        found.append(f"the ssh config says StrictHostKeyChecking {said} (an unknown login node key would "
                     f"be accepted); {CONFIG_FIX}")
    files = resolved.get("userknownhostsfile")
    if files is not None and all(name.lower() in _NO_FILE for name in files.split() or [""]):
        found.append(f"the ssh config says UserKnownHostsFile {files or 'none'} (no key is remembered); "
                     f"{CONFIG_FIX}")
    return found


def refuse_unchecked(where: str, problems: list[str]) -> None:
    """Raise the transports' configuration error when ``problems`` is not empty: nothing runs."""
    if problems:
        raise TransportConfigError(f"{where} would log in without checking the login node's host key: "
                                   + "; ".join(problems))
