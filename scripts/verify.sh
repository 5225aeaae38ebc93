#!/usr/bin/env bash
# Check the running deployment through its API. The work: `python -m qualify deploy verify`.
#   --smoke (default): /health, /v1/models serves the model, the arithmetic canary
#   --full:            and a long greedy decode that must repeat exactly, and a tool call
set -euo pipefail
PROG=verify
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat <<USAGE
Usage: scripts/verify.sh [--smoke | --full] [--env-file FILE]

  --smoke   health, model routing and the deterministic canary (19 x 23 = 437)
  --full    also: a long greedy decode compared twice, and a tool-call request
USAGE
}

args=(--level smoke)
while [ $# -gt 0 ]; do
  case $1 in
    --smoke) args[1]=smoke ;;
    --full) args[1]=full ;;
    --env-file) [ $# -ge 2 ] || fail "$EX_USAGE" "--env-file needs a file name"; args+=(--env-file "$2"); shift ;;
    -h | --help) usage; exit 0 ;;
    *) fail "$EX_USAGE" "unknown option: $1" "see scripts/verify.sh --help" ;;
  esac
  shift
done
hand_over verify "${args[@]}"
