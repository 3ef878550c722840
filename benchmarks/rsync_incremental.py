"""Code sync cost on the local cluster: full sync, no-change re-sync, one changed file.

Runs the training DAG's own code-sync step (``vcloud_pipeline.code.upload.sync_code_tree``: one manifest
check over the SSH login, then rsync with anchored excludes and ``--delete`` only when needed) on a
private copy of the project's ``trainer/`` tree into a fresh directory on the cluster, three times:
empty destination, nothing changed, one file changed. The changed tree is a new content hash and
goes into a code directory of its own; rsync copies the unchanged files from the first one on the
cluster (``--copy-dest``), so only the changed file travels. The times are what the DAG's sync task
reports as ``code_seconds``: the local content hash is not in them, because the run computes it
once before any sync (every job script carries it); it is printed on its own line (``hash_s``).
For comparison it also times the plain rsync no-change pass that the manifest check replaces.
One run each on an already open SSH connection; the machine is shared, so read the figures as
orders of magnitude. Last line: one JSON object.

    .venv/bin/python benchmarks/rsync_incremental.py
Needs the local cluster (make cluster-up).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "providers" / "slurm" / "src"), str(REPO / "plugins"), str(REPO / "trainer" / "src")]
CONN_ENV = Path(os.environ.get("VCLOUD_CLUSTER_DIR", "/var/lib/vcloud-localcluster")) / "airflow_conn.env"

from slurm_provider.hooks import SlurmHook  # noqa: E402
from vcloud_pipeline.plan.layout import run_paths  # noqa: E402
from vcloud_pipeline.profile import load_profile  # noqa: E402
from vcloud_pipeline.code.tree import CodeTree, code_sync_argv, tree_files  # noqa: E402
from vcloud_pipeline.code.upload import local_manifest, run_rsync, sync_code_tree  # noqa: E402


def load_connection_env() -> None:
    for line in CONN_ENV.read_text().splitlines():
        key, _, value = line.partition("=")
        os.environ.setdefault(key, shlex.split(value)[0])


def timed(fn) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def bytes_sent(tree: CodeTree, profile, dest: PurePosixPath, basis: str | None) -> int:
    """rsync's own count (``--stats``) of the bytes it sent to sync ``tree`` into the empty ``dest``."""
    with SlurmHook(profile.connection.conn_id).ssh_command() as ssh:
        argv = code_sync_argv(tree, ssh.destination, dest, ssh.argv, basis=basis)
        out = run_rsync([*argv[:-2], "--stats", *argv[-2:]], what="rsync --stats", ssh=ssh)
    line = next(line for line in out.splitlines() if line.startswith("Total bytes sent:"))
    return int(line.split(":")[1].strip().replace(",", ""))


def main() -> int:
    load_connection_env()
    with tempfile.TemporaryDirectory(prefix="vcloud-rsync-bench-") as tmp:
        base = f"/srv/vcloud/scratch/vcloud/benchmarks/rsync-{Path(tmp).name}"
        profile = load_profile("local", overrides={"paths.base": base})
        paths = run_paths(profile, "bench")
        hook = SlurmHook(profile.connection.conn_id)
        hook.make_dirs([paths.code_root])
        # a private copy of the tree, so the one-file change never touches the checkout
        subprocess.run(["rsync", "-a", "--exclude=__pycache__/", f"{REPO}/trainer", tmp], check=True)
        tree = CodeTree(Path(tmp))
        files = tree_files(tree)
        size = sum((Path(tmp) / f).stat().st_size for f in files)

        hash_s, manifest = timed(lambda: local_manifest(tree))
        full_s, sent_full = timed(lambda: sync_code_tree(paths, tree, manifest, hook))
        nochange_s, sent_nochange = timed(lambda: sync_code_tree(paths, tree, manifest, hook))
        with SlurmHook(profile.connection.conn_id).ssh_command() as ssh:
            argv = code_sync_argv(tree, ssh.destination, paths.code(manifest.hash).dir, ssh.argv)
            plain_nochange_s, _ = timed(lambda: run_rsync(argv, what="plain rsync re-sync", ssh=ssh))
        target = Path(tmp) / "trainer" / "src" / "vcloud" / "metrics.py"
        target.write_text(target.read_text() + "\n# benchmark edit\n")
        changed = local_manifest(tree)
        onefile_s, sent_onefile = timed(lambda: sync_code_tree(paths, tree, changed, hook))
        # what travels for the changed tree into a fresh directory, with and without the basis
        with_basis = bytes_sent(tree, profile, paths.code_root / "bench-copy-dest", basis=manifest.hash)
        without_basis = bytes_sent(tree, profile, paths.code_root / "bench-no-basis", basis=None)
        hook.runner.run(f"rm -rf -- {shlex.quote(base)}", timeout=120)

    assert (sent_full, sent_nochange, sent_onefile) == (True, False, True)
    print(f"code tree: {len(files)} files, {size / 1024:.0f} KiB (trainer/, anchored excludes)")
    print(f"local content hash           {hash_s:7.3f} s  (once per run, before any sync)")
    print(f"full sync                    {full_s:7.3f} s")
    print(f"no-change re-sync            {nochange_s:7.3f} s  ({nochange_s / full_s:.2f} of full; manifest check, no rsync)")
    print(f"plain rsync no-change pass   {plain_nochange_s:7.3f} s  ({plain_nochange_s / full_s:.2f} of full)")
    print(f"one file changed             {onefile_s:7.3f} s  (a new code directory, unchanged files copied on the cluster)")
    print(f"bytes sent, one file changed {with_basis:7d}    (--copy-dest from the previous code directory; "
          f"{without_basis} without it)")
    print(json.dumps({"full_s": round(full_s, 4), "nochange_s": round(nochange_s, 4), "onefile_s": round(onefile_s, 4),
                      "nochange_ratio": round(nochange_s / full_s, 4),
                      "plain_rsync_nochange_ratio": round(plain_nochange_s / full_s, 4),
                      "hash_s": round(hash_s, 4), "files": len(files), "bytes": size,
                      "onefile_bytes_sent": with_basis, "onefile_bytes_sent_without_basis": without_basis}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
