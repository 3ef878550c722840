"""Every job of every profile, as the profile renders it, is accepted by the local cluster's Slurm.

The LUMI, Levante and Cosmos profiles are loaded with only their site facts mapped
(include/local_cluster/site_facts.yaml): the #SBATCH lines are those the sites get, with the local
account and node sizes. ``sbatch --test-only`` checks each against partitions, typed GRES, limits
and the account, and says where the job would run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from slurm_provider.validation import parse_time_limit
from vcloud_pipeline.plan.jobspec import JobSpec
from vcloud_pipeline.plan.layout import run_paths
from vcloud_pipeline.profile import ClusterProfile, load_profile, overrides_from_environ
from vcloud_pipeline.jobs.render import render_job
from vcloud_pipeline.profile.site_facts import LOCAL_SITE_FACTS, SITE_FACTS_ENV, SiteFactsError, load_site_facts

from support.localcluster import LocalCluster

pytestmark = pytest.mark.cluster

CODE_HASH = "0" * 64
SITE_NODES = {"lumi": r"nid00500\d", "cosmos": r"nid00500\d", "levante": r"l5000\d", "local": r"nid00500\d"}
MULTINODE = {
    "lumi": JobSpec.train(1, partition="standard-g", nodes=2, gpus_per_node=8),
    "levante": JobSpec.train(1, nodes=2, gpus_per_node=4),
    "cosmos": JobSpec.train(1, nodes=2, gpus_per_node=4),
    "local": None,
}


def site_profile(name: str) -> ClusterProfile:
    """The profile as a DAG run on the local cluster loads it (site facts applied)."""
    environ = {SITE_FACTS_ENV: str(LOCAL_SITE_FACTS)} if name != "local" else {}
    return load_profile(name, overrides_from_environ(name, environ) or None, login="vcloud")


def every_job(name: str) -> list[tuple[str, JobSpec]]:
    jobs = [("data", JobSpec.data("tiny")), ("preflight", JobSpec.preflight()),
            *[(f"stage{s}", JobSpec.train(s)) for s in range(4)], ("export", JobSpec.export())]
    if MULTINODE[name] is not None:
        jobs.append(("stage1-two-nodes", MULTINODE[name]))
    return jobs


@pytest.mark.parametrize("name", ["lumi", "levante", "cosmos", "local"])
def test_every_job_of_the_profile_passes_sbatch_test_only(local_cluster: LocalCluster, name: str) -> None:
    profile = site_profile(name)
    paths = run_paths(profile, "site-check", synthetic_preset="tiny")
    for label, spec in every_job(name):
        job = render_job(profile, spec, paths, CODE_HASH)
        # The script on stdin: --test-only reads the #SBATCH lines and asks slurmctld, starts nothing.
        proc = local_cluster.ssh("sbatch --test-only", input=job.outer, check=False)
        message = proc.stderr.strip()
        assert proc.returncode == 0, f"{name} {label}: {message}\n{job.outer[:1500]}"
        where = re.search(r"on nodes (\S+) in partition (\S+)", message)
        assert where, f"{name} {label}: {message}"
        nodes = local_cluster.ssh(f"scontrol show hostnames {where.group(1)}").stdout.split()
        assert len(nodes) == spec.nodes and all(re.fullmatch(SITE_NODES[name], n) for n in nodes), \
            f"{name} {label}: {message}"
        # --test-only accepts a job that would pend forever on PartitionTimeLimit: check that too.
        partition = local_cluster.ssh(f"scontrol show partition {where.group(2)}").stdout
        max_time = re.search(r"MaxTime=(\S+)", partition).group(1)
        assert job.resources.time_seconds <= parse_time_limit(max_time), \
            f"{name} {label}: --time {job.resources.time_seconds}s exceeds {where.group(2)}'s MaxTime={max_time}"


def test_the_mapped_profiles_keep_their_own_job_scripts() -> None:
    """Site facts replace values, never the shape: LUMI still launches with Singularity, its binds,
    CONTAINLIBS, pylibs on PYTHONPATH and per-job MIOpen directories; Cosmos still loads its node-
    local staging and --rocm; typed GRES stays on Levante."""
    lumi = render_job(site_profile("lumi"), JobSpec.train(1), run_paths(site_profile("lumi"), "r"), CODE_HASH)
    assert "singularity exec" in lumi.outer and "--rocm" not in lumi.outer
    assert "export SINGULARITY_CONTAINLIBS=/usr/lib64/libcxi.so.1,/opt/rocm/lib/librocm_smi64.so.7" in lumi.outer
    assert "/opt/cray" in lumi.outer and "#SBATCH --account=vcloud_local" in lumi.outer
    assert "/projappl/vcloud_local/pylibs" in lumi.inner and "MIOPEN_USER_DB_PATH=/tmp/miopen_cache_" in lumi.inner
    assert "WANDB_MODE=disabled" in lumi.inner
    cosmos = site_profile("cosmos")
    cos = render_job(cosmos, JobSpec.train(1), run_paths(cosmos, "r"), CODE_HASH)
    assert "singularity exec --rocm" in cos.outer and "NODE_LOCAL=" in cos.outer
    assert "--partition" not in cos.outer  # the site's default partition
    levante = site_profile("levante")
    lev = render_job(levante, JobSpec.train(1, gpus_per_node=2), run_paths(levante, "r"), CODE_HASH)
    assert "#SBATCH --gres=gpu:a100_80:2" in lev.outer and "#SBATCH --partition=gpu" in lev.outer


def test_a_site_facts_file_refuses_what_is_not_a_site_fact(tmp_path: Path) -> None:
    facts = tmp_path / "facts.yaml"
    facts.write_text("lumi:\n  account: x\n  container.rocm: true\n")
    with pytest.raises(SiteFactsError, match=r"lumi.container.rocm is not a site fact; .* maps only account"):
        load_site_facts(facts)
    assert set(load_site_facts(LOCAL_SITE_FACTS)) == {"lumi", "levante", "cosmos"}
