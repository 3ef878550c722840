"""Code sync cost on the local cluster: full sync, no-change re-sync, one changed file.

Syncs the project's code tree (``trainer/``, anchored excludes, ``--delete``) with the exact argv
the training DAG uses, into a fresh directory on the cluster, three times: empty destination,
nothing changed, one file changed. One run each; the machine is shared, so read the figures as
orders of magnitude. Last line: one JSON object.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO / "trainer" / "src")]

from vcloud_pipeline.profiles import load_profile  # noqa: E402
from vcloud_pipeline.rsync import CodeTree, code_sync_argv, refuse_unanchored_excludes, ssh_destination, tree_files  # noqa: E402
from vcloud_pipeline.sync import run_rsync, ssh_command_for  # noqa: E402


def timed(argv: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    out = run_rsync(argv, what="benchmark sync")
    return time.perf_counter() - started, out


def main() -> int:
    profile = load_profile("local")
    ssh, dest = ssh_command_for(profile), ssh_destination(profile.connection)
    remote = f"{profile.paths.base}/benchmarks/rsync-{uuid.uuid4().hex[:8]}"
    subprocess.run([*ssh, profile.connection.ssh_alias, f"mkdir -p {shlex.quote(remote)}"], check=True, timeout=60)
    with tempfile.TemporaryDirectory(prefix="vcloud-rsync-bench-") as tmp:
        # a private copy of the tree, so the one-file change never touches the checkout
        subprocess.run(["rsync", "-a", "--exclude=__pycache__/", f"{REPO}/trainer", tmp], check=True)
        tree = CodeTree(Path(tmp))
        refuse_unanchored_excludes(tree)
        files = tree_files(tree)
        size = sum((Path(tmp) / f).stat().st_size for f in files)
        argv = code_sync_argv(tree, dest, remote, ssh) + ["--stats"]

        full_s, _ = timed(argv)
        nochange_s, _ = timed(argv)
        target = Path(tmp) / "trainer" / "src" / "vcloud" / "metrics.py"
        target.write_text(target.read_text() + "\n# benchmark edit\n")
        onefile_s, stats = timed(argv)
    transferred = next((line for line in stats.splitlines() if "regular files transferred" in line), "?")
    subprocess.run([*ssh, profile.connection.ssh_alias, f"rm -rf -- {shlex.quote(remote)}"], check=False, timeout=120)

    print(f"code tree: {len(files)} files, {size / 1024:.0f} KiB (trainer/, anchored excludes)")
    print(f"full sync          {full_s:7.3f} s")
    print(f"no-change re-sync  {nochange_s:7.3f} s  ({nochange_s / full_s:.2f} of full)")
    print(f"one file changed   {onefile_s:7.3f} s  ({transferred.strip()})")
    print(json.dumps({"full_s": round(full_s, 4), "nochange_s": round(nochange_s, 4), "onefile_s": round(onefile_s, 4),
                      "nochange_ratio": round(nochange_s / full_s, 4), "files": len(files), "bytes": size}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
