#!/usr/bin/env bash
# Stop and remove the deployment that start.sh made; --purge-cache also removes
# its named volumes (model download, vLLM and Triton caches).
set -euo pipefail
PROG=stop
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PURGE=0

usage() {
  cat <<USAGE
Usage: scripts/stop.sh [--purge-cache] [--env-file FILE]

Stops and removes the compose project's containers (the caches are kept).
  --purge-cache   also remove the named volumes: the next start downloads the model again
USAGE
}

parse_args() {
  while [ $# -gt 0 ]; do
    case $1 in
      --purge-cache) PURGE=1 ;;
      --env-file) [ $# -ge 2 ] || fail "$EX_USAGE" "--env-file needs a file name"; ENV_FILE=$2; shift ;;
      -h | --help) usage; exit 0 ;;
      *) fail "$EX_USAGE" "unknown option: $1" "see scripts/stop.sh --help" ;;
    esac
    shift
  done
}

# Without start.sh's compose file, remove what carries the project's label.
remove_by_label() {
  local ids
  say "no compose file at $COMPOSE_FILE; removing what is labelled com.docker.compose.project=$COMPOSE_PROJECT"
  ids=$(project_containers all)
  [ -z "$ids" ] || xargs "$CLI" rm -f <<<"$ids" >/dev/null
  ids=$("$CLI" network ls -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT")
  [ -z "$ids" ] || xargs "$CLI" network rm <<<"$ids" >/dev/null
  if ((PURGE)); then
    ids=$(project_volumes)
    [ -z "$ids" ] || xargs "$CLI" volume rm <<<"$ids" >/dev/null
  fi
}

main() {
  parse_args "$@"
  load_settings
  detect_engine
  if [ -f "$COMPOSE_FILE" ]; then
    local args=(down --remove-orphans)
    ((PURGE)) && args+=(--volumes)
    compose "${args[@]}" >&2 || fail "$EX_DEPLOY" "compose could not stop $COMPOSE_PROJECT (see above)" \
      "retry; or remove its containers: $CLI ps -a --filter label=com.docker.compose.project=$COMPOSE_PROJECT"
  else
    remove_by_label
  fi
  if ((PURGE)); then say "stopped $COMPOSE_PROJECT and removed its caches"; else say "stopped $COMPOSE_PROJECT (caches kept; --purge-cache removes them)"; fi
}

main "$@"
