#!/usr/bin/env bash
# PID 1 of the dev-cluster container: bring the cluster up, stay while its daemons run, and stop
# them by PID file (cluster.sh down) when the container is stopped.
set -euo pipefail
CLUSTER=/opt/vcloud/include/local_cluster/cluster.sh

bash "$CLUSTER" up
trap 'bash "$CLUSTER" down; exit 0' TERM INT
while bash "$CLUSTER" status >/dev/null; do
  sleep 10 &
  wait $!
done
echo "[cluster] a daemon stopped; its log is under ${VCLOUD_CLUSTER_DIR:-/var/lib/vcloud-localcluster}/log" >&2
bash "$CLUSTER" status >&2 || true
exit 1
