#!/usr/bin/env bash
# What the deployment that start.sh made is doing: containers, API health, GPU, caches.
# Exit status 0 when the API is healthy, 1 when it is not.
set -euo pipefail
PROG=status
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  echo "Usage: scripts/status.sh [--env-file FILE]"
}

parse_args() {
  while [ $# -gt 0 ]; do
    case $1 in
      --env-file) [ $# -ge 2 ] || fail "$EX_USAGE" "--env-file needs a file name"; ENV_FILE=$2; shift ;;
      -h | --help) usage; exit 0 ;;
      *) fail "$EX_USAGE" "unknown option: $1" "see scripts/status.sh --help" ;;
    esac
    shift
  done
}

section() { printf '\n== %s\n' "$*"; }

show_containers() {
  section "containers (project $COMPOSE_PROJECT)"
  if [ -f "$COMPOSE_FILE" ]; then
    compose ps
  else
    echo "no deployment: $COMPOSE_FILE does not exist (./start.sh makes it)"
  fi
}

show_api() {
  section "API $API_URL"
  qualify deploy health --base-url "$API_URL" || return 1
  qualify deploy models --base-url "$API_URL" --model "$SERVED_MODEL_NAME" || true
}

show_gpu() {
  section "GPU $GPU_DEVICE"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,uuid,temperature.gpu,utilization.gpu,memory.used,memory.total \
      --format=csv -i "$GPU_DEVICE" || true
  else
    echo "nvidia-smi not found"
  fi
}

show_caches() {
  section "caches (named volumes)"
  local vol mount size
  while IFS= read -r vol; do
    [ -n "$vol" ] || continue
    mount=$("$CLI" volume inspect --format '{{.Mountpoint}}' "$vol" 2>/dev/null) || mount=
    size=$(du -sh "$mount" 2>/dev/null | cut -f1) || size=
    printf '%-40s %s\n' "$vol" "${size:-size unknown}"
  done < <(project_volumes)
  [ -n "$(project_volumes)" ] || echo "none (removed, or never started)"
}

main() {
  parse_args "$@"
  load_settings
  pick_python
  detect_engine
  api_url
  local healthy=0
  show_containers
  show_api || healthy=1
  show_gpu
  show_caches
  return "$healthy"
}

main "$@"
