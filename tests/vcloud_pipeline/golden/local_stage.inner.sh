#!/bin/bash
# vcloud stage 0 training job of run full: inner script, runs inside the container (charliecloud) on every node of the job.
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

/opt/vcloud-localcluster/venv/bin/python -m vcloud.train --stage 0 --config /srv/vcloud/scratch/vcloud/code/3d335c1582bcd7e111e3579ac32fa11859e62f29c070eed41b57422981997908/trainer/configs/model_tiny.yaml --data /srv/vcloud/scratch/vcloud/data/prepared --out /srv/vcloud/scratch/vcloud/outputs/full --max-epochs 2 --set train.on_code_change=keep_weights &
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
