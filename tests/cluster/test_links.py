"""The host end of a node's veth pair is removed whoever removes it first (include/local_cluster/links.sh).

Deleting a network namespace removes the veth pair into it in the background: ``cluster.sh down``
once saw the host end listed, asked to delete it, and failed with ``Cannot find device`` because the
kernel had removed it in between, which left the cluster down for every test after it. These run on
real namespaces of their own (``vctest-<pid>-<n>``), no cluster needed; as root, like the bring-up.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


LINKS = Path(__file__).resolve().parents[2] / "include" / "local_cluster" / "links.sh"


def _bash(body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", f'set -euo pipefail\n. "{LINKS}"\n{body}'],
                          capture_output=True, text=True, timeout=60)


def _exists(interface: str) -> bool:
    return subprocess.run(["ip", "link", "show", interface], capture_output=True).returncode == 0


def test_the_host_end_is_gone_after_its_namespace_is_deleted_however_the_race_falls() -> None:
    """Delete the namespace, then the host end at once, many times over: each time the delete
    succeeds and the interface is gone, whether the kernel or the delete removed it."""
    rounds = 40  # the old look-then-delete failed about once in 40 rounds here
    names = [(f"vctest-{os.getpid()}-{n}", f"vct{os.getpid() % 100000}x{n}") for n in range(rounds)]
    script = "\n".join(
        f"ip netns add {ns}\n"
        f"ip link add {host} type veth peer name eth0 netns {ns}\n"
        f"ip netns del {ns}\n"
        f"delete_link {host}\n"
        f"link_absent {host}\n"
        for ns, host in names)
    try:
        result = _bash(script)
        assert result.returncode == 0, result.stderr
        assert result.stderr == "", result.stderr
        assert not any(_exists(host) for _, host in names)
    finally:
        for ns, host in names:
            subprocess.run(["ip", "link", "del", host], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_an_absent_interface_is_no_error() -> None:
    result = _bash(f"delete_link vct{os.getpid() % 100000}none\necho done")
    assert (result.returncode, result.stdout, result.stderr) == (0, "done\n", "")


def test_a_plain_delete_removes_both_ends() -> None:
    ns, host = f"vctest-{os.getpid()}-plain", f"vct{os.getpid() % 100000}p"
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns], check=True)
        result = _bash(f"delete_link {host}")
        assert result.returncode == 0, result.stderr
        assert not _exists(host)
        peer = subprocess.run(["ip", "-n", ns, "link", "show", "eth0"], capture_output=True)
        assert peer.returncode != 0, "the peer inside the namespace went with it"
    finally:
        subprocess.run(["ip", "link", "del", host], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
