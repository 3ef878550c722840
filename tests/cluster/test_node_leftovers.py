"""What jobs leave in a node's network namespace never breaks the next bring-up.

A job's process can outlive its node's slurmd (``cluster.sh down`` stops the daemons, not the jobs'
processes). Such a process keeps the node's network namespace, and the veth pair into it, alive
after ``ip netns del``: the next ``cluster.sh up`` found the host end of the pair, took the node's
network for set up, and failed with ``Cannot find device "eth0"`` in the new namespace. ``down``
stops what is left in each node's namespace (by the process ids the namespace lists); ``up``
replaces a host interface whose peer is not in the node's namespace.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from support.localcluster import CLUSTER_SCRIPT, LocalCluster, cluster_up, poll_until

pytestmark = [pytest.mark.exclusive_cluster, pytest.mark.timeout(900)]
NODE = "nid001001"
NAMESPACE, HOST_IF = f"vcloud-{NODE}", f"vc-{NODE}"


def _in_namespace(pid: int) -> bool:
    listed = subprocess.run(["ip", "netns", "pids", NAMESPACE], capture_output=True, text=True).stdout.split()
    return str(pid) in listed


def _node_answers(cluster: LocalCluster) -> str:
    return cluster.ssh(f"srun -p small -w {NODE} -t 1 hostname").stdout.strip()


@pytest.fixture
def _cluster_left_up():
    """The cluster is up again after this test however it ends: a failure between its ``down`` and
    its ``up`` would otherwise leave every cluster test after it refused at the login node."""
    yield
    up = cluster_up(timeout=600)
    assert up.returncode == 0, up.stderr


@pytest.mark.usefixtures("_cluster_left_up")
def test_down_stops_what_jobs_left_in_a_node_and_up_replaces_a_network_something_kept(
        local_cluster: LocalCluster) -> None:
    # 1. A process left in a node's namespace: `down` stops it.
    left = subprocess.Popen(["ip", "netns", "exec", NAMESPACE, "sleep", "600"])
    try:
        poll_until(lambda: _in_namespace(left.pid), timeout=30, interval=0.2, what="the process in the namespace")
        down = subprocess.run(["bash", str(CLUSTER_SCRIPT), "down"], capture_output=True, text=True, timeout=300)
        assert down.returncode == 0, down.stderr
        assert left.wait(timeout=30) == -15, "stopped with SIGTERM"
        assert f"stopping 1 process(es) jobs left in {NAMESPACE}: {left.pid}" in down.stderr, down.stderr
    finally:
        if left.poll() is None:
            left.kill()
            left.wait()

    # 2. What an earlier `down` left when it did not stop such a process: the namespace deleted by
    #    name, kept alive by the process, and the host end of its veth pair still here.
    subprocess.run(["ip", "netns", "add", NAMESPACE], check=True)
    subprocess.run(["ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", "eth0", "netns", NAMESPACE],
                   check=True)
    held = subprocess.Popen(["ip", "netns", "exec", NAMESPACE, "sleep", "600"])
    try:
        poll_until(lambda: _in_namespace(held.pid), timeout=30, interval=0.2, what="the process in the namespace")
        subprocess.run(["ip", "netns", "del", NAMESPACE], check=True)
        up = cluster_up(timeout=600)
        assert up.returncode == 0, up.stderr
        assert f"replacing {HOST_IF}, whose peer is not in {NAMESPACE}" in up.stderr, up.stderr
        deadline = time.monotonic() + 120
        while True:  # the node's slurmd registers again within seconds of its start
            try:
                assert _node_answers(local_cluster) == NODE
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)
    finally:
        held.kill()
        held.wait()
