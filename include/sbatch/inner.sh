#!/bin/bash
# vcloud @@TITLE@@: inner script, runs @@WHERE@@ on every node of the job.
# Rendered by vcloud_pipeline.render from profile '@@PROFILE@@' and include/sbatch/inner.sh;
# change those, not this file.
set -euo pipefail

@@CONTAINER_CHECK@@
@@ENV@@
cd @@CODE_DIR@@

child_pid=""
stop_signal=""
# shellcheck disable=SC2317  # invoked from the traps below
on_signal() {
    stop_signal="$1"
    if [ -n "$child_pid" ]; then
@@FORWARD@@
    fi
}
trap 'on_signal USR2' USR2
trap 'on_signal TERM' TERM

@@COMMAND@@ &
child_pid=$!
@@WAIT_FOR_CHILD@@
@@AFTER@@
if [ -n "$stop_signal" ]; then
    echo "vcloud inner script: stopped after SIG${stop_signal}, exit code ${rc}" >&2
fi
exit "$rc"
