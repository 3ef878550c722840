#!/bin/bash
# vcloud stage 1 training job of run full: inner script, runs inside the container (singularity) on every node of the job.
# Rendered by vcloud_pipeline.jobs.render from profile 'lumi' and include/sbatch/inner.sh;
# change those, not this file.
set -euo pipefail

# The code directory must hold exactly the code this job was synced and rendered for: its files hash
# to that hash (vcloud/code_digest.py, carried here, run by an interpreter that imports nothing from the
# tree it checks), else the job stops before anything of the tree runs.
python3 -I - /scratch/project_465002500/vcloud/code/3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908 3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908 86 <<'CODE_DIGEST_SCRIPT' || exit $?
"""The content hash of a code tree: one definition for the sync, which names a code directory on the
cluster by it, and for the job, which checks before the trainer starts that the directory still
holds exactly that code.

A sha256 over the sorted relative paths and contents of the files: a symlink contributes its target,
not the file behind it (``rsync -a`` copies links as links); modes and timestamps are left out, so a
fresh checkout of the same commit hashes the same. The sync chooses which files of a checkout go
(``vcloud_pipeline.code.tree``: its exclude rules); on the cluster, the tree is every file of the
code directory but the manifest the sync writes last and the bytecode directories that Python wrote
into trees synced before jobs kept bytecode out of them.

Standard library only, and runnable with no package around it: the job's inner script carries this
file's text and runs it with ``python -I -`` (an interpreter that imports nothing from the tree it
checks, nor from ``PYTHONPATH``)::

    python -I - <code dir> <expected hash> <exit code on a mismatch> < code_digest.py
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

MANIFEST_NAME = ".vcloud_manifest.json"
"""Written last into a synced code directory; the hash it carries is the hash of the rest."""

BYTECODE_DIR = "__pycache__"


def digest_files(root: Path, files: Iterable[PurePosixPath]) -> str:
    """sha256 hex over ``files`` (relative to ``root``, in the order given: sorted by the callers)."""
    digest = hashlib.sha256()
    for rel in files:
        local = Path(root) / rel
        if local.is_symlink():
            kind, data = b"L", os.readlink(local).encode()
        else:
            kind, data = b"F", local.read_bytes()
        digest.update(kind + b" " + rel.as_posix().encode() + b"\0" + str(len(data)).encode() + b"\0")
        digest.update(data)
    return digest.hexdigest()


def synced_files(root: Path) -> list[PurePosixPath]:
    """Relative paths of the files and symlinks of a synced code directory, sorted: all but the
    manifest at its top and anything in a ``__pycache__`` directory. Symlinked directories are not
    followed."""
    files: list[PurePosixPath] = []
    stack = [PurePosixPath()]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(Path(root) / rel_dir) as scan:
            for entry in scan:
                rel = rel_dir / entry.name
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != BYTECODE_DIR:
                        stack.append(rel)
                elif not (rel_dir == PurePosixPath() and entry.name == MANIFEST_NAME):
                    files.append(rel)
    return sorted(files, key=lambda p: p.as_posix())


def synced_tree_hash(root: Path) -> str:
    """The hash of the code a synced code directory holds now."""
    return digest_files(root, synced_files(root))


def mismatch(root: Path, expected: str, found: str | None) -> str | None:
    """What is wrong with code directory ``root`` for a job rendered for ``expected``, whose files hash
    to ``found`` (None: they could not be read); None when it holds exactly that code."""
    if found is None:
        return (f"refusing to start: the code directory {root} cannot be read; sync the code again "
                "(rerun the DAG run's sync_code task), then submit the job again")
    if found != expected:
        return (f"refusing to start: the code in {root} hashes to {found}, not {expected} that this job was "
                "synced and rendered for; files of its code directory were changed, added or removed on the "
                "cluster. Sync the code again (rerun the DAG run's sync_code task), then submit the job again")
    return None


def main(argv: list[str]) -> int:
    """``<code dir> <expected hash> <exit code on a mismatch>``: say what was found, on stderr."""
    root, expected, exit_mismatch = Path(argv[0]), argv[1], int(argv[2])
    started = time.monotonic()
    try:
        files = synced_files(root)
        found: str | None = digest_files(root, files)
    except OSError as exc:
        print(f"vcloud code check: {exc}", file=sys.stderr)
        files, found = [], None
    problem = mismatch(root, expected, found)
    if problem is not None:
        print(f"vcloud code check: {problem}", file=sys.stderr)
        return exit_mismatch
    print(f"vcloud code check: {root} holds code {expected} ({len(files)} files, hashed in "
          f"{(time.monotonic() - started) * 1000:.0f} ms)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
CODE_DIGEST_SCRIPT
# Bytecode goes to this user's own directory on the node, never into the code tree: the tree is
# read-only once synced, and bytecode there would be code its hash does not cover. The directory
# outlives the start, so the image's packages compile once per node rather than at every start
# (importing PyTorch from source costs seconds of CPU). A name taken by anything but our own private
# directory (another user's, a link) is not used: the start then writes to a fresh one, removed at its end.
pycache_dir="${TMPDIR:-/tmp}/vcloud-pycache-$(id -u)"
own_pycache=""
mkdir -m 700 -- "$pycache_dir" 2>/dev/null || true
if [ -d "$pycache_dir" ] && [ ! -L "$pycache_dir" ] && [ -O "$pycache_dir" ] && [ "$(stat -c %a -- "$pycache_dir")" = 700 ]; then
    PYTHONPYCACHEPREFIX="$pycache_dir"
else
    echo "vcloud inner script: ${pycache_dir} is not this user's private directory; bytecode goes to one of this start's own" >&2
    PYTHONPYCACHEPREFIX="$(mktemp -d "${TMPDIR:-/tmp}/vcloud-pycache.XXXXXX")"
    own_pycache="$PYTHONPYCACHEPREFIX"
fi
export PYTHONPYCACHEPREFIX
export PYTHONPATH=/scratch/project_465002500/vcloud/code/3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908/trainer/src:/projappl/project_465002500/pylibs/9caf97b2e4388733"${PYTHONPATH:+:${PYTHONPATH}}"
echo 'vcloud inner script: packages outside the container from requirement set 9caf97b2e4388733 in /projappl/project_465002500/pylibs/9caf97b2e4388733, provisioned for image /appl/local/csc/soft/ai/images/pytorch_2.5.1_lumi_rocm6.2.4_flash-attn-3.0.0.post1.sif (size 21474836480 mtime 1767225600)' >&2
export VCLOUD_CODE_HASH=3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908
export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True
export WANDB_MODE=disabled
# MIOpen: a per-job database on node-local disk (a shared one locks up across nodes);
# kernels are searched and compiled on first use.
export MIOPEN_USER_DB_PATH=/tmp/miopen_cache_"${SLURM_JOB_ID}"
export MIOPEN_CUSTOM_CACHE_DIR="${MIOPEN_USER_DB_PATH}"
export MIOPEN_FIND_MODE=1
mkdir -p "${MIOPEN_USER_DB_PATH}"
# GPUs are required (accelerator rocm): PyTorch must see as many as Slurm gave
# this node, or the job stops instead of training on the CPU.
export VCLOUD_GPUS_REQUIRED="${SLURM_GPUS_ON_NODE:-8}"
export VCLOUD_GPU_HINT='PyTorch in the CSC container sees the GCDs only with the host GPU libraries injected and libfabric bound: export SINGULARITY_CONTAINLIBS=/usr/lib64/libcxi.so.1,/opt/rocm/lib/librocm_smi64.so.7 (container.containlibs) and run singularity exec -B /opt/cray/libfabric (or /opt/cray in container.bind_env); never add --rocm (the host libdrm needs GLIBC 2.33, the container has 2.31). Check in a dev-g job: python3 -c "import torch; print(torch.cuda.device_count())" in the container prints the number of GCDs the job asked for.'
# Ranks that exit with a code of the contract (85, 87, 88) record it here, on storage
# every node of the job sees; vcloud.launch, torchrun that ends with its ranks' exit code instead of
# its own exit 1, reads the records after a failed launch.
export VCLOUD_EXIT_RECORD_DIR=/scratch/project_465002500/vcloud/logs/full/.vcloud-full-stage1."${SLURM_JOB_ID}".exits
cd /scratch/project_465002500/vcloud/code/3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908

child_pid=""
stop_signal=""
# shellcheck disable=SC2317  # invoked from the traps below
on_signal() {
    stop_signal="$1"
    if [ -n "$child_pid" ]; then
        # torchrun dies on USR2 and gives its workers only 30 s after TERM: signal the
        # workers (its children) directly so that they finish the step and checkpoint.
        pkill --signal "$1" --parent "$child_pid" || kill -s TERM "$child_pid" 2>/dev/null || true
    fi
}
trap 'on_signal USR2' USR2
trap 'on_signal TERM' TERM

python3 -m vcloud.launch \
    --nnodes=2 \
    --node_rank="${SLURM_NODEID}" \
    --nproc_per_node=8 \
    --master_addr="${MASTER_ADDR}" \
    --master_port="${MASTER_PORT}" \
    -m vcloud.train --stage 1 --config /scratch/project_465002500/vcloud/code/3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908/trainer/configs/model_full.yaml --data /scratch/project_465002500/vcloud/data/sen12mscrts_real/prepared --out /scratch/project_465002500/vcloud/outputs/full &
child_pid=$!
# Wait for "$child_pid" and set rc to its exit status. wait returns early (status > 128) when a
# trapped signal arrives, so wait again while the child lives; the wait that saw it end has its
# status. Asking once more covers a child that ended while a trap ran; bash 5.2 sometimes answers
# that question with -1 (a trap reaped the child), and then the status seen in the loop stands.
rc=255
while kill -0 "$child_pid" 2>/dev/null; do
    rc=0
    wait "$child_pid" || rc=$?
done
recorded=0
wait "$child_pid" || recorded=$?
if [ "$recorded" -ge 0 ] && [ "$recorded" -le 255 ]; then
    rc=$recorded
fi
# A stop signal that reached the workers before the trainer could handle it leaves no exit record:
# the launch then ends with torchrun's own failure (1) or dies of the signal. It is the
# stop all the same.
if [ -n "$stop_signal" ] && { [ "$rc" -eq 1 ] || [ "$rc" -gt 128 ]; }; then rc=85; fi
if [ -n "$stop_signal" ]; then
    echo "vcloud inner script: stopped after SIG${stop_signal}, exit code ${rc}" >&2
fi
if [ -n "$own_pycache" ]; then rm -rf -- "$own_pycache"; fi
exit "$rc"
