"""Pick the transport an Airflow connection asks for, in one place.

The connection extra ``transport`` selects it: ``paramiko`` (default: the SSH provider's hooks,
key or password from the connection, pinned ``host_key``) or ``openssh`` (the system ``ssh``
client and an ssh_config alias with a shared ControlMaster, for logins that need a one-time
password).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from airflow.providers.common.compat.connection import get_async_connection
from airflow.providers.ssh.hooks.ssh import SSHHook

from slurm_provider.transport.base import (
    AsyncRemoteCommandRunner,
    CommandResult,
    RemoteCommandRunner,
    TransportConfigError,
    describe_login,
)
from slurm_provider.transport.host_keys import extra_problems, refuse_unchecked
from slurm_provider.transport.openssh import OpenSSHTarget
from slurm_provider.transport.openssh_runners import AsyncOpenSSHRunner, OpenSSHRunner
from slurm_provider.transport.ssh_provider import AsyncSSHProviderRunner, SSHProviderRunner

PARAMIKO = "paramiko"
OPENSSH = "openssh"
TRANSPORTS = (PARAMIKO, OPENSSH)


def transport_name(extra: Mapping[str, Any]) -> str:
    """The transport a connection's extras ask for; an unknown name is refused with the known ones."""
    name = str(extra.get("transport") or PARAMIKO).strip().lower()
    if name not in TRANSPORTS:
        raise TransportConfigError(
            f"connection extra transport={extra.get('transport')!r} is not known "
            f"(known: {', '.join(TRANSPORTS)})"
        )
    return name


def checked_transport(conn_id: str, extra: Mapping[str, Any]) -> str:
    """:func:`transport_name`, after refusing extras that turn host-key checking off (nothing may
    run on a login node whose key is not checked)."""
    refuse_unchecked(f"connection {conn_id!r}", extra_problems(extra))
    return transport_name(extra)


def runner_for_connection(conn_id: str) -> RemoteCommandRunner:
    """A synchronous runner for the Airflow connection ``conn_id``."""
    conn = SSHHook.get_connection(conn_id)
    extra = conn.extra_dejson
    if checked_transport(conn_id, extra) == OPENSSH:
        return OpenSSHRunner(OpenSSHTarget.from_extra(extra, host=conn.host))
    return SSHProviderRunner(conn_id)


def async_runner_for_connection(conn_id: str) -> AsyncConnectionRunner:
    """An async runner for ``conn_id``; the connection is read (without blocking) on the first command."""
    return AsyncConnectionRunner(conn_id)


class AsyncConnectionRunner:
    """The async runner an Airflow connection asks for, chosen when the first command runs.

    Creating it does no I/O, so a trigger can build it in ``__init__``/``run()`` and the
    connection is looked up inside the event loop with the provider's async connection getter.
    """

    def __init__(self, conn_id: str) -> None:
        self.conn_id = conn_id
        self._runner: AsyncRemoteCommandRunner | None = None
        self._lock: asyncio.Lock | None = None
        self._extra: dict[str, Any] | None = None

    @property
    def transport(self) -> AsyncRemoteCommandRunner | None:
        """The concrete runner once chosen (None before the first command)."""
        return self._runner

    @property
    def connections_opened(self) -> int:
        return getattr(self._runner, "connections_opened", 0)

    @property
    def commands_issued(self) -> int:
        return getattr(self._runner, "commands_issued", 0)

    async def _resolve(self) -> AsyncRemoteCommandRunner:
        if self._runner is not None:
            return self._runner
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._runner is None:
                self._runner = await self._create()
        return self._runner

    async def extra(self) -> dict[str, Any]:
        """The connection's extras (read once, without blocking)."""
        if self._extra is None:
            self._extra = dict((await get_async_connection(self.conn_id)).extra_dejson)
        return self._extra

    async def _create(self) -> AsyncRemoteCommandRunner:
        conn = await get_async_connection(self.conn_id)
        extra = conn.extra_dejson
        self._extra = dict(extra)
        if checked_transport(self.conn_id, extra) == OPENSSH:
            return AsyncOpenSSHRunner(OpenSSHTarget.from_extra(extra, host=conn.host))
        where = describe_login(self.conn_id, conn.login, conn.host, conn.port or 22)
        return AsyncSSHProviderRunner(self.conn_id, where=where, pinned_host_key=extra.get("host_key"))

    async def run(self, command: str, *, stdin: bytes | str | None = None, timeout: float) -> CommandResult:
        runner = await self._resolve()
        return await runner.run(command, stdin=stdin, timeout=timeout)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.close()
