#!/usr/bin/env bash
# `make demo`: the training DAG end to end on the local Slurm cluster (profile local, config tiny).
# `make demo PROFILE=lumi` (or levante, cosmos): the same with that site's own job scripts, only its
# site facts mapped to the local cluster (include/local_cluster/site_facts.yaml, VCLOUD_SITE_FACTS).
#
# Runs `airflow dags test vcloud_training` in a project-local Airflow home (.airflow/demo, gitignored):
# code sync over the cluster's SSH login, the synthetic dataset job (first time only), preflight
# (sbatch --test-only, budget, import check job), stages 0-2 and the viewer export as real Slurm jobs
# (stage 3 is not submitted: the tiny config names no unlabeled domain for it to adapt to).
# Ends with the run's output listing, what each stage's GPU-hours bought on validation and the
# GPU-hour ledger, read back from the cluster.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${REPO}/.venv/bin/python"
CLUSTER_DIR="${VCLOUD_CLUSTER_DIR:-/var/lib/vcloud-localcluster}"
CONN_ENV="${CLUSTER_DIR}/airflow_conn.env"
PROFILE="${PROFILE:-local}"
RUN_NAME="${DEMO_RUN_NAME:-demo-${PROFILE}-$(date -u +%Y%m%d-%H%M%S)}"

if [ ! -x "$PY" ]; then
    echo "demo: ${PY} is missing; run 'make venv' first" >&2
    exit 1
fi
if [ ! -r "$CONN_ENV" ]; then
    echo "demo: ${CONN_ENV} is missing; start the local cluster with 'make cluster-up'" >&2
    exit 1
fi
if ! sinfo -h >/dev/null 2>&1; then
    echo "demo: sinfo does not answer; start the local cluster with 'make cluster-up'" >&2
    exit 1
fi

if [ "$PROFILE" != local ]; then
    export VCLOUD_SITE_FACTS="${REPO}/include/local_cluster/site_facts.yaml"
    if ! grep -q "^${PROFILE}:" "$VCLOUD_SITE_FACTS"; then
        echo "demo: profile ${PROFILE} has no site facts in ${VCLOUD_SITE_FACTS} (known: local and" \
            "$(sed -n 's/^\([a-z0-9_-]*\):$/\1/p' "$VCLOUD_SITE_FACTS" | paste -sd, -))" >&2
        exit 1
    fi
    echo "demo: profile ${PROFILE} with its site facts mapped to the local cluster (${VCLOUD_SITE_FACTS})"
fi

export AIRFLOW_HOME="${REPO}/.airflow/demo"
mkdir -p "$AIRFLOW_HOME"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
# The Rendered Template view shows the whole job script (about 8 KB; Airflow cuts at 4096 by default).
export AIRFLOW__CORE__MAX_TEMPLATED_FIELD_LENGTH=65536
export AIRFLOW__CORE__DAGS_FOLDER="${REPO}/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="${REPO}/plugins"
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:///${AIRFLOW_HOME}/airflow.db"
export AIRFLOW__LOGGING__BASE_LOG_FOLDER="${AIRFLOW_HOME}/logs"
# One line per event that matters: not every SSH channel the status polls open.
export AIRFLOW__LOGGING__NAMESPACE_LEVELS="asyncssh=WARNING paramiko=WARNING"
export PYTHONPATH="${REPO}/providers/slurm/src:${REPO}/plugins:${REPO}/trainer/src:${REPO}${PYTHONPATH:+:${PYTHONPATH}}"
# The cluster's SSH login as Airflow connections (AIRFLOW_CONN_VCLOUD_LOCAL_CLUSTER, ...).
set -a
# shellcheck source=/dev/null
. "$CONN_ENV"
set +a
# Poll the local cluster every few seconds (deployments keep the first poll at >= 10 s).
export VCLOUD_POLL_INTERVAL="${VCLOUD_POLL_INTERVAL:-3}"
export VCLOUD_MAX_POLL_INTERVAL="${VCLOUD_MAX_POLL_INTERVAL:-10}"
export VCLOUD_FIRST_POLL_DELAY="${VCLOUD_FIRST_POLL_DELAY:-2}"

echo "demo: Airflow home ${AIRFLOW_HOME}; migrating its database"
"$PY" -m airflow db migrate >"${AIRFLOW_HOME}/db-migrate.log" 2>&1 || {
    tail -n 30 "${AIRFLOW_HOME}/db-migrate.log" >&2
    exit 1
}

conf=$(printf '{"profile": "%s", "config": "tiny", "run_name": "%s"}' "$PROFILE" "$RUN_NAME")
echo "demo: airflow dags test vcloud_training --conf '${conf}'"
started=$(date +%s)
log="${AIRFLOW_HOME}/dags-test-${RUN_NAME}.log"
set +e
"$PY" -m airflow dags test vcloud_training --conf "$conf" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
elapsed=$(( $(date +%s) - started ))

dag_run_id=$(sed -n 's/.*DagRun Finished: .*run_id=\([^,]*\),.*/\1/p' "$log" | tail -n 1)
echo
echo "demo: DAG run ${dag_run_id:-?} finished in ${elapsed} s (airflow exit code ${rc}); task states:"
if [ -n "$dag_run_id" ]; then
    "$PY" -m airflow tasks states-for-dag-run vcloud_training "$dag_run_id" -o plain 2>/dev/null \
        | awk '{print "  " $0}' || true
fi
echo
"$PY" -m vcloud_pipeline.dag.report --profile "$PROFILE" --config tiny --run "$RUN_NAME" ${dag_run_id:+--dag-run-id "$dag_run_id"}
if [ "$rc" -ne 0 ] || grep -q "DagRun Finished: .*state=failed" "$log"; then
    echo "demo: the DAG run failed; see ${log}" >&2
    exit 1
fi
