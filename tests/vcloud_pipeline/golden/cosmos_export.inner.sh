#!/bin/bash
# vcloud viewer export job of run full: inner script, runs inside the container (singularity) on every node of the job.
# Rendered by vcloud_pipeline.jobs.render from profile 'cosmos' and include/sbatch/inner.sh;
# change those, not this file.
set -euo pipefail

export PYTHONPATH=/cosmos/vast/scratch/cosmouser/vcloud/code/3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908/trainer/src"${PYTHONPATH:+:${PYTHONPATH}}"
export VCLOUD_CODE_HASH=3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908
export NCCL_SOCKET_IFNAME=hsn0
export RCCL_MSCCL_ENABLE=1
export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True
export WANDB_MODE=disabled
# MIOpen: a per-job database on node-local disk (a shared one locks up across nodes);
# kernels are searched and compiled on first use.
export MIOPEN_USER_DB_PATH=/tmp/miopen_cache_"${SLURM_JOB_ID}"
export MIOPEN_CUSTOM_CACHE_DIR="${MIOPEN_USER_DB_PATH}"
export MIOPEN_FIND_MODE=1
mkdir -p "${MIOPEN_USER_DB_PATH}"
cd /cosmos/vast/scratch/cosmouser/vcloud/code/3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908

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

python3 -m vcloud.export --config /cosmos/vast/scratch/cosmouser/vcloud/code/3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908/trainer/configs/model_tiny.yaml --data /scratch/cosmouser/job_"${SLURM_JOB_ID}"/data --out /scratch/cosmouser/job_"${SLURM_JOB_ID}"/outputs --dest /cosmos/vast/scratch/cosmouser/vcloud/viewer_data/full &
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
