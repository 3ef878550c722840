#!/bin/bash
# vcloud stage 0 training job of run full: inner script, runs in the job environment on every node of the job.
# Rendered by vcloud_pipeline.jobs.render from profile 'levante' and include/sbatch/inner.sh;
# change those, not this file.
set -euo pipefail

export PYTHONPATH=/work/bb1234/b381234/vcloud/code/3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908/trainer/src"${PYTHONPATH:+:${PYTHONPATH}}"
export VCLOUD_CODE_HASH=3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908
export WANDB_MODE=disabled
# GPUs are required (accelerator cuda): PyTorch must see as many as Slurm gave
# this node, or the job stops instead of training on the CPU.
export VCLOUD_GPUS_REQUIRED="${SLURM_GPUS_ON_NODE:-4}"
export VCLOUD_GPU_HINT='Run on the gpu partition with A100s requested (--partition=gpu --gres=gpu:a100_80:N; scontrol show job ID lists Partition=gpu and the Gres), and point software.python at a venv with a CUDA build of PyTorch: python -c "import torch; print(torch.version.cuda, torch.cuda.device_count())" on a gpu node prints a CUDA version and the GPU count, not None and 0.'
# Ranks that exit with a code of the contract (85, 87, 88) record it here, on storage
# every node of the job sees; vcloud.launch, torchrun that ends with its ranks' exit code instead of
# its own exit 1, reads the records after a failed launch.
export VCLOUD_EXIT_RECORD_DIR=/work/bb1234/b381234/vcloud/logs/full/.vcloud-full-stage0."${SLURM_JOB_ID}".exits
cd /work/bb1234/b381234/vcloud/code/3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908

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

/work/bb1234/b381234/vcloud/venv/bin/python -m vcloud.launch \
    --nnodes=1 \
    --node_rank="${SLURM_NODEID}" \
    --nproc_per_node=4 \
    --master_addr="${MASTER_ADDR}" \
    --master_port="${MASTER_PORT}" \
    -m vcloud.train --stage 0 --config /work/bb1234/b381234/vcloud/code/3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908/trainer/configs/model_tiny.yaml --data /work/bb1234/b381234/vcloud/data/prepared --out /work/bb1234/b381234/vcloud/outputs/full --max-epochs 5 --set train.on_code_change=refuse &
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
exit "$rc"
