"""Code sync against the real local cluster: anchored excludes, the manifest, the hash check, and
one code directory per content hash.

The LUMI guide's rsync lesson (seed 000), run with real rsync both ways: ``--exclude=/data`` leaves
out the top-level dataset directory and nothing else; ``--exclude=data`` would also have dropped
``trainer/src/vcloud/data/`` and the job would die with ``No module named 'vcloud.data'``.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from support.localcluster import LocalCluster, poll_until
from slurm_provider.hooks import SlurmHook
from slurm_provider.transport import HostKeyRejected
from vcloud_pipeline.code.retention import remove_unused_code_dirs
from vcloud_pipeline.plan.layout import MANIFEST_NAME, RunPaths, run_paths
from vcloud_pipeline.plan.request import parse_request
from vcloud_pipeline.profile import load_profile
from vcloud_pipeline.jobs.render import EXIT_CODE_MISMATCH
from vcloud_pipeline.code.tree import (
    DEFAULT_EXCLUDES,
    CodeTree,
    ExcludeError,
    code_hash,
    code_sync_argv,
    refuse_unanchored_excludes,
    rsync_argv,
)
from vcloud_pipeline.plan.stages import StagePlan
from vcloud_pipeline.code.upload import (
    local_manifest,
    render_run_jobs,
    run_rsync,
    sync_code_tree,
    sync_run,
)

pytestmark = pytest.mark.usefixtures("cluster_connection")


def project_like_tree(root: Path) -> Path:
    """A checkout with a top-level dataset directory and the trainer's own ``data`` package."""
    files = {
        "data/raw/ROIs1158/s2.tif": "raw dataset bytes",
        "data/prepared/index.json": "{}",
        "trainer/src/vcloud/__init__.py": "",
        "trainer/src/vcloud/data/__init__.py": "",
        "trainer/src/vcloud/data/dataset.py": "class SeriesDataset: ...\n",
        "trainer/configs/model_tiny.yaml": "name: tiny\n",
        "README.md": "vcloud\n",
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def remote_files(cluster: LocalCluster, directory: str) -> set[str]:
    out = cluster.ssh(f"cd {shlex.quote(directory)} && find . -type f -printf '%P\\n'").stdout
    return set(out.split())


def test_anchored_exclude_keeps_the_data_package_and_the_unanchored_one_loses_it(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    source = project_like_tree(tmp_path / "src")
    profile = load_profile("local")
    base = local_cluster.test_dir()

    tree = CodeTree(source, top_level=None)  # everything, so only the excludes decide
    refuse_unanchored_excludes(tree)
    with SlurmHook(profile.connection.conn_id).ssh_command() as login:
        ssh, dest = login.argv, login.destination
        run_rsync(code_sync_argv(tree, dest, f"{base}/anchored", ssh), what="anchored sync", ssh=login)
    anchored = remote_files(local_cluster, f"{base}/anchored")
    assert "trainer/src/vcloud/data/__init__.py" in anchored
    assert "trainer/src/vcloud/data/dataset.py" in anchored
    assert not any(f.startswith("data/") for f in anchored), anchored
    assert "README.md" in anchored

    unanchored = tuple("data" if e == "/data" else e for e in DEFAULT_EXCLUDES)
    with pytest.raises(ExcludeError, match=r"'data' is not anchored.*No module named 'vcloud.data'"):
        refuse_unanchored_excludes(CodeTree(source, top_level=None, excludes=unanchored))
    # what plain rsync does with it, had nothing refused it
    filters = [f"--exclude={e}" for e in unanchored]
    with SlurmHook(profile.connection.conn_id).ssh_command() as login:
        run_rsync(rsync_argv(source, login.destination, f"{base}/unanchored", login.argv, filters=filters),
                  what="unanchored sync", ssh=login)
    lost = remote_files(local_cluster, f"{base}/unanchored")
    assert "trainer/src/vcloud/__init__.py" in lost
    assert not any(f.startswith("trainer/src/vcloud/data/") for f in lost), lost


def test_a_job_refuses_to_start_when_the_code_on_the_cluster_changed(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[3]
    base = local_cluster.test_dir()
    profile = load_profile("local", overrides={"paths.base": base})
    request = parse_request({"profile": "local", "run_name": "hashcheck"})
    paths = run_paths(profile, request.run_name)
    tree = CodeTree(repo)
    manifest = local_manifest(tree)
    jobs = render_run_jobs(profile, StagePlan.build(request, profile).job_specs(), paths, manifest.hash)
    code = paths.code(manifest.hash)
    with SlurmHook(profile.connection.conn_id) as hook:
        sync_run(paths, tree, jobs, manifest, hook, tmp_path / "jobs")
        synced = local_cluster.ssh(f"cat {shlex.quote(str(code.manifest))}").stdout
        assert f'"hash": "{manifest.hash}"' in synced

        # the code tree arrives byte for byte: pulling it back hashes the same
        back = tmp_path / "back"
        with SlurmHook(profile.connection.conn_id).ssh_command() as login:
            pull = ["rsync", "-a", "-s", "-e", login.shell, f"{login.destination}:{code.dir}/",
                    f"{back}/"]
            run_rsync(pull, what="pull back", ssh=login)
        assert code_hash(back) == manifest.hash

        # someone changes this hash's code directory on the cluster before the job starts
        other = manifest.to_json().replace(manifest.hash, "f" * 64)
        local_cluster.ssh(f"chmod u+w {shlex.quote(str(code.manifest))} && cat > {shlex.quote(str(code.manifest))}",
                          input=other)  # read-only once synced: its owner makes it writable first
        job = jobs["preflight"]
        submitted = hook.submit(job.outer, job_name=job.job_name, output=str(job.stdout_pattern))
        job_id = str(submitted.job_id)
        status = poll_until(lambda: (s := hook.statuses([job_id])[job_id]).is_terminal and s, timeout=180,
                            what=f"job {job_id} to end", interval=1)
    assert status.state.value == "FAILED"
    assert status.exit_code == EXIT_CODE_MISMATCH
    err = local_cluster.ssh(f"cat {shlex.quote(str(job.stderr_path(job_id)))}").stdout
    assert "refusing to start: the code on the cluster (" + "f" * 64 + ")" in err
    assert manifest.hash in err


def test_unchanged_code_is_not_sent_again_but_any_change_on_either_side_is(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    source = project_like_tree(tmp_path / "src")
    base = local_cluster.test_dir()
    profile = load_profile("local", overrides={"paths.base": base})
    paths = run_paths(profile, "resync")
    tree = CodeTree(source)
    first = local_manifest(tree)
    code = shlex.quote(str(paths.code(first.hash).dir))
    with SlurmHook(profile.connection.conn_id) as hook:
        local_cluster.ssh(f"mkdir -p {shlex.quote(str(paths.code_root))}")
        assert sync_code_tree(paths, tree, first, hook) is True
        assert sync_code_tree(paths, tree, local_manifest(tree), hook) is False

        # the synced tree is read-only, for its owner too
        dataset = f"{code}/trainer/src/vcloud/data/dataset.py"
        assert local_cluster.ssh(f"echo 'edited on the login node' >> {dataset}", check=False).returncode != 0

        # an edit on the cluster (newer than the manifest), made by the owner after taking write permission
        # back, is undone by the next sync
        local_cluster.ssh(f"chmod -R u+w {code} && echo 'edited on the login node' >> {dataset}")
        assert sync_code_tree(paths, tree, local_manifest(tree), hook) is True
        assert local_cluster.ssh(f"cat {dataset}").stdout == "class SeriesDataset: ...\n"
        assert sync_code_tree(paths, tree, local_manifest(tree), hook) is False

        # a file deleted on the cluster comes back
        local_cluster.ssh(f"chmod -R u+w {code} && rm {code}/trainer/src/vcloud/data/__init__.py")
        assert sync_code_tree(paths, tree, local_manifest(tree), hook) is True
        assert "trainer/src/vcloud/data/__init__.py" in remote_files(local_cluster, str(paths.code(first.hash).dir))
        before = remote_files(local_cluster, str(paths.code(first.hash).dir))

        # A local change is a new hash with a directory of its own; the first one stays as it was.
        # Unchanged files are copied from it on the cluster, not sent: a same-size, same-mtime edit
        # made only there (which rsync's quick check cannot see) shows up in the new directory.
        local_cluster.ssh(f"chmod -R u+w {code} && m=\"$(stat -c %y {dataset})\" && sed -i 's/Dataset: /DatasetX:/' {dataset} && "
                          f"touch -d \"$m\" {dataset}")
        (source / "trainer" / "configs" / "model_tiny.yaml").write_text("name: tiny\nepochs: 2\n")
        changed = local_manifest(tree)
        assert changed.hash != first.hash
        assert sync_code_tree(paths, tree, changed, hook) is True
        new = paths.code(changed.hash)
        assert f'"hash": "{changed.hash}"' in local_cluster.ssh(f"cat {shlex.quote(str(new.manifest))}").stdout
        assert remote_files(local_cluster, str(new.dir)) == before
        assert local_cluster.ssh(f"cat {shlex.quote(str(new.dir))}/trainer/configs/model_tiny.yaml").stdout == \
            "name: tiny\nepochs: 2\n"
        assert local_cluster.ssh(f"cat {shlex.quote(str(new.dir))}/trainer/src/vcloud/data/dataset.py").stdout == \
            "class SeriesDatasetX:...\n", "the unchanged file was sent instead of copied on the cluster"
        assert f'"hash": "{first.hash}"' in local_cluster.ssh(f"cat {code}/.vcloud_manifest.json").stdout


def test_a_cleanup_keeps_the_newest_and_what_live_jobs_use_and_removes_the_rest(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    source = project_like_tree(tmp_path / "src")
    profile = load_profile("local", overrides={"paths.base": local_cluster.test_dir(), "paths.code_keep": 1})
    paths = run_paths(profile, "cleanup")
    tree = CodeTree(source)
    config = source / "trainer" / "configs" / "model_tiny.yaml"
    hashes = []
    with SlurmHook(profile.connection.conn_id) as hook:
        local_cluster.ssh(f"mkdir -p {shlex.quote(str(paths.code_root))}")
        for version in (1, 2, 3):
            config.write_text(f"name: tiny\nversion: {version}\n")
            manifest = local_manifest(tree)
            assert sync_code_tree(paths, tree, manifest, hook) is True
            hashes.append(manifest.hash)
        oldest, middle, newest = hashes

        # a queued job (held, so it stays queued) of an earlier run still needs the oldest code
        held = local_cluster.sbatch("#!/bin/bash\ntrue\n", "--hold", "--output=/dev/null",
                                    f'--comment={{"code":"{oldest}"}}')
        try:
            plan = remove_unused_code_dirs(profile, paths, hook, current=newest)
            assert (plan.remove, plan.in_use, plan.newest) == ((middle,), (oldest,), (newest,))
            assert remote_code_dirs(local_cluster, paths) == {oldest, newest, f".{oldest}.sync-lock",
                                                              f".{newest}.sync-lock"}  # middle's lock went too
        finally:
            local_cluster.ssh(f"scancel {held}")
        local_cluster.wait_for_state(held, {"CANCELLED"}, timeout=60)

        plan = remove_unused_code_dirs(profile, paths, hook, current=newest)
        assert (plan.remove, plan.in_use) == ((oldest,), ())
        assert remote_code_dirs(local_cluster, paths) == {newest, f".{newest}.sync-lock"}
        assert remove_unused_code_dirs(profile, paths, hook, current=newest).remove == ()


def remote_code_dirs(cluster: LocalCluster, paths: RunPaths) -> set[str]:
    """Every entry of the code root, hidden ones included (a removal leaves nothing behind)."""
    return set(cluster.ssh(f"ls -A {shlex.quote(str(paths.code_root))}").stdout.split())


@pytest.mark.parametrize("transport", ["paramiko", "openssh"])
def test_the_sync_refuses_a_wrong_pinned_host_key_in_the_words_of_the_hook(
        local_cluster: LocalCluster, tmp_path: Path, transport: str, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    impostor = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    wrong_key = " ".join(impostor.with_suffix(".pub").read_text().split()[:2])
    if transport == "paramiko":
        conn = local_cluster.key_only_connection()
    else:  # the cluster's alias with a socket of its own: a master that is already up checks no host key
        control_dir = Path(tempfile.mkdtemp(prefix="cm-", dir="/tmp"))
        request.addfinalizer(lambda: shutil.rmtree(control_dir, ignore_errors=True))
        config = local_cluster.ssh_config_copy(tmp_path, control_dir / "%C")
        conn = local_cluster.connection("vcloud_local_cluster_openssh")
        conn["extra"]["ssh_config_file"] = str(config)
    conn["extra"]["host_key"] = wrong_key
    monkeypatch.setenv("AIRFLOW_CONN_IMPOSTOR", json.dumps(conn))
    source = project_like_tree(tmp_path / "src")
    base = local_cluster.test_dir()
    profile = load_profile("local", overrides={"paths.base": base, "connection.conn_id": "impostor"})
    paths = run_paths(profile, "impostor")
    tree = CodeTree(source)
    manifest = local_manifest(tree)

    with pytest.raises(HostKeyRejected) as by_hook:
        SlurmHook("impostor").runner.run("true", timeout=30)
    with SlurmHook("vcloud_local_cluster") as trusted:  # only rsync meets the impostor's pin
        trusted.runner.run(f"mkdir -p {shlex.quote(str(paths.code_root))}", timeout=30)
        with pytest.raises(HostKeyRejected) as by_rsync:
            sync_code_tree(paths, tree, manifest, SlurmHook("impostor", runner=trusted.runner))
    assert str(by_rsync.value) == str(by_hook.value)
    assert "does not match the pinned key" in str(by_rsync.value)
    assert by_rsync.value.__notes__ == [f"while syncing {source} to {paths.code(manifest.hash).dir} with rsync"]
    assert remote_files(local_cluster, str(paths.code_root)) == set(), "nothing may arrive"


def test_two_members_of_a_project_sync_the_same_run_one_after_the_other(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    """The run's directories (its job scripts directory above all) belong to the member who synced
    first; the other member's sync writes into them without setting anything on what it does not
    own (rsync exit 23, "failed to set permissions", before); the directories either creates stay
    group-writable, the scripts are read-only."""
    repo = Path(__file__).resolve().parents[3]
    base = local_cluster.test_dir()
    local_cluster.ssh(f"chmod 2775 {shlex.quote(base)}")  # the project group's directory
    request = parse_request({"profile": "local", "run_name": "shared"})
    tree = CodeTree(repo)
    manifest = local_manifest(tree)
    for n, conn_id in enumerate([local_cluster.teammate_conn_id, local_cluster.conn_id]):
        profile = load_profile("local", overrides={"paths.base": base, "connection.conn_id": conn_id})
        paths = run_paths(profile, request.run_name)
        jobs = render_run_jobs(profile, StagePlan.build(request, profile).job_specs(), paths, manifest.hash)
        with SlurmHook(conn_id) as hook:
            # a staging directory of mode 0700, as the sync_code task's TemporaryDirectory
            sync_run(paths, tree, jobs, manifest, hook, Path(tempfile.mkdtemp(dir=tmp_path)))
    listing = local_cluster.ssh(f"stat -c '%U %A %n' {shlex.quote(str(paths.jobs_dir))} "
                                f"{shlex.quote(str(paths.jobs_dir))}/*").stdout.splitlines()
    owner, mode, _ = listing[0].split(maxsplit=2)
    assert (owner, mode) == (local_cluster.teammate, "drwxrwsr-x"), listing[0]
    scripts = [line.split(maxsplit=2) for line in listing[1:]]
    assert len(scripts) == 2 * len(jobs), listing
    # read-only for everyone; the directory is the group's, so either member adds (or renames over) them
    assert all(mode[2] == "-" and mode[5] == "-" and mode[8] == "-" for _, mode, _ in scripts), listing


def test_two_writers_of_one_code_take_turns_and_leave_no_temporary_file(local_cluster: LocalCluster,
                                                                        tmp_path: Path) -> None:
    """Two deployments (or two members) sync the same code at the same moment: the second one's rsync
    waits for the first one's lock, so a job that checks its code once the manifest stands never meets
    the other's temporary files. Here another writer holds the lock; the sync waits, writes nothing
    meanwhile, and once the lock is free leaves the complete, frozen tree."""
    import threading

    source = project_like_tree(tmp_path / "src")
    profile = load_profile("local", overrides={"paths.base": local_cluster.test_dir()})
    paths = run_paths(profile, "turns")
    tree = CodeTree(source)
    manifest = local_manifest(tree)
    code, lock = paths.code(manifest.hash), paths.code_sync_lock(manifest.hash)
    q = shlex.quote
    local_cluster.ssh(f"mkdir -p {q(str(paths.code_root))}")
    holder = local_cluster.ssh(f"setsid flock {q(str(lock))} sleep 600 >/dev/null 2>&1 < /dev/null & echo $!").stdout.strip()
    outcome: dict[str, object] = {}

    def sync() -> None:
        try:
            with SlurmHook(profile.connection.conn_id) as hook:
                outcome["sent"] = sync_code_tree(paths, tree, manifest, hook)
        except BaseException as exc:  # the assertion below names it
            outcome["error"] = exc

    writer = threading.Thread(target=sync)
    writer.start()
    try:
        poll_until(lambda: f"flock -w 900 {lock} rsync" in local_cluster.ssh("ps -eo args", check=False).stdout,
                   timeout=120, what="the sync's rsync to wait for the other writer's lock")
        files = local_cluster.ssh(f"find {q(str(code.dir))} -type f 2>/dev/null | wc -l").stdout.strip()
        assert files == "0", f"{files} file(s) written while another writer held the lock"
    finally:
        local_cluster.ssh(f"kill -- -{holder}", check=False)
    writer.join(300)
    assert not writer.is_alive() and "error" not in outcome, outcome
    assert outcome["sent"] is True
    stray = local_cluster.ssh(f"find {q(str(code.dir))} -name '.*' ! -name {MANIFEST_NAME}").stdout.split()
    assert stray == [], f"temporary files left in the code directory: {stray}"
    remote_hash = local_cluster.ssh(f"cat {q(str(code.manifest))}").stdout
    assert json.loads(remote_hash)["hash"] == manifest.hash
    writable = local_cluster.ssh(f"find {q(str(code.dir))} -perm /222 | wc -l").stdout.strip()
    assert writable == "0", "the finished tree is read-only"
