#!/usr/bin/env bash
# One-command deploy of a qualified vLLM image on this host's NVIDIA Blackwell GPU.
#
#   preflight   driver, GPU -> target, memory, engine + compose, GPU runtime,
#               disk, port; nothing pulled or started yet
#   trust gate  the release's signed manifest for that target: signature, image
#               digest and verdict; the GPU checks run on this host first unless
#               the release is already baseline for the target (--probe forces them)
#   deploy      pull by digest, compose up, wait for /health, canary completion
#
# All of it runs in `python -m qualify deploy start` (qualify/deploy/run.py);
# this script finds the toolkit's Python and hands over.
# Settings: .env (made from .env.example on the first run). See --help.
set -euo pipefail
PROG=start
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/scripts/lib.sh"

usage() {
  cat <<USAGE
Usage: ./start.sh [options]

Deploys the qualified vLLM image for this host's GPU and checks that it answers.

  --dry-run                 run the preflight and the trust gate, print the compose file; start nothing
  --allow-unqualified       deploy even when the trust gate refuses the image's qualification
                            (a failing verdict, failed GPU checks, no manifest with IMAGE set);
                            never a bad signature or a different image digest
  --allow-no-gpu-runtime    accept GPU_RUNTIME=none: the container gets NO GPU (for testing the
                            deploy machinery with a stand-in server)
  --probe                   run the GPU checks on this host even when the release is baseline
  --allow-downgrade         with RELEASE_TAG set: deploy that release although this host accepted a
                            newer one (or a later promotion of it) before
  --env-file FILE           settings file (default: .env, made from .env.example when missing)
  -h, --help                this help

Exit status: 0 serving; 2 settings; 3 preflight; 4 trust gate; 5 deploy or health (on GB10 also:
unified memory ran short while the server started); 6 canary;
12 the host refused (a full disk, a permission: the message names the path); 13 a check the
release requires did not run (scripts/verify.sh); 130 interrupted.
Afterwards: scripts/status.sh, scripts/verify.sh [--smoke|--full], scripts/stop.sh [--purge-cache].
USAGE
}

args=()
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run | --allow-unqualified | --allow-no-gpu-runtime | --probe | --allow-downgrade) args+=("$1") ;;
    --env-file)
      [ $# -ge 2 ] || fail "$EX_USAGE" "--env-file needs a file name" "./start.sh --env-file FILE"
      args+=(--env-file "$2")
      shift ;;
    -h | --help) usage; exit 0 ;;
    *) fail "$EX_USAGE" "unknown option: $1" "see ./start.sh --help" ;;
  esac
  shift
done
hand_over start "${args[@]}"
