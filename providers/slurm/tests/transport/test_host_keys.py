"""Which settings turn host-key checking off: connection extras, and ssh_config as ``ssh -G`` resolves it.

The ssh_config cases go through the real OpenSSH client's ``ssh -G`` (local, no network), so the
values checked are the ones ssh itself would use, whatever spelling the file has.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from slurm_provider.transport import TransportConfigError
from slurm_provider.transport.host_keys import extra_problems, refuse_unchecked, ssh_config_problems
from slurm_provider.transport.openssh import parse_ssh_g

PIN = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA+FyJGmYfy8zo5LMRX2V3JhRuUVxh6TdNGOkT63oaCH"


@pytest.mark.parametrize(("extra", "named"), [
    ({"no_host_key_check": True}, "no_host_key_check is true"),
    ({"no_host_key_check": "True"}, "no_host_key_check is true"),
    ({"ignore_hostkey_verification": "yes"}, "ignore_hostkey_verification is true"),
    ({"allow_host_key_change": "true", "host_key": PIN}, "allow_host_key_change is true"),
    ({"known_hosts": "None"}, "known_hosts is none"),
    ({"host_key": "  "}, "host_key is empty"),
])
def test_extras_that_turn_checking_off_are_named_with_what_to_set(extra: dict, named: str) -> None:
    problems = extra_problems(extra)
    assert len(problems) == 1 and problems[0].startswith(named)
    assert "host_key" in problems[0]


@pytest.mark.parametrize("extra", [
    {},
    {"host_key": PIN},
    {"no_host_key_check": False, "host_key": PIN},
    {"no_host_key_check": "false", "allow_host_key_change": "false"},
    {"known_hosts": "/opt/airflow/secrets/ssh/known_hosts"},
    {"transport": "openssh", "ssh_alias": "lumi", "ssh_config_file": "/x/config"},
])
def test_extras_that_keep_checking_on_pass(extra: dict) -> None:
    assert extra_problems(extra) == []


def _resolved(tmp_path: Path, *lines: str) -> dict[str, str]:
    config = tmp_path / "ssh_config"
    config.write_text("Host lumi\n    HostName lumi.example\n" + "".join(f"    {line}\n" for line in lines))
    out = subprocess.run(["ssh", "-F", str(config), "-G", "lumi"], capture_output=True, text=True, check=True,
                         timeout=20).stdout
    return parse_ssh_g(out)


@pytest.mark.parametrize(("lines", "named"), [
    (["StrictHostKeyChecking no"], "StrictHostKeyChecking no"),
    (["StrictHostKeyChecking off"], "StrictHostKeyChecking no"),
    (["StrictHostKeyChecking accept-new"], "StrictHostKeyChecking accept-new"),
    (["UserKnownHostsFile /dev/null"], "UserKnownHostsFile /dev/null"),
])
def test_ssh_configs_that_turn_checking_off_are_named_with_what_to_set(tmp_path: Path, lines: list[str],
                                                                      named: str) -> None:
    problems = ssh_config_problems(_resolved(tmp_path, *lines))
    assert len(problems) == 1 and f"the ssh config says {named}" in problems[0]
    assert problems[0].endswith("set StrictHostKeyChecking yes and UserKnownHostsFile to a file holding the "
                                "login node's key")


def test_both_config_settings_are_reported(tmp_path: Path) -> None:
    problems = ssh_config_problems(_resolved(tmp_path, "StrictHostKeyChecking no", "UserKnownHostsFile /dev/null"))
    assert len(problems) == 2


@pytest.mark.parametrize("lines", [
    ["StrictHostKeyChecking yes", "UserKnownHostsFile /srv/ssh/known_hosts"],
    ["UserKnownHostsFile /srv/ssh/known_hosts /dev/null"],
    [],  # ssh's defaults: ask (a prompt BatchMode turns into a refusal), ~/.ssh/known_hosts
])
def test_ssh_configs_that_check_pass(tmp_path: Path, lines: list[str]) -> None:
    assert ssh_config_problems(_resolved(tmp_path, *lines)) == []


def test_refusal_names_the_login_and_every_problem() -> None:
    refuse_unchecked("connection 'c'", [])
    with pytest.raises(TransportConfigError) as caught:
        refuse_unchecked("connection 'c'", extra_problems({"no_host_key_check": True, "known_hosts": "none"}))
    message = str(caught.value)
    assert message.startswith("connection 'c' would log in without checking the login node's host key: ")
    assert "no_host_key_check is true" in message and "known_hosts is none" in message
    assert not caught.value.retryable
