#!/usr/bin/env bash
# The local cluster's trainer image: what the CSC PyTorch Singularity image is on LUMI, built here
# from Debian packages and the trainer's runtime requirements, without any container registry.
#
#   build_image.sh           build the image unless it is up to date (`make image`)
#   build_image.sh --force   build it again
#   build_image.sh check     exit 0 when the image is up to date, 1 when it is missing or stale
#
# The image is a directory (ch-run mounts it read-only for jobs; the cluster user only reads it):
#   1. debootstrap --variant=minbase of Debian 12 with python3, python3-venv, python3-pip and
#      ca-certificates, from the mirror apt on this machine uses;
#   2. inside it (`ch-run -w`, as root), a venv at /opt/vcloud-localcluster/venv holding
#      trainer/requirements-runtime.txt: the same path as the bare venv of `cluster.sh up`, so the
#      profile's software.python serves both runtimes. pip sees the host's CA bundle and pip
#      configuration (find-links, constraints, local indexes), bound read-only;
#   3. mount points for the profile's binds (/srv, the project filesystem), and `python3` on the
#      default PATH (/usr/local/bin) being the venv's, as in the CSC image the sites' profiles run
#      (their software.python is the container's python3);
#   4. its build hash in /etc/vcloud-image.sha256 inside, and in $IMAGE.sha256 next to it.
# A directory image, not SquashFS: that needs /dev/fuse, and ch-run 0.31 then stays the FUSE parent
# of the job and does not forward signals, so the pre-timeout USR2 would never reach the trainer.
#
# The build hash covers requirements-runtime.txt and this script: the image is rebuilt only when
# one of them changes. Runs as root on Debian 12; installs charliecloud-runtime and debootstrap.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
IMAGE="${VCLOUD_IMAGE:-/var/lib/vcloud-localcluster/images/vcloud-trainer}"
REQUIREMENTS="$REPO/trainer/requirements-runtime.txt"
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,python3-pip,ca-certificates
VENV=/opt/vcloud-localcluster/venv
HASH_FILE=/etc/vcloud-image.sha256
STEP_TAG="[image]" STEP_LOGS="$(dirname "$IMAGE")"
# shellcheck source=include/local_cluster/steps.sh
. "$HERE/steps.sh"
MOUNT_POINTS=(/srv)
HOST_PACKAGES=(charliecloud-runtime debootstrap)

log() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] ERROR: %s\n' "$*" >&2; exit 1; }

build_hash() {
  cat "$REQUIREMENTS" "$HERE/build_image.sh" | sha256sum | cut -d' ' -f1
}

up_to_date() {  # up_to_date HASH: the image exists and was built from HASH
  [[ -x $IMAGE$VENV/bin/python && -f $IMAGE.sha256 && $(<"$IMAGE.sha256") == "$1" ]]
}

install_host_packages() {
  local missing=() pkg
  for pkg in "${HOST_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return 0
  log "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

apt_mirror() {  # the first deb URI apt uses for $SUITE (deb822 .sources, then one-line .list files)
  local uri
  if [[ -n ${VCLOUD_DEBIAN_MIRROR:-} ]]; then echo "$VCLOUD_DEBIAN_MIRROR"; return 0; fi
  uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v suite="$SUITE" '
    BEGIN { RS = ""; FS = "\n" }
    {
      types = ""; uris = ""; suites = ""; enabled = "yes"
      for (i = 1; i <= NF; i++) {
        if ($i ~ /^#/) continue
        split($i, kv, ":"); key = tolower(kv[1]); value = substr($i, length(kv[1]) + 2)
        if (key == "types") types = value
        else if (key == "uris") uris = value
        else if (key == "suites") suites = value
        else if (key == "enabled") enabled = value
      }
      if (index(" " types " ", " deb ") && index(" " suites " ", " " suite " ") && enabled !~ /no/) {
        split(uris, u, " "); print u[1]; exit
      }
    }')
  if [[ -z $uri ]]; then
    uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      sed -n -E "s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+)[[:space:]]+${SUITE}[[:space:]].*/\2/p" | head -n 1)
  fi
  [[ -n $uri ]] || die "no 'deb ... $SUITE' entry in /etc/apt/sources.list(.d); set VCLOUD_DEBIAN_MIRROR"
  echo "$uri"
}

pip_sources() {  # host files pip reads (CA bundle, configuration, local wheels and indexes) that exist
  local path
  for path in /etc/ssl/certs /etc/xdg/pip /etc/pip.conf "${XDG_CONFIG_HOME:-$HOME/.config}/pip" \
              /opt/wheels /opt/pypi*; do
    [[ -e $path ]] && echo "$path"
  done
  return 0
}

in_image() {  # in_image ROOT CMD...: run CMD as root in the image ROOT, writable, pip sources bound read-only
  local root=$1; shift
  local sources binds=() path
  # ch-run refuses to start without $USER, which root's environment often lacks.
  export USER="${USER:-$(id -un)}"
  mapfile -t sources < <(pip_sources)
  for path in "${sources[@]}"; do binds+=(-b "$path:$path"); done
  # ch-run has no read-only binds: make the sources read-only mounts in a private mount namespace;
  # the container's user namespace cannot remount them writable.
  # shellcheck disable=SC2016  # expanded by the inner bash
  unshare --mount --propagation private -- bash -c '
    n=$1; shift
    for path in "${@:1:$n}"; do mount --bind -o ro "$path" "$path"; done
    shift "$n"
    exec ch-run "$@"' _ "${#sources[@]}" "${sources[@]}" -w "${binds[@]}" "$root" -- "$@"
}

build() {  # build HASH
  local want=$1 root="$IMAGE.building" mirror created=() path t0=$SECONDS
  step install_host_packages
  STEP_NAME="find the Debian mirror"
  mirror=$(apt_mirror)
  install -d -m 755 "$(dirname "$IMAGE")"
  rm -rf "$root"
  trap 'rm -rf "$IMAGE.building"' EXIT
  STEP_NAME="debootstrap $SUITE"
  log "debootstrap $SUITE (minbase + $BASE_PACKAGES) from $mirror"
  if ! debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$root" "$mirror" \
      >"$IMAGE.debootstrap.log" 2>&1; then
    tail -n 20 "$IMAGE.debootstrap.log" >&2
    die "debootstrap failed (log: $IMAGE.debootstrap.log)"
  fi
  rm -f "$root"/var/cache/apt/archives/*.deb
  log "root file system done after $((SECONDS - t0))s; installing $(basename "$REQUIREMENTS") into $VENV"

  # Mount points for the pip sources, removed again after the build.
  while read -r path; do
    [[ -e $root$path ]] && continue
    if [[ -d $path ]]; then mkdir -p "$root$path"; else mkdir -p "$(dirname "$root$path")"; touch "$root$path"; fi
    created+=("$path")
  done < <(pip_sources)
  install -d -m 755 "$root$VENV"
  install -m 644 "$REQUIREMENTS" "$root/opt/vcloud-localcluster/requirements-runtime.txt"
  STEP_NAME="the image's venv"
  in_image "$root" /usr/bin/python3 -m venv "$VENV"
  # pip of Debian 12 warns about every project a local index lacks: noise, not a problem.
  if ! in_image "$root" "$VENV/bin/pip" install -q --no-cache-dir --disable-pip-version-check \
      -r /opt/vcloud-localcluster/requirements-runtime.txt 2>&1 | { grep -v "^WARNING: Location" || true; } >&2; then
    die "pip could not install $(basename "$REQUIREMENTS") into the image"
  fi
  in_image "$root" /usr/bin/env MPLCONFIGDIR=/tmp "$VENV/bin/python" \
    -c 'import torch, numpy, tifffile, rasterio, yaml, matplotlib' \
    || die "the image's venv does not import its packages"
  for path in "${created[@]}"; do
    if [[ -d $root$path ]]; then rmdir "$root$path"; else rm -f "$root$path"; fi
    rmdir -p --ignore-fail-on-non-empty "$(dirname "$root$path")"
  done

  STEP_NAME="finish the image"
  for path in "${MOUNT_POINTS[@]}"; do install -d -m 755 "$root$path"; done
  # ch-run binds the node's /etc/hosts only onto a file the image has: without it no node name
  # resolves inside, and torchrun's rendezvous at MASTER_ADDR (a node name) never completes.
  [[ -e $root/etc/hosts ]] || install -m 644 /dev/null "$root/etc/hosts"
  # (a wrapper, not a symlink: Python finds its venv from the path it was started by)
  local name
  for name in python3 python; do
    printf '#!/bin/sh\nexec %s "$@"\n' "$VENV/bin/python3" >"$root/usr/local/bin/$name"
    chmod 755 "$root/usr/local/bin/$name"
  done
  echo "$want" >"$root$HASH_FILE"
  chmod 644 "$root$HASH_FILE"
  chmod -R a+rX "$root/opt/vcloud-localcluster"
  chmod 755 "$root"

  rm -rf "$IMAGE"
  mv "$root" "$IMAGE"
  trap - EXIT
  echo "$want" >"$IMAGE.sha256"
  log "built $IMAGE in $((SECONDS - t0))s ($(du -sh "$IMAGE" | cut -f1)), build hash $want"
}

main() {
  local want
  [[ -r $REQUIREMENTS ]] || die "missing $REQUIREMENTS"
  want=$(build_hash)
  case "${1:-}" in
    check) up_to_date "$want"; return ;;
    packages) [[ $(id -u) -eq 0 ]] || die "run as root (it installs packages)"; install_host_packages; return ;;
    --force|"") ;;
    *) echo "usage: $0 [--force|check|packages]" >&2; exit 2 ;;
  esac
  [[ $(id -u) -eq 0 ]] || die "run as root (it installs packages and writes $IMAGE)"
  install -d -m 755 "$(dirname "$IMAGE")"
  # One build at a time: `make test` and `make demo` may start together.
  exec 9>"$IMAGE.lock"
  flock 9
  if [[ ${1:-} != --force ]] && up_to_date "$want"; then
    [[ -n ${VCLOUD_IMAGE_QUIET:-} ]] || log "$IMAGE is up to date (build hash $want)"
    return 0
  fi
  build "$want"
}

main "$@"
