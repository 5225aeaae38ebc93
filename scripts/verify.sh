#!/usr/bin/env bash
# Check the running deployment through its API.
#   --smoke (default): /health, /v1/models serves the model, the arithmetic canary
#   --full:            and a long greedy decode that must repeat exactly, and a tool call
set -euo pipefail
PROG=verify
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

LEVEL=smoke

usage() {
  cat <<USAGE
Usage: scripts/verify.sh [--smoke | --full] [--env-file FILE]

  --smoke   health, model routing and the deterministic canary (19 x 23 = 437)
  --full    also: a long greedy decode compared twice, and a tool-call request
USAGE
}

parse_args() {
  while [ $# -gt 0 ]; do
    case $1 in
      --smoke) LEVEL=smoke ;;
      --full) LEVEL=full ;;
      --env-file) [ $# -ge 2 ] || fail "$EX_USAGE" "--env-file needs a file name"; ENV_FILE=$2; shift ;;
      -h | --help) usage; exit 0 ;;
      *) fail "$EX_USAGE" "unknown option: $1" "see scripts/verify.sh --help" ;;
    esac
    shift
  done
}

main() {
  parse_args "$@"
  load_settings
  pick_python
  api_url
  local checks=(health models canary) check passed=0 failed=0
  if [ "$LEVEL" = full ]; then
    checks+=(determinism)
    if [ -n "$TOOL_CALL_PARSER" ]; then checks+=(tool-call); else say "tool-call: skipped (TOOL_CALL_PARSER is empty)"; fi
  fi
  say "$LEVEL checks against $API_URL ($SERVED_MODEL_NAME)"
  for check in "${checks[@]}"; do
    if qualify deploy "$check" --base-url "$API_URL" --model "$SERVED_MODEL_NAME"; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
      [ "$check" = health ] && break # nothing else can answer
    fi
  done
  say "$LEVEL: $passed of ${#checks[@]} checks passed"
  ((failed == 0)) || fail "$EX_CHECK" "$failed check(s) failed against $API_URL" \
    "look at the server: $(script_hint status), or the engine's logs for project $COMPOSE_PROJECT"
}

main "$@"
