#!/usr/bin/env bash
# Check the running deployment through its API. The work: `python -m qualify deploy verify`, and for
# --matrix `python -m qualify serve-check` (the serving correctness matrix, a signed record).
#   --smoke (default): /health, /v1/models serves the model, the arithmetic canary
#   --full:            and a long greedy decode that must repeat exactly, and a tool call
#   --matrix:          the serving matrix (determinism, needles, tools, soak, providers, accuracy)
set -euo pipefail
PROG=verify
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat <<USAGE
Usage: scripts/verify.sh [--smoke | --full | --matrix [MATRIX OPTIONS]] [--env-file FILE]

  --smoke   health, model routing and the deterministic canary (19 x 23 = 437)
  --full    also: a long greedy decode compared twice, and a tool call
  --matrix  the serving correctness matrix, written as a record beside the release's manifest
            (python -m qualify serve-check; its options: --sign-key KEY, --out FILE, --reference FILE,
            --reference-model DIR, --reference-python PY, --record-reference FILE, --server-log FILE)

Exit status: 0 every check passed; 6 a check failed; 13 none failed, but one the release's signed
policy requires for the target's intended level did not run (a tool call with TOOL_CALL_PARSER
empty, needles longer than MAX_MODEL_LEN): never a pass; 2 settings.
USAGE
}

level=smoke
env_args=()
matrix_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --smoke) level=smoke ;;
    --full) level=full ;;
    --matrix) level=matrix ;;
    --env-file) [ $# -ge 2 ] || fail "$EX_USAGE" "--env-file needs a file name"; env_args=(--env-file "$2"); shift ;;
    --sign-key | --out | --reference | --reference-model | --reference-python | --record-reference | --server-log)
      [ $# -ge 2 ] || fail "$EX_USAGE" "$1 needs a value"
      matrix_args+=("$1" "$2"); shift ;;
    -h | --help) usage; exit 0 ;;
    *) fail "$EX_USAGE" "unknown option: $1" "see scripts/verify.sh --help" ;;
  esac
  shift
done
if [ "$level" = matrix ]; then
  run_qualify serve-check "${env_args[@]}" "${matrix_args[@]}"
fi
[ ${#matrix_args[@]} -eq 0 ] || fail "$EX_USAGE" "${matrix_args[0]} is an option of --matrix" "see scripts/verify.sh --help"
hand_over verify --level "$level" "${env_args[@]}"
