"""Transports against the local cluster's real SSH login: both connections, sync and async.

Every behaviour is checked on the paramiko connection (SSH provider hooks) and on the OpenSSH
connection (system ``ssh`` with the ControlMaster alias), through the same tests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shlex
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.localcluster import new_key_pair
from support.ports import free_port
from slurm_provider.transport import (
    AuthenticationFailed,
    CommandResult,
    ControlMasterNotRunning,
    HostKeyRejected,
    OpenSSHRunner,
    OpenSSHTarget,
    TransportConfigError,
    TransportTimeout,
    TransportUnavailable,
    async_runner_for_connection,
    runner_for_connection,
    transport_name,
)
from slurm_provider.transport.openssh import classify_ssh_failure, control_master_lapsed, parse_ssh_g

PARAMIKO_CONN = "vcloud_local_cluster"
OPENSSH_CONN = "vcloud_local_cluster_openssh"
CONN_IDS = [PARAMIKO_CONN, OPENSSH_CONN]


@pytest.fixture(params=CONN_IDS)
def conn_id(request: pytest.FixtureRequest, cluster_connection: str) -> str:
    return request.param


def run_sync(conn_id: str, command: str, **kwargs) -> CommandResult:
    runner = runner_for_connection(conn_id)
    try:
        return runner.run(command, timeout=kwargs.pop("timeout", 30), **kwargs)
    finally:
        runner.close()


def run_async(conn_id: str, command: str, **kwargs) -> CommandResult:
    async def main() -> CommandResult:
        runner = async_runner_for_connection(conn_id)
        try:
            return await runner.run(command, timeout=kwargs.pop("timeout", 30), **kwargs)
        finally:
            await runner.close()

    return asyncio.run(main())


RUNNERS = {"sync": run_sync, "async": run_async}


@pytest.fixture(params=sorted(RUNNERS))
def run(request: pytest.FixtureRequest):
    return RUNNERS[request.param]


def _set_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, conn: dict) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    return conn_id


@pytest.fixture
def marker() -> Iterator[Path]:
    """A path the cluster user could create (world-writable /tmp) if a command ran when it must not."""
    path = Path(tempfile.gettempdir()) / f"slurm-provider-marker-{os.urandom(6).hex()}"
    yield path
    path.unlink(missing_ok=True)


# --- running commands -----------------------------------------------------------------------------


def test_result_carries_exit_status_and_both_streams(conn_id: str, run) -> None:
    result = run(conn_id, "cat; echo to-stderr >&2; exit 3", stdin="from stdin\n")
    assert result == CommandResult(
        "cat; echo to-stderr >&2; exit 3", 3, "from stdin\n", "to-stderr\n", None
    )
    assert not result.ok


def test_exit_255_of_the_remote_command_is_data(conn_id: str, run) -> None:
    # 255 is also what ssh exits with when *it* fails; only ssh's own log decides which it was.
    result = run(conn_id, "echo partial; exit 255")
    assert (result.exit_status, result.stdout) == (255, "partial\n")


def test_megabytes_both_ways_do_not_deadlock(conn_id: str) -> None:
    payload = os.urandom(3 * 1024 * 1024).hex()[: 3 * 1024 * 1024]  # more than an SSH window
    result = run_sync(conn_id, "cat; head -c 2000000 /dev/zero | tr '\\0' e >&2", stdin=payload, timeout=60)
    assert result.exit_status == 0
    assert result.stdout == payload
    assert result.stderr == "e" * 2_000_000


def test_timeout_is_a_retryable_transport_error_and_the_runner_recovers(conn_id: str) -> None:
    runner = runner_for_connection(conn_id)
    try:
        with pytest.raises(TransportTimeout) as caught:
            runner.run("sleep 10", timeout=1)
        assert caught.value.retryable
        assert runner.run("echo still here", timeout=30).stdout == "still here\n"
    finally:
        runner.close()


def test_async_runner_shares_one_connection_across_concurrent_commands(conn_id: str) -> None:
    async def main() -> tuple[set[str], int, int]:
        runner = async_runner_for_connection(conn_id)
        try:
            results = await asyncio.gather(
                *(runner.run("sleep 0.2; echo $SSH_CONNECTION", timeout=30) for _ in range(12))
            )
            results.append(await runner.run("echo $SSH_CONNECTION", timeout=30))
            return {r.stdout for r in results}, runner.connections_opened, runner.commands_issued
        finally:
            await runner.close()

    client_endpoints, opened, issued = asyncio.run(main())
    assert len(client_endpoints) == 1, f"commands used several TCP connections: {client_endpoints}"
    assert issued == 13
    assert opened <= 1 if conn_id == OPENSSH_CONN else opened == 1


def test_sync_runner_reuses_its_connection(conn_id: str) -> None:
    runner = runner_for_connection(conn_id)
    try:
        first = runner.run("echo $SSH_CONNECTION", timeout=30).stdout
        second = runner.run("echo $SSH_CONNECTION", timeout=30).stdout
    finally:
        runner.close()
    assert first == second
    assert runner.commands_issued == 2 and runner.connections_opened <= 1


def test_paramiko_connection_sends_small_packets_without_delay(cluster_connection: str) -> None:
    # With Nagle's algorithm on, every short command waited ~40 ms for the peer's delayed ACK.
    runner = runner_for_connection(PARAMIKO_CONN)
    try:
        runner.run("true", timeout=30)
        sock = runner._connection().sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        runner.close()


def test_openssh_rides_the_control_master(local_cluster, cluster_connection: str) -> None:
    config = parse_ssh_g(subprocess.run(local_cluster.ssh_argv("-G"), capture_output=True, text=True,
                                        check=True).stdout)
    runner = runner_for_connection(OPENSSH_CONN)
    assert isinstance(runner, OpenSSHRunner)
    try:
        first = runner.run("echo $SSH_CONNECTION", timeout=30)
        socket_path = Path(config["controlpath"])
        assert socket_path.is_socket(), f"no ControlMaster socket at {socket_path}"
        check = subprocess.run(local_cluster.ssh_argv("-O", "check"), capture_output=True, text=True)
        assert check.returncode == 0 and "Master running" in check.stderr
        master_pid = check.stderr.split("pid=")[1].split(")")[0]
        second = runner.run("echo $SSH_CONNECTION", timeout=30)
        again = subprocess.run(local_cluster.ssh_argv("-O", "check"), capture_output=True, text=True)
    finally:
        runner.close()
    # Same client port: the second command travelled over the master's TCP connection.
    assert first.stdout == second.stdout
    assert f"pid={master_pid})" in again.stderr
    assert runner.connections_opened <= 1


# --- failures: which are retryable, and what they say ----------------------------------------------


@pytest.mark.parametrize("transport", ["paramiko", "openssh", "openssh-config"])
def test_wrong_pinned_host_key_is_refused(local_cluster, cluster_connection: str, run, transport: str,
                                          tmp_path: Path, control_dir: Path, marker: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _, wrong_key = new_key_pair(tmp_path, "impostor")
    conn = local_cluster.connection(PARAMIKO_CONN)
    if transport == "paramiko":
        conn["extra"] = {**conn["extra"], "host_key": wrong_key}
    else:
        wrong_known_hosts = tmp_path / "known_hosts"
        wrong_known_hosts.write_text(f"[127.0.0.1]:{local_cluster.ssh_port} {wrong_key}\n")
        overrides = {"UserKnownHostsFile": str(wrong_known_hosts)} if transport == "openssh-config" else {}
        extra = {"transport": "openssh", "ssh_alias": "vcloud-local",
                 "ssh_config_file": str(local_cluster.ssh_config_copy(tmp_path, control_dir / "%C", **overrides))}
        if transport == "openssh":
            extra["host_key"] = wrong_key
        conn = {"conn_type": "ssh", "host": "127.0.0.1", "port": local_cluster.ssh_port, "extra": extra}
    conn_id = _set_connection(monkeypatch, f"wrong_host_key_{transport.replace('-', '_')}", conn)

    with pytest.raises(HostKeyRejected) as caught:
        run(conn_id, f"touch {shlex.quote(str(marker))}")
    assert not caught.value.retryable
    assert not marker.exists(), "the command ran although the host key was wrong"
    run(PARAMIKO_CONN, f"touch {shlex.quote(str(marker))}")  # the same command does run when trusted
    assert marker.exists()


UNCHECKED = {
    "no_host_key_check": ({"no_host_key_check": True}, {}),
    "ignore_hostkey_verification": ({"ignore_hostkey_verification": "true"}, {}),
    "allow_host_key_change": ({"allow_host_key_change": "true"}, {}),
    "known_hosts_none": ({"known_hosts": "none"}, {}),
    "config_strict_no": (None, {"StrictHostKeyChecking": "no"}),
    "config_accept_new": (None, {"StrictHostKeyChecking": "accept-new"}),
    "config_known_hosts_dev_null": (None, {"UserKnownHostsFile": "/dev/null"}),
}
"""Ways to turn host-key checking off: extras of the key-based connection, or ssh_config settings of
the openssh one (whose connection also pins the key: the master a person opens reads the config alone)."""


@pytest.mark.parametrize("setting", sorted(UNCHECKED))
def test_a_connection_that_turns_host_key_checking_off_runs_nothing(
        local_cluster, cluster_connection: str, run, setting: str, tmp_path: Path, control_dir: Path,
        marker: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    extras, config_options = UNCHECKED[setting]
    if extras is not None:
        conn = local_cluster.connection(PARAMIKO_CONN)
        conn["extra"] = {**conn["extra"], **extras}
    else:
        config = local_cluster.ssh_config_copy(tmp_path, control_dir / "%C", **config_options)
        pin = local_cluster.known_hosts.read_text().split(maxsplit=1)[1].strip()
        conn = {"conn_type": "ssh", "extra": {"transport": "openssh", "ssh_alias": "vcloud-local",
                                              "ssh_config_file": str(config), "host_key": pin}}
    conn_id = _set_connection(monkeypatch, f"unchecked_{setting}", conn)

    with pytest.raises(TransportConfigError) as caught:
        run(conn_id, f"touch {shlex.quote(str(marker))}")
    message = str(caught.value)
    assert "would log in without checking the login node's host key" in message
    if extras is not None:
        assert message.startswith(f"connection '{conn_id}'") and "host_key extra" in message
    else:
        assert "StrictHostKeyChecking yes and UserKnownHostsFile" in message
    assert not caught.value.retryable
    assert not marker.exists(), "a command ran on a connection that does not check the host key"
    assert not list(control_dir.iterdir()), "a master connection was opened"
    # The same login with its key pinned (and the cluster's own ssh_config, which checks it) runs.
    run(PARAMIKO_CONN if extras is not None else OPENSSH_CONN, f"touch {shlex.quote(str(marker))}")
    assert marker.exists()


def test_connection_refused_is_retryable(local_cluster, cluster_connection: str, run, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    conn = {**local_cluster.connection(PARAMIKO_CONN), "port": free_port()}
    conn_id = _set_connection(monkeypatch, "refused_paramiko", conn)
    with pytest.raises(TransportUnavailable) as caught:
        run(conn_id, "true", timeout=15)
    assert caught.value.retryable


def test_openssh_connection_refused_is_retryable(local_cluster, cluster_connection: str, run, tmp_path: Path,
                                                 control_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = local_cluster.ssh_config_copy(tmp_path, control_dir / "%C", Port=str(free_port()))
    conn_id = _set_connection(monkeypatch, "refused_openssh", {
        "conn_type": "ssh", "extra": {"transport": "openssh", "ssh_alias": "vcloud-local",
                                      "ssh_config_file": str(config)}})
    with pytest.raises(TransportUnavailable) as caught:
        run(conn_id, "true", timeout=15)
    assert caught.value.retryable and "Connection refused" in str(caught.value)


def test_rejected_key_is_not_retryable(local_cluster, cluster_connection: str, run, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    stranger, _ = new_key_pair(tmp_path, "stranger")
    conn = local_cluster.connection(PARAMIKO_CONN)
    conn["extra"] = {**conn["extra"], "key_file": str(stranger), "look_for_keys": False}
    conn_id = _set_connection(monkeypatch, "rejected_key", conn)
    with pytest.raises(AuthenticationFailed) as caught:
        run(conn_id, "true")
    assert not caught.value.retryable


def test_openssh_without_master_says_how_to_open_one(local_cluster, cluster_connection: str, run,
                                                     tmp_path: Path, control_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Stands in for an OTP login: without the master, BatchMode ssh cannot log in.
    stranger, _ = new_key_pair(tmp_path, "stranger")
    config = local_cluster.ssh_config_copy(tmp_path, control_dir / "%C", IdentityFile=str(stranger))
    conn_id = _set_connection(monkeypatch, "otp_alias", {
        "conn_type": "ssh", "extra": {"transport": "openssh", "ssh_alias": "vcloud-local",
                                      "ssh_config_file": str(config)}})
    with pytest.raises(ControlMasterNotRunning) as caught:
        run(conn_id, "true")
    assert not caught.value.retryable
    message = str(caught.value)
    assert message.startswith(f"no ControlMaster is running for ssh alias vcloud-local ({config}) "
                              "(ssh said: ")
    # ssh -G expands the ControlPath's %C (a hash of host, port and user): the socket's real name
    assert re.search(f"; its login needs a person \\(one-time password\\). Open it again on host "
                     f"{re.escape(socket.gethostname())} \\(where this task or trigger looked for the master, "
                     f"ControlPath {re.escape(str(control_dir))}/[0-9a-f]{{40}}\\) with: "
                     f"{re.escape(f'ssh -F {config} -o ControlMaster=auto -fN vcloud-local')}$", message), message


def test_require_control_master_never_logs_in_itself(local_cluster, cluster_connection: str, run,
                                                     tmp_path: Path, control_dir: Path, marker: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    config = local_cluster.ssh_config_copy(tmp_path, control_dir / "%C")  # a login that *would* succeed
    conn_id = _set_connection(monkeypatch, "master_only", {
        "conn_type": "ssh", "extra": {"transport": "openssh", "ssh_alias": "vcloud-local",
                                      "ssh_config_file": str(config), "require_control_master": True}})
    with pytest.raises(ControlMasterNotRunning, match="no ControlMaster is running for ssh alias vcloud-loc"):
        run(conn_id, f"touch {shlex.quote(str(marker))}")
    assert not marker.exists()
    assert not list(control_dir.iterdir()), "a master connection was opened"


def test_no_secret_reaches_the_logs(local_cluster, cluster_connection: str, tmp_path: Path,
                                    caplog: pytest.LogCaptureFixture,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    private_key = local_cluster.key_file.read_text()
    password = "pw-Zq8-never-log-me"
    conn = local_cluster.connection(PARAMIKO_CONN)
    extra = {k: v for k, v in conn["extra"].items() if k != "key_file"}
    conn = {**conn, "password": password, "extra": {**extra, "private_key": private_key}}
    conn_id = _set_connection(monkeypatch, "inline_key", conn)
    _, wrong_key = new_key_pair(tmp_path, "impostor")
    bad_id = _set_connection(monkeypatch, "inline_key_bad_host",
                             {**conn, "extra": {**conn["extra"], "host_key": wrong_key}})

    caplog.set_level(logging.DEBUG)
    messages = []
    for run in (run_sync, run_async):
        assert run(conn_id, "echo hello", stdin="input").stdout == "hello\n"
        with pytest.raises(HostKeyRejected) as caught:
            run(bad_id, "true")
        messages.append(str(caught.value))

    logged = caplog.text + "\n".join(messages)
    assert "Connected to vcloud@127.0.0.1" in caplog.text  # the capture works
    assert password not in logged
    key_lines = [line for line in private_key.splitlines() if line and not line.startswith("-----")]
    assert key_lines and not any(line in logged for line in key_lines)


# --- pure parts ---------------------------------------------------------------------------------


def test_transport_name_defaults_to_paramiko_and_refuses_unknown() -> None:
    assert transport_name({}) == "paramiko"
    assert transport_name({"transport": "OpenSSH"}) == "openssh"
    with pytest.raises(TransportConfigError, match="known: paramiko, openssh"):
        transport_name({"transport": "telnet"})


def test_openssh_target_refuses_an_alias_that_reads_as_an_option() -> None:
    with pytest.raises(TransportConfigError, match="not a host alias"):
        OpenSSHTarget(alias="-oProxyCommand=touch /tmp/pwned")


def test_openssh_command_line_never_prompts_and_ends_options() -> None:
    argv = OpenSSHTarget(alias="lumi2").command_argv("squeue --me", log_file="/tmp/l", known_hosts=None,
                                                     timeout=30)
    assert argv[0] == "ssh" and "-F" not in argv
    assert "BatchMode=yes" in argv and "ClearAllForwardings=yes" in argv
    assert argv[-3:] == ["lumi2", "--", "squeue --me"]


@pytest.mark.parametrize(("log", "expected", "retryable"), [
    ("Host key verification failed.", HostKeyRejected, False),
    ("ssh: connect to host lumi.csc.fi port 22: Connection refused", TransportUnavailable, True),
    ("ssh: connect to host lumi.csc.fi port 22: Connection timed out", TransportTimeout, True),
    ("digifarm@lumi.csc.fi: Permission denied (publickey,keyboard-interactive).",
     ControlMasterNotRunning, False),
    ("/home/u/.ssh/config: line 3: Bad configuration option: foo", TransportConfigError, False),
])
def test_ssh_failures_are_classified(log: str, expected: type, retryable: bool) -> None:
    error = classify_ssh_failure(OpenSSHTarget(alias="lumi2"), log, shares_master=True)
    assert type(error) is expected and error.retryable is retryable


def test_refused_login_without_a_master_setup_says_how_to_add_one() -> None:
    error = classify_ssh_failure(OpenSSHTarget(alias="lumi2"), "Permission denied (publickey).",
                                 shares_master=False)
    assert type(error) is AuthenticationFailed and "ControlMaster auto" in str(error)


def test_otp_message_names_the_alias_and_the_host_to_open_it_on() -> None:
    error = classify_ssh_failure(OpenSSHTarget(alias="lumi2"), "Permission denied (keyboard-interactive).",
                                 shares_master=True, control_path="/opt/airflow/ssh-control/lumi2")
    assert str(error) == (
        "no ControlMaster is running for ssh alias lumi2 (ssh said: Permission denied "
        "(keyboard-interactive).); its login needs a person (one-time password). Open it again on host "
        f"{socket.gethostname()} (where this task or trigger looked for the master, ControlPath "
        "/opt/airflow/ssh-control/lumi2) with: ssh -o ControlMaster=auto -fN lumi2"
    )


def test_the_lapsed_master_message_names_the_host_that_looked() -> None:
    """With several workers and triggerers the socket is on one of them: the message names it."""
    target = OpenSSHTarget(alias="lumi2")
    error = control_master_lapsed(target, host="worker-lumi")
    assert type(error) is ControlMasterNotRunning and not error.retryable
    assert "Open it again on host worker-lumi (where this task or trigger looked for the master) with: " \
           "ssh -o ControlMaster=auto -fN lumi2" in str(error)


def test_async_timeout_is_retryable_and_the_connection_stays_usable(conn_id: str) -> None:
    async def main() -> tuple[bool, str, int]:
        runner = async_runner_for_connection(conn_id)
        try:
            with pytest.raises(TransportTimeout) as caught:
                await runner.run("sleep 10", timeout=1)
            after = await runner.run("echo still here", timeout=30)
            return caught.value.retryable, after.stdout, runner.connections_opened
        finally:
            await runner.close()

    retryable, stdout, opened = asyncio.run(main())
    assert retryable and stdout == "still here\n" and opened <= 1


def test_lost_connection_is_retryable_and_the_next_command_reconnects(cluster_connection: str) -> None:
    # Only the paramiko connection is private to the runner; the OpenSSH master is shared.
    kill_session = "kill -9 $PPID"  # the sshd process serving this connection

    def sync() -> tuple[bool, str, int]:
        runner = runner_for_connection(PARAMIKO_CONN)
        try:
            with pytest.raises(TransportUnavailable) as caught:
                runner.run(kill_session, timeout=30)
            after = runner.run("echo back", timeout=30)
            return caught.value.retryable, after.stdout, runner.connections_opened
        finally:
            runner.close()

    async def asynchronous() -> tuple[bool, str, int]:
        runner = async_runner_for_connection(PARAMIKO_CONN)
        try:
            with pytest.raises(TransportUnavailable) as caught:
                await runner.run(kill_session, timeout=30)
            after = await runner.run("echo back", timeout=30)
            return caught.value.retryable, after.stdout, runner.connections_opened
        finally:
            await runner.close()

    assert sync() == (True, "back\n", 2)
    assert asyncio.run(asynchronous()) == (True, "back\n", 2)


def test_command_that_exits_before_its_input_is_written_still_returns_its_result(
        cluster_connection: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # `sbatch` rejecting an option exits before it reads the script on stdin. On a busy worker the
    # channel can close before the client writes: the command's exit status and output are the
    # result, not "cannot reach". Made certain here by waiting for the channel to close first.
    import asyncssh

    create_session = asyncssh.SSHClientConnection.create_session

    async def slow_client(self, *args, **kwargs):
        channel, session = await create_session(self, *args, **kwargs)
        await channel.wait_closed()
        return channel, session

    monkeypatch.setattr(asyncssh.SSHClientConnection, "create_session", slow_client)
    result = run_async(PARAMIKO_CONN, "echo rejected >&2; exit 1", stdin="#!/bin/bash\n" * 10_000)
    assert (result.exit_status, result.stdout, result.stderr) == (1, "", "rejected\n")


def test_commands_that_ignore_their_input_return_their_result_on_one_connection(
        cluster_connection: str, run) -> None:
    command, payload = "exec 0<&-; echo hello", "x" * 100_000

    async def many() -> list[CommandResult]:
        runner = async_runner_for_connection(PARAMIKO_CONN)
        try:
            return [await runner.run(command, stdin=payload, timeout=30) for _ in range(20)]
        finally:
            await runner.close()

    if run is run_async:
        results = asyncio.run(many())
    else:
        with runner_for_connection(PARAMIKO_CONN) as runner:
            results = [runner.run(command, stdin=payload, timeout=30) for _ in range(20)]
    assert [(r.exit_status, r.stdout) for r in results] == [(0, "hello\n")] * 20
