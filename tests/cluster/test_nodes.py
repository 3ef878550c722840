"""The local cluster's compute nodes: each a slurmd in its own network and UTS namespace, shaped and
typed like the sites' nodes, reached from the login node through real Slurm."""

from __future__ import annotations

import re

import pytest

from support.localcluster import LocalCluster, cluster_up

pytestmark = pytest.mark.cluster

LUMI_G = re.compile(r"nid00500\d")


def _sinfo_nodes(cluster: LocalCluster) -> dict[str, dict[str, str]]:
    rows = cluster.ssh("sinfo -h -N -o '%N|%G|%c|%m|%P'").stdout.split()
    nodes: dict[str, dict[str, str]] = {}
    for row in rows:
        name, gres, cpus, memory, partition = row.split("|")
        node = nodes.setdefault(name, {"gres": gres, "cpus": cpus, "memory": memory, "partitions": ""})
        node["partitions"] = ",".join(sorted(filter(None, node["partitions"].split(",") + [partition])))
    return nodes


def test_nodes_are_typed_and_shaped_like_the_sites(local_cluster: LocalCluster) -> None:
    nodes = _sinfo_nodes(local_cluster)
    lumi_g = {n: v for n, v in nodes.items() if LUMI_G.fullmatch(n)}
    levante = {n: v for n, v in nodes.items() if "gpu" in v["partitions"].split(",")}
    assert len(lumi_g) == 3 and all(v["gres"] == "gpu:mi250:8" for v in lumi_g.values()), nodes
    assert all("small-g*" in v["partitions"] for v in lumi_g.values()), nodes
    assert len(levante) == 2 and all(v["gres"] == "gpu:a100_80:4" for v in levante.values()), nodes
    cpu_nodes = {n: v for n, v in nodes.items() if v["gres"] == "(null)"}
    assert cpu_nodes, nodes
    # Seed 003: a GPU node has fewer cores than a CPU node.
    assert max(int(v["cpus"]) for n, v in nodes.items() if n not in cpu_nodes) < \
        min(int(v["cpus"]) for v in cpu_nodes.values())


def test_a_two_node_job_runs_its_steps_on_two_hosts(local_cluster: LocalCluster) -> None:
    out = local_cluster.ssh("srun -N2 --ntasks-per-node=1 -t 2 hostname")
    assert out.returncode == 0, out.stderr
    hosts = out.stdout.split()
    assert len(hosts) == 2 and len(set(hosts)) == 2 and all(LUMI_G.fullmatch(h) for h in hosts), hosts


def test_each_node_has_its_own_address_and_resolves_the_others(local_cluster: LocalCluster) -> None:
    probe = ("echo \"$(hostname) $SLURM_NODEID $(ip -o -4 addr show | awk '{print $2\"=\"$4}' | sort | paste -sd,)"
             " $(getent hosts nid005001 | awk '{print $1}')\"")
    out = local_cluster.ssh(f"srun -p dev-g -N3 --ntasks-per-node=1 -t 2 bash -c {_quote(probe)}")
    assert out.returncode == 0, out.stderr
    lines = sorted(out.stdout.splitlines())
    assert len(lines) == 3, lines
    addresses = set()
    conf = local_cluster.ssh("scontrol show node nid005001").stdout
    nid005001_addr = re.search(r"NodeAddr=(\S+)", conf).group(1)
    for line in lines:
        host, _, interfaces, resolved = line.split()
        # Only the node's loopback and its veth on the cluster's bridge: nothing of this machine's network.
        found = dict(item.split("=") for item in interfaces.split(","))
        assert set(found) == {"lo", "eth0"}, line
        assert found["lo"] == "127.0.0.1/8" and found["eth0"].startswith("10.203.0."), line
        addresses.add(found["eth0"])
        assert resolved == nid005001_addr, line
    assert len(addresses) == 3


def test_typed_gpu_requests_land_on_the_nodes_that_have_that_type(local_cluster: LocalCluster) -> None:
    out = local_cluster.ssh("srun -p gpu -N2 --gres=gpu:a100_80:2 -t 2 bash -c "
                            "'echo $(hostname) $SLURM_GPUS_ON_NODE'")
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == ["l50001 2", "l50002 2"]
    wrong = local_cluster.ssh("sbatch --test-only -p small-g --gres=gpu:a100_80:1 -t 2 --wrap true", check=False)
    assert wrong.returncode != 0 and "Requested node configuration is not available" in wrong.stderr


def test_only_compute_nodes_have_the_singularity_stand_in(local_cluster: LocalCluster) -> None:
    on_node = local_cluster.ssh("srun -t 2 bash -c 'command -v singularity && singularity --version'")
    assert on_node.returncode == 0, on_node.stderr
    path, version = on_node.stdout.splitlines()
    assert path == "/usr/local/bin/singularity" and "stand-in" in version
    assert local_cluster.ssh("command -v singularity", check=False).returncode != 0  # not on the login node


def test_containers_on_the_nodes_resolve_the_nodes_after_another_bring_up(local_cluster: LocalCluster) -> None:
    """The nodes' /etc/hosts is bound from a file that `cluster.sh up` must update in place: a replaced
    file would leave the running nodes a deleted one that no container can bind."""
    proc = cluster_up(timeout=300)
    assert proc.returncode == 0, proc.stderr
    image = local_cluster.state_dir / "images" / "sites" / "lumi.sif"
    out = local_cluster.ssh(f"srun -p dev-g -t 2 singularity exec {image} getent hosts nid005002", check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["10.203.0.12", "nid005002"]


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
