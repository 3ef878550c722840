# shellcheck shell=bash
# Sourced by cluster.sh: removing the host end of a node's veth pair, which the kernel may remove too.
#
# A veth pair whose peer's namespace is being deleted goes away with that namespace, in the
# background: the host end can vanish between a look at it and `ip link del` ("Cannot find device"),
# or still be listed a moment after `ip netns del` returned.

link_absent() {  # link_absent INTERFACE: true when no such interface exists
  ! ip link show "$1" >/dev/null 2>&1
}

delete_link() {  # delete_link INTERFACE: gone afterwards, whether this delete or the kernel removed it
  local interface=$1 tries
  link_absent "$interface" && return 0
  ip link del "$interface" 2>/dev/null || true
  for ((tries = 0; tries < 100; tries++)); do
    link_absent "$interface" && return 0
    sleep 0.1
  done
  printf '%s ERROR: %s is still there 10 s after its delete: ip link show %s\n' \
    "${STEP_TAG:-[links]}" "$interface" "$interface" >&2
  return 1
}
