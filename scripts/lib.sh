# shellcheck shell=bash
# Helpers shared by start.sh and scripts/{status,stop,verify}.sh; sourced, never run.
#
# Exit codes: 2 usage or settings, 3 preflight, 4 trust gate, 5 deploy or
# health, 6 API checks. Messages go to stderr; what a script produces
# (the compose file of --dry-run, status) goes to stdout.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly REPO
# shellcheck disable=SC2034  # used by the scripts that source this file
readonly EX_USAGE=2 EX_PREFLIGHT=3 EX_TRUST=4 EX_DEPLOY=5 EX_CHECK=6
# shellcheck disable=SC2034
readonly SERVICE=vllm
PROG=${PROG:-$(basename "$0" .sh)}
ENV_FILE=${ENV_FILE:-$REPO/.env}

# --- messages -------------------------------------------------------------------

say() { printf '[%s] %s\n' "$PROG" "$*" >&2; }
warn() { printf '[%s] WARNING: %s\n' "$PROG" "$*" >&2; }

# fail CODE WHAT [FIX...]: say what is wrong and how to fix it, then exit.
fail() {
  local code=$1 what=$2 fix
  shift 2
  printf '[%s] ERROR: %s\n' "$PROG" "$what" >&2
  for fix in "$@"; do printf '  fix: %s\n' "$fix" >&2; done
  exit "$code"
}

# banner LINE...: a box on stderr that nobody can miss.
banner() {
  local rule='################################################################################' line
  printf '\n%s\n' "$rule" >&2
  for line in "$@"; do printf '## %s\n' "$line" >&2; done
  printf '%s\n\n' "$rule" >&2
}

trim() {
  local s=$1
  s=${s#"${s%%[![:space:]]*}"}
  printf '%s' "${s%"${s##*[![:space:]]}"}"
}

first_line() { printf '%s' "${1%%$'\n'*}"; }

# kv KEY: the value of the first `KEY=value` line on stdin (what `qualify deploy` prints).
kv() {
  local line
  while IFS= read -r line; do
    if [[ $line == "$1="* ]]; then
      printf '%s\n' "${line#*=}"
      return 0
    fi
  done
  return 1
}

# script_hint NAME [ARG...]: how to run one of our scripts with the same settings file.
script_hint() {
  local name=$1
  shift
  printf 'scripts/%s.sh' "$name"
  [ "$ENV_FILE" = "$REPO/.env" ] || printf ' --env-file %s' "$ENV_FILE"
  [ $# -eq 0 ] || printf ' %s' "$@"
}

make_tmpdir() {
  TMPD=$(mktemp -d "${TMPDIR:-/tmp}/blackwell-$PROG.XXXXXX")
  trap 'rm -rf "$TMPD"' EXIT
}

# --- settings (.env) ------------------------------------------------------------

# unquote VALUE: strip one pair of matching quotes, or an unquoted ` # comment`.
unquote() {
  local v dq='^"([^"]*)"[[:space:]]*(#.*)?$' sq="^'([^']*)'[[:space:]]*(#.*)?\$"
  v=$(trim "$1")
  if [[ $v =~ $dq || $v =~ $sq ]]; then
    printf '%s' "${BASH_REMATCH[1]}"
  else
    v=" $v" # so that a value that is only a comment is empty
    trim "${v%%[[:space:]]#*}"
  fi
}

# The settings .env.example documents, once: " KEY1 KEY2 ... ".
KNOWN_SETTINGS=" $(sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p' "$REPO/.env.example" | tr '\n' ' ') "

known_setting() { [[ $1 == CONTAINER_ENV_* || $KNOWN_SETTINGS == *" $1 "* ]]; }

# read_env_file FILE: KEY=VALUE lines into shell variables; nothing is evaluated.
# A variable already set (by the environment or an earlier file) is kept.
read_env_file() {
  local file=$1 line key value n=0
  local blank='^[[:space:]]*(#.*)?$' pair='^[[:space:]]*(export[[:space:]]+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$'
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    line=${line%$'\r'}
    [[ $line =~ $blank ]] && continue
    [[ $line =~ $pair ]] || fail "$EX_USAGE" "$file:$n: not a KEY=VALUE line: $line" "correct or delete that line"
    key=${BASH_REMATCH[2]}
    value=$(unquote "${BASH_REMATCH[3]}")
    if ! known_setting "$key"; then
      warn "$file:$n: unknown setting $key ignored (the known ones are in .env.example)"
      continue
    fi
    [ -n "${!key+set}" ] || printf -v "$key" '%s' "$value"
  done <"$file"
}

require_int() {
  [[ ${!1} =~ ^[0-9]+$ ]] || fail "$EX_USAGE" "$1=${!1} in $ENV_FILE is not a whole number" "correct it in $ENV_FILE"
}

absolute() { if [[ $1 == /* ]]; then printf '%s' "$1"; else printf '%s' "$REPO/$1"; fi; }

# load_settings: the environment, then $ENV_FILE, then .env.example as defaults.
load_settings() {
  [ -f "$ENV_FILE" ] && read_env_file "$ENV_FILE"
  read_env_file "$REPO/.env.example"
  local n
  for n in API_PORT MAX_MODEL_LEN HEALTH_TIMEOUT_S MIN_FREE_DISK_GIB LOG_TAIL_LINES; do require_int "$n"; done
  [[ $COMPOSE_PROJECT =~ ^[a-z0-9][a-z0-9_-]*$ ]] ||
    fail "$EX_USAGE" "COMPOSE_PROJECT=$COMPOSE_PROJECT: use lower-case letters, digits, '-' and '_'" "correct it in $ENV_FILE"
  MANIFESTS_DIR=$(absolute "$MANIFESTS_DIR")
  DEPLOY_DIR=$(absolute "$DEPLOY_DIR")
  COMPOSE_FILE=$DEPLOY_DIR/$COMPOSE_PROJECT/compose.json
}

# --- the toolkit's Python -------------------------------------------------------

python_ok() { command -v "$1" >/dev/null 2>&1 && "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }

# pick_python: PY, a Python 3.11+ that runs qualify/ (QUALIFY_PYTHON, the repo's venvs, python3).
pick_python() {
  local c
  if [ -n "${QUALIFY_PYTHON:-}" ]; then
    python_ok "$QUALIFY_PYTHON" || fail "$EX_PREFLIGHT" "QUALIFY_PYTHON=$QUALIFY_PYTHON is not a Python 3.11 or newer" \
      "point QUALIFY_PYTHON at one, or unset it"
    PY=$QUALIFY_PYTHON
    return 0
  fi
  for c in "$REPO/.venv/bin/python" "$REPO/.nox/_toolkit/bin/python" python3; do
    if python_ok "$c"; then
      PY=$c
      return 0
    fi
  done
  fail "$EX_PREFLIGHT" "no Python 3.11 or newer found; start.sh asks qualify/ which target fits this GPU" \
    "install python3 (3.11+), or set QUALIFY_PYTHON to one"
}

qualify() { PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m qualify "$@"; }

# shellcheck disable=SC2034
api_url() { API_URL=$(qualify deploy url --bind-address "$BIND_ADDRESS" --port "$API_PORT"); }

# --- container engine -----------------------------------------------------------

# docker_clients: each docker client on this host once (a newer one on PATH may lack compose).
docker_clients() {
  local c p seen=" "
  for c in docker /usr/bin/docker; do
    p=$(command -v "$c" 2>/dev/null) || continue
    [[ $seen == *" $p "* ]] && continue
    seen+="$p "
    printf '%s\n' "$p"
  done
}

find_docker() {
  local c
  while IFS= read -r c; do
    if ENGINE_ERROR=$(timeout 30 "$c" info 2>&1 >/dev/null); then
      ENGINE=docker CLI=$c
      return 0
    fi
  done < <(docker_clients)
  return 1
}

find_podman() {
  command -v podman >/dev/null 2>&1 || return 1
  ENGINE_ERROR=$(timeout 60 podman info 2>&1 >/dev/null) || return 1
  ENGINE=podman CLI=podman
}

# find_compose: COMPOSE, the first compose that works with ENGINE.
find_compose() {
  local c
  if [ "$ENGINE" = docker ]; then
    while IFS= read -r c; do
      if "$c" compose version >/dev/null 2>&1; then
        COMPOSE=("$c" compose)
        return 0
      fi
    done < <(docker_clients)
    if docker-compose version >/dev/null 2>&1; then
      COMPOSE=(docker-compose)
      return 0
    fi
  elif podman-compose version >/dev/null 2>&1; then
    COMPOSE=(podman-compose)
    return 0
  fi
  return 1
}

# detect_engine: ENGINE (docker|podman), CLI (its client) and COMPOSE, or a failure saying how to get them.
detect_engine() {
  ENGINE_ERROR=
  case $CONTAINER_ENGINE in
    docker) find_docker || no_engine "Docker does not answer" ;;
    podman) find_podman || no_engine "Podman does not work" ;;
    auto) find_docker || find_podman || no_engine "no container engine answers (neither docker nor podman)" ;;
    *) fail "$EX_USAGE" "CONTAINER_ENGINE=$CONTAINER_ENGINE: use auto, docker or podman" "correct it in $ENV_FILE" ;;
  esac
  find_compose || no_compose
}

no_engine() {
  local detail=${ENGINE_ERROR:+: $(first_line "$ENGINE_ERROR")}
  case $ENGINE_ERROR in
    *"permission denied"*)
      fail "$EX_PREFLIGHT" "$1$detail" "add yourself to the docker group (sudo usermod -aG docker \$USER, then log in again), or run as root" ;;
    *)
      fail "$EX_PREFLIGHT" "$1$detail" "install Docker Engine (https://docs.docker.com/engine/install/) and start it: sudo systemctl enable --now docker" \
        "or install Podman with podman-compose" ;;
  esac
}

no_compose() {
  if [ "$ENGINE" = docker ]; then
    fail "$EX_PREFLIGHT" "Docker answers but has no compose: neither 'docker compose' nor 'docker-compose' works" \
      "install the Compose plugin (package docker-compose-plugin) or docker-compose"
  fi
  fail "$EX_PREFLIGHT" "Podman works but podman-compose does not" "install podman-compose (pip install podman-compose, or your distribution's package)"
}

compose() { "${COMPOSE[@]}" -p "$COMPOSE_PROJECT" -f "$COMPOSE_FILE" "$@"; }

# project_containers all|running: ids of this compose project's containers.
project_containers() {
  local status=()
  [ "$1" = all ] || status=(--filter "status=$1")
  "$CLI" ps -aq --filter "label=com.docker.compose.project=$COMPOSE_PROJECT" "${status[@]}"
}

project_volumes() { "$CLI" volume ls -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT"; }
