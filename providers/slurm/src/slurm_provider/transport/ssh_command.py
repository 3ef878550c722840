"""The system ``ssh`` command that reaches a connection's login node exactly as its transport does.

For tools that start ``ssh`` themselves (``rsync -e``), so that a file transfer and a Slurm command
never reach the cluster in two different ways:

- key-based connections (the SSH provider's hooks): host, port and login from the connection, its
  key (``key_file``, or the ``private_key`` extra written to a private file), a known_hosts file
  holding only the pinned ``host_key`` with ``StrictHostKeyChecking=yes``, ``IdentitiesOnly=yes``
  and ``-F /dev/null``: nothing in the worker's ``~/.ssh`` changes how it logs in;
- ``openssh`` connections: the same ssh_config file, alias, pinned key and ControlMaster socket
  as :class:`~slurm_provider.transport.openssh.OpenSSHRunner`; never a ControlPath of our own.

ssh's own messages go to a private log file. When the tool fails, :meth:`SSHCommand.run` turns
them into the transports' own exceptions and words (a wrong host key reads the same for ``squeue``
and for ``rsync``). Private files live in a 0700 directory, 0600 each, removed when the context ends.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_provider.transport.base import (
    HOST_KEY_EXTRA_FIX,
    TransportConfigError,
    TransportError,
    describe_login,
    known_hosts_text,
    login_refused,
)
from slurm_provider.transport.factory import OPENSSH, checked_transport
from slurm_provider.transport.openssh import OpenSSHTarget, classify_ssh_log
from slurm_provider.transport.openssh_runners import OpenSSHRunner

DEFAULT_CONNECT_TIMEOUT = 10
WORKDIR_PREFIX = "slurm-provider-ssh-command-"
"""Private directory (0700) of one :func:`ssh_command_for_connection`: key, known_hosts, ssh log."""
NO_PIN_FIX = ("add the login node's key to ~/.ssh/known_hosts, or better pin it with the connection's "
              "host_key extra")


@dataclass(frozen=True)
class KeyLogin:
    """A key-based login as the SSH provider's ``SSHHook`` makes it, in the ssh client's terms."""

    conn_id: str
    host: str
    port: int
    user: str
    key_file: str | None = None
    """The connection's ``key_file`` (or the IdentityFile the hook took from ``~/.ssh/config``)."""
    inline_key: bool = False
    """The key is the connection's ``private_key`` extra (wins over ``key_file``, as in the hook)."""
    host_key: str | None = None
    """The pinned ``<type> <base64>`` key; None: ssh's known_hosts files decide, strictly."""
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT
    proxy_command: str | None = None
    password_only: bool = False
    """The connection logs in with a password and names no key: an unattended ssh cannot."""

    @property
    def where(self) -> str:
        return describe_login(self.conn_id, self.user, self.host, self.port)

    @classmethod
    def from_ssh_hook(cls, conn_id: str, hook: Any, extra: Mapping[str, Any]) -> KeyLogin:
        """Read what ``SSHHook`` resolved from the connection (and its ``~/.ssh/config`` fallbacks)."""
        inline = bool(extra.get("private_key"))
        host_key = extra.get("host_key")
        return cls(
            conn_id=conn_id,
            host=str(hook.remote_host),
            port=int(hook.port or 22),
            user=str(hook.username),
            key_file=None if inline else hook.key_file,
            inline_key=inline,
            host_key=str(host_key).strip() if host_key else None,
            connect_timeout=int(hook.conn_timeout or DEFAULT_CONNECT_TIMEOUT),
            proxy_command=hook.host_proxy_cmd or None,
            password_only=bool(hook.password) and not (inline or hook.key_file),
        )


def key_login_argv(login: KeyLogin, *, identity_file: str | None, known_hosts: str | None,
                   log_file: str) -> list[str]:
    """``ssh`` options for ``login`` (the destination is ``login.host``). Pure.

    ``identity_file``: the connection's key as a file; ``known_hosts``: a file with only the pinned
    key. ``-F /dev/null`` keeps the worker's own ssh config out; without a pin, ssh's default
    known_hosts files are checked strictly, as paramiko checks the system host keys. Connections
    that turn checking off never get here (:func:`~slurm_provider.transport.factory.checked_transport`).
    """
    argv = [
        "ssh", "-F", "/dev/null", "-E", log_file, "-x", "-a",
        "-p", str(login.port), "-l", login.user,
        "-o", "BatchMode=yes",
        "-o", "LogLevel=ERROR",
        "-o", f"ConnectTimeout={login.connect_timeout}",
        "-o", "ClearAllForwardings=yes",
    ]
    if identity_file:
        argv += ["-i", identity_file, "-o", "IdentitiesOnly=yes"]
    argv += ["-o", "StrictHostKeyChecking=yes"]
    if known_hosts:
        argv += ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null"]
    if login.proxy_command:
        argv += ["-o", f"ProxyCommand={login.proxy_command}"]
    return argv


@dataclass(frozen=True)
class SSHCommand:
    """An ``ssh`` command line and the destination it logs in to, for ``rsync -e`` and the like."""

    argv: tuple[str, ...]
    """``ssh`` and its options, without the destination."""
    destination: str
    """What follows the options: ``host`` (key logins; the user is ``-l``) or the ssh_config alias."""
    where: str
    """How messages name the login."""
    log_file: str
    classify: Callable[[str], TransportError] = field(repr=False, compare=False)
    """ssh's log of a failed login -> the transport's exception for it."""

    @property
    def shell(self) -> str:
        """The command as one string (``rsync -e``)."""
        return shlex.join(self.argv)

    def run(self, argv: Sequence[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a tool that uses this ssh (``argv`` carries ``-e self.shell``); return it as it ended.

        Raises the transport's :class:`TransportError` when the tool failed because ssh could not
        log in (what ssh logged decides); a failure of the tool itself is the caller's to judge.
        """
        Path(self.log_file).write_text("")
        proc = subprocess.run(list(argv), capture_output=True, text=True, errors="replace", timeout=timeout,
                              check=False)
        if proc.returncode != 0:
            ssh_log = Path(self.log_file).read_text(errors="replace")
            if ssh_log.strip():
                raise self.classify(ssh_log)
        return proc


def private_key_text(content: str, passphrase: str | None = None) -> str:
    """The connection's ``private_key`` as a file ssh reads without a prompt (decrypted when the
    connection gives its passphrase; paramiko holds it decrypted in memory the same way)."""
    text = content.strip() + "\n"
    if not passphrase:
        return text
    from cryptography.hazmat.primitives import serialization

    data, secret = text.encode(), passphrase.encode()
    try:
        try:
            key = serialization.load_ssh_private_key(data, secret)
        except ValueError:
            key = serialization.load_pem_private_key(data, secret)  # type: ignore[assignment]
    except (ValueError, TypeError) as exc:
        raise TransportConfigError(
            f"the connection's private_key cannot be opened with its passphrase ({exc})") from None
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                             serialization.NoEncryption()).decode()


def _private_file(directory: str, name: str, text: str) -> str:
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    return path


def _key_login_command(conn_id: str, extra: Mapping[str, Any], workdir: str, log_file: str) -> SSHCommand:
    from airflow.providers.common.compat.sdk import AirflowException
    from airflow.providers.ssh.hooks.ssh import SSHHook

    try:
        hook = SSHHook(ssh_conn_id=conn_id, conn_retry_attempts=1)
    except (AirflowException, ValueError, TypeError) as exc:  # e.g. both key_file and private_key
        raise TransportConfigError(f"connection {conn_id!r}: {exc}") from None
    login = KeyLogin.from_ssh_hook(conn_id, hook, extra)
    if login.password_only:
        raise TransportConfigError(
            f"connection {conn_id!r} logs in with a password, which an unattended ssh (rsync) cannot type: "
            "give it a key (private_key or key_file extra), or use the openssh transport with a ControlMaster"
        )
    identity = login.key_file
    if login.inline_key:
        passphrase = extra.get("private_key_passphrase") or extra.get("passphrase")
        identity = _private_file(workdir, "id", private_key_text(str(extra["private_key"]), passphrase))
    elif identity:
        identity = os.path.expanduser(identity)
    known_hosts = None
    if login.host_key:
        known_hosts = _private_file(workdir, "known_hosts", known_hosts_text(login.host_key))
    argv = key_login_argv(login, identity_file=identity, known_hosts=known_hosts, log_file=log_file)

    def classify(ssh_log: str) -> TransportError:
        return classify_ssh_log(ssh_log, where=login.where, pinned=login.host_key,
                                host_key_fix=HOST_KEY_EXTRA_FIX if login.host_key else NO_PIN_FIX,
                                login_failed=lambda said: login_refused(login.where, said))

    return SSHCommand(tuple(argv), login.host, login.where, log_file, classify)


def _openssh_command(target: OpenSSHTarget, workdir: str, log_file: str) -> SSHCommand:
    runner = OpenSSHRunner(target)
    try:
        runner.check_ready()
    finally:
        runner.close()
    known_hosts = None
    if target.host_key:
        known_hosts = _private_file(workdir, "known_hosts", known_hosts_text(target.host_key))
    argv = target.client_argv(log_file=log_file, known_hosts=known_hosts)
    return SSHCommand(tuple(argv), target.alias, target.where, log_file, runner.classify)


def _connection(conn_id: str) -> Any:
    from airflow.providers.ssh.hooks.ssh import SSHHook

    return SSHHook.get_connection(conn_id)


@contextlib.contextmanager
def ssh_command_for_connection(conn_id: str) -> Iterator[SSHCommand]:
    """The :class:`SSHCommand` of Airflow connection ``conn_id``; its private files go with the context."""
    conn = _connection(conn_id)
    extra = conn.extra_dejson
    workdir = tempfile.mkdtemp(prefix=WORKDIR_PREFIX)
    try:
        log_file = _private_file(workdir, "ssh.log", "")
        if checked_transport(conn_id, extra) == OPENSSH:
            yield _openssh_command(OpenSSHTarget.from_extra(extra, host=conn.host), workdir, log_file)
        else:
            yield _key_login_command(conn_id, extra, workdir, log_file)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def remote_user_for_connection(conn_id: str) -> str:
    """The user name the login node sees: the connection's login, or for ``openssh`` connections
    the ``User`` ssh resolves for the alias. No network."""
    conn = _connection(conn_id)
    extra = conn.extra_dejson
    if checked_transport(conn_id, extra) == OPENSSH:
        runner = OpenSSHRunner(OpenSSHTarget.from_extra(extra, host=conn.host))
        try:
            return runner.resolved_config()["user"]
        finally:
            runner.close()
    from airflow.providers.ssh.hooks.ssh import SSHHook

    return str(SSHHook(ssh_conn_id=conn_id, conn_retry_attempts=1).username)


def person_login_argv(conn_id: str) -> tuple[str, ...]:
    """How a person logs in where connection ``conn_id``'s commands run, as an ssh argv without a
    remote command (for :class:`~slurm_provider.job_handles.JobHandles`): ``ssh [-F file] alias`` for
    an ``openssh`` connection (the person's session reuses the alias's ControlMaster), ``ssh [-p port]
    [-i key_file] user@host`` for a key-based one (an inline ``private_key`` is the deployment's, not
    shown). No network."""
    conn = _connection(conn_id)
    extra = conn.extra_dejson
    if checked_transport(conn_id, extra) == OPENSSH:
        target = OpenSSHTarget.from_extra(extra, host=conn.host)
        return ("ssh", *(("-F", target.config_file) if target.config_file else ()), target.alias)
    if not conn.host:
        raise TransportConfigError(f"connection {conn_id!r} names no host")
    argv = ["ssh"]
    if conn.port and int(conn.port) != 22:
        argv += ["-p", str(conn.port)]
    if extra.get("key_file"):
        argv += ["-i", str(extra["key_file"])]
    argv.append(f"{conn.login}@{conn.host}" if conn.login else str(conn.host))
    return tuple(argv)
