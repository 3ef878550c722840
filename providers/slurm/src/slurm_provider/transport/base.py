"""What every transport promises: run one remote command, return its output, raise only when unreachable.

A transport never reads Slurm's output. A command that ran and exited non-zero is a
:class:`CommandResult` like any other; only a failure to *reach* the login node (refused, reset,
timed out, host key rejected, authentication failed) is an exception, a :class:`TransportError`
whose ``retryable`` flag tells the caller whether trying again later can help.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

NO_EXIT_STATUS = -1
"""``exit_status`` when the remote side sent none (the command was killed by a signal)."""


@dataclass(frozen=True)
class CommandResult:
    """One finished remote command: the login shell's exit status and both output streams."""

    command: str
    exit_status: int
    """The remote command's exit status; ``NO_EXIT_STATUS`` (-1) when it reported none."""
    stdout: str
    stderr: str
    exit_signal: str | None = None
    """Signal name when the remote command was killed by one (when the transport can tell)."""

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


class TransportError(Exception):
    """The login node could not be reached or refused us; nothing is known about the command.

    ``retryable`` is True for failures that go away by themselves (connection refused, reset,
    lost, timed out) and False for ones a person must fix (authentication, host key, config).
    """

    retryable: bool = True

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable


class TransportUnavailable(TransportError):
    """Connection refused, reset or lost: the login node or the network is down for now."""

    retryable = True


class TransportTimeout(TransportUnavailable):
    """Connecting or running the command took longer than the timeout.

    The command may still have run (e.g. a submission may have been accepted): callers that
    change state on the cluster must look before they retry.
    """


class AuthenticationFailed(TransportError):
    """The login node rejected our credentials; retrying with the same ones cannot help."""

    retryable = False


class ControlMasterNotRunning(AuthenticationFailed):
    """An OpenSSH alias whose login needs a person (one-time password) has no live master connection.

    Not retryable by the command that met it, but not the end of a watch either: once a person
    opens the master again, the same connection works (the job poller keeps trying).
    """


class HostKeyRejected(TransportError):
    """The login node's host key is not the pinned one (or is unknown): a possible man in the middle."""

    retryable = False


class TransportConfigError(TransportError):
    """The connection's settings are unusable (unknown transport, missing alias, bad ssh config)."""

    retryable = False


@runtime_checkable
class RemoteCommandRunner(Protocol):
    """Runs shell command lines on a cluster's login node, one at a time, synchronously."""

    def run(self, command: str, *, stdin: bytes | str | None = None, timeout: float) -> CommandResult:
        """Run ``command`` in the remote login shell, feed it ``stdin``, wait at most ``timeout`` seconds."""
        ...

    def close(self) -> None:
        """Release the connection (a no-op when there is none)."""
        ...


@runtime_checkable
class AsyncRemoteCommandRunner(Protocol):
    """The asyncio twin of :class:`RemoteCommandRunner`; one connection serves many commands."""

    async def run(self, command: str, *, stdin: bytes | str | None = None, timeout: float) -> CommandResult:
        ...

    async def close(self) -> None:
        ...


def stdin_bytes(stdin: bytes | str | None) -> bytes | None:
    """Text is sent as UTF-8; ``None`` means the command sees an immediate end of input."""
    if stdin is None or isinstance(stdin, bytes):
        return stdin
    return stdin.encode("utf-8")


def decode_output(data: bytes | None) -> str:
    """Remote output as text; bytes that are not UTF-8 become U+FFFD instead of an exception."""
    return (data or b"").decode("utf-8", errors="replace")


def check_timeout(timeout: float) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


# --- the words every SSH client uses for the same failure ------------------------------------------
# paramiko, asyncssh, the OpenSSH runner and the ssh that rsync starts all meet the same failures;
# they describe them with these functions, so a person reads one message whichever client saw it.


def describe_login(conn_id: str, user: str | None, host: str | None, port: int | None) -> str:
    """``user@host:port (connection 'id')``: where a key-based connection logs in."""
    where = f"{user}@{host}" if user else str(host)
    return f"{where}:{port} (connection {conn_id!r})" if port else f"{where} (connection {conn_id!r})"


def host_key_fingerprint(host_key: str) -> str | None:
    """``SHA256:...`` of a pinned ``<type> <base64>`` key, as ssh and paramiko print fingerprints."""
    parts = host_key.split()
    if len(parts) < 2:
        return None
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        return None
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def known_hosts_text(host_key: str) -> str:
    """A known_hosts file that trusts exactly the pinned key, for whatever name the client looks up."""
    key_type, key_data = host_key.split()[:2]
    return f"* {key_type} {key_data}\n"


HOST_KEY_EXTRA_FIX = "update the connection's host_key extra"


def host_key_mismatch(where: str, *, offered: str | None = None, pinned: str | None = None,
                      fix: str = HOST_KEY_EXTRA_FIX) -> HostKeyRejected:
    """The login node presented a host key other than the pinned one: possibly a man in the middle."""
    seen = []
    if offered:
        seen.append(f"it sent {offered}")
    if pinned:
        seen.append(f"pinned is {pinned}")
    detail = f" ({', '.join(seen)})" if seen else ""
    return HostKeyRejected(
        f"host key of {where} does not match the pinned key{detail}: refusing to connect, nothing was run "
        f"or copied. If the login node's key really changed (check the new fingerprint with the site), {fix}."
    )


def host_key_unknown(where: str, detail: str | None = None) -> HostKeyRejected:
    """No key is pinned or known for the login node; we never trust one on first use."""
    said = f" ({detail})" if detail else ""
    return HostKeyRejected(
        f"host key of {where} is not known{said}: refusing to connect. Pin it with the connection's "
        "host_key extra (ssh-keyscan the login node, check the fingerprint with the site) instead of "
        "disabling the check."
    )


def login_refused(where: str, detail: str) -> AuthenticationFailed:
    """The login node refused the connection's credentials."""
    return AuthenticationFailed(
        f"authentication to {where} failed ({detail}); check the connection's login and key_file/private_key"
    )
