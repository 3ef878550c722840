#!/usr/bin/env bash
# The real sites' images on the local cluster (images/sites/, named by include/local_cluster/site_facts.yaml),
# made from the trainer image of build_image.sh (`make image` runs this after it; `cluster.sh up` too,
# which gets links to the trainer image itself until it is built):
#
#   lumi.sif    -> lumi-image: the trainer image without tifffile, as CSC's PyTorch image lacks it
#                  (the pipeline's provisioning step installs it into the project's pylibs); a copy of
#                  hard links (`cp -al`, no second copy of the data) with tifffile's entries unlinked,
#                  made again when the trainer image's build hash changes. LUMI's breaks with --rocm
#                  as the CSC image does (lumi.sif.rocm-breaks, written by cluster.sh).
#   cosmos.sif  -> the trainer image itself.
#
# Idempotent; the links are replaced in one rename each, so jobs that resolve them meanwhile see one
# image or the other. Runs as root.
set -euo pipefail

IMAGE="${VCLOUD_IMAGE:-/var/lib/vcloud-localcluster/images/vcloud-trainer}"
SITES="$(dirname "$IMAGE")/sites"
VENV=/opt/vcloud-localcluster/venv
LUMI_LACKS=(tifffile)
STEP_TAG="[site images]" STEP_LOGS="$SITES"
# shellcheck source=include/local_cluster/steps.sh
. "$(dirname "${BASH_SOURCE[0]}")/steps.sh"

log() { printf '[site images] %s\n' "$*" >&2; }
die() { printf '[site images] ERROR: %s\n' "$*" >&2; exit 1; }

relink() {  # relink TARGET LINK: LINK points at TARGET, replaced in one rename
  ln -sfn "$1" "$2.new.$$"
  mv -T "$2.new.$$" "$2"
}

image_without() {  # image_without NAME PACKAGE...: $SITES/NAME-image is the trainer image without PACKAGEs
  local name=$1; shift
  local site="$SITES/$name-image" want package
  want="$(<"$IMAGE.sha256") without $*"
  if [[ -d $site && -f $site.sha256 && $(<"$site.sha256") == "$want" ]]; then return 0; fi
  rm -rf "$site.building"
  cp -al "$IMAGE" "$site.building"
  # Unlinking entries of the copy leaves the trainer image's files as they are (never write into one).
  for package in "$@"; do
    rm -rf "$site.building$VENV"/lib/python3*/site-packages/"$package" \
           "$site.building$VENV"/lib/python3*/site-packages/"$package"-*.dist-info
    [[ -z $(compgen -G "$site.building$VENV/lib/python3*/site-packages/$package*") ]] \
      || die "could not remove $package from $site.building"
  done
  rm -rf "$site"
  mv "$site.building" "$site"
  echo "$want" >"$site.sha256"
  log "$site: the trainer image without $*"
}

main() {  # main [--or-placeholders]
  [[ $(id -u) -eq 0 ]] || die "run as root (it writes $SITES)"
  install -d -m 755 "$SITES"
  # One writer of the links at a time: `cluster.sh up` and `make image` may run at once.
  exec 9>"$SITES/.lock"
  flock 9
  if [[ ! -d $IMAGE || ! -f $IMAGE.sha256 ]]; then
    # --or-placeholders (cluster.sh up): until `make image` has built the trainer image, both sites
    # name it; made here, under the lock, so a build that finishes meanwhile is never overwritten.
    [[ ${1:-} == --or-placeholders ]] || die "no trainer image at $IMAGE: build it first (make image)"
    relink ../vcloud-trainer "$SITES/lumi.sif"
    relink ../vcloud-trainer "$SITES/cosmos.sif"
    return 0
  fi
  image_without lumi "${LUMI_LACKS[@]}"
  relink lumi-image "$SITES/lumi.sif"
  relink ../vcloud-trainer "$SITES/cosmos.sif"
}

main "$@"
