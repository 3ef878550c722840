"""What every transport promises: run one remote command, return its output, raise only when unreachable.

A transport never reads Slurm's output. A command that ran and exited non-zero is a
:class:`CommandResult` like any other; only a failure to *reach* the login node (refused, reset,
timed out, host key rejected, authentication failed) is an exception, a :class:`TransportError`
whose ``retryable`` flag tells the caller whether trying again later can help.
"""

from __future__ import annotations

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
    """An OpenSSH alias whose login needs a person (one-time password) has no live master connection."""


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
