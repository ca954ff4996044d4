# vllm-cluster-lib.sh: helpers shared by the host scripts of vllm-cluster.
#
# Installed at /opt/vllm-cluster/lib/vllm-cluster-lib.sh by every user data and by the
# nodes' setup command; sourced by vllm-cluster-node, vllm-cluster-first-boot and
# vllm-cluster-gateway, which run with `set -euo pipefail`. Defines functions, the state
# directory both kinds of host share, and the list of temporary paths the EXIT trap
# removes (remove_on_exit). A helper two host scripts need lives here, not in both.
#
# Reads: LOG_NAME (or NODE_NAME) for the log prefix.
# shellcheck shell=bash

readonly STATE_DIR=/var/lib/vllm-cluster

log() { printf '%s [%s] %s\n' "$(date -u +%H:%M:%S)" "${LOG_NAME:-${NODE_NAME:-node}}" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

require_root() {
  [ "$(id -u)" -eq 0 ] || die "run as root (sudo)"
}

# Source env files (KEY=value lines, as components/bootstrap.py and the node's setup
# write them) and export what they set, so the Python checks see it too.
load_env() {
  local file
  for file in "$@"; do
    [ -r "$file" ] || die "$file is missing: run 'vllm-cluster-node setup' first"
    set -a
    # shellcheck disable=SC1090  # the env files are written by the node's setup and the stack
    . "$file"
    set +a
  done
}

# Two runs of setup at once (cloud-init's and the stack's, or a command sent again)
# must not interleave: the second waits. The lock is held until the script exits; a
# node's idle check (vllm-cluster-node idle-check) sees a setup in progress by it.
readonly SETUP_LOCK=/run/vllm-cluster-setup.lock
hold_setup_lock() {
  exec 9>"$SETUP_LOCK"
  flock 9
}

# When setup last finished, for whoever looks at the host.
record_setup_done() {
  mkdir -p "$STATE_DIR"
  date -u +%FT%TZ >"$STATE_DIR/setup.done"
}

# Temporary files and directories are removed by an EXIT trap, not by hand: a `die`,
# a failed command under `set -e` or a SIGTERM from systemd ends the script on a path
# that would otherwise have to remember them. The scripts set no EXIT trap of their own.
# A subshell ($(...), a pipeline) keeps its own list and trap: bash does not run the
# parent's EXIT trap there, and the subshell must not remove what the parent still uses.
TEMP_PATHS=()
TEMP_PATHS_OWNER=""

# Remove the paths given (files or directories) when this shell exits, however it exits.
remove_on_exit() {
  if [ "$TEMP_PATHS_OWNER" != "$BASHPID" ]; then
    TEMP_PATHS=()
    TEMP_PATHS_OWNER=$BASHPID
    trap remove_temp_paths EXIT
  fi
  TEMP_PATHS+=("$@")
}

remove_temp_paths() {
  [ "$TEMP_PATHS_OWNER" = "$BASHPID" ] || return 0
  if [ "${#TEMP_PATHS[@]}" -gt 0 ]; then
    rm -rf -- "${TEMP_PATHS[@]}"
  fi
}

# Replace $1 with stdin's content only if it differs; prints "changed" or "unchanged".
# The new content is written beside the target, so the final mv is atomic; when it is
# not moved into place (unchanged, or a failure), the EXIT trap removes it.
install_if_changed() {
  local target=$1 mode=$2 temp
  temp=$(mktemp "$target.XXXXXX")
  remove_on_exit "$temp"
  cat >"$temp"
  chmod "$mode" "$temp"
  if [ -f "$target" ] && cmp -s "$temp" "$target"; then
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

# Run "$@" (a command or a function, in this shell) while a reporter logs "$1: still
# running after N s" every PROGRESS_SECONDS (30): a remote command that prints nothing
# for minutes (a lock wait, a quiet download, a build) looks dead to whoever watches,
# and a NAT or firewall with an idle timeout (350 s at an AWS NAT gateway) drops it.
# The step's status is the function's: under `set -e` a failure ends the script as it
# would without this wrapper. The reporter reads a pipe this shell holds: the end of
# the step (or of the script, however it ends) closes it, so the reporter never
# outlives the script and never keeps the session's stderr, and with it the remote
# command, open. It closes fds 8 and 9 (the wheelhouse and setup locks): it holds no
# lock of the script's.
with_progress() {
  local what=$1 reporter status
  shift
  exec {reporter}> >(
    exec 8>&- 9>&- >/dev/null
    interval=${PROGRESS_SECONDS:-30} started=$SECONDS
    while :; do
      read -r -t "$interval" && continue
      # Past its time limit read fails with a status above 128; at the end of input, 1.
      [ $? -gt 128 ] || exit 0
      log "$what: still running after $((SECONDS - started)) s"
    done
  )
  # Not `"$@" || status=$?`: that would turn `set -e` off inside the step.
  "$@"
  status=$?
  exec {reporter}>&-
  return "$status"
}

# --- sshd -------------------------------------------------------------------------
# sshd sends a keepalive on every session idle for 15 s, so that no NAT or firewall
# between the operator and the host drops a remote command that prints nothing for a
# while: pulumi-command's SSH client sends none (its ssh.ClientConfig has no keepalive,
# provider/pkg/provider/remote/connection.go) and sshd's ClientAliveInterval is 0 (off).
# 15 s is far inside an AWS NAT gateway's idle timeout, 350 s ("Internet connection
# drops after 350 seconds", https://docs.aws.amazon.com/vpc/latest/userguide/
# nat-gateway-troubleshooting.html#nat-gateway-troubleshooting-timeout), AWS Network
# Firewall's default 350 s, and the 30-60 s some stateful firewalls and home routers keep
# an idle TCP flow. 8 unanswered keepalives (2 minutes) end a session whose client is
# gone, while a client that merely stalls a minute keeps its command. Ubuntu 24.04's
# and Debian 12's sshd_config include sshd_config.d/*.conf first, and sshd keeps the
# first value it reads (sshd_config(5)): a drop-in named early wins over the main file.
# sshd is reloaded only when the drop-in changed: a reload re-reads the configuration
# for new sessions and cuts none (this one included); a stopped sshd (Ubuntu 24.04
# starts it from ssh.socket) reads it when it starts.
ensure_sshd_keepalive() {
  local dir=${SSHD_CONFIG_DIR:-/etc/ssh/sshd_config.d} changed
  mkdir -p "$dir"
  changed=$(printf '%s\n' "# Written by vllm-cluster (vllm-cluster-lib.sh ensure_sshd_keepalive)." \
    "ClientAliveInterval 15" "ClientAliveCountMax 8" | install_if_changed "$dir/05-vllm-cluster-keepalive.conf" 644)
  [ "$changed" = changed ] || return 0
  # sshd -t needs its privilege separation directory, which Ubuntu 24.04 makes only when
  # ssh.socket first starts sshd (at first boot nobody may have connected yet).
  mkdir -p "${SSHD_RUN_DIR:-/run/sshd}"
  sshd -t || die "sshd refuses its configuration with $dir/05-vllm-cluster-keepalive.conf (above)"
  if systemctl is-active --quiet ssh.service; then
    systemctl reload ssh.service
  fi
  log "sshd sends keepalives every 15 s ($dir/05-vllm-cluster-keepalive.conf)"
}
