"""Two members of one project on the local cluster (two login users of one group, a project directory
of mode 2775): what one member's sync finished writing, the other cannot change; a link the other plants
at a temporary name is not followed; and a code directory the other replaced wholesale (its parent stays
group-writable, so that new code directories can be added) is refused by the job, naming both hashes.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from support.localcluster import LocalCluster, poll_until
from slurm_provider.watch.end_records import end_record_shell, parse_end_record
from slurm_provider.hooks import SlurmHook
from slurm_provider.transport import CommandResult
from vcloud_pipeline.code.retention import mark_run
from vcloud_pipeline.code.tree import CodeTree
from vcloud_pipeline.code.upload import local_manifest, render_run_jobs, sync_run
from vcloud_pipeline.jobs.render import EXIT_CODE_MISMATCH
from vcloud_pipeline.plan.layout import RunPaths, run_key, run_paths
from vcloud_pipeline.plan.request import parse_request
from vcloud_pipeline.plan.stages import StagePlan
from vcloud_pipeline.profile import load_profile

pytestmark = [pytest.mark.usefixtures("cluster_connection"), pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[3]


def q(path: object) -> str:
    return shlex.quote(str(path))


def as_teammate(cluster: LocalCluster, command: str) -> CommandResult:
    """``command`` on the login node as the project's second member."""
    with SlurmHook(cluster.teammate_conn_id) as hook:
        return hook.runner.run(command, timeout=60)


def synced_run(cluster: LocalCluster, tmp_path: Path, run: str) -> tuple[RunPaths, dict, str]:
    """The first member syncs ``run`` of this checkout into a project directory shared with the group."""
    base = cluster.test_dir()
    cluster.ssh(f"chmod 2775 {q(base)}")  # the project group's directory
    profile = load_profile("local", overrides={"paths.base": base})
    request = parse_request({"profile": "local", "run_name": run})
    paths = run_paths(profile, request.run_name)
    tree = CodeTree(REPO)
    manifest = local_manifest(tree)
    jobs = render_run_jobs(profile, StagePlan.build(request, profile).job_specs(), paths, manifest.hash)
    with SlurmHook(profile.connection.conn_id) as hook:
        sync_run(paths, tree, jobs, manifest, hook, tmp_path / "jobs")
    return paths, jobs, manifest.hash


def test_a_member_cannot_change_the_code_or_the_job_scripts_another_member_synced(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    paths, jobs, code_hash = synced_run(local_cluster, tmp_path, "members")
    code = paths.code(code_hash)
    module = code.dir / "trainer" / "src" / "vcloud" / "train.py"
    job = jobs["preflight"]
    before = local_cluster.ssh(f"cd {q(code.dir)} && find . -type f -exec sha256sum {{}} + | sort; "
                               f"sha256sum {q(job.inner_path)} {q(job.outer_path)}").stdout

    attempts = {
        "edit a module": f"echo 'import os' >> {q(module)}",
        "remove a module": f"rm -f {q(module)}",
        "add a module": f"touch {q(code.dir / 'trainer' / 'src' / 'vcloud' / 'sitecustomize.py')}",
        "move the trainer aside": f"mv {q(code.dir / 'trainer')} {q(code.dir / 'trainer.old')}",
        "change the manifest": f"echo '{{}}' > {q(code.manifest)}",
        "give itself write permission": f"chmod -R g+w {q(code.dir)}",
        "edit the inner script": f"echo 'echo other' >> {q(job.inner_path)}",
        "edit the outer script": f"echo 'echo other' >> {q(job.outer_path)}",
    }
    for what, command in attempts.items():
        result = as_teammate(local_cluster, command)
        assert result.exit_status != 0, f"the second member could {what}: {command}"
        assert "Permission denied" in result.stderr or "Operation not permitted" in result.stderr, \
            (what, result.stderr)

    after = local_cluster.ssh(f"cd {q(code.dir)} && find . -type f -exec sha256sum {{}} + | sort; "
                              f"sha256sum {q(job.inner_path)} {q(job.outer_path)}").stdout
    assert after == before
    modes = local_cluster.ssh(f"stat -c '%A %n' {q(paths.code_root)} {q(code.dir)} {q(module)} "
                              f"{q(job.inner_path)} {q(job.outer_path)} {q(paths.jobs_dir)}").stdout.splitlines()
    assert [line.split()[0] for line in modes] == [
        "drwxrwsr-x", "dr-xr-sr-x", "-r--r--r--", "-r-xr-xr-x", "-r--r--r--", "drwxrwsr-x"], modes
    # the other member's cleanup leaves it to its owner
    with SlurmHook(local_cluster.teammate_conn_id) as teammate:
        teammate.remove_dirs([(code.dir, paths.code_being_removed(code_hash))])
    assert local_cluster.ssh(f"cat {q(code.manifest)}").stdout.count(code_hash) == 1
    # the directories stay the group's: new code directories and job scripts are added next to them
    assert as_teammate(local_cluster, f"mkdir {q(paths.code_root / ('a' * 64))} && "
                                      f"touch {q(paths.jobs_dir / 'other.sbatch')}").exit_status == 0


def test_a_code_directory_another_member_replaced_is_refused_by_the_job_with_both_hashes(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    """The code root is group-writable, so the other member can rename a whole code directory aside and
    put a copy in its place, the manifest and its hash string included: the job hashes the tree."""
    paths, jobs, code_hash = synced_run(local_cluster, tmp_path, "replaced")
    code = paths.code(code_hash)
    aside = paths.code_root / "aside"
    package = code.dir / "trainer" / "src" / "vcloud"
    replaced = as_teammate(local_cluster, f"umask 002 && mv {q(code.dir)} {q(aside)} && cp -r {q(aside)} {q(code.dir)} "
                                          f"&& chmod -R u+w {q(code.dir)} && echo 'import os' >> {q(package / '__init__.py')}")
    assert replaced.exit_status == 0, replaced.stderr
    assert code_hash in local_cluster.ssh(f"cat {q(code.manifest)}").stdout, "the manifest's string is the same"

    job = jobs["preflight"]
    try:
        with SlurmHook(local_cluster.conn_id) as hook:
            submitted = hook.submit(job.outer, job_name=job.job_name, output=str(job.stdout_pattern))
            job_id = str(submitted.job_id)
            status = poll_until(lambda: (s := hook.statuses([job_id])[job_id]).is_terminal and s, timeout=240,
                                what=f"job {job_id} to end", interval=1)
    finally:
        local_cluster.cancel_jobs_under(str(paths.code_root.parent))
    err = local_cluster.ssh(f"cat {q(job.stderr_path(job_id))}").stdout
    assert status.exit_code == EXIT_CODE_MISMATCH, err
    assert f"refusing to start: the code in {code.dir} hashes to " in err, err
    assert f", not {code_hash} that this job was synced and rendered for" in err, err
    print(err)


def test_a_link_another_member_planted_at_a_temporary_name_is_not_followed(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    paths, jobs, code_hash = synced_run(local_cluster, tmp_path, "links")
    victim = paths.code_root.parent / "victim"
    # A file of the second member that the first could write (group-writable): the target of the links.
    assert as_teammate(local_cluster, f"umask 002 && echo untouched > {q(victim)}").exit_status == 0

    # The run markers' temp file was `.<marker>.tmp`, a name anyone could foresee.
    key = run_key("vcloud_training", "manual__links")
    marker = paths.run_marker(key, code_hash)
    planted = as_teammate(local_cluster, f"umask 002 && mkdir -p {q(paths.run_markers_dir)} && "
                                         f"ln -s {q(victim)} {q(paths.run_markers_dir / f'.{marker.name}.tmp')}")
    assert planted.exit_status == 0, planted.stderr
    with SlurmHook(local_cluster.conn_id) as hook:
        mark_run(hook, paths, key, code_hash, "DAG run manual__links of run links")
    assert local_cluster.ssh(f"cat {q(marker)}").stdout == "DAG run manual__links of run links\n"
    assert local_cluster.ssh(f"test -L {q(marker)} || echo regular").stdout.strip() == "regular"

    # A job's exit record: a link at the record's own name is replaced, never written through.
    logs = paths.logs_dir
    script = f"#!/bin/bash\n{end_record_shell(str(logs / '%x.%j.out'))}\nexit 0\n"
    job_id = local_cluster.sbatch(script, "--hold", "--job-name=links", f"--output={logs}/%x.%j.out")
    try:
        record = logs / f"links.{job_id}.out.end"
        assert as_teammate(local_cluster, f"ln -s {q(victim)} {q(record)}").exit_status == 0
        local_cluster.ssh(f"scontrol release {job_id}")
        local_cluster.wait_for_state(job_id, ["COMPLETED"], timeout=240)
        text = poll_until(lambda: local_cluster.ssh(f"test -L {q(record)} || cat {q(record)}", check=False).stdout,
                          timeout=60, what="the exit record")
    finally:
        local_cluster.root("scancel", str(job_id), check=False)
    found = parse_end_record(text)
    assert found is not None and found.job_id == str(job_id) and found.exit_code == 0, text
    assert local_cluster.ssh(f"cat {q(victim)}").stdout == "untouched\n"
    assert not [name for name in local_cluster.ssh(f"ls -A {q(logs)}").stdout.split() if ".end." in name], \
        "no temp file is left"
