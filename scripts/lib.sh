# shellcheck shell=bash
# What start.sh and scripts/{status,stop,verify}.sh share: find the toolkit's
# Python and hand over to `python -m qualify deploy ACTION`, which does the
# work in one process. Sourced, never run.
#
# Exit codes: 2 usage or settings, 3 preflight, 4 trust gate, 5 deploy or
# health, 6 API checks, 12 the host refused (a full disk: the message names
# the path), 13 a check the release requires did not run, 130 interrupted.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly REPO
# The codes the shell part exits with itself (qualify/core/errors.py holds the table; a test compares).
# shellcheck disable=SC2034  # EX_USAGE: used by the scripts that source this file
readonly EX_USAGE=2 EX_PREFLIGHT=3
PROG=${PROG:-$(basename "$0" .sh)}

fail() {
  local code=$1 what=$2 fix
  shift 2
  printf '[%s] ERROR: %s\n' "$PROG" "$what" >&2
  for fix in "$@"; do printf '  fix: %s\n' "$fix" >&2; done
  exit "$code"
}

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
  for c in "$REPO/.venv/bin/python" python3; do  # .venv: the toolkit's (scripts/setup-host.sh makes it)
    if python_ok "$c"; then
      PY=$c
      return 0
    fi
  done
  fail "$EX_PREFLIGHT" "no Python 3.11 or newer found; the deploy runs in the toolkit's Python" \
    "install python3 (3.11+), or set QUALIFY_PYTHON to one"
}

# run_qualify COMMAND ARG...: `python -m qualify COMMAND` in the toolkit's Python; its exit status is ours.
run_qualify() {
  pick_python
  "$PY" -c 'import cryptography, elftools' 2>/dev/null || fail "$EX_PREFLIGHT" \
    "'$PY' lacks the toolkit's dependencies (cryptography, pyelftools)" \
    "bash $REPO/scripts/setup-host.sh   (it makes $REPO/.venv, which the scripts then use)" \
    "or set QUALIFY_PYTHON to a Python with the toolkit installed"
  PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m qualify "$@" --prog "$PROG"
}

# hand_over ACTION ARG...: the deploy's Python does the rest; its exit status is ours.
hand_over() { run_qualify deploy "$@"; }
