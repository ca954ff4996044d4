# vllm-cluster-lib.sh: helpers shared by the host scripts of vllm-cluster.
#
# Installed at /opt/vllm-cluster/lib/vllm-cluster-lib.sh by the node's and the
# gateway's user data; sourced by vllm-cluster-node and vllm-cluster-gateway, which
# run with `set -euo pipefail`. Defines functions only.
#
# Reads: LOG_NAME (or NODE_NAME) for the log prefix.
# shellcheck shell=bash

log() { printf '%s [%s] %s\n' "$(date -u +%H:%M:%S)" "${LOG_NAME:-${NODE_NAME:-node}}" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Replace $1 with stdin's content only if it differs; prints "changed" or "unchanged".
install_if_changed() {
  local target=$1 mode=$2 temp
  temp=$(mktemp "$target.XXXXXX")
  cat >"$temp"
  chmod "$mode" "$temp"
  if [ -f "$target" ] && cmp -s "$temp" "$target"; then
    rm -f "$temp"
    echo unchanged
  else
    mv -f "$temp" "$target"
    echo changed
  fi
}

# How long apt may wait for another apt (apt-daily, unattended-upgrades, cloud-init)
# at first boot before we give up.
readonly APT_LOCK_WAIT_SECONDS=600

# apt-get update, waiting for the package lists lock. At first boot another apt
# (apt-daily and friends) may hold /var/lib/apt/lists/lock, and DPkg::Lock::Timeout
# covers only the dpkg lock: `apt-get update` then fails at once. Retry instead.
apt_update() {
  local deadline=$((SECONDS + APT_LOCK_WAIT_SECONDS)) output
  until output=$(apt-get -o DPkg::Lock::Timeout="$APT_LOCK_WAIT_SECONDS" update -q 2>&1); do
    if [ "$SECONDS" -ge "$deadline" ]; then
      printf '%s\n' "$output" >&2
      die "apt-get update failed for $APT_LOCK_WAIT_SECONDS s (output above)"
    fi
    if grep -q 'Could not get lock' <<<"$output"; then
      log "apt-get update: another apt holds the package lists lock (first boot?); waiting"
    else
      log "apt-get update failed; retrying in 5 s: $(tail -n 1 <<<"$output")"
    fi
    sleep 5
  done
}

apt_install() {
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$APT_LOCK_WAIT_SECONDS" install -y -q "$@"
}
