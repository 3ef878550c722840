#!/bin/bash
# vcloud {{ title }}: inner script, runs {{ where }} on every node of the job.
# Rendered by vcloud_pipeline.jobs.render from profile '{{ profile.name }}' and include/sbatch/inner.sh;
# change those, not this file.
set -euo pipefail

{% if container and container.runtime == "charliecloud" %}
# ch-run sets CH_RUNNING in the container; a bare run would use the host's software instead.
if [ -z "${CH_RUNNING:-}" ]; then
    echo "vcloud inner script: not inside a Charliecloud container (CH_RUNNING is unset); the outer script starts it with ch-run" >&2
    exit 1
fi
image_hash="$(cat {{ IMAGE_HASH_FILE }} 2>/dev/null || echo unknown)"
echo "vcloud inner script: in Charliecloud image ${image_hash} on $(hostname)" >&2
{% endif %}
# The code directory must hold exactly the code this job was synced and rendered for: its files hash
# to that hash (vcloud/code_digest.py, carried here, run by an interpreter that imports nothing from the
# tree it checks), else the job stops before anything of the tree runs.
{{ python | shq }} -I - {{ code.dir | shq }} {{ code.hash | shq }} {{ EXIT_CODE_MISMATCH }} <<'CODE_DIGEST_SCRIPT' || exit $?
{{ code_digest }}
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
export PYTHONPATH={{ pythonpath | join(":") | shq }}"${PYTHONPATH:+:${PYTHONPATH}}"
{% if pylibs_note %}
echo {{ ("vcloud inner script: packages outside the container from " ~ pylibs_note) | shq }} >&2
{% endif %}
export {{ CODE_HASH_ENV }}={{ code.hash | shq }}
{% for name, value in profile.software.env.items() %}
export {{ name }}={{ value | shq }}
{% endfor %}
{% if profile.software.miopen_cache_dir %}
# MIOpen: a per-job database on node-local disk (a shared one locks up across nodes);
# kernels are searched and compiled on first use.
export MIOPEN_USER_DB_PATH={{ profile.software.miopen_cache_dir | shq }}
export MIOPEN_CUSTOM_CACHE_DIR="${MIOPEN_USER_DB_PATH}"
export MIOPEN_FIND_MODE=1
mkdir -p "${MIOPEN_USER_DB_PATH}"
{% endif %}
{% if gpus_required %}
# GPUs are required (accelerator {{ profile.accelerator.kind }}): PyTorch must see as many as Slurm gave
# this node, or the job stops instead of training on the CPU.
export {{ GPUS_REQUIRED_ENV }}="${SLURM_GPUS_ON_NODE:-{{ res.gpus_per_node }}}"
{% if profile.accelerator.missing_gpu_hint %}
export {{ GPU_HINT_ENV }}={{ profile.accelerator.missing_gpu_hint | shq(job_id=False) }}
{% endif %}
{% endif %}
{% if torchrun %}
# Ranks that exit with a code of the contract ({{ RECORDED_EXITS | join(', ') }}) record it here, on storage
# every node of the job sees; vcloud.launch, torchrun that ends with its ranks' exit code instead of
# its own exit {{ EXIT_ERROR }}, reads the records after a failed launch.
export {{ RANK_EXITS_DIR_ENV }}={{ exit_records | shq }}
{% endif %}
{% if outputs_mirror %}
# Outputs live on node-local disk: the trainer copies every checkpoint back to shared storage as it
# saves it, so a node failure loses at most the checkpoint interval.
export {{ OUTPUTS_MIRROR_ENV }}={{ paths.outputs_dir | shq }}
{% endif %}
cd {{ code.dir | shq }}

child_pid=""
stop_signal=""
# shellcheck disable=SC2317  # invoked from the traps below
on_signal() {
    stop_signal="$1"
    if [ -n "$child_pid" ]; then
{% if torchrun %}
        # torchrun dies on USR2 and gives its workers only 30 s after TERM: signal the
        # workers (its children) directly so that they finish the step and checkpoint.
        pkill --signal "$1" --parent "$child_pid" || kill -s TERM "$child_pid" 2>/dev/null || true
{% else %}
        kill -s "$1" "$child_pid" 2>/dev/null || true
{% endif %}
    fi
}
trap 'on_signal USR2' USR2
trap 'on_signal TERM' TERM

{% if torchrun %}
{{ python | shq }} -m vcloud.launch \
    --nnodes={{ res.nodes }} \
    --node_rank="${SLURM_NODEID}" \
    --nproc_per_node={{ res.gpus_per_node }} \
    --master_addr="${MASTER_ADDR}" \
    --master_port="${MASTER_PORT}" \
    {{ python_args | shjoin }} &
{% elif data_job %}
{{ python | shq }} {{ data_job.generate | shjoin }} && {{ python | shq }} {{ data_job.prepare | shjoin }} &
{% else %}
{{ python | shq }} {{ python_args | shjoin }} &
{% endif %}
child_pid=$!
{{ wait_for_child }}
{% if torchrun %}
# A stop signal that reached the workers before the trainer could handle it leaves no exit record:
# the launch then ends with torchrun's own failure ({{ EXIT_ERROR }}) or dies of the signal. It is the
# stop all the same.
if [ -n "$stop_signal" ] && { [ "$rc" -eq {{ EXIT_ERROR }} ] || [ "$rc" -gt 128 ]; }; then rc={{ EXIT_REQUEUE }}; fi
{% endif %}
if [ -n "$stop_signal" ]; then
    echo "vcloud inner script: stopped after SIG${stop_signal}, exit code ${rc}" >&2
fi
if [ -n "$own_pycache" ]; then rm -rf -- "$own_pycache"; fi
exit "$rc"
