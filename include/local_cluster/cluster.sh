#!/usr/bin/env bash
# The local Slurm cluster with an SSH login node: the embedded default that stands in for LUMI in
# the demo and the tests. Its compute nodes (NodeName/NodeAddr lines of templates/slurm.conf) each
# run a slurmd in their own network, UTS and mount namespace: own hostname, own address on the
# bridge $BRIDGE (the controller's address there is $CONTROLLER_ADDR), own /etc/hosts naming every
# node, and the Singularity stand-in (include/local_cluster/singularity, built on Charliecloud) on
# their PATH. The login node and slurmctld are this machine.
#
#   cluster.sh up       install what is missing, create the bridge and the nodes' namespaces, start
#                       munge, MariaDB, slurmdbd, slurmctld, one slurmd per node and sshd
#                       (idempotent: running daemons are left alone)
#   cluster.sh down     stop what `up` started, by PID file, newest first
#   cluster.sh status   one line per daemon
#   cluster.sh install  only install the Debian packages and the jobs' runtime environment (image builds)
#   cluster.sh packages only install the Debian packages (make bringup, before its steps run at once)
#   cluster.sh purge    stop the cluster and remove everything `up` and `make image` created (state
#                       directory with the accounting database and the images, the project and site
#                       file systems, the runtime environment, the cluster users, Slurm's configs):
#                       the next `up` is a first bring-up, as on a machine that never ran one.
#                       Debian packages stay installed.
#
# Runs as root on Debian 12, without systemd. Everything it creates lives under $VCLOUD_CLUSTER_DIR
# (default /var/lib/vcloud-localcluster), the cluster user's home, /etc/slurm and the project
# filesystem $VCLOUD_SCRATCH. Jobs run as the unprivileged $VCLOUD_CLUSTER_USER, never as root.
#
# The defaults make a login node on this machine's loopback. The docker-compose `dev-cluster`
# container (include/docker/cluster.Dockerfile) runs the same bring-up and sets, for Airflow in
# other containers: VCLOUD_SSH_LISTEN (sshd's listen address), VCLOUD_SSH_HOST (the login node's
# name in the client config, known_hosts and connections), VCLOUD_CONTROL_PATH (ssh ControlPath
# of the client config; the state directory is mounted read-only there) and
# VCLOUD_CLIENT_KEY_OWNER (owner of the client key, the uid Airflow runs as).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
STATE="${VCLOUD_CLUSTER_DIR:-/var/lib/vcloud-localcluster}"
STEP_TAG="[cluster]" STEP_LOGS="$STATE/log"
# shellcheck source=include/local_cluster/steps.sh
. "$HERE/steps.sh"
# shellcheck source=include/local_cluster/links.sh
. "$HERE/links.sh"
CLUSTER_USER="${VCLOUD_CLUSTER_USER:-vcloud}"
# A second member of the same project: same Slurm account, same project group (the cluster user's),
# own login key and Airflow connection; for the tests of what two people sharing a project may do.
TEAMMATE="${VCLOUD_CLUSTER_TEAMMATE:-vcloud2}"
SSH_PORT="${VCLOUD_SSH_PORT:-2222}"
SSH_LISTEN="${VCLOUD_SSH_LISTEN:-127.0.0.1}"
SSH_HOST="${VCLOUD_SSH_HOST:-127.0.0.1}"
CONTROL_PATH="${VCLOUD_CONTROL_PATH:-$STATE/run/ssh-%C}"
CLIENT_KEY_OWNER="${VCLOUD_CLIENT_KEY_OWNER:-}"
SCRATCH="${VCLOUD_SCRATCH:-/srv/vcloud/scratch/vcloud}"
RUNTIME_VENV="${VCLOUD_RUNTIME_VENV:-/opt/vcloud-localcluster/venv}"
CONN_ID="vcloud_local_cluster"
# The nodes' network: a bridge on this machine and one veth pair per node, nothing else.
BRIDGE="${VCLOUD_CLUSTER_BRIDGE:-vcbr0}"
CONTROLLER_ADDR="${VCLOUD_CONTROLLER_ADDR:-10.203.0.1}"
NETNS_PREFIX="vcloud-"
# What the real sites' profiles expect of a machine (include/local_cluster/site_facts.yaml maps the
# rest): their file system roots, and LUMI's host libraries the CSC image needs bound in
# (SINGULARITY_CONTAINLIBS, SINGULARITY_BIND), as empty stand-ins where this machine lacks them.
SITE_ROOTS=(/scratch /projappl /flash /appl /pfs /project /opt/cray/libfabric /cosmos/vast/scratch /var/spool/slurmd)
SITE_HOST_LIBS=(/usr/lib64/libcxi.so.1 /usr/lib64/libjansson.so.4 /opt/rocm/lib/librocm_smi64.so.7)
SITE_ACCOUNT_DIRS=(/scratch/vcloud_local /projappl/vcloud_local/pylibs /flash/vcloud_local /project/vcloud_local)
SLURM_ACCOUNT="vcloud_local"
# The project allocation as Slurm holds it: GrpTRESMins=billing on the account (1000 GPU-hours, the
# local profile's billing.allocation). Set again at every bring-up, so a test that lowered it and
# died leaves no lasting change.
ALLOCATION_BILLING_MINUTES="${VCLOUD_ALLOCATION_BILLING_MINUTES:-60000}"

APT_PACKAGES=(munge mariadb-server slurmctld slurmd slurmdbd slurm-client openssh-server
              openssh-client rsync python3-venv shellcheck charliecloud-runtime iproute2
              util-linux)

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { printf '[cluster] ERROR: %s\n' "$*" >&2; exit 1; }

pid_alive() {  # pid_alive PIDFILE: true when the file names a live process of that daemon
  # The process name must match the pid file's daemon, so a stale file whose pid the kernel has
  # since given to another process is never taken for ours (and never signalled by `down`).
  local pidfile=$1 pid daemon
  [[ -s $pidfile ]] || return 1
  pid=$(<"$pidfile")
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  daemon=$(basename "$pidfile" .pid)
  [[ $daemon == mariadb ]] && daemon=mariadbd
  [[ $daemon == slurmd-* ]] && daemon=slurmd
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$daemon" ]]
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds
  local seconds=$1 what=$2; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after ${seconds}s waiting for $what (logs: $STATE/log)"
    sleep 0.5
  done
}

render() {  # render TEMPLATE DEST MODE OWNER: fill @VARS@ in a template
  local template=$1 dest=$2 mode=$3 owner=$4 tmp
  tmp=$(mktemp "$dest.XXXXXX")
  sed -e "s|@STATE@|$STATE|g" -e "s|@HOSTNAME@|$(hostname -s)|g" \
      -e "s|@SSH_PORT@|$SSH_PORT|g" -e "s|@SSH_LISTEN@|$SSH_LISTEN|g" -e "s|@CLUSTER_USER@|$CLUSTER_USER|g" \
      -e "s|@TEAMMATE@|$TEAMMATE|g" \
      -e "s|@DB_PASSWORD@|${DB_PASSWORD:-}|g" -e "s|@TASK_PLUGIN@|${TASK_PLUGIN:-task/none}|g" \
      -e "s|@JOBACCT_PARAMS@|${JOBACCT_PARAMS:-OverMemoryKill}|g" \
      -e "s|@CONTROLLER_ADDR@|$CONTROLLER_ADDR|g" "$HERE/templates/$template" >"$tmp"
  chmod "$mode" "$tmp"
  chown "$owner" "$tmp"
  mv -f "$tmp" "$dest"
}

replace_file() {  # replace_file DEST: stdin becomes DEST (mode 644) in one rename
  # Tests and tasks read the client files (ssh config, known_hosts, connections) while another
  # `up` runs: a file truncated and then written would be seen empty for a moment.
  local dest=$1 tmp
  tmp=$(mktemp "$dest.XXXXXX")
  cat >"$tmp"
  chmod 644 "$tmp"
  mv -f "$tmp" "$dest"
}

install_packages() {
  local missing=() pkg
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return 0
  log "installing Debian packages: ${missing[*]} (log: $STATE/log/apt.log)"
  install -d -m 755 "$STATE/log"
  # Package scripts must not start daemons: this script owns their lifecycle.
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  apt-get update -qq >>"$STATE/log/apt.log" 2>&1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >>"$STATE/log/apt.log" 2>&1
  rm -f /usr/sbin/policy-rc.d
}

prepare_dirs() {
  mkdir -p "$STATE"/{run,log,ssh,dev,etc} "$STATE/spool/slurmd"
  mkdir -p "$STATE/spool/slurmctld"
  chown slurm:slurm "$STATE/spool/slurmctld" "$STATE/log"
  chmod 755 "$STATE" "$STATE/run" "$STATE/log"
  local i
  for i in 0 1 2 3 4 5 6 7; do
    [[ -c $STATE/dev/gpu$i ]] || mknod -m 666 "$STATE/dev/gpu$i" c 195 "$i"
  done
}

ensure_cluster_user() {
  if ! id "$CLUSTER_USER" >/dev/null 2>&1; then
    log "creating cluster user $CLUSTER_USER"
    useradd --create-home --shell /bin/bash "$CLUSTER_USER"
  fi
  # '*' = no password but not locked: sshd (without PAM) refuses locked accounts even for keys.
  usermod -p '*' "$CLUSTER_USER"
  local home
  home=$(getent passwd "$CLUSTER_USER" | cut -d: -f6)
  install -d -m 700 -o "$CLUSTER_USER" -g "$CLUSTER_USER" "$home/.ssh"
  [[ -s $STATE/ssh/id_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -C "airflow@vcloud-local" -f "$STATE/ssh/id_ed25519"
  chmod 600 "$STATE/ssh/id_ed25519"
  [[ -z $CLIENT_KEY_OWNER ]] || chown "$CLIENT_KEY_OWNER" "$STATE/ssh/id_ed25519"
  install -m 600 -o "$CLUSTER_USER" -g "$CLUSTER_USER" "$STATE/ssh/id_ed25519.pub" "$home/.ssh/authorized_keys"
  install -d -m 755 "$(dirname "$SCRATCH")"
  # The project directory belongs to the project's group, setgid, as on LUMI's /scratch/project_*.
  install -d -m 2775 -o "$CLUSTER_USER" -g "$CLUSTER_USER" "$SCRATCH"
  chmod 2775 "$SCRATCH"
  ensure_teammate
}

ensure_teammate() {
  if ! id "$TEAMMATE" >/dev/null 2>&1; then
    log "creating a second project member $TEAMMATE (group $CLUSTER_USER)"
    useradd --create-home --shell /bin/bash "$TEAMMATE"
  fi
  usermod -p '*' -a -G "$CLUSTER_USER" "$TEAMMATE"
  local home key="$STATE/ssh/id_ed25519_$TEAMMATE"
  home=$(getent passwd "$TEAMMATE" | cut -d: -f6)
  install -d -m 700 -o "$TEAMMATE" -g "$TEAMMATE" "$home/.ssh"
  [[ -s $key ]] || ssh-keygen -q -t ed25519 -N '' -C "airflow-$TEAMMATE@vcloud-local" -f "$key"
  chmod 600 "$key"
  [[ -z $CLIENT_KEY_OWNER ]] || chown "$CLIENT_KEY_OWNER" "$key"
  install -m 600 -o "$TEAMMATE" -g "$TEAMMATE" "$key.pub" "$home/.ssh/authorized_keys"
}

prepare_site_roots() {
  local dir lib images="$STATE/images/sites"
  for dir in "${SITE_ROOTS[@]}"; do install -d -m 755 "$dir"; done
  for lib in "${SITE_HOST_LIBS[@]}"; do
    [[ -e $lib ]] && continue
    install -d -m 755 "$(dirname "$lib")"
    install -m 644 /dev/null "$lib"
  done
  # The project's directories, owned by the cluster user as a project's are by its group; Cosmos'
  # per-user VAST and node-local directories; Levante's base (mapped under /srv).
  for dir in "${SITE_ACCOUNT_DIRS[@]}" "/cosmos/vast/scratch/$CLUSTER_USER" "/scratch/$CLUSTER_USER" \
             "/srv/vcloud/levante"; do
    install -d -m 755 -o "$CLUSTER_USER" -g "$CLUSTER_USER" "$dir"
  done
  # The sites' images are the local trainer image (make image); LUMI's lacks tifffile as the CSC
  # image does (images/sites/lumi-image, made by site_images.sh; the trainer image until it exists)
  # and breaks with --rocm, as the CSC image does (the stand-in reads the .rocm-breaks file next to it).
  install -d -m 755 "$images"
  VCLOUD_IMAGE="$STATE/images/vcloud-trainer" bash "$HERE/site_images.sh" --or-placeholders
  printf '%s\n' "FATAL: the LUMI CSC image breaks with --rocm: it binds the host's libdrm.so, built against GLIBC 2.33, into a container with GLIBC 2.31 (/lib64/libc.so.6: version \`GLIBC_2.33' not found); use SINGULARITY_CONTAINLIBS and -B /opt/cray instead" \
    >"$images/lumi.sif.rocm-breaks"
}

start_munge() {
  [[ -s /etc/munge/munge.key ]] || { mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null || \
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none; }
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  install -d -m 755 -o munge -g munge /run/munge
  install -d -m 700 -o munge -g munge /var/lib/munge /var/log/munge
  install -d -m 755 -o munge -g munge "$STATE/run/munge"
  if pid_alive "$STATE/run/munge/munged.pid"; then return 0; fi
  log "starting munged"
  runuser -u munge -- /usr/sbin/munged --pid-file="$STATE/run/munge/munged.pid" --force
  wait_for 10 munged test -s "$STATE/run/munge/munged.pid"
  wait_for 10 "munge round trip" sh -c 'munge -n | unmunge'
}

start_mariadb() {
  # The accounting database lives in the state directory, so removing it (purge) removes every row
  # the cluster ever wrote: a first bring-up creates the database, its user and its rows itself.
  local datadir="$STATE/mysql"
  install -d -m 755 -o mysql -g mysql /run/mysqld
  if [[ ! -d $datadir/mysql ]]; then
    log "creating MariaDB's data directory $datadir"
    rm -rf "$datadir"
    install -d -m 750 -o mysql -g mysql "$datadir"
    mariadb-install-db --user=mysql --datadir="$datadir" --auth-root-authentication-method=socket \
      --skip-test-db >"$STATE/log/mariadb-install-db.log" 2>&1
  fi
  if ! pid_alive "$STATE/run/mariadb.pid"; then
    log "starting MariaDB"
    install -m 640 -o mysql -g adm /dev/null "$STATE/log/mariadb.log"
    start-stop-daemon --start --background --make-pidfile --pidfile "$STATE/run/mariadb.pid" \
      --exec /usr/sbin/mariadbd -- --user=mysql --datadir="$datadir" --bind-address=127.0.0.1 \
      --innodb-lock-wait-timeout=900 --log-error="$STATE/log/mariadb.log"
  fi
  wait_for 60 MariaDB mysqladmin --protocol=socket ping
  if [[ ! -s $STATE/etc/db_password ]]; then
    head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$STATE/etc/db_password"
    chmod 600 "$STATE/etc/db_password"
  fi
  DB_PASSWORD=$(<"$STATE/etc/db_password")
  mysql --protocol=socket <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASSWORD';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASSWORD';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL
}

choose_memory_enforcement() {
  # The nodes share this machine's kernel and cgroup tree: with task/cgroup the steps of one job on
  # two nodes would share a cgroup. The accounting poller enforces memory instead.
  TASK_PLUGIN=task/none JOBACCT_PARAMS=OverMemoryKill
}

slurm_config_hash() {
  cat /etc/slurm/slurm.conf /etc/slurm/gres.conf /etc/slurm/cgroup.conf | sha256sum | cut -d' ' -f1
}

write_slurm_configs() {
  install -d -m 755 /etc/slurm
  choose_memory_enforcement
  render slurm.conf /etc/slurm/slurm.conf 644 root:root
  render gres.conf /etc/slurm/gres.conf 644 root:root
  render cgroup.conf /etc/slurm/cgroup.conf 644 root:root
  render slurmdbd.conf /etc/slurm/slurmdbd.conf 600 slurm:slurm
}

restart_if_config_changed() {
  # Running daemons keep the configuration they started with (jobs survive a restart): compare it
  # with the one just written, as recorded when slurmctld last started.
  local applied="$STATE/run/slurm-config.sha256" pidfile running=0
  [[ -s $applied && $(<"$applied") == "$(slurm_config_hash)" ]] && return 0
  for pidfile in "$STATE/run/slurmctld.pid" "$STATE"/run/slurmd-*.pid "$STATE/run/slurmd.pid"; do
    if pid_alive "$pidfile"; then running=1; fi
  done
  ((running)) || return 0
  log "Slurm configuration changed: restarting slurmctld and the nodes' slurmd"
  stop_nodes
  stop_pidfile slurmctld "$STATE/run/slurmctld.pid"
}

start_slurmdbd() {
  if ! pid_alive "$STATE/run/slurmdbd.pid"; then
    log "starting slurmdbd"
    /usr/sbin/slurmdbd
  fi
  wait_for 60 slurmdbd sacctmgr -n list cluster
}

register_accounts() {
  sacctmgr -i -Q add cluster vcloud-local >/dev/null 2>&1 || true
  if ! sacctmgr -n -P list account "$SLURM_ACCOUNT" format=account | grep -qx "$SLURM_ACCOUNT"; then
    sacctmgr -i -Q add account "$SLURM_ACCOUNT" cluster=vcloud-local \
      description="vcloud local cluster" organization=vcloud >/dev/null
  fi
  local user
  for user in "$CLUSTER_USER" "$TEAMMATE" root; do
    if ! sacctmgr -n -P list assoc users="$user" account="$SLURM_ACCOUNT" format=user | grep -qx "$user"; then
      sacctmgr -i -Q add user "$user" account="$SLURM_ACCOUNT" defaultaccount="$SLURM_ACCOUNT" \
        cluster=vcloud-local >/dev/null
    fi
  done
  sacctmgr -i -Q modify account "$SLURM_ACCOUNT" where cluster=vcloud-local \
    set GrpTRESMins="billing=$ALLOCATION_BILLING_MINUTES" >/dev/null
}

start_slurmctld() {
  if ! pid_alive "$STATE/run/slurmctld.pid"; then
    log "starting slurmctld"
    /usr/sbin/slurmctld -i
    slurm_config_hash >"$STATE/run/slurm-config.sha256"
  fi
  wait_for 60 slurmctld scontrol ping
}

node_table() {  # "NAME ADDRESS" per compute node, from the rendered slurm.conf
  sed -n 's/^NodeName=\([^ ]*\) NodeAddr=\([0-9.]*\) .*/\1 \2/p' /etc/slurm/slurm.conf
}

ensure_bridge() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    log "creating bridge $BRIDGE ($CONTROLLER_ADDR/24)"
    ip link add "$BRIDGE" type bridge
  fi
  # (captured first: `grep -q` would end the pipe early, and pipefail take that for a failure)
  [[ $(ip -4 addr show dev "$BRIDGE") == *"inet $CONTROLLER_ADDR/"* ]] || ip addr add "$CONTROLLER_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
}

ensure_node_network() {  # ensure_node_network NAME ADDRESS: namespace, veth pair, address, /etc/hosts
  local name=$1 addr=$2 ns="$NETNS_PREFIX$1" host_if="vc-$1"
  [[ -e /run/netns/$ns ]] || ip netns add "$ns"
  if ip link show "$host_if" >/dev/null 2>&1 && ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
    # left from a namespace of an earlier bring-up that something kept alive: its peer is not here
    log "replacing $host_if, whose peer is not in $ns"
    delete_link "$host_if"
  fi
  if ! ip link show "$host_if" >/dev/null 2>&1; then
    ip link add "$host_if" type veth peer name eth0 netns "$ns"
  fi
  ip link set "$host_if" master "$BRIDGE"
  ip link set "$host_if" up
  ip -n "$ns" link set lo up
  [[ $(ip -n "$ns" -4 addr show dev eth0) == *"inet $addr/"* ]] || ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
}

write_node_files() {  # the nodes' /etc/hosts and the commands only compute nodes have
  local name addr
  install -d -m 755 "$STATE/nodes" "$STATE/node-bin"
  {
    printf '127.0.0.1\tlocalhost\n'
    printf '%s\t%s\n' "$CONTROLLER_ADDR" "$(hostname -s)"
    while read -r name addr; do printf '%s\t%s\n' "$addr" "$name"; done < <(node_table)
  } >"$STATE/nodes/hosts.new"
  # Rewritten in place, never replaced: running nodes have this very file (inode) bound on /etc/hosts.
  if ! cmp -s "$STATE/nodes/hosts.new" "$STATE/nodes/hosts"; then
    cat "$STATE/nodes/hosts.new" >"$STATE/nodes/hosts"
  fi
  chmod 644 "$STATE/nodes/hosts"
  rm -f "$STATE/nodes/hosts.new"
  [[ -x $HERE/singularity ]] || die "missing $HERE/singularity (the compute nodes' Singularity stand-in)"
  install -m 755 "$HERE/singularity" "$STATE/node-bin/singularity"
}

start_node() {  # start_node NAME: slurmd in the node's namespaces (net, UTS for its hostname, mount)
  local name=$1 ns="$NETNS_PREFIX$1"
  pid_alive "$STATE/run/slurmd-$name.pid" && return 0
  log "starting slurmd of node $name"
  install -d -m 755 "$STATE/spool/slurmd-$name"
  # In the node's own mount namespace: its /etc/hosts, and /usr/local/bin with the stand-in
  # `singularity` over this machine's (an overlay: the login node keeps its own /usr/local/bin).
  # shellcheck disable=SC2016  # expanded by the inner bash, from its arguments
  nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private -- bash -euc '
    hostname "$1"
    mount --bind "$2/nodes/hosts" /etc/hosts
    mount -t overlay overlay -o "lowerdir=$2/node-bin:/usr/local/bin" /usr/local/bin
    exec /usr/sbin/slurmd
  ' start-node "$name" "$STATE"
}

start_nodes() {
  local name addr
  write_node_files
  while read -r name addr; do
    ensure_node_network "$name" "$addr"
    start_node "$name"
  done < <(node_table)
  wait_for 90 "every node to be usable" nodes_usable
}

nodes_usable() {
  local name state rc=0
  while read -r name state; do
    case "$state" in
      idle*|mixed*|allocated*|completing*) ;;
      down*|drain*|fail*) scontrol update nodename="$name" state=resume >/dev/null 2>&1; rc=1 ;;
      *) rc=1 ;;
    esac
  done < <(sinfo -h -N -o '%N %T' | sort -u)
  [[ -n $(sinfo -h -N -o '%N') ]] && return $rc
}

stop_nodes() {
  local pidfile
  for pidfile in "$STATE"/run/slurmd-*.pid "$STATE/run/slurmd.pid"; do
    [[ -e $pidfile ]] || continue
    stop_pidfile "$(basename "$pidfile" .pid)" "$pidfile"
  done
}

stop_node_processes() {  # stop_node_processes NAMESPACE: what jobs left running in a node once its slurmd stopped
  local ns=$1 pids pid
  mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
  ((${#pids[@]})) || return 0
  log "stopping ${#pids[@]} process(es) jobs left in $ns: ${pids[*]}"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 50); do
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
    ((${#pids[@]})) || return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

remove_node_networks() {
  # A process left in a node's namespace would keep the namespace, and the veth pair into it, alive
  # after `ip netns del`; the next bring-up would then find a host interface whose peer is elsewhere.
  local ns name
  for ns in /run/netns/"$NETNS_PREFIX"*; do
    [[ -e $ns ]] || continue
    name=$(basename "$ns")
    stop_node_processes "$name"
    # The host end first, which takes its peer with it at once: after `ip netns del` the kernel
    # removes the pair in the background, between any look at the host end and a delete of it.
    delete_link "vc-${name#"$NETNS_PREFIX"}"
    ip netns del "$name"
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
}

start_sshd() {
  [[ -s $STATE/ssh/host_ed25519_key ]] || ssh-keygen -q -t ed25519 -N '' -C vcloud-local-login \
    -f "$STATE/ssh/host_ed25519_key"
  # (the first bring-up has no sshd_config yet: nothing to compare, and no failing pipeline)
  local before=""
  [[ -f $STATE/etc/sshd_config ]] && before=$(sha256sum "$STATE/etc/sshd_config" | cut -d' ' -f1)
  render sshd_config "$STATE/etc/sshd_config" 600 root:root
  install -d -m 755 /run/sshd
  /usr/sbin/sshd -t -f "$STATE/etc/sshd_config"
  if ! pid_alive "$STATE/run/sshd.pid"; then
    log "starting sshd on $SSH_LISTEN:$SSH_PORT"
    /usr/sbin/sshd -f "$STATE/etc/sshd_config" -E "$STATE/log/sshd.log"
  elif [[ $before != $(sha256sum "$STATE/etc/sshd_config" | cut -d' ' -f1) ]]; then
    log "sshd_config changed: sshd reloads it (open sessions stay)"
    kill -HUP "$(<"$STATE/run/sshd.pid")"
    sleep 1
  fi
  wait_for 20 sshd bash -c "exec 3<>/dev/tcp/127.0.0.1/$SSH_PORT"
}

write_client_config() {
  local host_key_line host_key_b64
  host_key_line=$(cut -d' ' -f1,2 "$STATE/ssh/host_ed25519_key.pub")
  host_key_b64=$(cut -d' ' -f2 "$STATE/ssh/host_ed25519_key.pub")
  printf '[%s]:%s %s\n' "$SSH_HOST" "$SSH_PORT" "$host_key_line" | replace_file "$STATE/ssh/known_hosts"
  replace_file "$STATE/ssh/config" <<EOF
# OpenSSH client config for the local cluster's login node (alias: vcloud-local).
Host vcloud-local
    HostName $SSH_HOST
    Port $SSH_PORT
    User $CLUSTER_USER
    IdentityFile $STATE/ssh/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile $STATE/ssh/known_hosts
    StrictHostKeyChecking yes
    BatchMode yes
    ControlMaster auto
    ControlPath $CONTROL_PATH
    ControlPersist 10m
EOF
  /usr/bin/python3 - "$STATE" "$CONN_ID" "$CLUSTER_USER" "$SSH_PORT" "$host_key_b64" "$SSH_HOST" "$TEAMMATE" <<'PY'
import json, os, shlex, sys
state, conn_id, user, port, host_key, host, teammate = sys.argv[1:]
base = {"conn_type": "ssh", "host": host, "port": int(port), "login": user}
# Paramiko/asyncssh transport (providers-ssh): key file and the pinned host key.
paramiko_conn = dict(base, extra={
    "key_file": f"{state}/ssh/id_ed25519",
    "host_key": f"ssh-ed25519 {host_key}",
    "no_host_key_check": False,
})
# System OpenSSH transport: the ssh_config alias (ControlMaster, pinned known_hosts).
openssh_conn = dict(base, extra={
    "transport": "openssh",
    "ssh_alias": "vcloud-local",
    "ssh_config_file": f"{state}/ssh/config",
})
# The second project member: same login node, own user and key.
teammate_conn = dict(paramiko_conn, login=teammate, extra=dict(paramiko_conn["extra"],
                                                              key_file=f"{state}/ssh/id_ed25519_{teammate}"))
conns = {conn_id: paramiko_conn, f"{conn_id}_openssh": openssh_conn, f"{conn_id}_{teammate}": teammate_conn}

def replace(path, text):  # whole or not at all, for a reader while another `up` runs
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)

replace(f"{state}/airflow_conn.json", json.dumps(conns, indent=2))
replace(f"{state}/airflow_conn.env", "".join(f"AIRFLOW_CONN_{cid.upper()}={shlex.quote(json.dumps(conn))}\n"
                                             for cid, conn in conns.items()))
PY
}

ensure_runtime_venv() {
  # The bare software environment for jobs (profile override container.runtime: none; by default
  # jobs run in the Charliecloud image of build_image.sh): separate from Airflow's venv, rebuilt
  # only when the trainer's runtime requirements change.
  local reqs="$REPO/trainer/requirements-runtime.txt" stamp want
  [[ -f $reqs ]] || die "missing $reqs"
  want=$(sha256sum "$reqs" | cut -d' ' -f1)
  stamp="$RUNTIME_VENV/.requirements.sha256"
  if [[ -x $RUNTIME_VENV/bin/python && -f $stamp && $(<"$stamp") == "$want" ]]; then return 0; fi
  log "building the cluster runtime environment in $RUNTIME_VENV"
  rm -rf "$RUNTIME_VENV"
  /usr/bin/python3 -m venv "$RUNTIME_VENV"
  "$RUNTIME_VENV/bin/pip" install -q --disable-pip-version-check -r "$reqs" 2>&1 | grep -v '^WARNING: Location' || true
  "$RUNTIME_VENV/bin/python" -c 'import torch, numpy, tifffile, rasterio, yaml' \
    || die "runtime environment in $RUNTIME_VENV does not import its packages"
  echo "$want" >"$stamp"
  chmod -R a+rX "$RUNTIME_VENV"
}

cmd_up() {
  [[ $(id -u) -eq 0 ]] || die "run as root (it installs packages and starts daemons); jobs run as $CLUSTER_USER"
  local t0=$SECONDS
  step install_packages
  step prepare_dirs
  step ensure_cluster_user
  step prepare_site_roots
  step start_munge
  step start_mariadb
  step write_slurm_configs
  step ensure_bridge
  step start_slurmdbd
  step register_accounts
  step restart_if_config_changed
  stop_pidfile "slurmd (single-node layout)" "$STATE/run/slurmd.pid"
  step start_slurmctld
  step start_nodes
  step start_sshd
  step write_client_config
  step ensure_runtime_venv
  log "up in $((SECONDS - t0))s: sinfo partitions $(sinfo -h -o '%P' | paste -sd, -); ssh vcloud-local via $STATE/ssh/config"
}

stop_pidfile() {  # stop_pidfile NAME PIDFILE: TERM, wait, KILL if needed
  local name=$1 pidfile=$2 pid i
  pid_alive "$pidfile" || { rm -f "$pidfile"; return 0; }
  pid=$(<"$pidfile")
  log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; sleep 0.5; fi
  rm -f "$pidfile"
}

cmd_install() {
  [[ $(id -u) -eq 0 ]] || die "run as root (it installs packages)"
  install_packages
  ensure_runtime_venv
}

cmd_down() {
  [[ $(id -u) -eq 0 ]] || die "run as root"
  local master
  for master in "$STATE"/run/ssh-*; do
    if [[ -S $master ]]; then
      ssh -F "$STATE/ssh/config" -o ControlPath="$master" -O exit vcloud-local 2>/dev/null || true
    fi
  done
  stop_pidfile sshd "$STATE/run/sshd.pid"
  stop_nodes
  stop_pidfile slurmctld "$STATE/run/slurmctld.pid"
  remove_node_networks
  stop_pidfile slurmdbd "$STATE/run/slurmdbd.pid"
  stop_pidfile MariaDB "$STATE/run/mariadb.pid"
  stop_pidfile munged "$STATE/run/munge/munged.pid"
  log "down"
}

cmd_purge() {
  [[ $(id -u) -eq 0 ]] || die "run as root"
  cmd_down
  local path user
  log "removing what the cluster created: $STATE, $RUNTIME_VENV, the project and site file systems, users $CLUSTER_USER and $TEAMMATE"
  rm -rf "$STATE" "$RUNTIME_VENV" "$SCRATCH" /srv/vcloud /cosmos
  # Purging what an earlier purge (or an interrupted first bring-up) already removed is no error.
  local runtime_dir
  runtime_dir=$(dirname "$RUNTIME_VENV")
  if [[ -d $runtime_dir ]]; then rmdir --ignore-fail-on-non-empty "$runtime_dir"; fi
  for path in "${SITE_ROOTS[@]}"; do rm -rf "$path"; done
  for path in "${SITE_HOST_LIBS[@]}"; do  # the empty stand-ins only, never a real library
    [[ -f $path && ! -s $path ]] && rm -f "$path"
  done
  rm -f /etc/slurm/slurm.conf /etc/slurm/gres.conf /etc/slurm/cgroup.conf /etc/slurm/slurmdbd.conf
  for user in "$TEAMMATE" "$CLUSTER_USER"; do
    if id "$user" >/dev/null 2>&1; then userdel -r "$user" 2>/dev/null || userdel "$user"; fi
  done
  if getent group "$CLUSTER_USER" >/dev/null; then groupdel "$CLUSTER_USER"; fi
  log "purged: the next 'up' starts from nothing"
}

cmd_status() {
  local name rc=0 pidfile
  for name in munge/munged mariadb slurmdbd slurmctld sshd; do
    if pid_alive "$STATE/run/$name.pid"; then
      printf '%-18s running (pid %s)\n' "${name#*/}" "$(<"$STATE/run/$name.pid")"
    else
      printf '%-18s stopped\n' "${name#*/}"; rc=1
    fi
  done
  while read -r name _; do
    pidfile="$STATE/run/slurmd-$name.pid"
    if pid_alive "$pidfile"; then
      printf '%-18s running (pid %s)\n' "slurmd-$name" "$(<"$pidfile")"
    else
      printf '%-18s stopped\n' "slurmd-$name"; rc=1
    fi
  done < <(node_table 2>/dev/null)
  return $rc
}

case "${1:-}" in
  up) cmd_up ;;
  down) step cmd_down ;;
  status) cmd_status ;;
  install) cmd_install ;;
  packages) [[ $(id -u) -eq 0 ]] || die "run as root (it installs packages)"; step install_packages ;;
  purge) step cmd_purge ;;
  *) echo "usage: $0 up|down|status|install|packages|purge" >&2; exit 2 ;;
esac
