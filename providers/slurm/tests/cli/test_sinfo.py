"""sinfo: unavailable nodes and host lists."""

from __future__ import annotations

from slurm_provider.cli.sinfo import build_sinfo_unavailable_nodes, parse_sinfo_unavailable
from slurm_provider.cli.values import expand_hostlist
from providers.slurm.tests.cli.captured_output import raw
from providers.slurm.tests.cli.command_words import argv_of


def test_sinfo_unavailable_nodes() -> None:
    argv = argv_of(build_sinfo_unavailable_nodes("small-g"))
    assert argv[:3] == ["sinfo", "-h", "-N"] and "--partition=small-g" in argv


def test_hostlists_and_sinfo() -> None:
    assert expand_hostlist("nid[005001-005003,005007]") == ["nid005001", "nid005002", "nid005003", "nid005007"]
    assert expand_hostlist("vcnode1,gpu[1-2]") == ["vcnode1", "gpu1", "gpu2"]
    assert expand_hostlist("rack[1-2]-node[01-02]") == ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]
    assert expand_hostlist("") == []
    assert parse_sinfo_unavailable(raw("sinfo_unavailable.txt")) == {}
    assert parse_sinfo_unavailable("nid[005001-005002]|drained|bad GPU\nnid005010|down*|Not responding\n") == {
        "nid005001": "drained",
        "nid005002": "drained",
        "nid005010": "down*",
    }
