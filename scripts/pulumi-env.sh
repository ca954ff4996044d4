# shellcheck shell=bash
# Sourced by scripts/deploy and scripts/destroy: makes the Pulumi CLI available and
# points it at a state backend and a secrets passphrase, so no Pulumi account is needed.
#
# Reads: PULUMI_BACKEND_URL, PULUMI_ACCESS_TOKEN, PULUMI_CONFIG_PASSPHRASE(_FILE),
#        VLLM_CLUSTER_HOME (default ~/.vllm-cluster). Sets project_dir.
#   state       $VLLM_CLUSTER_HOME/state       unless a backend or access token is given
#   passphrase  $VLLM_CLUSTER_HOME/passphrase  generated once, mode 600: back it up

project_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
home_dir=${VLLM_CLUSTER_HOME:-$HOME/.vllm-cluster}

usage() {
  local stacks=() file
  for file in "$project_dir"/stacks/Pulumi.*.yaml; do
    file=${file##*/Pulumi.}
    stacks+=("${file%.yaml}")
  done
  echo "usage: $0 STACK [pulumi options...]   (stacks: ${stacks[*]})" >&2
  exit 2
}

require_stack() {
  [ -n "${1:-}" ] || usage
  [ -f "$project_dir/stacks/Pulumi.$1.yaml" ] || { echo "no stack file stacks/Pulumi.$1.yaml" >&2; usage; }
}

setup_pulumi() {
  if ! command -v pulumi >/dev/null 2>&1; then
    echo "Installing the Pulumi CLI with Pulumi's official installer (get.pulumi.com)..."
    curl -fsSL https://get.pulumi.com | sh
    export PATH="$HOME/.pulumi/bin:$PATH"
  fi

  if [ -z "${PULUMI_BACKEND_URL:-}" ] && [ -z "${PULUMI_ACCESS_TOKEN:-}" ]; then
    mkdir -p "$home_dir/state"
    export PULUMI_BACKEND_URL="file://$home_dir/state"
  fi

  if [ -z "${PULUMI_CONFIG_PASSPHRASE:-}" ] && [ -z "${PULUMI_CONFIG_PASSPHRASE_FILE:-}" ]; then
    local passphrase_file="$home_dir/passphrase"
    if [ ! -f "$passphrase_file" ]; then
      mkdir -p "$home_dir"
      (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$passphrase_file")
      echo "Generated the stack secrets passphrase in $passphrase_file; back it up, it decrypts the stack's secrets."
    fi
    export PULUMI_CONFIG_PASSPHRASE_FILE="$passphrase_file"
  fi
}
