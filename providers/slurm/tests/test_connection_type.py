"""The ``slurm`` connection type: its form, the provider info Airflow reads it from, and the transport
a ``slurm`` connection's extras select (``ssh`` connections keep working as they are)."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import jsonschema
import pytest

from slurm_provider.connection_form import CONNECTION_FIELDS, ui_field_behaviour
from slurm_provider.get_provider_info import get_provider_info
from slurm_provider.hooks import SlurmAsyncHook, SlurmHook
from slurm_provider.transport import (
    TRANSPORTS,
    OpenSSHRunner,
    SSHProviderRunner,
    TransportConfigError,
    runner_for_connection,
)

SCHEMA = Path(importlib.import_module("airflow").__file__).parent / "provider_info.schema.json"
PROVIDER_SRC = Path(__file__).resolve().parents[1] / "src"


def _class(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _host_key() -> str:
    """A well-formed public host key (``<type> <base64>``), as ssh-keyscan prints it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    public = Ed25519PrivateKey.generate().public_key()
    return public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


HOST_KEY = _host_key()


def _set_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, conn: dict) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    return conn_id


# --- the form ------------------------------------------------------------------------------------


def test_the_provider_info_follows_airflows_schema_and_names_what_exists() -> None:
    info = get_provider_info()
    jsonschema.validate(info, json.loads(SCHEMA.read_text()))
    assert info["package-name"] == "airflow-provider-slurm-ssh"
    for section in ("hooks", "operators", "sensors", "triggers"):
        for module in info[section][0]["python-modules"]:
            importlib.import_module(module)
    assert [_class(link).__name__ for link in info["extra-links"]] == ["SlurmJobLogLink"]
    (conn_type,) = info["connection-types"]
    hook = _class(conn_type["hook-class-name"])
    assert hook is SlurmHook and hook.conn_type == conn_type["connection-type"] == "slurm"
    assert conn_type["hook-name"] == SlurmHook.hook_name == "Slurm"
    assert SlurmAsyncHook.conn_type == "slurm"


def test_the_form_asks_for_what_the_transports_read() -> None:
    fields = get_provider_info()["connection-types"][0]["conn-fields"]
    assert set(fields) == {"transport", "host_key", "key_file", "private_key", "private_key_passphrase",
                           "ssh_alias", "ssh_config_file", "require_control_master", "min_call_interval"}
    assert tuple(fields["transport"]["schema"]["enum"]) == TRANSPORTS
    assert fields["transport"]["schema"]["default"] == "paramiko"
    secret = {name for name, field in fields.items() if field["schema"].get("format") == "password"}
    assert secret == {"private_key", "private_key_passphrase"}, "secrets are masked in the UI and the API"
    assert all(field["label"] and field["description"] for field in fields.values())
    assert fields == CONNECTION_FIELDS


def test_standard_fields_are_relabelled_and_the_hook_says_the_same() -> None:
    behaviour = get_provider_info()["connection-types"][0]["ui-field-behaviour"]
    assert behaviour["hidden-fields"] == ["schema"]
    assert behaviour["relabeling"] == {"host": "Login node", "login": "Username",
                                       "password": "Password (only without a key)"}
    assert {"host", "port", "login", "host_key", "ssh_alias"} <= set(behaviour["placeholders"])
    assert SlurmHook.get_ui_field_behaviour() == ui_field_behaviour() == {
        "hidden_fields": behaviour["hidden-fields"], "relabeling": behaviour["relabeling"],
        "placeholders": behaviour["placeholders"]}


def test_the_provider_info_names_no_site() -> None:
    text = json.dumps(get_provider_info())
    assert not re.search(r"(?i)lumi|levante|cosmos|vcloud|hpc.?view", text)


# --- the transport a connection selects ----------------------------------------------------------


def test_a_slurm_connection_without_transport_uses_the_ssh_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    conn_id = _set_connection(monkeypatch, "slurm_form_default", {
        "conn_type": "slurm", "host": "login.example.org", "port": 2200, "login": "alice",
        "extra": {"key_file": "/keys/id_ed25519", "host_key": HOST_KEY}})
    runner = runner_for_connection(conn_id)
    assert isinstance(runner, SSHProviderRunner)
    assert runner.where == "alice@login.example.org:2200 (connection 'slurm_form_default')"


def test_a_slurm_connection_with_the_openssh_transport_rides_the_alias(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host cluster\n  HostName login.example.org\n")
    conn_id = _set_connection(monkeypatch, "slurm_form_openssh", {
        "conn_type": "slurm", "host": "login.example.org",
        "extra": {"transport": "openssh", "ssh_alias": "cluster", "ssh_config_file": str(config),
                  "host_key": HOST_KEY, "require_control_master": "true"}})
    runner = runner_for_connection(conn_id)
    assert isinstance(runner, OpenSSHRunner)
    assert (runner.target.alias, runner.target.config_file) == ("cluster", str(config))
    assert runner.target.host_key == HOST_KEY
    assert runner.target.require_control_master is True


def test_a_slurm_connection_with_an_unknown_transport_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    conn_id = _set_connection(monkeypatch, "slurm_form_bad", {
        "conn_type": "slurm", "host": "h", "extra": {"transport": "telnet"}})
    with pytest.raises(TransportConfigError, match=r"transport='telnet' is not known \(known: paramiko, openssh\)"):
        runner_for_connection(conn_id)


# --- on the local cluster ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["paramiko", "openssh"])
def test_a_slurm_connection_runs_a_job(local_cluster, cluster_connection: str, airflow_home: Path,
                                       capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
                                       transport: str) -> None:
    """The operator, its trigger and the job, over a connection of type ``slurm`` made of the cluster's
    login (key and pinned host key, or the ssh_config alias)."""
    from support.lifecycle import run_lifecycle

    source = cluster_connection if transport == "paramiko" else f"{cluster_connection}_openssh"
    conn = {**local_cluster.connection(source), "conn_type": "slurm"}
    assert (conn["extra"].get("transport") or "paramiko") == transport
    conn_id = _set_connection(monkeypatch, f"slurm_type_{transport}", conn)
    monkeypatch.setenv("SLURM_LIFECYCLE_CONN_ID", conn_id)
    outcome = run_lifecycle(capfd, script="#!/bin/bash\necho \"hello from $SLURM_JOB_ID\"; hostname\n",
                            log_dir=local_cluster.test_dir())
    assert outcome.state == "success", outcome.output[-3000:]
    job_id = outcome.result["job_id"]
    assert [run["State"] for run in local_cluster.sacct_runs(int(job_id))] == ["COMPLETED"]
    assert f"[job {job_id}] hello from {job_id}" in outcome.output


@pytest.mark.parametrize("transport", ["paramiko", "openssh"])
def test_the_forms_test_button_logs_in_and_names_slurms_version(local_cluster, cluster_connection: str,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 transport: str) -> None:
    source = cluster_connection if transport == "paramiko" else f"{cluster_connection}_openssh"
    conn_id = _set_connection(monkeypatch, f"slurm_button_{transport}",
                              {**local_cluster.connection(source), "conn_type": "slurm"})
    ok, message = SlurmHook(conn_id).test_connection()
    assert ok, message
    # The local cluster runs a tested release: the button says so (an untested one is said, not refused).
    assert re.fullmatch(r"logged in; Slurm \d+\.\d+\.\d+ \(a release this provider is tested against\)", message), \
        message


def test_the_test_button_refuses_a_login_node_with_another_host_key(local_cluster, cluster_connection: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    conn = local_cluster.connection(cluster_connection)
    conn = {**conn, "conn_type": "slurm", "extra": {**conn["extra"], "host_key": HOST_KEY}}
    ok, message = SlurmHook(_set_connection(monkeypatch, "slurm_button_impostor", conn)).test_connection()
    assert not ok and "host key" in message, message
