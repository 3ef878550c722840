#!/bin/bash
# vcloud preflight import check of run full: inner script, runs inside the container (charliecloud) on every node of the job.
# Rendered by vcloud_pipeline.jobs.render from profile 'local' and include/sbatch/inner.sh;
# change those, not this file.
set -euo pipefail

# ch-run sets CH_RUNNING in the container; a bare run would use the host's software instead.
if [ -z "${CH_RUNNING:-}" ]; then
    echo "vcloud inner script: not inside a Charliecloud container (CH_RUNNING is unset); the outer script starts it with ch-run" >&2
    exit 1
fi
image_hash="$(cat /etc/vcloud-image.sha256 2>/dev/null || echo unknown)"
echo "vcloud inner script: in Charliecloud image ${image_hash} on $(hostname)" >&2
export PYTHONPATH=/srv/vcloud/scratch/vcloud/code/3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908/trainer/src"${PYTHONPATH:+:${PYTHONPATH}}"
export VCLOUD_CODE_HASH=3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908
export WANDB_MODE=disabled
export OMP_NUM_THREADS=1
cd /srv/vcloud/scratch/vcloud/code/3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908

child_pid=""
stop_signal=""
# shellcheck disable=SC2317  # invoked from the traps below
on_signal() {
    stop_signal="$1"
    if [ -n "$child_pid" ]; then
        kill -s "$1" "$child_pid" 2>/dev/null || true
    fi
}
trap 'on_signal USR2' USR2
trap 'on_signal TERM' TERM

/opt/vcloud-localcluster/venv/bin/python -c 'import importlib
import os
import sys

# Filled in by vcloud_pipeline.jobs.render: the names and the exit code the trainer shares.
GPUS_REQUIRED_ENV = "VCLOUD_GPUS_REQUIRED"
GPU_HINT_ENV = "VCLOUD_GPU_HINT"
EXIT_GPUS_MISSING = int("87")

failed = []
for name in ("vcloud", "vcloud.data", "tifffile", "rasterio", "torch"):
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        failed.append(name)
        print("preflight: import", name, "FAILED:", type(exc).__name__, exc, flush=True)
        continue
    version = getattr(module, "__version__", "n/a")
    where = getattr(module, "__file__", "?")
    print("preflight:", name, version, "from", where, flush=True)
gpus_missing = False
if "torch" not in failed:
    import torch
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print("preflight: torch accelerator available=%s devices=%d hip=%s cuda=%s" % (
        torch.cuda.is_available(), visible, torch.version.hip, torch.version.cuda), flush=True)
    # Set by the job script when the profile requires GPUs: how many Slurm gave this node.
    required = int(os.environ.get(GPUS_REQUIRED_ENV, "").strip() or 0)
    if visible < required:
        gpus_missing = True
        build = ("a ROCm build (HIP %s)" % torch.version.hip if torch.version.hip
                 else "a CUDA %s build" % torch.version.cuda if torch.version.cuda else "a CPU-only build")
        print("preflight: FAILED: GPUs required: this node of the job was given %d %s, but PyTorch sees %d "
              "(torch %s, %s); the training jobs would run on the CPU" % (
                  required, "GPU" if required == 1 else "GPUs", visible, torch.__version__, build), flush=True)
        hint = os.environ.get(GPU_HINT_ENV, "").strip()
        if hint:
            print("preflight: what to do:", hint, flush=True)
print("preflight: python", sys.version.split()[0], "at", sys.executable, flush=True)
if failed:
    print("preflight: FAILED imports:", ", ".join(failed) + ";",
          "check PYTHONPATH, the synced code and the extra packages directory", flush=True)
if gpus_missing:
    sys.exit(EXIT_GPUS_MISSING)
if failed:
    sys.exit(1)
print("preflight: OK", flush=True)
' &
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
if [ -n "$stop_signal" ]; then
    echo "vcloud inner script: stopped after SIG${stop_signal}, exit code ${rc}" >&2
fi
exit "$rc"
