"""Transport through the system OpenSSH client and the user's ssh_config alias (e.g. ``cluster``).

Logins that need a one-time password (many national supercomputers) cannot be automated. They can be
*shared*: with ``ControlMaster auto``, ``ControlPath`` and ``ControlPersist`` in the alias, a
person runs ``ssh cluster`` once in a terminal, types the code, and every later ``ssh cluster ...``
rides that authenticated master connection without asking again. This runner is such a later
``ssh``: it always passes ``BatchMode=yes`` so it can never stop at a prompt, and when no master
is up and the login is refused it says so, with the command the person has to run.

ssh's own diagnostics go to a private log file (``-E``), not to stderr: the command's stderr is
data, and an exit status of 255 is only a transport failure when ssh itself logged an error.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from slurm_provider.transport.base import (
    HOST_KEY_EXTRA_FIX,
    AuthenticationFailed,
    ControlMasterNotRunning,
    HostKeyRejected,
    TransportConfigError,
    TransportError,
    TransportTimeout,
    TransportUnavailable,
    host_key_fingerprint,
    host_key_mismatch,
    host_key_unknown,
)


SSH_FAILURE_STATUS = 255
_ALIAS = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@:%+-]{0,254}$")
_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off", ""}

_HOST_KEY_CHANGED = ("remote host identification has changed", "has changed and you have requested strict")
_HOST_KEY_MESSAGES = ("host key verification failed", "host key is known for", "host key for")
_OFFERED_KEY = re.compile(r"key sent by the remote host is\s+(SHA256:[A-Za-z0-9+/]+)")
_AUTH_MESSAGES = ("permission denied", "too many authentication failures", "authentication failed")
_CONFIG_MESSAGES = ("bad configuration option", "could not resolve hostname", "terminating, ")


def _flag(value: object, field: str) -> bool:
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise TransportConfigError(f"connection extra {field}={value!r} is not a boolean (use true or false)")


@dataclass(frozen=True)
class OpenSSHTarget:
    """Where and how the system ``ssh`` client logs in, from the connection's extras."""

    alias: str
    """Host alias in the ssh config (``cluster``); the config decides host name, user, key, master."""
    config_file: str | None = None
    """``-F`` file; None means the user's ``~/.ssh/config`` (and the system-wide one)."""
    host_key: str | None = None
    """Pinned host key (``ssh-ed25519 AAAA...``); overrides the config's known_hosts when set."""
    require_control_master: bool = False
    """Never log in ourselves: refuse to run unless an authenticated master connection is up."""
    connect_timeout: int = 10

    def __post_init__(self) -> None:
        if not isinstance(self.alias, str) or not _ALIAS.match(self.alias):
            raise TransportConfigError(
                f"ssh_alias {self.alias!r} is not a host alias (letters, digits and _.@:%+- ; not starting "
                "with '-'), e.g. 'cluster'"
            )
        if self.config_file is not None and not Path(self.config_file).is_file():
            raise TransportConfigError(
                f"ssh_config_file {self.config_file!r} does not exist; fix the connection extra or drop "
                "it to use ~/.ssh/config"
            )
        if self.host_key is not None and len(self.host_key.split()) < 2:
            raise TransportConfigError(
                f"host_key must be '<type> <base64>' (e.g. 'ssh-ed25519 AAAA...'), got {self.host_key!r}"
            )
        if not isinstance(self.connect_timeout, int) or self.connect_timeout < 1:
            raise TransportConfigError(f"connect_timeout must be a whole number of seconds >= 1, got "
                                       f"{self.connect_timeout!r}")

    @classmethod
    def from_extra(cls, extra: Mapping[str, object], *, host: str | None = None) -> OpenSSHTarget:
        """Read ``ssh_alias`` (else the connection's host), ``ssh_config_file``, ``host_key``,
        ``require_control_master`` and ``connect_timeout`` from a connection's extras."""
        alias = extra.get("ssh_alias") or host
        if not alias:
            raise TransportConfigError(
                "transport 'openssh' needs the connection extra ssh_alias (e.g. 'cluster')"
            )
        config_file = extra.get("ssh_config_file")
        host_key = extra.get("host_key")
        try:
            connect_timeout = int(extra.get("connect_timeout", 10))  # type: ignore[call-overload]
        except (TypeError, ValueError):
            raise TransportConfigError(
                f"connection extra connect_timeout={extra.get('connect_timeout')!r} is not a whole "
                "number of seconds"
            ) from None
        return cls(
            alias=str(alias),
            config_file=os.path.expanduser(str(config_file)) if config_file else None,
            host_key=str(host_key).strip() if host_key else None,
            require_control_master=_flag(
                extra.get("require_control_master", False), "require_control_master"
            ),
            connect_timeout=connect_timeout,
        )

    @property
    def where(self) -> str:
        """How messages name this login: the alias, and the config file when it is not the default."""
        return f"ssh alias {self.alias}" + (f" ({self.config_file})" if self.config_file else "")

    @property
    def host_key_fix(self) -> str:
        """What a person changes when the login node's key really changed."""
        if self.host_key:
            return HOST_KEY_EXTRA_FIX
        return (f"update the known_hosts file that the ssh config names for {self.alias} "
                "(UserKnownHostsFile), or pin the key with the connection's host_key extra")

    def base_argv(self) -> list[str]:
        argv = ["ssh"]
        if self.config_file:
            argv += ["-F", self.config_file]
        return argv

    def reopen_master_command(self) -> str:
        """What a person runs in a terminal (typing the one-time password) to open the master again.

        ``ControlMaster=auto`` also where the alias says ``no`` (a deployment whose containers only
        ride a master), and it replaces a stale socket left by a master that was killed.
        """
        return shlex.join([*self.base_argv(), "-o", "ControlMaster=auto", "-fN", self.alias])

    def client_argv(self, *, log_file: str, known_hosts: str | None,
                    connect_timeout: int | None = None) -> list[str]:
        """The ``ssh`` options of every unattended call, commands and rsync's ``-e`` alike: never
        prompt, ssh's own messages to ``log_file``, no forwarding, the pinned key when there is one,
        and the alias's own ControlMaster socket (never one of ours). The alias comes after these."""
        connect = connect_timeout or self.connect_timeout
        argv = [
            *self.base_argv(), "-E", log_file, "-x", "-a",
            "-o", "BatchMode=yes",
            "-o", "LogLevel=ERROR",
            "-o", f"ConnectTimeout={connect}",
            "-o", "ClearAllForwardings=yes",
        ]
        if self.require_control_master:
            argv += ["-o", "ControlMaster=no"]
        if known_hosts is not None:
            argv += ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
                     "-o", "StrictHostKeyChecking=yes"]
        return argv

    def command_argv(
        self, command: str, *, log_file: str, known_hosts: str | None, timeout: float
    ) -> list[str]:
        """``ssh ... <alias> -- <command>`` that never prompts and keeps ssh's messages out of stderr."""
        connect = max(1, min(self.connect_timeout, int(timeout)))
        argv = self.client_argv(log_file=log_file, known_hosts=known_hosts, connect_timeout=connect)
        return [*argv, "-T", self.alias, "--", command]

    def check_argv(self) -> list[str]:
        return [*self.base_argv(), "-o", "BatchMode=yes", "-O", "check", self.alias]

    def config_argv(self) -> list[str]:
        return [*self.base_argv(), "-G", self.alias]


def parse_ssh_g(text: str) -> dict[str, str]:
    """``ssh -G`` output (``key value`` lines, keys lower-case) as a dict; repeated keys keep the first."""
    config: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key and key not in config:
            config[key] = value.strip()
    return config


def uses_control_master(config: Mapping[str, str]) -> bool:
    """True when the alias can share a master connection (a ControlPath is set)."""
    return config.get("controlpath", "none").lower() not in ("none", "")


def classify_ssh_log(ssh_log: str, *, where: str, pinned: str | None, host_key_fix: str,
                     login_failed: Callable[[str], TransportError]) -> TransportError:
    """The exception for an ``ssh`` that exited 255 having logged ``ssh_log`` (its ``-E`` file).

    Shared by every caller of the OpenSSH client (this runner, the ssh under rsync), so the same
    failure reads the same whoever met it. ``login_failed`` words a refused login: what to do
    depends on how the connection logs in.
    """
    lower = " ".join(ssh_log.split()).lower()
    said = last_line(ssh_log)
    if any(m in lower for m in _HOST_KEY_CHANGED):
        offered = _OFFERED_KEY.search(ssh_log)
        return host_key_mismatch(where, offered=offered.group(1) if offered else None,
                                 pinned=host_key_fingerprint(pinned) if pinned else None, fix=host_key_fix)
    if "no matching host key type" in lower:
        return HostKeyRejected(f"{where}: {said}")
    if any(m in lower for m in _HOST_KEY_MESSAGES):
        return host_key_unknown(where, said)
    if any(m in lower for m in _AUTH_MESSAGES):
        return login_failed(said)
    if any(m in lower for m in _CONFIG_MESSAGES):
        return TransportConfigError(f"{where}: {said}")
    if "timed out" in lower:
        return TransportTimeout(f"{where}: {said}")
    return TransportUnavailable(f"cannot reach {where}: {said}")


def classify_ssh_failure(target: OpenSSHTarget, ssh_log: str, *, shares_master: bool,
                         control_path: str | None = None) -> TransportError:
    """The exception for an ssh run on ``target`` that exited 255 with ``ssh_log`` (ssh's own messages).

    A live master cannot fail authentication, so a refused login on an alias that shares one
    means the master is missing or gone: the person has to open it again.
    """

    def login_failed(said: str) -> TransportError:
        if shares_master:
            return control_master_lapsed(target, said, control_path=control_path)
        return AuthenticationFailed(
            f"{target.where}: login refused ({said}); for logins that need a one-time password add "
            "ControlMaster auto, ControlPath and ControlPersist to the alias in your ssh config"
        )

    return classify_ssh_log(ssh_log, where=target.where, pinned=target.host_key,
                            host_key_fix=target.host_key_fix, login_failed=login_failed)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def control_master_lapsed(target: OpenSSHTarget, said: str | None = None, *, control_path: str | None = None,
                          host: str | None = None) -> ControlMasterNotRunning:
    """The one message for an alias whose master connection is not running (never opened, timed
    out, or closed): only a person can log in again, and this says how and where.

    A master is a socket on one machine: with several workers and triggerers, the person has to open
    it on the host whose task or trigger looked for it (``host``, default this machine's name), the
    one its Airflow queue routes that connection's tasks and triggers to.
    """
    detail = f" (ssh said: {said})" if said else ""
    where = host or socket.gethostname()
    socket_path = f", ControlPath {control_path}" if control_path else ""
    return ControlMasterNotRunning(
        f"no ControlMaster is running for {target.where}{detail}; its login needs a person (one-time "
        f"password). Open it again on host {where} (where this task or trigger looked for the master"
        f"{socket_path}) with: {target.reopen_master_command()}"
    )
