#!/usr/bin/env bash
# What the deployment that start.sh made is doing: containers, API health, GPU, caches.
# Exit status 0 when the API is healthy, 1 when it is not. The work: `python -m qualify deploy status`.
set -euo pipefail
PROG=status
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

args=()
while [ $# -gt 0 ]; do
  case $1 in
    --env-file) [ $# -ge 2 ] || fail "$EX_USAGE" "--env-file needs a file name"; args+=(--env-file "$2"); shift ;;
    -h | --help) echo "Usage: scripts/status.sh [--env-file FILE]"; exit 0 ;;
    *) fail "$EX_USAGE" "unknown option: $1" "see scripts/status.sh --help" ;;
  esac
  shift
done
hand_over status "${args[@]}"
