"""The runners that carry a command over the system OpenSSH client, blocking and asyncio: one ``ssh``
per command, through the connection's ControlMaster where its ssh_config sets one. What a
connection's OpenSSH login is, and what an ``ssh`` failure means, is :mod:`slurm_provider.transport.openssh`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import weakref
from pathlib import Path

from slurm_provider.transport.base import (
    CommandResult,
    ControlMasterNotRunning,
    TransportConfigError,
    TransportError,
    TransportTimeout,
    TransportUnavailable,
    check_timeout,
    decode_output,
    known_hosts_text,
    stdin_bytes,
)
from slurm_provider.transport.host_keys import refuse_unchecked, ssh_config_problems
from slurm_provider.transport.openssh import (
    SSH_FAILURE_STATUS,
    OpenSSHTarget,
    classify_ssh_failure,
    control_master_lapsed,
    last_line,
    parse_ssh_g,
    uses_control_master,
)

log = logging.getLogger(__name__)

LOCAL_TIMEOUT = 20.0
"""Seconds a local ``ssh -G`` or ``ssh -O check`` may take."""


class _OpenSSHState:
    """What both runners remember between commands: the resolved config and whether a master is up."""

    def __init__(self, target: OpenSSHTarget) -> None:
        self.target = target
        self.config: dict[str, str] | None = None
        self.master_up: bool | None = None
        self._workdir: str | None = None
        self._known_hosts: str | None = None
        self.connections_opened = 0
        self.commands_issued = 0

    def _dir(self) -> str:
        """A private directory for ssh's log files and the pinned known_hosts, removed on close or
        when the runner is garbage-collected (callers that never close do not leak it)."""
        if self._workdir is None:
            self._workdir = tempfile.mkdtemp(prefix="slurm-provider-ssh-")
            self._cleanup = weakref.finalize(self, shutil.rmtree, self._workdir, True)
        return self._workdir

    @property
    def known_hosts(self) -> str | None:
        """A private known_hosts holding only the pinned key (None: the ssh config decides)."""
        if self.target.host_key and self._known_hosts is None:
            self._known_hosts = os.path.join(self._dir(), "known_hosts")
            Path(self._known_hosts).write_text(known_hosts_text(self.target.host_key))
        return self._known_hosts

    def accept_config(self, ssh_g_output: str) -> dict[str, str]:
        """Keep and return the alias's resolved settings (``ssh -G``), refusing a config that turns
        host-key checking off before any command runs."""
        config = parse_ssh_g(ssh_g_output)
        refuse_unchecked(self.target.where, ssh_config_problems(config))
        self.config = config
        return config

    @property
    def shares_master(self) -> bool:
        return self.config is not None and uses_control_master(self.config)

    @property
    def control_path(self) -> str | None:
        """The alias's ControlPath as ``ssh -G`` resolved it (None before, or without one)."""
        return self.config.get("controlpath") if self.shares_master and self.config else None

    def lapsed(self, said: str | None = None) -> ControlMasterNotRunning:
        return control_master_lapsed(self.target, said, control_path=self.control_path)

    def classify(self, ssh_log: str) -> TransportError:
        return classify_ssh_failure(self.target, ssh_log, shares_master=self.shares_master,
                                    control_path=self.control_path)

    def new_log_file(self) -> str:
        fd, path = tempfile.mkstemp(prefix="ssh-", suffix=".log", dir=self._dir())
        os.close(fd)
        return path

    def must_check_master(self) -> bool:
        return self.shares_master and self.master_up is not True

    def check_master_rule(self) -> None:
        """With ``require_control_master``, refuse unless the alias's master is up."""
        if self.target.require_control_master:
            if not self.shares_master:
                raise TransportConfigError(
                    f"require_control_master is set but ssh alias {self.target.alias} has no ControlPath: "
                    "add ControlMaster auto, ControlPath and ControlPersist to it in your ssh config"
                )
            if not self.master_up:
                raise self.lapsed()

    def before_command(self) -> None:
        self.check_master_rule()
        self.commands_issued += 1

    def after_command(self, ssh_failed: bool, master_was_up: bool | None) -> None:
        if ssh_failed:
            self.master_up = None
            return
        if not self.shares_master or not master_was_up:
            self.connections_opened += 1
        if not master_was_up:
            self.master_up = None  # a master may have been started by this command: look next time

    def result(self, command: str, returncode: int, stdout: bytes, stderr: bytes, log_file: str,
               master_was_up: bool | None) -> CommandResult:
        ssh_log = Path(log_file).read_text(errors="replace") if os.path.exists(log_file) else ""
        os.unlink(log_file)
        if returncode == SSH_FAILURE_STATUS and ssh_log.strip():
            self.after_command(True, master_was_up)
            raise self.classify(ssh_log)
        if returncode < 0:
            self.after_command(True, master_was_up)
            raise TransportUnavailable(
                f"{self.target.where}: ssh was killed by signal {-returncode} on this machine"
            )
        self.after_command(False, master_was_up)
        return CommandResult(command, returncode, decode_output(stdout), decode_output(stderr))

    def close(self) -> None:
        if self._workdir is not None:
            self._cleanup()
        self._workdir, self._known_hosts = None, None


class OpenSSHRunner:
    """Synchronous runner: one ``ssh`` process per command, sharing the alias's master connection."""

    def __init__(self, target: OpenSSHTarget) -> None:
        self.target = target
        self._state = _OpenSSHState(target)

    @property
    def connections_opened(self) -> int:
        """Logins this runner caused (0 while it only rides a master someone else opened)."""
        return self._state.connections_opened

    @property
    def commands_issued(self) -> int:
        return self._state.commands_issued

    def _local(self, argv: list[str]) -> subprocess.CompletedProcess[bytes]:
        try:
            return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=LOCAL_TIMEOUT)
        except FileNotFoundError as exc:
            raise TransportConfigError("the OpenSSH client `ssh` is not installed on this machine") from exc
        except subprocess.TimeoutExpired as exc:
            raise TransportTimeout(f"`{shlex.join(argv)}` did not answer within {LOCAL_TIMEOUT}s") from exc

    def master_running(self) -> bool:
        """``ssh -O check <alias>``: is an authenticated master connection up?"""
        return self._local(self.target.check_argv()).returncode == 0

    def resolved_config(self) -> dict[str, str]:
        """The alias's settings as ssh resolves them (``ssh -G``: user, hostname, controlpath ...)."""
        if self._state.config is not None:
            return self._state.config
        proc = self._local(self.target.config_argv())
        if proc.returncode != 0:
            raise TransportConfigError(f"`{shlex.join(self.target.config_argv())}` failed: "
                                       f"{last_line(decode_output(proc.stderr))}")
        return self._state.accept_config(decode_output(proc.stdout))

    def _prepare(self) -> bool | None:
        self.resolved_config()
        if self._state.must_check_master():
            self._state.master_up = self.master_running()
        return self._state.master_up

    def check_ready(self) -> bool:
        """For another ``ssh`` on this alias (rsync's): apply ``require_control_master`` as a command
        would, and say whether the alias shares a master (a refused login then means it lapsed)."""
        self._prepare()
        self._state.check_master_rule()
        return self._state.shares_master

    def classify(self, ssh_log: str) -> TransportError:
        """What a failed ``ssh`` on this alias means, in the words of this runner's own failures."""
        return self._state.classify(ssh_log)

    def run(self, command: str, *, stdin: bytes | str | None = None, timeout: float) -> CommandResult:
        timeout = check_timeout(timeout)
        master_was_up = self._prepare()
        self._state.before_command()
        log_file = self._state.new_log_file()
        argv = self.target.command_argv(command, log_file=log_file, known_hosts=self._state.known_hosts,
                                        timeout=timeout)
        log.debug("Running on %s: %s", self.target.alias, command)
        data = stdin_bytes(stdin)
        try:
            proc = subprocess.run(argv, input=data if data is not None else b"", capture_output=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            os.unlink(log_file)
            self._state.after_command(True, master_was_up)
            raise TransportTimeout(
                f"{self.target.where}: command did not finish within {timeout}s"
            ) from exc
        except FileNotFoundError as exc:
            raise TransportConfigError("the OpenSSH client `ssh` is not installed on this machine") from exc
        return self._state.result(command, proc.returncode, proc.stdout, proc.stderr, log_file, master_was_up)

    def close(self) -> None:
        """Forget local state; the master connection belongs to the person who opened it and stays up."""
        self._state.close()

    def __enter__(self) -> OpenSSHRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncOpenSSHRunner:
    """Async twin of :class:`OpenSSHRunner` on ``asyncio.create_subprocess_exec``."""

    def __init__(self, target: OpenSSHTarget) -> None:
        self.target = target
        self._state = _OpenSSHState(target)
        self._prepare_lock: asyncio.Lock | None = None

    @property
    def connections_opened(self) -> int:
        return self._state.connections_opened

    @property
    def commands_issued(self) -> int:
        return self._state.commands_issued

    async def _local(self, argv: list[str]) -> tuple[int, bytes, bytes]:
        try:
            return await _communicate(argv, None, LOCAL_TIMEOUT)
        except FileNotFoundError as exc:
            raise TransportConfigError("the OpenSSH client `ssh` is not installed on this machine") from exc
        except asyncio.TimeoutError as exc:
            raise TransportTimeout(f"`{shlex.join(argv)}` did not answer within {LOCAL_TIMEOUT}s") from exc

    async def master_running(self) -> bool:
        returncode, _, _ = await self._local(self.target.check_argv())
        return returncode == 0

    async def _prepare(self) -> bool | None:
        if self._prepare_lock is None:
            self._prepare_lock = asyncio.Lock()
        async with self._prepare_lock:
            if self._state.config is None:
                returncode, out, err = await self._local(self.target.config_argv())
                if returncode != 0:
                    raise TransportConfigError(f"`{shlex.join(self.target.config_argv())}` failed: "
                                               f"{last_line(decode_output(err))}")
                self._state.accept_config(decode_output(out))
            if self._state.must_check_master():
                self._state.master_up = await self.master_running()
            return self._state.master_up

    async def run(self, command: str, *, stdin: bytes | str | None = None, timeout: float) -> CommandResult:
        timeout = check_timeout(timeout)
        master_was_up = await self._prepare()
        self._state.before_command()
        log_file = self._state.new_log_file()
        argv = self.target.command_argv(command, log_file=log_file, known_hosts=self._state.known_hosts,
                                        timeout=timeout)
        log.debug("Running on %s: %s", self.target.alias, command)
        try:
            returncode, out, err = await _communicate(argv, stdin_bytes(stdin), timeout)
        except asyncio.TimeoutError as exc:
            os.unlink(log_file)
            self._state.after_command(True, master_was_up)
            raise TransportTimeout(
                f"{self.target.where}: command did not finish within {timeout}s"
            ) from exc
        except FileNotFoundError as exc:
            raise TransportConfigError("the OpenSSH client `ssh` is not installed on this machine") from exc
        return self._state.result(command, returncode, out, err, log_file, master_was_up)

    async def close(self) -> None:
        self._state.close()


async def _communicate(argv: list[str], data: bytes | None, timeout: float) -> tuple[int, bytes, bytes]:
    """Run ``argv`` with ``data`` on stdin; on timeout or cancellation kill it and re-raise."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(data if data is not None else b""), timeout)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        _abandon(proc)
        raise
    assert proc.returncode is not None
    return proc.returncode, out, err


def _abandon(proc: asyncio.subprocess.Process) -> None:
    """Kill ``ssh`` and close our ends of its pipes.

    A ControlMaster client hands its stdio descriptors to the master, which keeps them until the
    remote command ends; before Python 3.12 ``Process.wait()`` waits for those pipes to close, so
    a hung remote command would hang us too. Closing the subprocess transport releases them now.
    """
    if proc.returncode is None:
        proc.kill()
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()
