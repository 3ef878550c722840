#!/usr/bin/env bash
# System packages the test suite needs besides the local cluster: Debian's headless Chromium for
# the HPC view's browser test (tests/deploy/test_hpc_view_browser.py) and docker-compose to
# validate docker-compose.yaml; Debian's PostgreSQL and Redis for the Celery deployment test
# (tests/support/celery_hosts.py starts private instances of both, on ports of
# their own). Idempotent; runs as root on Debian 12.
set -euo pipefail

STEP_TAG="[test-deps]"
# shellcheck source=include/local_cluster/steps.sh
. "$(dirname "${BASH_SOURCE[0]}")/local_cluster/steps.sh"

PACKAGES=(chromium fonts-dejavu-core docker-compose postgresql redis-server)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
((${#missing[@]} == 0)) && exit 0
[[ $(id -u) -eq 0 ]] || { echo "[test-deps] run as root to install: ${missing[*]}" >&2; exit 1; }
echo "[test-deps] installing Debian packages: ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
