"""The job environment provisions itself, on the local cluster (real Slurm, real SSH, real pip).

The LUMI profile runs with its site facts mapped, on a private copy of LUMI's site image that lacks
tifffile as CSC's does (hard links of the trainer image, tifffile unlinked), and with a private
``paths.pylibs`` and project directory: nothing here touches what other tests or the demo use.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.localcluster import LocalCluster
from slurm_provider import job_name_for
from slurm_provider.hooks import SlurmHook
from vcloud_pipeline.code.tree import CodeTree
from vcloud_pipeline.code.upload import local_manifest, render_run_jobs, sync_run
from vcloud_pipeline.plan.jobspec import JobSpec
from vcloud_pipeline.plan.labels import JobLabel
from vcloud_pipeline.plan.layout import pylibs_set, run_paths
from vcloud_pipeline.profile import ClusterProfile, load_profile, overrides_from_environ
from vcloud_pipeline.profile.site_facts import LOCAL_SITE_FACTS, SITE_FACTS_ENV
from vcloud_pipeline.provision.environment import JobEnvironment, read_image_identity
from vcloud_pipeline.provision.requirements import RequirementSet, parse_requirements, runtime_requirements
from vcloud_pipeline.provision.step import ProvisionError, provision_environment

pytestmark = [pytest.mark.usefixtures("cluster_connection"), pytest.mark.timeout(1500)]
REPO = Path(__file__).resolve().parents[2]
VENV = "/opt/vcloud-localcluster/venv"
OLD_TIFFFILE, NEW_TIFFFILE = "tifffile==2026.3.3", "tifffile==2026.2.24"


@pytest.fixture(scope="module")
def lumi_site(local_cluster: LocalCluster) -> Iterator[dict[str, str]]:
    """A private LUMI site image without tifffile, a private pylibs and project directory."""
    images = local_cluster.state_dir / "images"
    trainer = images / "vcloud-trainer"
    private = images / f"test-{uuid.uuid4().hex[:12]}"
    image = private / "lumi.sif"
    private.mkdir(mode=0o755)
    try:
        subprocess.run(["cp", "-al", str(trainer), str(image)], check=True, timeout=300)
        for entry in (image / VENV.lstrip("/") / "lib").glob("python3*/site-packages/tifffile*"):
            shutil.rmtree(entry)  # unlinks the copy's entries; the trainer image keeps its files
        assert not list((image / VENV.lstrip("/") / "lib").glob("python3*/site-packages/tifffile*"))
        tag = uuid.uuid4().hex[:12]
        site = {"image": str(image), "pylibs": f"/projappl/vcloud_local/pylibs/test-{tag}",
                "base": f"/scratch/vcloud_local/test-{tag}/vcloud"}
        local_cluster.ssh(f"mkdir -p {shlex.quote(site['pylibs'])} {shlex.quote(site['base'])}")
        yield site
        local_cluster.ssh(f"chmod -R u+w {shlex.quote(site['pylibs'])} {shlex.quote(str(Path(site['base']).parent))}; "
                          f"rm -rf {shlex.quote(site['pylibs'])} {shlex.quote(str(Path(site['base']).parent))}",
                          check=False, timeout=300)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def lumi_overrides(site: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"container.image": site["image"], "paths.pylibs": site["pylibs"], "paths.base": site["base"], **extra}


def lumi_profile(site: dict[str, str], **extra: Any) -> ClusterProfile:
    """LUMI's profile as a DAG run on the local cluster loads it, on the private site."""
    facts = overrides_from_environ("lumi", {SITE_FACTS_ENV: str(LOCAL_SITE_FACTS)})
    return load_profile("lumi", {**facts, **lumi_overrides(site, **extra)}, login="vcloud")


def with_pin(requirements: RequirementSet, old: str, new: str) -> RequirementSet:
    assert old in requirements.pins
    return parse_requirements("\n".join(new if pin == old else pin for pin in requirements.pins))


def for_image(profile: ClusterProfile, requirements: RequirementSet) -> JobEnvironment:
    """The environment a job rendered without sync_code's identity read is rendered for: the pins and
    the profile's image reference."""
    return JobEnvironment.of(profile, requirements)


def test_the_first_run_installs_what_the_image_lacks_and_the_second_is_one_command_that_installs_nothing(
        local_cluster: LocalCluster, lumi_site: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    profile, requirements = lumi_profile(lumi_site), runtime_requirements()
    environment = for_image(profile, requirements)
    pylibs = pylibs_set(profile, environment.key)
    assert pylibs is not None
    caplog.set_level(logging.INFO, logger="vcloud_pipeline.provision.step")
    with SlurmHook(profile.connection.conn_id) as hook:
        first = provision_environment(profile, hook, environment)
        assert hook.commands_issued == 1
    print("\n".join(record.getMessage() for record in caplog.records))  # the step's log, for people
    assert first.state == "installed" and first.installed == (OLD_TIFFFILE,), first
    assert first.provided == len(requirements) - 1 and first.directory == str(pylibs.dir)
    listing = local_cluster.ssh(f"ls -A {shlex.quote(str(pylibs.dir))}; ls -A {shlex.quote(str(pylibs.root))}").stdout
    assert "tifffile\n" in listing and ".vcloud_requirements\n" in listing
    assert ".building" not in listing and ".vcloud-provision.lock" not in listing, listing
    # finished: read-only for everyone, so no member changes what another's jobs import
    module = pylibs.dir / "tifffile" / "__init__.py"
    modes = local_cluster.ssh(f"stat -c '%A' {shlex.quote(str(pylibs.dir))} {shlex.quote(str(pylibs.marker))} "
                              f"{shlex.quote(str(module))}").stdout.split()
    assert len(modes) == 3 and not any("w" in mode for mode in modes), modes
    with SlurmHook(local_cluster.teammate_conn_id) as teammate:
        edit = teammate.runner.run(f"echo 'import os' >> {shlex.quote(str(module))}", timeout=60)
    assert edit.exit_status != 0 and "Permission denied" in edit.stderr, edit
    marker = local_cluster.ssh(f"cat {shlex.quote(str(pylibs.marker))}").stdout
    assert f"requirements {requirements.hash}\n" in marker and f"missing {OLD_TIFFFILE}\n" in marker
    assert f"set {environment.key}\nimage {lumi_site['image']}\n" in marker
    assert any(f"installed on the login node into {pylibs.dir}: {OLD_TIFFFILE}" in r.getMessage()
               for r in caplog.records)
    stamp = local_cluster.ssh(f"stat -c '%i %Y' {shlex.quote(str(pylibs.marker))}").stdout

    caplog.clear()
    with SlurmHook(profile.connection.conn_id) as hook:
        second = provision_environment(profile, hook, environment)
        assert hook.commands_issued == 1 and dict(hook.command_counts) == {"provision": 1}
    assert second.state == "present" and second.directory == str(pylibs.dir)
    assert local_cluster.ssh(f"stat -c '%i %Y' {shlex.quote(str(pylibs.marker))}").stdout == stamp
    assert any(f"already in {pylibs.dir}" in r.getMessage() and "nothing installed" in r.getMessage()
               for r in caplog.records)


def test_a_changed_set_installs_into_a_new_directory_while_a_queued_job_of_the_old_set_imports_its_own(
        local_cluster: LocalCluster, lumi_site: dict[str, str], tmp_path: Path) -> None:
    profile, old = lumi_profile(lumi_site), runtime_requirements()
    new = with_pin(old, OLD_TIFFFILE, NEW_TIFFFILE)
    old_dir, new_dir = pylibs_set(profile, for_image(profile, old).key), pylibs_set(profile, for_image(profile, new).key)
    assert old_dir is not None and new_dir is not None and old_dir.dir != new_dir.dir
    paths = run_paths(profile, "provision-queued")
    tree = CodeTree(REPO)
    manifest = local_manifest(tree)
    jobs = render_run_jobs(profile, {JobLabel.PREFLIGHT: JobSpec.preflight()}, paths, manifest.hash)
    job = jobs[JobLabel.PREFLIGHT]
    assert f"{old_dir.dir}\"" in job.inner  # rendered for the checkout's set
    with SlurmHook(profile.connection.conn_id) as hook:
        assert provision_environment(profile, hook, for_image(profile, old)).directory == str(old_dir.dir)
        sync_run(paths, tree, jobs, manifest, hook, tmp_path / "jobs")
        job_id = int(local_cluster.ssh(f"sbatch --parsable --hold {shlex.quote(str(job.outer_path))}")
                     .stdout.strip().split(";")[0])
        try:
            assert local_cluster.current_state(job_id) == "PENDING"
            changed = provision_environment(profile, hook, for_image(profile, new))
            assert changed.state == "installed" and changed.installed == (NEW_TIFFFILE,)
            assert changed.directory == str(new_dir.dir)
            local_cluster.ssh(f"scontrol release {job_id}")
            state = local_cluster.wait_for_state(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=600)
        finally:
            local_cluster.ssh(f"scancel {job_id}", check=False)
    out = local_cluster.ssh(f"cat {shlex.quote(str(job.stdout_path(str(job_id))))}").stdout
    assert state == "COMPLETED", out[-3000:]
    assert f"preflight: tifffile 2026.3.3 from {old_dir.dir}/tifffile/__init__.py" in out, out[-3000:]
    both = local_cluster.ssh(f"cat {shlex.quote(str(old_dir.marker))} {shlex.quote(str(new_dir.marker))}").stdout
    assert f"missing {OLD_TIFFFILE}" in both and f"missing {NEW_TIFFFILE}" in both


def test_a_set_built_for_one_image_is_not_reused_with_another_image(
        local_cluster: LocalCluster, lumi_site: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    """The profile names another image (here a second path to the same image, as a site that moves
    its image): same pins, another set; the first image again finds its own set. An image replaced at
    the same path (here: its mtime changed) keys another set too."""
    image = Path(lumi_site["image"])
    other = image.with_name("lumi-next.sif")
    other.symlink_to(image.name)
    first_profile, other_profile = lumi_profile(lumi_site), lumi_profile(lumi_site, **{"container.image": str(other)})
    requirements = runtime_requirements()
    caplog.set_level(logging.INFO, logger="vcloud_pipeline.provision.step")
    with SlurmHook(first_profile.connection.conn_id) as hook:
        identity = read_image_identity(first_profile, hook)
        assert identity is not None and identity == read_image_identity(other_profile, hook)  # one image behind both
        first = JobEnvironment.of(first_profile, requirements, identity)
        second = JobEnvironment.of(other_profile, requirements, identity)
        assert first.key != second.key
        built = provision_environment(first_profile, hook, first)
        for_other = provision_environment(other_profile, hook, second)
        again = provision_environment(first_profile, hook, first)
        stat = image.stat()
        os.utime(image, (stat.st_atime, stat.st_mtime + 60))  # the image replaced in place
        replaced = read_image_identity(first_profile, hook)
    print("\n".join(record.getMessage() for record in caplog.records))  # the step's log, for people
    assert built.state == "installed" and built.installed == (OLD_TIFFFILE,) and built.image == str(image)
    assert for_other.state == "installed" and for_other.installed == (OLD_TIFFFILE,), for_other
    assert for_other.directory != built.directory and for_other.image == str(other)
    assert again.state == "present" and again.directory == built.directory
    assert replaced is not None and replaced != identity
    assert JobEnvironment.of(first_profile, requirements, replaced).key not in (first.key, second.key)
    markers = [local_cluster.ssh(f"cat {shlex.quote(str(d))}/.vcloud_requirements").stdout
               for d in (built.directory, for_other.directory)]
    assert f"image {image}\nimage-identity {identity}\n" in markers[0]
    assert f"image {other}\nimage-identity {identity}\n" in markers[1]
    assert any(f"for image {other} ({identity}) installed on the login node" in r.getMessage()
               for r in caplog.records)


def test_an_uninstallable_pin_fails_with_its_hint_and_leaves_no_set(
        local_cluster: LocalCluster, lumi_site: dict[str, str]) -> None:
    profile = lumi_profile(lumi_site)
    bad = for_image(profile, with_pin(runtime_requirements(), OLD_TIFFFILE, "tifffile==1999.1.1"))
    pylibs = pylibs_set(profile, bad.key)
    assert pylibs is not None
    with SlurmHook(profile.connection.conn_id) as hook, pytest.raises(ProvisionError) as failure:
        provision_environment(profile, hook, bad)
    message = str(failure.value)
    assert f"provisioning requirement set {bad.key} ({bad.describe_image()}) of profile lumi on the login node " \
           "failed (exit 72)" in message
    assert "No matching distribution found for tifffile==1999.1.1" in message, message
    assert "Hint: The package index has no wheel of a pinned version" in message
    assert "Hint (lumi): On LUMI install from a login node" in message
    left = local_cluster.ssh(f"ls -A {shlex.quote(str(pylibs.root))}").stdout.split()
    assert pylibs.hash not in left and f".{pylibs.hash}.building" not in left and ".vcloud-provision.lock" not in left


@pytest.mark.usefixtures("airflow_home")
def test_the_dag_stops_at_provisioning_on_a_node_without_network_and_submits_no_stage_job(
        local_cluster: LocalCluster, lumi_site: dict[str, str], monkeypatch: pytest.MonkeyPatch, capfd) -> None:
    from tests.dags.test_dag_on_cluster import run_dag

    # where: job runs pip on a compute node: the local cluster's nodes have no route out, as LUMI's.
    monkeypatch.setenv(SITE_FACTS_ENV, str(LOCAL_SITE_FACTS))
    monkeypatch.setenv("VCLOUD_PROFILE_OVERRIDES", json.dumps({"lumi": lumi_overrides(
        lumi_site, **{"paths.pylibs": lumi_site["pylibs"] + "/job", "provision.where": "job",
                      "provision.partition": "dev-g"})}))
    monkeypatch.setenv("VCLOUD_POLL_INTERVAL", "2")
    run_name = f"noprov-{uuid.uuid4().hex[:6]}"
    run_id, states, _ = run_dag(profile="lumi", config="tiny", run_name=run_name, max_epochs=1)
    out = "".join(capfd.readouterr())
    assert states["provision_env"] == "failed", states
    later = ["prepare_data", "preflight_imports", "stage0", "stage1", "stage2", "stage3", "export"]
    assert {task: states[task] for task in later} == dict.fromkeys(later, "upstream_failed"), states
    assert states["<run>"] == "failed"
    assert "pip could not install what the container lacks; no job of the run was submitted" in out, out[-4000:]
    with capfd.disabled():  # the task's failure as a person reads it (pytest -s)
        start = out.index("ProvisionError: provisioning requirement set")
        print(out[start:out.index("Hint (lumi)", start) + 200])
    assert "Hint: pip cannot reach the package index" in out and "Hint: The package index has no wheel" not in out
    assert "Hint (lumi): On LUMI install from a login node" in out
    # The provisioning job ran and failed; not one job of the run reached Slurm.
    names = local_cluster.root("sacct", "-a", "-X", "-n", "-P", "-S", "now-1hours", "--format=JobName,State").stdout
    assert re.search(r"^vcloud-provision-[0-9a-f]{16}\|FAILED", names, re.M), names
    run_jobs = [job_name_for("vcloud_training", task, run_id) for task in later]
    assert not [name for name in run_jobs if name in names], names


def test_two_installers_of_one_set_at_once_install_it_once(
        local_cluster: LocalCluster, lumi_site: dict[str, str]) -> None:
    """Two DAG runs that provision the same new set at the same moment: the lock lets one install it;
    the other finds it complete once the lock is free and installs nothing."""
    from concurrent.futures import ThreadPoolExecutor

    profile = lumi_profile(lumi_site)
    environment = for_image(profile, with_pin(runtime_requirements(), OLD_TIFFFILE, "tifffile==2026.2.20"))

    def provision() -> str:
        with SlurmHook(profile.connection.conn_id) as hook:
            return provision_environment(profile, hook, environment).state

    with ThreadPoolExecutor(max_workers=2) as pool:
        states = sorted(pool.map(lambda _: provision(), range(2)))
    assert states == ["installed", "present"], states
    pylibs = pylibs_set(profile, environment.key)
    assert pylibs is not None
    marker = local_cluster.ssh(f"cat {shlex.quote(str(pylibs.marker))}").stdout
    assert marker.count("requirements ") == 1 and "missing tifffile==2026.2.20" in marker
