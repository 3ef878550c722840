#!/usr/bin/env bash
# Capture real Slurm output for the parser golden tests.
#
# Runs on the local single-node cluster (Slurm 22.05, `make cluster-up`) as root and submits
# small jobs as the unprivileged cluster user `vcloud`. Every command line is produced by
# slurm_provider.cli, so the golden files are exactly what the hook will read.
# Writes <scenario>.txt (stdout), <scenario>.stderr.txt where stderr matters, and
# jobs.env (the job id of each scenario). Expected parse results (*.json) are written by
#   .venv/bin/python providers/slurm/tests/golden/make_expected.py
# and reviewed by hand before committing.
#
# Takes about 4 minutes (one job must reach its 1-minute time limit).
#
# Not captured by this script, because they stop the cluster's daemons (then `make cluster-up`):
#   answer_sacct_no_database.stderr.txt     slurmdbd stopped:  runuser -u vcloud -- sacct -X -n -P -j 1
#   answer_squeue_no_controller.stderr.txt  slurmctld stopped: runuser -u vcloud -- squeue -h -j 1
#   answer_sacct_bad_time.stderr.txt        runuser -u vcloud -- sacct -X -n -P --starttime=garbage
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
PY="$REPO/.venv/bin/python"
USER_NAME=vcloud
WORK=/home/vcloud/slurm_provider_golden   # on the cluster's shared file system
export PYTHONPATH="$REPO/providers/slurm/src"

build() {  # build 'c.build_squeue([1, 2])' -> the command line (c: every slurm_provider.cli module's names)
    "$PY" -c 'import sys, types
from slurm_provider.cli import job_files, sacct, sbatch, scancel, scontrol, sinfo, squeue, sshare
modules = (job_files, sacct, sbatch, scancel, scontrol, sinfo, squeue, sshare)
c = types.SimpleNamespace(**{k: v for m in modules for k, v in vars(m).items()})
print(eval(sys.argv[1], {"c": c}))' "$1"
}
as_user() {  # as_user CMD  (stdin passes through)
    runuser -u "$USER_NAME" -- sh -c "cd $WORK && $1"
}
state_of() {  # state_of JOBID -> sacct state of the newest run
    runuser -u "$USER_NAME" -- sacct -X -n -P -o State -j "$1" | tail -n 1
}
wait_for() {  # wait_for JOBID REGEX [TIMEOUT_S]
    local id=$1 want=$2 limit=${3:-180} waited=0
    until state_of "$id" | grep -Eq "$want"; do
        sleep 2; waited=$((waited + 2))
        if [ "$waited" -ge "$limit" ]; then echo "job $id never reached $want (now: $(state_of "$id"))" >&2; exit 1; fi
    done
}
submit() {  # submit NAME SCRIPT [python kwargs] -> job id; raw stdout to sbatch_<NAME>.txt
    local name=$1 script=$2 kwargs=${3:-}
    local cmd
    cmd=$(build "c.build_sbatch_submit(job_name='gc-$name', output='$WORK/logs/%x_%j.out', comment=c.JobComment(dag='golden', task='$name', run='manual__capture', attempt=1, stage='stage0'), chdir='$WORK'$kwargs)")
    case "$script" in '#!'*) ;; *) script="#!/bin/bash
$script" ;; esac
    printf '%s\n' "$script" | as_user "$cmd" > "$HERE/sbatch_$name.txt"
    cut -d';' -f1 < "$HERE/sbatch_$name.txt"
}
save() {  # save FILE CMD  -> stdout to FILE, stderr to FILE.stderr.txt (kept only if non-empty)
    local file=$1 cmd=$2
    set +e
    as_user "$cmd" > "$HERE/$file.txt" 2> "$HERE/$file.stderr.txt"
    echo $? > "$HERE/$file.rc"
    set -e
    [ -s "$HERE/$file.stderr.txt" ] || rm -f "$HERE/$file.stderr.txt"
    [ "$(cat "$HERE/$file.rc")" != 0 ] || rm -f "$HERE/$file.rc"
}

sinfo > /dev/null  # fails fast when the cluster is not up
runuser -u "$USER_NAME" -- mkdir -p "$WORK/logs"

# --- jobs that take a while, submitted first ------------------------------------------------
TIMEOUT_ID=$(submit timeout 'echo "started"; sleep 600' ", time_limit='1'")
REQUEUE_ID=$(submit requeue '#!/bin/bash
echo "run ${SLURM_RESTART_COUNT:-0} on $(hostname)"
if [ "${SLURM_RESTART_COUNT:-0}" -ge 2 ]; then echo "resumed and done"; exit 0; fi
sleep 600' ", extra_options=['--requeue'], time_limit='0:10:00'")
CANCEL_ID=$(submit cancelled 'echo "waiting to be cancelled"; sleep 600' ", time_limit='0:10:00'")
COMPLETED_ID=$(submit completed '#!/bin/bash
echo "epoch 1/2 loss=0.50"
echo "Stage 0 – température ✓ done"
echo "warning on stderr" >&2
sleep 3
echo "epoch 2/2 loss=0.25"' ", partition='small-g', time_limit='0:05:00', extra_options=['--gpus=1', '--mem=256M']")
FAILED_ID=$(submit failed '#!/bin/bash
echo "Traceback (most recent call last):"
echo "ModuleNotFoundError: No module named '"'"'vcloud.data'"'"'" >&2
exit 3' ", time_limit='0:05:00'")
OOM_ID=$(submit oom '#!/bin/bash
python3 -c "import time; b = b\"x\" * (600 * 1024 * 1024); time.sleep(20)"' ", time_limit='0:05:00', extra_options=['--mem=100M']")
ARRAY_ID=$(submit array '#!/bin/bash
srun --ntasks=1 echo "array task $SLURM_ARRAY_TASK_ID"
sleep 2' ", time_limit='0:05:00', extra_options=['--array=0-2']")
THROTTLED_ID=$(submit throttled 'sleep 40' ", time_limit='0:05:00', extra_options=['--array=0-3%1']")
# sbatch --parsable prints "<id>;<cluster>" when a cluster is named.
CLUSTER_ID=$(submit cluster 'echo hi' ", time_limit='0:05:00', extra_options=['--clusters=vcloud-local']")

# --- pending jobs with reasons that never resolve by themselves -----------------------------
wait_for "$FAILED_ID" '^FAILED'
wait_for "$COMPLETED_ID" '^COMPLETED'
# squeue still lists finished jobs for MinJobAge seconds (60 here), then forgets them.
save squeue_recent "$(build "c.build_squeue([$COMPLETED_ID, $FAILED_ID])")"
PARTLIMIT_ID=$(submit partlimit 'echo never' ", partition='dev-g', time_limit='4:00:00'")
BEGIN_ID=$(submit begin 'echo later' ", time_limit='0:05:00', extra_options=['--begin=now+1hour']")
DEPNEVER_ID=$(submit depnever 'echo never' ", time_limit='0:05:00', dependency='afterok:$FAILED_ID'")
HELD_ID=$(submit held 'echo held' ", time_limit='0:05:00', extra_options=['--hold']")

wait_for "$CANCEL_ID" '^RUNNING'
wait_for "$REQUEUE_ID" '^RUNNING'
sleep 8  # let the scheduler set reasons
save squeue_live "$(build "c.build_squeue([$CANCEL_ID, $REQUEUE_ID, $TIMEOUT_ID, $PARTLIMIT_ID, $BEGIN_ID, $DEPNEVER_ID, $HELD_ID, $THROTTLED_ID, $FAILED_ID, 999999])")"
save sacct_pending "$(build "c.build_sacct([$PARTLIMIT_ID, $BEGIN_ID, $DEPNEVER_ID, $HELD_ID, $THROTTLED_ID])")"
save scontrol_pending "$(build "c.build_scontrol_show_job($PARTLIMIT_ID)")"
save scontrol_running "$(build "c.build_scontrol_show_job($CANCEL_ID)")"
save scontrol_array "$(build "c.build_scontrol_show_job($THROTTLED_ID)")"
save squeue_by_name "$(build "c.build_squeue_by_name('gc-begin', user='vcloud')")"
# The account's allocation as Slurm holds it, while jobs run (TRESRunMins) and after GPU jobs ran.
save sshare_account "$(build "c.build_sshare_account('vcloud_local')")"
save sshare_unknown_account "$(build "c.build_sshare_account('nosuch_account')")"

# --- cancel by the user ----------------------------------------------------------------------
save scancel "$(build "c.build_scancel([$CANCEL_ID])")"
wait_for "$CANCEL_ID" '^CANCELLED'

# --- requeue twice, then let it finish ---------------------------------------------------------
runuser -u "$USER_NAME" -- scontrol requeue "$REQUEUE_ID"
sleep 3
save squeue_requeued "$(build "c.build_squeue([$REQUEUE_ID])")"
save scontrol_requeued "$(build "c.build_scontrol_show_job($REQUEUE_ID)")"
wait_for "$REQUEUE_ID" '^RUNNING' 240
runuser -u "$USER_NAME" -- scontrol requeue "$REQUEUE_ID"
sleep 3
wait_for "$REQUEUE_ID" '^COMPLETED' 240

# --- wait for the rest ---------------------------------------------------------------------------
wait_for "$COMPLETED_ID" '^COMPLETED'
wait_for "$OOM_ID" '^(OUT_OF_MEMORY|FAILED|CANCELLED)'
wait_for "$ARRAY_ID" '^COMPLETED'
wait_for "$CLUSTER_ID" '^COMPLETED'
wait_for "$TIMEOUT_ID" '^TIMEOUT' 240

save squeue_finished "$(build "c.build_squeue([$COMPLETED_ID, $FAILED_ID, $CANCEL_ID])")"
save sacct_finished "$(build "c.build_sacct([$COMPLETED_ID, $FAILED_ID, $TIMEOUT_ID, $CANCEL_ID, $OOM_ID, $CLUSTER_ID])")"
save sacct_requeue "$(build "c.build_sacct([$REQUEUE_ID])")"
save sacct_requeue_nodup "$(build "c.build_sacct([$REQUEUE_ID], duplicates=False)")"
save sacct_steps "$(build "c.build_sacct([$OOM_ID, $CANCEL_ID, $FAILED_ID], allocations_only=False)")"
save sacct_array_steps "$(build "c.build_sacct([$ARRAY_ID], allocations_only=False)")"
save sacct_by_name "$(build "c.build_sacct_by_name('gc-completed', since='now-1days', user='vcloud')")"
save sacct_unknown "$(build "c.build_sacct([999999])")"
save squeue_unknown "$(build "c.build_squeue([999999])")"
save scontrol_unknown "$(build "c.build_scontrol_show_job(999999)")"
save scontrol_finished "$(build "c.build_scontrol_show_job($FAILED_ID)")"
save scancel_finished "$(build "c.build_scancel([$COMPLETED_ID])")"
# Reservations as a site announces them: a maintenance window and a team's reservation.
scontrol create reservation ReservationName=maint-test StartTime=now+2days Duration=04:00:00 Nodes=nid001001 \
    Flags=MAINT,IGNORE_JOBS Users=root > /dev/null
scontrol create reservation ReservationName=team-demo StartTime=now+3days Duration=01:00:00 Nodes=l50001 \
    Users="$USER_NAME" Accounts=vcloud_local > /dev/null
save scontrol_show_reservation "$(build "c.build_scontrol_show_reservations()")"
scontrol delete ReservationName=maint-test
scontrol delete ReservationName=team-demo
save scontrol_no_reservation "$(build "c.build_scontrol_show_reservations()")"

# --- sbatch --test-only and refused submissions ------------------------------------------------
printf '#!/bin/bash\necho test\n' | as_user "$(build "c.build_sbatch_test_only(job_name='gc-test', output='$WORK/logs/%x_%j.out', partition='small-g', time_limit='0:10:00', extra_options=['--gpus=1'])")" \
    > /dev/null 2> "$HERE/sbatch_test_only.stderr.txt"
set +e
printf '#!/bin/bash\necho test\n' | as_user "$(build "c.build_sbatch_test_only(job_name='gc-test', output='$WORK/logs/%x_%j.out', partition='nosuch-g')")" \
    > /dev/null 2> "$HERE/sbatch_test_only_bad_partition.stderr.txt"
printf '#!/bin/bash\necho test\n' | as_user "$(build "c.build_sbatch_submit(job_name='gc-badaccount', output='$WORK/logs/%x_%j.out', account='nosuch_account')")" \
    > /dev/null 2> "$HERE/sbatch_bad_account.stderr.txt"
set -e

# --- log and progress files -----------------------------------------------------------------------
LOG="$WORK/logs/gc-completed_$COMPLETED_ID.out"
save read_log_start "$(build "c.build_read_log('$LOG', 0)")"
save read_log_middle "$(build "c.build_read_log('$LOG', 20, max_bytes=30)")"
save read_log_end "$(build "c.build_read_log('$LOG', $(stat -c %s "$LOG"))")"
save read_log_truncated "$(build "c.build_read_log('$LOG', 10_000_000)")"
save read_log_missing "$(build "c.build_read_log('$WORK/logs/no such file.out', 0)")"
runuser -u "$USER_NAME" -- sh -c "printf '{\"epoch\": 3, \"step\": 120, \"psnr\": 31.5}\n' > '$WORK/progress it'\''s.json'"
save read_progress "$(build "c.build_read_progress(\"$WORK/progress it's.json\")")"
save read_progress_missing "$(build "c.build_read_progress('$WORK/nothing here.json')")"

save sinfo_unavailable "$(build "c.build_sinfo_unavailable_nodes()")"

# Job logs, for the hint tests.
for pair in "oom:$OOM_ID" "timeout:$TIMEOUT_ID" "failed:$FAILED_ID" "cancelled:$CANCEL_ID" "requeue:$REQUEUE_ID"; do
    cp "$WORK/logs/gc-${pair%%:*}_${pair#*:}.out" "$HERE/log_${pair%%:*}.txt"
done

cat > "$HERE/jobs.env" <<EOF
COMPLETED_ID=$COMPLETED_ID
FAILED_ID=$FAILED_ID
TIMEOUT_ID=$TIMEOUT_ID
CANCEL_ID=$CANCEL_ID
REQUEUE_ID=$REQUEUE_ID
OOM_ID=$OOM_ID
ARRAY_ID=$ARRAY_ID
THROTTLED_ID=$THROTTLED_ID
CLUSTER_ID=$CLUSTER_ID
PARTLIMIT_ID=$PARTLIMIT_ID
BEGIN_ID=$BEGIN_ID
DEPNEVER_ID=$DEPNEVER_ID
HELD_ID=$HELD_ID
WORK=$WORK
EOF

# Leave nothing queued behind.
runuser -u "$USER_NAME" -- scancel "$PARTLIMIT_ID" "$BEGIN_ID" "$DEPNEVER_ID" "$HELD_ID" "$THROTTLED_ID" || true
echo "captured into $HERE"
