# shellcheck shell=bash
# Sourced by the bring-up scripts (cluster.sh, build_image.sh, site_images.sh, test_deps.sh): a
# command that fails under `set -e` names the step it belonged to, the file and line, the command
# and the log to read, instead of ending the script silently (make then prints a bare "Error 1").
#
#   STEP_TAG="[cluster]" STEP_LOGS="/var/lib/vcloud-localcluster/log"   (before sourcing)
#   step COMMAND [ARG...]   runs COMMAND (a function of the script) as the step named by it
STEP_TAG="${STEP_TAG:-[bring-up]}"
STEP_LOGS="${STEP_LOGS:-}"
STEP_NAME="starting"

step() {  # step COMMAND [ARG...]: COMMAND runs as the step a failure names
  STEP_NAME=$*
  "$@"
}

on_step_error() {  # on_step_error RC FILE LINE COMMAND: the ERR trap
  # A failure inside a command substitution is reported by the shell that ran it: the subshell
  # stays silent so the message appears once.
  [[ $BASHPID == "$$" ]] || return 0
  printf '%s ERROR: step "%s" failed (exit %s) at %s line %s: %s\n' \
    "$STEP_TAG" "$STEP_NAME" "$1" "$2" "$3" "$4" >&2
  [[ -z $STEP_LOGS ]] || printf '%s the logs of this step are under %s\n' "$STEP_TAG" "$STEP_LOGS" >&2
}

set -E
trap 'on_step_error $? "${BASH_SOURCE[0]}" "$LINENO" "$BASH_COMMAND"' ERR
