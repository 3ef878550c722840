"""The ssh command rsync uses, against the local cluster's real login: it logs in exactly as the hook.

Both connections of the local cluster: ``vcloud_local_cluster`` (key-based, SSH provider hooks) and
``vcloud_local_cluster_openssh`` (ssh_config alias with a ControlMaster). The key-based one is used
with its key only as ``private_key`` content and ``HOME`` pointing at an empty directory, so nothing
but the connection can have let rsync in. Failures (wrong pinned host key, lapsed master) must read
the same from the hook and from rsync.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from support.localcluster import LocalCluster, new_key_pair
from slurm_provider.hooks import SlurmHook
from slurm_provider.transport import (
    ControlMasterNotRunning,
    HostKeyRejected,
    KeyLogin,
    OpenSSHTarget,
    TransportConfigError,
    TransportError,
)
from slurm_provider.transport.base import host_key_fingerprint
from slurm_provider.transport.openssh import classify_ssh_log
from slurm_provider.transport.ssh_command import WORKDIR_PREFIX, key_login_argv, private_key_text

PARAMIKO_CONN = "vcloud_local_cluster"
OPENSSH_CONN = "vcloud_local_cluster_openssh"
PIN = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA+FyJGmYfy8zo5LMRX2V3JhRuUVxh6TdNGOkT63oaCH"


def _set_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, conn: dict) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    return conn_id


def rsync_file(hook: SlurmHook, local: Path, remote: str) -> subprocess.CompletedProcess[str]:
    with hook.ssh_command() as ssh:
        return ssh.run(["rsync", "-a", "-s", "-e", ssh.shell, str(local), f"{ssh.destination}:{remote}"],
                       timeout=120)


# --- pure parts ---------------------------------------------------------------------------------


def test_key_login_argv_uses_only_the_connections_key_and_pinned_host_key() -> None:
    login = KeyLogin(conn_id="lumi_key", host="lumi.csc.fi", port=22, user="digifarm", inline_key=True,
                     host_key=PIN)
    argv = key_login_argv(login, identity_file="/tmp/d/id", known_hosts="/tmp/d/known_hosts",
                          log_file="/tmp/d/log")
    assert argv == [
        "ssh", "-F", "/dev/null", "-E", "/tmp/d/log", "-x", "-a", "-p", "22", "-l", "digifarm",
        "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10",
        "-o", "ClearAllForwardings=yes",
        "-i", "/tmp/d/id", "-o", "IdentitiesOnly=yes",
        "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=/tmp/d/known_hosts",
        "-o", "GlobalKnownHostsFile=/dev/null",
    ]
    assert login.where == "digifarm@lumi.csc.fi:22 (connection 'lumi_key')"


def test_key_login_argv_without_a_pin_checks_strictly() -> None:
    jumping = KeyLogin(conn_id="c", host="h", port=2222, user="u", key_file="/k", connect_timeout=5,
                       proxy_command="ssh -W %h:%p jump")
    unpinned = key_login_argv(jumping, identity_file="/k", known_hosts=None, log_file="/l")
    assert unpinned[unpinned.index("StrictHostKeyChecking=yes") - 1] == "-o"
    assert not any(a.startswith("UserKnownHostsFile") for a in unpinned)
    assert "ConnectTimeout=5" in unpinned and "ProxyCommand=ssh -W %h:%p jump" in unpinned
    keyless = key_login_argv(KeyLogin(conn_id="c", host="h", port=22, user="u"),
                             identity_file=None, known_hosts=None, log_file="/l")
    assert "StrictHostKeyChecking=yes" in keyless and not any("/dev/null" in a for a in keyless[3:])
    assert "-i" not in keyless and "IdentitiesOnly=yes" not in keyless  # ssh's own keys, as paramiko's


def test_openssh_client_argv_rides_the_aliases_own_master() -> None:
    target = OpenSSHTarget(alias="lumi2", require_control_master=True, host_key=PIN)
    argv = target.client_argv(log_file="/l", known_hosts="/kh")
    assert argv[:4] == ["ssh", "-E", "/l", "-x"]
    assert "ControlMaster=no" in argv and not any(a.startswith("ControlPath") for a in argv)
    assert "UserKnownHostsFile=/kh" in argv and "StrictHostKeyChecking=yes" in argv
    assert target.reopen_master_command() == "ssh -o ControlMaster=auto -fN lumi2"


def test_fingerprint_of_a_pin_is_what_ssh_keygen_prints(tmp_path: Path) -> None:
    path, public = new_key_pair(tmp_path, "host")
    printed = subprocess.run(["ssh-keygen", "-lf", f"{path}.pub"], capture_output=True, text=True,
                             check=True).stdout
    assert host_key_fingerprint(public) == printed.split()[1]
    assert host_key_fingerprint("ssh-ed25519 not-base64!") is None


def test_a_changed_host_key_in_sshs_log_names_both_fingerprints() -> None:
    ssh_log = ("@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
               "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
               "The fingerprint for the ED25519 key sent by the remote host is\n"
               "SHA256:orbz9up0qzEi6gkSpBd5vZuUbQrJZ1r+9eiIHDZnfoQ.\n"
               "Host key for [127.0.0.1]:2222 has changed and you have requested strict checking.\n"
               "Host key verification failed.\n")
    error = classify_ssh_log(ssh_log, where="u@h:22 (connection 'c')", pinned=PIN, host_key_fix="fix it",
                             login_failed=lambda said: TransportError(said))
    assert isinstance(error, HostKeyRejected) and not error.retryable
    assert str(error) == (
        "host key of u@h:22 (connection 'c') does not match the pinned key (it sent "
        f"SHA256:orbz9up0qzEi6gkSpBd5vZuUbQrJZ1r+9eiIHDZnfoQ, pinned is {host_key_fingerprint(PIN)}): "
        "refusing to connect, nothing was run or copied. If the login node's key really changed (check the "
        "new fingerprint with the site), fix it."
    )


def test_a_key_with_a_passphrase_is_written_decrypted_for_batch_mode(tmp_path: Path) -> None:
    path, public = new_key_pair(tmp_path, "locked", passphrase="correct horse")
    opened = tmp_path / "opened"
    opened.write_text(private_key_text(path.read_text(), "correct horse"))
    opened.chmod(0o600)
    derived = subprocess.run(["ssh-keygen", "-y", "-P", "", "-f", str(opened)], capture_output=True,
                             text=True)
    assert derived.returncode == 0, derived.stderr
    assert " ".join(derived.stdout.split()[:2]) == public
    with pytest.raises(TransportConfigError, match="cannot be opened with its passphrase"):
        private_key_text(path.read_text(), "wrong")
    pasted = "-----BEGIN X-----\nabc\n-----END X-----"  # pasted without the final newline ssh insists on
    assert private_key_text(pasted) == pasted + "\n"


# --- on the local cluster -----------------------------------------------------------------------


@pytest.mark.parametrize("conn_id", [PARAMIKO_CONN, OPENSSH_CONN])
def test_rsync_logs_in_with_nothing_but_the_connection(local_cluster: LocalCluster, cluster_connection: str,
                                                       conn_id: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "empty-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    if conn_id == PARAMIKO_CONN:
        conn_id = _set_connection(monkeypatch, "key_only", local_cluster.key_only_connection())
    payload = tmp_path / "payload.txt"
    payload.write_text("arrived\n")
    remote = f"{local_cluster.test_dir()}/it's here.txt"

    hook = SlurmHook(conn_id)
    with hook.ssh_command() as ssh:
        workdir = Path(ssh.log_file).parent
        assert workdir.parent == private_tmp and workdir.name.startswith(WORKDIR_PREFIX)
        assert stat.S_IMODE(workdir.stat().st_mode) == 0o700
        for private in workdir.iterdir():
            assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
        if conn_id == "key_only":
            assert (workdir / "id").read_text() == local_cluster.key_file.read_text()
            assert "IdentitiesOnly=yes" in ssh.argv and "StrictHostKeyChecking=yes" in ssh.argv
        else:
            assert ssh.argv[:3] == ("ssh", "-F", str(local_cluster.ssh_config))
            assert ssh.destination == "vcloud-local"
        proc = ssh.run(["rsync", "-a", "-s", "-e", ssh.shell, str(payload), f"{ssh.destination}:{remote}"],
                       timeout=120)
        assert proc.returncode == 0, proc.stderr
    assert list(home.iterdir()) == [], "something wrote to HOME"
    assert list(private_tmp.iterdir()) == [], "the private key or known_hosts outlived the sync"
    assert local_cluster.ssh(f"cat {shlex.quote(remote)}").stdout == "arrived\n"
    assert hook.remote_user() == local_cluster.user


@pytest.mark.parametrize("transport", ["paramiko", "openssh-config"])
def test_rsync_refuses_a_connection_that_turns_host_key_checking_off(
        local_cluster: LocalCluster, cluster_connection: str, transport: str, tmp_path: Path,
        control_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if transport == "paramiko":
        conn = local_cluster.key_only_connection()
        conn["extra"] = {**conn["extra"], "no_host_key_check": True}
        conn["extra"].pop("host_key", None)
    else:
        config = local_cluster.ssh_config_copy(tmp_path, control_dir / "%C", StrictHostKeyChecking="no")
        conn = {"conn_type": "ssh", "extra": {"transport": "openssh", "ssh_alias": "vcloud-local",
                                              "ssh_config_file": str(config)}}
    conn_id = _set_connection(monkeypatch, f"unchecked_rsync_{transport.replace('-', '_')}", conn)
    target = f"{local_cluster.test_dir()}/must-not-arrive-unchecked"
    payload = tmp_path / "payload"
    payload.write_text("x")

    with pytest.raises(TransportConfigError, match="without checking the login node's host key"):
        rsync_file(SlurmHook(conn_id), payload, target)
    assert local_cluster.ssh(f"test -e {shlex.quote(target)}", check=False).returncode == 1


@pytest.mark.parametrize("transport", ["paramiko", "openssh", "openssh-config"])
def test_a_wrong_pinned_host_key_is_refused_by_the_hook_and_by_rsync_in_the_same_words(
        local_cluster: LocalCluster, cluster_connection: str, transport: str, tmp_path: Path,
        control_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, wrong_key = new_key_pair(tmp_path, "impostor")
    if transport == "paramiko":
        conn = local_cluster.key_only_connection()
        conn["extra"]["host_key"] = wrong_key
    else:
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{local_cluster.ssh_port} {wrong_key}\n")
        options = {"UserKnownHostsFile": str(known_hosts)} if transport == "openssh-config" else {}
        config = local_cluster.ssh_config_copy(tmp_path, control_dir / "%C", **options)
        extra = {"transport": "openssh", "ssh_alias": "vcloud-local", "ssh_config_file": str(config)}
        if transport == "openssh":
            extra["host_key"] = wrong_key
        conn = {"conn_type": "ssh", "extra": extra}
    conn_id = _set_connection(monkeypatch, f"impostor_{transport.replace('-', '_')}", conn)
    target = f"{local_cluster.test_dir()}/must-not-arrive"
    payload = tmp_path / "payload"
    payload.write_text("x")

    hook = SlurmHook(conn_id)
    with pytest.raises(HostKeyRejected) as by_hook:
        hook.runner.run(f"touch {shlex.quote(target)}", timeout=30)
    hook.close()
    with pytest.raises(HostKeyRejected) as by_rsync:
        rsync_file(hook, payload, target)

    assert str(by_rsync.value) == str(by_hook.value)
    message = str(by_hook.value)
    assert message.startswith("host key of ")
    assert "does not match the pinned key (it sent SHA256:" in message
    assert ": refusing to connect, nothing was run or copied." in message
    if transport == "openssh-config":  # the pin is the config's known_hosts
        assert message.endswith("update the known_hosts file that the ssh config names for vcloud-local "
                                "(UserKnownHostsFile), or pin the key with the connection's host_key extra.")
    else:
        assert message.endswith("update the connection's host_key extra.")
    if transport != "openssh-config":
        assert f"pinned is {host_key_fingerprint(wrong_key)}" in message
    assert local_cluster.ssh(f"test -e {shlex.quote(target)}", check=False).returncode != 0


def test_a_lapsed_master_is_one_message_for_the_hook_and_rsync_and_the_command_in_it_opens_it(
        local_cluster: LocalCluster, cluster_connection: str, tmp_path: Path, control_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = local_cluster.otp_ssh_config(tmp_path, control_dir / "master")
    conn_id = _set_connection(monkeypatch, "otp_rsync", {
        "conn_type": "ssh", "extra": {"transport": "openssh", "ssh_alias": "vcloud-local",
                                      "ssh_config_file": str(config)}})
    payload = tmp_path / "payload"
    payload.write_text("after the master\n")
    remote = f"{local_cluster.test_dir()}/payload"

    hook = SlurmHook(conn_id)
    with pytest.raises(ControlMasterNotRunning) as by_hook:
        hook.runner.run("true", timeout=30)
    with pytest.raises(ControlMasterNotRunning) as by_rsync:
        rsync_file(hook, payload, remote)
    assert str(by_rsync.value) == str(by_hook.value)
    reopen = f"ssh -F {config} -o ControlMaster=auto -fN vcloud-local"
    control_path = control_dir / "master"
    assert str(by_hook.value) == (
        f"no ControlMaster is running for ssh alias vcloud-local ({config}) (ssh said: vcloud@127.0.0.1: "
        "Permission denied (publickey)."
        f"); its login needs a person (one-time password). Open it again on host {socket.gethostname()} "
        f"(where this task or trigger looked for the master, ControlPath {control_path}) with: {reopen}"
    )

    # The person runs that command and types the code (here: the key stands in for it).
    local_cluster.open_master(config)
    try:
        assert hook.runner.run("echo $SSH_CONNECTION", timeout=30).exit_status == 0
        proc = rsync_file(hook, payload, remote)
        assert proc.returncode == 0, proc.stderr
        assert local_cluster.ssh(f"cat {shlex.quote(remote)}").stdout == "after the master\n"
        check = subprocess.run(["ssh", "-F", str(config), "-O", "check", "vcloud-local"], capture_output=True,
                               text=True, timeout=30)
        assert check.returncode == 0 and "Master running" in check.stderr
    finally:
        local_cluster.close_master(config)
        hook.close()
    assert not os.path.exists(control_dir / "master")
