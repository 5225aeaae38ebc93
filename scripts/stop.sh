#!/usr/bin/env bash
# Stop and remove the deployment that start.sh made; --purge-cache also removes
# its named volumes (model download, vLLM and Triton caches). The work: `python -m qualify deploy stop`.
set -euo pipefail
PROG=stop
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat <<USAGE
Usage: scripts/stop.sh [--purge-cache] [--env-file FILE]

Stops and removes the compose project's containers (the caches are kept).
  --purge-cache   also remove the named volumes: the next start downloads the model again
USAGE
}

args=()
while [ $# -gt 0 ]; do
  case $1 in
    --purge-cache) args+=(--purge-cache) ;;
    --env-file) [ $# -ge 2 ] || fail "$EX_USAGE" "--env-file needs a file name"; args+=(--env-file "$2"); shift ;;
    -h | --help) usage; exit 0 ;;
    *) fail "$EX_USAGE" "unknown option: $1" "see scripts/stop.sh --help" ;;
  esac
  shift
done
hand_over stop "${args[@]}"
