"""Transport through Airflow's SSH provider: ``SSHHook`` (paramiko) and ``SSHHookAsync`` (asyncssh).

The provider's hooks read the Airflow connection (login, key file or inline key, password,
pinned ``host_key``, timeouts) and open the connection; these runners only run commands on it.
Both keep **one** connection for their lifetime and reconnect after it is lost.

``SSHHook.exec_ssh_client_command`` is not used: it closes stdin before the command starts (the
job script travels on stdin) and logs every output line (logs and files we read would flood the
task log). ``SSHHookAsync.run_command`` is not used either: it opens a connection per command and
reports a command killed by a signal as exit status 0.
"""

from __future__ import annotations

import asyncio
import logging
import selectors
import socket
import threading
import time
import weakref
from typing import Any

import paramiko
from airflow.providers.ssh.hooks.ssh import SSHHook, SSHHookAsync

from slurm_provider.transport.base import (
    NO_EXIT_STATUS,
    CommandResult,
    TransportError,
    TransportTimeout,
    TransportUnavailable,
    check_timeout,
    decode_output,
    describe_login,
    host_key_fingerprint,
    host_key_mismatch,
    host_key_unknown,
    login_refused,
    stdin_bytes,
)

# asyncssh logs several INFO lines per command; in a triggerer that is per job per poll.
logging.getLogger("asyncssh").setLevel(logging.WARNING)
log = logging.getLogger(__name__)

_READ_CHUNK = 65536
_IDLE_WAKEUP = 0.5
"""Longest sleep between checks of a quiet channel (paramiko's fileno misses some close events)."""


def map_paramiko_error(exc: BaseException, where: str) -> TransportError:
    """Translate a paramiko/socket failure into a :class:`TransportError` with the right retry flag."""
    if isinstance(exc, TransportError):
        return exc
    if isinstance(exc, paramiko.BadHostKeyException):
        return host_key_mismatch(where, offered=exc.key.fingerprint, pinned=exc.expected_key.fingerprint)
    if isinstance(exc, paramiko.AuthenticationException):
        return login_refused(where, f"{type(exc).__name__}: {exc}")
    if isinstance(exc, paramiko.SSHException) and "known_hosts" in str(exc):
        return host_key_unknown(where, str(exc))
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return TransportTimeout(f"timed out talking to {where}: {exc or 'no answer'}")
    if isinstance(exc, (OSError, EOFError, paramiko.SSHException)):
        return TransportUnavailable(f"cannot reach {where}: {type(exc).__name__}: {exc}")
    return TransportError(f"SSH to {where} failed: {type(exc).__name__}: {exc}", retryable=False)


class SSHProviderRunner:
    """Synchronous runner on one paramiko connection opened by the SSH provider's ``SSHHook``."""

    def __init__(self, conn_id: str, *, ssh_hook: Any | None = None) -> None:
        self.conn_id = conn_id
        # One connection attempt per call: retrying (with back-off) is the caller's decision.
        self._hook = ssh_hook or SSHHook(ssh_conn_id=conn_id, conn_retry_attempts=1)
        self._client: paramiko.SSHClient | None = None
        self._closer: weakref.finalize | None = None
        self.connections_opened = 0
        self.commands_issued = 0

    @property
    def where(self) -> str:
        return describe_login(self.conn_id, self._hook.username, self._hook.remote_host, self._hook.port)

    def _connection(self) -> paramiko.Transport:
        transport = self._client.get_transport() if self._client else None
        if transport is not None and transport.is_active():
            return transport
        self.close()
        try:
            self._client = self._hook.get_conn()
        except Exception as exc:
            raise map_paramiko_error(exc, self.where) from exc
        # A caller that never closes (a hook dropped after one poke) must not leak the connection.
        self._closer = weakref.finalize(self, self._client.close)
        self.connections_opened += 1
        log.info("Connected to %s", self.where)
        transport = self._client.get_transport()
        if transport is None:
            raise TransportUnavailable(f"connection to {self.where} closed right after it opened")
        disable_nagle(transport.sock)
        return transport

    def run(self, command: str, *, stdin: bytes | str | None = None, timeout: float) -> CommandResult:
        deadline = time.monotonic() + check_timeout(timeout)
        data = stdin_bytes(stdin)
        transport = self._connection()
        self.commands_issued += 1
        log.debug("Running on %s: %s", self.where, command)
        try:
            channel = transport.open_session(timeout=_remaining(deadline))
            try:
                channel.exec_command(command)
                return self._collect(channel, command, data, deadline)
            finally:
                channel.close()
        except TransportError:
            raise
        except Exception as exc:
            if not transport.is_active():
                self.close()
            raise map_paramiko_error(exc, self.where) from exc

    def _collect(
        self, channel: paramiko.Channel, command: str, data: bytes | None, deadline: float
    ) -> CommandResult:
        """Feed stdin from a thread while reading both streams, so neither side can block the other."""
        writer_error: list[BaseException] = []

        def write_stdin() -> None:
            try:
                if data:
                    channel.sendall(data)
                channel.shutdown_write()
            except Exception as exc:
                writer_error.append(exc)

        writer = threading.Thread(target=write_stdin, name="ssh-stdin", daemon=True)
        writer.start()
        stdout, stderr = bytearray(), bytearray()
        with selectors.DefaultSelector() as selector:
            selector.register(channel, selectors.EVENT_READ)
            while True:
                if channel.recv_ready():
                    stdout += channel.recv(_READ_CHUNK)
                    continue
                if channel.recv_stderr_ready():
                    stderr += channel.recv_stderr(_READ_CHUNK)
                    continue
                if channel.eof_received or channel.closed:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TransportTimeout(f"command on {self.where} did not finish within the timeout")
                selector.select(min(remaining, _IDLE_WAKEUP))
        if not channel.status_event.wait(max(deadline - time.monotonic(), 0.01)):
            raise TransportTimeout(f"command on {self.where} sent no exit status within the timeout")
        writer.join(timeout=1)
        exit_status = channel.recv_exit_status()
        if exit_status == NO_EXIT_STATUS and not channel.get_transport().is_active():
            raise TransportUnavailable(f"connection to {self.where} was lost while a command ran")
        if writer_error and exit_status == NO_EXIT_STATUS:
            raise map_paramiko_error(writer_error[0], self.where)
        return CommandResult(command, exit_status, decode_output(bytes(stdout)), decode_output(bytes(stderr)))

    def close(self) -> None:
        if self._closer is not None:
            self._closer()
        self._client, self._closer = None, None
        self._hook.client = None

    def __enter__(self) -> SSHProviderRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def disable_nagle(sock: Any) -> None:
    """Send small SSH packets at once, like OpenSSH does.

    paramiko leaves Nagle's algorithm on; with the peer's delayed ACK every short command then
    waits ~40 ms for its channel-close packets, which dominates polls and quick checks.
    """
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, AttributeError):  # a proxy command's pipe has no TCP options
        pass


def _remaining(deadline: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TransportTimeout("timed out before the command could start")
    return remaining


def map_asyncssh_error(exc: BaseException, where: str, *, pinned: str | None = None) -> TransportError:
    """Translate an asyncssh/socket failure into a :class:`TransportError` with the right retry flag.

    ``pinned``: the connection's ``host_key`` extra, if any (asyncssh names no fingerprint itself).
    """
    import asyncssh

    if isinstance(exc, TransportError):
        return exc
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        if pinned:
            return host_key_mismatch(where, pinned=host_key_fingerprint(pinned))
        return host_key_unknown(where, exc.reason)
    if isinstance(exc, asyncssh.PermissionDenied):
        return login_refused(where, exc.reason)
    if isinstance(exc, (asyncssh.KeyExchangeFailed, asyncssh.ProtocolNotSupported, asyncssh.IllegalUserName)):
        return TransportError(f"SSH to {where} failed: {exc.reason}", retryable=False)
    if isinstance(exc, (asyncssh.TimeoutError, asyncio.TimeoutError, TimeoutError, socket.timeout)):
        return TransportTimeout(f"timed out talking to {where}")
    if isinstance(exc, asyncssh.DisconnectError):
        return TransportUnavailable(f"connection to {where} closed: {exc.reason}")
    if isinstance(exc, (OSError, EOFError, asyncssh.ChannelOpenError, asyncssh.Error)):
        return TransportUnavailable(f"cannot reach {where}: {type(exc).__name__}: {exc}")
    return TransportError(f"SSH to {where} failed: {type(exc).__name__}: {exc}", retryable=False)


def _feed_stdin(process: Any, data: bytes | None) -> None:
    """Write ``data`` and EOF to the remote command's stdin. A command may exit without reading
    its input (``sbatch`` rejecting an option before it reads the script): once the channel is
    closed the write fails, and the command's exit status and output are still the result, as
    with the paramiko transport. A lost connection shows as a missing exit status instead."""
    try:
        if data:
            process.stdin.write(data)
        process.stdin.write_eof()
    except BrokenPipeError:
        log.debug("the remote command closed its input before reading all of it")


class AsyncSSHProviderRunner:
    """Async runner on one asyncssh connection opened by the SSH provider's ``SSHHookAsync``.

    The connection is opened by the first command and shared by every later one, including
    concurrent ones (each runs on its own channel, at most ``max_sessions`` at a time: OpenSSH
    allows 10 sessions per connection by default). ``SSHHookAsync`` turns the connection's
    ``host_key`` extra into the only trusted key, so a wrong or missing pin is refused.
    """

    def __init__(
        self, conn_id: str, *, where: str | None = None, ssh_hook: Any | None = None, max_sessions: int = 8,
        pinned_host_key: str | None = None,
    ) -> None:
        self.conn_id = conn_id
        self._pinned = pinned_host_key
        self._hook = ssh_hook or SSHHookAsync(ssh_conn_id=conn_id)
        self._conn: Any = None
        self._connect_lock: asyncio.Lock | None = None
        self._sessions: asyncio.Semaphore | None = None
        self._max_sessions = max_sessions
        self._where = where or f"connection {conn_id!r}"
        self.connections_opened = 0
        self.commands_issued = 0

    async def _connection(self, deadline: float) -> Any:
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
            self._sessions = asyncio.Semaphore(self._max_sessions)
        async with self._connect_lock:
            if self._conn is not None and not self._conn.is_closed():
                return self._conn
            self._conn = None
            try:
                conn = await asyncio.wait_for(self._hook.get_conn(), _remaining(deadline))
            except Exception as exc:
                raise map_asyncssh_error(exc, self._where, pinned=self._pinned) from exc
            self._conn = conn
            self.connections_opened += 1
            log.info("Connected to %s", self._where)
            return conn

    async def run(self, command: str, *, stdin: bytes | str | None = None, timeout: float) -> CommandResult:
        deadline = time.monotonic() + check_timeout(timeout)
        data = stdin_bytes(stdin)
        conn = await self._connection(deadline)
        assert self._sessions is not None
        async with self._sessions:
            self.commands_issued += 1
            log.debug("Running on %s: %s", self._where, command)
            process = None
            try:
                process = await asyncio.wait_for(conn.create_process(command, encoding=None), _remaining(deadline))
                _feed_stdin(process, data)
                result = await process.wait(check=False, timeout=_remaining(deadline))
            except Exception as exc:
                if process is not None:
                    process.close()  # a command past its timeout does not keep a session of the connection
                if conn.is_closed():
                    self._conn = None
                raise map_asyncssh_error(exc, self._where, pinned=self._pinned) from exc
        exit_status = result.exit_status
        signal_name = result.exit_signal[0] if result.exit_signal else None
        if exit_status is None:
            if conn.is_closed() and signal_name is None:
                self._conn = None
                raise TransportUnavailable(f"connection to {self._where} was lost while a command ran")
            exit_status = NO_EXIT_STATUS
        return CommandResult(
            command, exit_status, decode_output(result.stdout), decode_output(result.stderr), signal_name
        )

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            await conn.wait_closed()
