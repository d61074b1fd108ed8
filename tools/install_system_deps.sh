#!/usr/bin/env bash
# Debian packages the CI checks need, installed only where missing (needs root or sudo; apt-get):
#   hipcc, libamdhip64-dev  the hipcc compile check of csrc/hip (tools/compile_check_gpu.sh)
# The tests need none: oneTBB for the HIP CPU runtime comes from pip (tools/setup_env.sh).
# Without apt-get it says what is missing and leaves it to the caller's checks to fail or skip.
set -euo pipefail
need=()
command -v hipcc >/dev/null 2>&1 || need+=(hipcc libamdhip64-dev)
[ ${#need[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_system_deps: no apt-get; please install: ${need[*]}" >&2
  exit 0
fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
echo "install_system_deps: installing ${need[*]}"
log=$(mktemp)
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"; } >"$log" 2>&1; then
  tail -20 "$log" >&2
  rm -f "$log"
  echo "install_system_deps: apt-get failed" >&2
  exit 1
fi
rm -f "$log"
