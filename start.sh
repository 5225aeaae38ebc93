#!/usr/bin/env bash
# One-command deploy of a qualified vLLM image on this host's NVIDIA Blackwell GPU.
#
#   preflight   driver, GPU -> target (qualify targets for-gpu), memory, engine
#               + compose, GPU runtime, disk, port; nothing pulled or started yet
#   trust gate  the release's signed manifest for that target: signature, image
#               digest and verdict (qualify verify); GPU checks on this host
#               first when the image was qualified only statically
#   deploy      pull by digest, compose up, wait for /health, canary completion
#
# Settings: .env (made from .env.example on the first run). See --help.
set -euo pipefail
PROG=start
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/scripts/lib.sh"

DRY_RUN=0 ALLOW_UNQUALIFIED=0 ALLOW_NO_GPU_RUNTIME=0 NEED_PROBE=0
MANIFEST='' IMAGE_REF='' GATE_REASON=''
GPU_RUN_ARGS=()

usage() {
  cat <<EOF
Usage: ./start.sh [options]

Deploys the qualified vLLM image for this host's GPU and checks that it answers.

  --dry-run                 run the preflight and the trust gate, print the compose file; start nothing
  --allow-unqualified       deploy even when the trust gate refuses the image's qualification
                            (a failing verdict, failed GPU checks, no manifest with IMAGE set);
                            never a bad signature or a different image digest
  --allow-no-gpu-runtime    accept GPU_RUNTIME=none: the container gets NO GPU (for testing the
                            deploy machinery with a stand-in server)
  --env-file FILE           settings file (default: .env, made from .env.example when missing)
  -h, --help                this help

Exit status: 0 serving; 2 settings; 3 preflight; 4 trust gate; 5 deploy or health; 6 canary.
Afterwards: scripts/status.sh, scripts/verify.sh [--smoke|--full], scripts/stop.sh [--purge-cache].
EOF
}

parse_args() {
  while [ $# -gt 0 ]; do
    case $1 in
      --dry-run) DRY_RUN=1 ;;
      --allow-unqualified) ALLOW_UNQUALIFIED=1 ;;
      --allow-no-gpu-runtime) ALLOW_NO_GPU_RUNTIME=1 ;;
      --env-file)
        [ $# -ge 2 ] || fail "$EX_USAGE" "--env-file needs a file name" "./start.sh --env-file FILE"
        ENV_FILE=$2
        shift ;;
      -h | --help) usage; exit 0 ;;
      *) fail "$EX_USAGE" "unknown option: $1" "see ./start.sh --help" ;;
    esac
    shift
  done
}

first_run_env() {
  [ -f "$ENV_FILE" ] && return 0
  cp "$REPO/.env.example" "$ENV_FILE"
  say "first run: created $ENV_FILE from .env.example; edit it to change the model, port or GPU"
}

# --- preflight: GPU ---------------------------------------------------------------

check_driver() {
  command -v nvidia-smi >/dev/null 2>&1 || fail "$EX_PREFLIGHT" \
    "no NVIDIA GPU found: nvidia-smi is not on PATH, so this host has no NVIDIA driver and no visible NVIDIA GPU" \
    "install the NVIDIA driver (570 or newer for Blackwell); it provides nvidia-smi" \
    "this deploy needs an NVIDIA Blackwell GPU: RTX 5090 / RTX PRO 6000, B200, B300, GB200 or DGX Spark (GB10)"
  local out
  out=$(timeout 30 nvidia-smi -L 2>&1) || fail "$EX_PREFLIGHT" \
    "nvidia-smi cannot reach the NVIDIA driver: $(first_line "$out")" \
    "load the driver (reboot after installing it, or: sudo modprobe nvidia), then check with nvidia-smi"
}

# query_gpu: GPU_CAP, GPU_NAME, GPU_MEM, GPU_UUID of the GPU that GPU_DEVICE names.
query_gpu() {
  local out
  out=$(timeout 30 nvidia-smi --query-gpu=compute_cap,name,memory.total,uuid --format=csv,noheader \
    -i "$GPU_DEVICE" 2>&1) || fail "$EX_PREFLIGHT" \
    "GPU_DEVICE=$GPU_DEVICE does not name a GPU on this host: $(first_line "$out")" \
    "set GPU_DEVICE in $ENV_FILE to an index or UUID that nvidia-smi -L lists: $(nvidia-smi -L 2>/dev/null | tr '\n' ' ')"
  [ "$(grep -c . <<<"$out")" -eq 1 ] || fail "$EX_PREFLIGHT" "GPU_DEVICE=$GPU_DEVICE names more than one GPU" \
    "set GPU_DEVICE in $ENV_FILE to one index or UUID"
  IFS=, read -r GPU_CAP GPU_NAME GPU_MEM GPU_UUID <<<"$out"
  GPU_CAP=$(trim "$GPU_CAP") GPU_NAME=$(trim "$GPU_NAME") GPU_MEM=$(trim "$GPU_MEM") GPU_UUID=$(trim "$GPU_UUID")
  [[ $GPU_CAP =~ ^[0-9]+\.[0-9]+$ ]] || fail "$EX_PREFLIGHT" \
    "the driver does not report the compute capability of $GPU_NAME ($GPU_CAP)" \
    "update the NVIDIA driver (570 or newer for Blackwell)"
  say "GPU $GPU_DEVICE: $GPU_NAME, compute capability $GPU_CAP, memory $GPU_MEM, $GPU_UUID"
}

# match_target: TARGET, from images/targets.toml through the toolkit (never a table here).
match_target() {
  local machine out rc=0
  machine=$(uname -m)
  out=$(qualify targets for-gpu --capability "$GPU_CAP" --machine "$machine" 2>&1) || rc=$?
  case $rc in
    0) TARGET=$out ;;
    3) fail "$EX_PREFLIGHT" "platform mismatch: $GPU_NAME (compute capability $GPU_CAP) on this $machine host. $out" \
      "images are built per CPU platform: run on a host of the platform named above (DGX Spark / GB10 is arm64)" ;;
    2) fail "$EX_PREFLIGHT" "unsupported GPU: $GPU_NAME (compute capability $GPU_CAP). $out" \
      "deploy on one of the supported GPUs, or set GPU_DEVICE in $ENV_FILE to one" ;;
    *) fail "$EX_PREFLIGHT" "cannot tell the target for capability $GPU_CAP: $out" \
      "check images/targets.toml with: python3 -m qualify targets check" ;;
  esac
  say "target: $TARGET"
}

check_memory() {
  local out
  out=$(qualify deploy memory --target "$TARGET" --memory-total "$GPU_MEM" \
    ${GPU_MEMORY_UTILIZATION:+--fraction "$GPU_MEMORY_UTILIZATION"}) ||
    fail "$EX_PREFLIGHT" "GPU memory: the model server does not fit $GPU_NAME (see above)" \
      "free memory or choose another GPU (GPU_DEVICE), then run ./start.sh again"
  MEM_FRACTION=$(kv gpu_memory_utilization <<<"$out")
  say "memory: $(kv pool_gib <<<"$out") GiB ($(kv source <<<"$out")), gpu_memory_utilization $MEM_FRACTION"
}

# --- preflight: engine, GPU runtime, disk, port -----------------------------------

nvidia_runtime_present() {
  [ "$ENGINE" = docker ] || return 1
  "$CLI" info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"nvidia"' && return 0
  command -v nvidia-container-runtime-hook >/dev/null 2>&1
}

cdi_spec_files() {
  local dir f
  for dir in $CDI_SPEC_DIRS; do
    for f in "$dir"/*.yaml "$dir"/*.yml "$dir"/*.json; do
      if [ -f "$f" ] && grep -q 'nvidia.com/gpu' "$f"; then printf '%s\n' "$f"; fi
    done
  done
}

cdi_usable() {
  [ -n "$(cdi_spec_files)" ] || return 1
  [ "$ENGINE" = podman ] && return 0
  # Docker reads CDI specs from 25 on (feature flag; default from 28); 20.10 has no such field.
  local dirs
  dirs=$("$CLI" info --format '{{json .CDISpecDirs}}' 2>/dev/null) || return 1
  [[ $dirs == \[\"* ]]
}

no_gpu_runtime() {
  if [ "$ENGINE" = podman ]; then
    fail "$EX_PREFLIGHT" "Podman cannot give the container a GPU: no CDI spec naming nvidia.com/gpu in $CDI_SPEC_DIRS" \
      "install the NVIDIA Container Toolkit and run: sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
  fi
  fail "$EX_PREFLIGHT" "Docker cannot give the container a GPU: no NVIDIA container runtime, and no usable CDI spec" \
    "install the NVIDIA Container Toolkit, then: sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker" \
    "or, with Docker 25+ and CDI enabled: sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
}

allow_no_gpu_runtime() {
  ((ALLOW_NO_GPU_RUNTIME || ALLOW_UNQUALIFIED)) || fail "$EX_PREFLIGHT" \
    "GPU_RUNTIME=none would start the server WITHOUT a GPU; refused" \
    "set GPU_RUNTIME=auto in $ENV_FILE" \
    "to test the deploy machinery with a stand-in server, pass --allow-no-gpu-runtime"
  banner "GPU_RUNTIME=none: THE CONTAINER GETS NO GPU." \
    "Only a stand-in server (testing the deploy machinery) can serve like this;" \
    "a real vLLM image will fail. Set GPU_RUNTIME=auto for a real deployment."
}

# cdi_device: the CDI name of our GPU (nvidia-ctk names devices by index and, lately, by UUID).
cdi_device() {
  if cdi_spec_files | xargs grep -lq -- "$GPU_UUID" 2>/dev/null; then
    printf '%s' "$GPU_UUID"
  elif [[ $GPU_DEVICE =~ ^[0-9]+$ ]]; then
    printf '%s' "$GPU_DEVICE"
  else
    fail "$EX_PREFLIGHT" "the CDI spec does not name $GPU_UUID" \
      "regenerate it: sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml; or set GPU_DEVICE to an index"
  fi
}

# check_gpu_runtime: RUNTIME (nvidia|cdi|none), CONTAINER_GPU and GPU_RUN_ARGS, exposing only our GPU.
check_gpu_runtime() {
  RUNTIME=$GPU_RUNTIME
  if [ "$RUNTIME" = auto ]; then
    if nvidia_runtime_present; then RUNTIME=nvidia; elif cdi_usable; then RUNTIME=cdi; else no_gpu_runtime; fi
  fi
  case $RUNTIME in
    nvidia)
      nvidia_runtime_present || no_gpu_runtime
      CONTAINER_GPU=$GPU_UUID
      GPU_RUN_ARGS=(--gpus "device=$GPU_UUID") ;;
    cdi)
      cdi_usable || no_gpu_runtime
      CONTAINER_GPU=$(cdi_device)
      GPU_RUN_ARGS=(--device "nvidia.com/gpu=$CONTAINER_GPU") ;;
    none)
      allow_no_gpu_runtime
      CONTAINER_GPU= ;;
    *) fail "$EX_USAGE" "GPU_RUNTIME=$GPU_RUNTIME: use auto, nvidia, cdi or none" "correct it in $ENV_FILE" ;;
  esac
  say "GPU runtime: $RUNTIME${CONTAINER_GPU:+ (device $CONTAINER_GPU only)}"
}

selinux_enforcing() {
  [ "$(getenforce 2>/dev/null)" = Enforcing ] || [ "$(cat /sys/fs/selinux/enforce 2>/dev/null)" = 1 ]
}

check_selinux() {
  SELINUX_OFF=0
  if [ "$ENGINE" = podman ] && selinux_enforcing; then
    SELINUX_OFF=1
    GPU_RUN_ARGS+=(--security-opt label=disable)
    say "SELinux is enforcing: the container runs with label=disable (else NVML reports 'Insufficient Permissions')"
  fi
}

engine_storage() {
  local dir
  if [ "$ENGINE" = docker ]; then
    dir=$("$CLI" info --format '{{.DockerRootDir}}' 2>/dev/null) || dir=
  else
    dir=$("$CLI" info --format '{{.Store.GraphRoot}}' 2>/dev/null) || dir=
  fi
  if [ -n "$dir" ] && [ -d "$dir" ]; then printf '%s' "$dir"; else printf '/'; fi
}

check_disk() {
  local dir free
  dir=$(engine_storage)
  free=$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 { print int($4 / 1048576) }')
  if [ -z "$free" ]; then
    warn "cannot tell the free space under $dir"
    return 0
  fi
  ((free >= MIN_FREE_DISK_GIB)) || fail "$EX_PREFLIGHT" \
    "only $free GiB free under $dir (the engine's storage, which also holds the model cache); need $MIN_FREE_DISK_GIB GiB" \
    "free space there (images you no longer need: $CLI image ls, $CLI image rm ...)" \
    "or lower MIN_FREE_DISK_GIB in $ENV_FILE if the image and model are already present"
  say "disk: $free GiB free under $dir"
}

check_port() {
  if [ -n "$(project_containers running)" ]; then
    say "port: compose project $COMPOSE_PROJECT is running already; it will be recreated"
    return 0
  fi
  qualify deploy port --address "$BIND_ADDRESS" --port "$API_PORT" || fail "$EX_PREFLIGHT" \
    "the API port $BIND_ADDRESS:$API_PORT is not free (see above)" \
    "stop what holds it, or set API_PORT (and BIND_ADDRESS) in $ENV_FILE"
  say "port: $BIND_ADDRESS:$API_PORT is free"
}

preflight() {
  say "preflight (settings: $ENV_FILE)"
  check_driver
  query_gpu
  pick_python
  match_target
  check_memory
  detect_engine
  say "engine: $ENGINE ($CLI), compose: ${COMPOSE[*]}"
  check_gpu_runtime
  check_selinux
  check_disk
  check_port
}

# --- trust gate ---------------------------------------------------------------------

# refuse_or_override REASON: stop, unless --allow-unqualified, which is announced loudly.
refuse_or_override() {
  ((ALLOW_UNQUALIFIED)) || fail "$EX_TRUST" "trust gate: REFUSED: $1" \
    "deploy a release whose manifest passes for $TARGET (RELEASE_TAG in $ENV_FILE)" \
    "or, at your own risk: ./start.sh --allow-unqualified"
  banner "--allow-unqualified: DEPLOYING AN IMAGE THE TRUST GATE REFUSED" "reason: $1" \
    "image: ${IMAGE_REF:-$IMAGE}" "Its qualification does not vouch for it on this host."
  GATE_REASON="UNQUALIFIED (--allow-unqualified): $1"
}

require_verify() {
  qualify verify --help >/dev/null 2>&1 || fail "$EX_TRUST" \
    "the trust gate cannot run: '$PY -m qualify verify' does not load (missing Python dependencies?)" \
    "python3 -m venv $REPO/.venv && $REPO/.venv/bin/pip install -e $REPO   (start.sh then uses .venv)" \
    "or set QUALIFY_PYTHON to a Python with the toolkit installed"
}

# no_release: without a manifest only --allow-unqualified with a digest-pinned IMAGE deploys.
no_release() {
  if ((ALLOW_UNQUALIFIED)) && [[ $IMAGE =~ @sha256:[0-9a-f]{64}$ ]]; then
    IMAGE_REF=$IMAGE
    refuse_or_override "no released manifest for $TARGET"
    return 0
  fi
  fail "$EX_TRUST" "trust gate: no released manifest for $TARGET (see above); nothing qualifies an image for this GPU" \
    "update this checkout to a release that has one (git pull --tags), or set RELEASE_TAG in $ENV_FILE" \
    "or, at your own risk: set IMAGE=registry/name@sha256:... in $ENV_FILE and pass --allow-unqualified"
}

# need_gpu_checks: a statically qualified image serves only after its GPU checks pass here.
need_gpu_checks() {
  say "trust gate: $GATE_REASON"
  if [ "$RUNTIME" = none ]; then
    refuse_or_override "the image is qualified only statically, and with GPU_RUNTIME=none its GPU checks cannot run here"
    return 0
  fi
  NEED_PROBE=1
}

# verify_manifest: signature and digest (never overridable), then the verdict.
verify_manifest() {
  local sig=$1 pub=$2 integrity decision qual_rc=0
  integrity=$(qualify verify "$MANIFEST" --key "$pub" --signature "$sig" --image "$IMAGE_REF" --json) ||
    fail "$EX_TRUST" "trust gate: REFUSED $MANIFEST: its signature or image digest does not verify (the failing check is named above)" \
      "do not deploy this image; restore the release files (git checkout $RELEASE_TAG -- manifests/) or fetch the release again" \
      "this refusal cannot be overridden: nothing vouches for what the image is"
  qualify verify "$MANIFEST" --key "$pub" --signature "$sig" --image "$IMAGE_REF" --require-pass --json \
    >/dev/null 2>"$TMPD/require-pass.err" || qual_rc=$?
  decision=$(qualify deploy gate --require-pass-rc "$qual_rc" <<<"$integrity")
  GATE_REASON=$(kv reason <<<"$decision")
  case $(kv action <<<"$decision") in
    deploy) say "trust gate: passed: $GATE_REASON" ;;
    probe) need_gpu_checks ;;
    *)
      cat "$TMPD/require-pass.err" >&2
      refuse_or_override "$GATE_REASON" ;;
  esac
}

trust_gate() {
  local out rc=0
  say "trust gate: release ${RELEASE_TAG:-(newest)} for $TARGET under $MANIFESTS_DIR"
  require_verify
  out=$(qualify deploy release --manifests "$MANIFESTS_DIR" --target "$TARGET" --tag "$RELEASE_TAG" \
    --image "$IMAGE" --key-fingerprint "$RELEASE_KEY_FINGERPRINT") || rc=$?
  if ((rc == 20)); then
    no_release
    return 0
  fi
  ((rc == 0)) || fail "$EX_TRUST" "trust gate: the release manifest for $TARGET cannot be used (see above)" \
    "restore the release folder from the release tag, or correct IMAGE / RELEASE_TAG in $ENV_FILE"
  RELEASE_TAG=$(kv tag <<<"$out")
  MANIFEST=$(kv manifest <<<"$out")
  IMAGE_REF=$(kv image <<<"$out")
  say "manifest: $MANIFEST; image: $IMAGE_REF"
  if [ "$(kv key_pinned <<<"$out")" = true ]; then
    say "release key: $(kv key_fingerprint <<<"$out") (pinned)"
  else
    say "release key: $(kv key_fingerprint <<<"$out"), from the release folder (pin it: RELEASE_KEY_FINGERPRINT in $ENV_FILE)"
  fi
  verify_manifest "$(kv signature <<<"$out")" "$(kv public_key <<<"$out")"
}

# --- GPU checks on this host (images qualified only statically) -----------------

# run_gpu_probe IMAGE TARGET OUTDIR: the probe's GPU checks inside the image, on our GPU.
# Contract: `qualify probe` exits 0 only when every requested check passes. One
# function, so the invocation is easy to adjust.
run_gpu_probe() {
  local image=$1 target=$2 outdir=$3 elftools
  elftools=$("$PY" -c 'import elftools, os; print(os.path.dirname(elftools.__file__))') ||
    fail "$EX_TRUST" "the probe needs pyelftools, which $PY lacks" "$PY -m pip install pyelftools==0.33"
  "$CLI" run --rm "${GPU_RUN_ARGS[@]}" -e CUDA_DEVICE_ORDER=PCI_BUS_ID \
    -v "$REPO/qualify:/opt/qualify/qualify:ro" -v "$elftools:/opt/qualify/elftools:ro" -v "$outdir:/evidence" \
    -e PYTHONPATH=/opt/qualify --entrypoint python3 "$image" \
    -m qualify probe --target "$target" --only gpu --out /evidence/gpu.json
}

gpu_evidence_file() {
  local host
  host=$(hostname -s 2>/dev/null || hostname)
  printf '%s' "${MANIFEST%.json}.gpu-evidence.${host//[^A-Za-z0-9._-]/_}.json"
}

gpu_probe_gate() {
  local outdir evidence rc=0
  outdir=$(mktemp -d "$TMPD/probe.XXXXXX")
  evidence=$(gpu_evidence_file)
  say "GPU checks: running the probe inside the image on $GPU_NAME before serving"
  run_gpu_probe "$IMAGE_REF" "$TARGET" "$outdir" || rc=$?
  if [ -f "$outdir/gpu.json" ]; then
    if cp "$outdir/gpu.json" "$evidence"; then say "GPU evidence saved: $evidence"; else warn "cannot write $evidence"; fi
  fi
  if ((rc == 0)); then
    say "GPU checks: all passed on this host"
    GATE_REASON="$GATE_REASON; GPU checks passed here"
    return 0
  fi
  refuse_or_override "the GPU checks failed on this host (probe exit $rc; evidence: $evidence)"
}

# --- deploy -------------------------------------------------------------------------

render_compose() {
  local args extra v
  args=(deploy compose --image "$IMAGE_REF" --target "$TARGET" --model "$MODEL_ID" --revision "$MODEL_REVISION"
    --served-model-name "$SERVED_MODEL_NAME" --gpu-memory-utilization "$MEM_FRACTION"
    --max-model-len "$MAX_MODEL_LEN" --gpu-runtime "$RUNTIME" --gpu-device "$CONTAINER_GPU"
    --bind-address "$BIND_ADDRESS" --port "$API_PORT" --shm-size "$SHM_SIZE" --tool-call-parser "$TOOL_CALL_PARSER"
    --health-start-period "$HEALTH_TIMEOUT_S" --label "dev.blackwell-qualify.image=$IMAGE_REF"
    --label "dev.blackwell-qualify.core.manifest=${MANIFEST:-none}" --label "dev.blackwell-qualify.gate=$GATE_REASON")
  ((SELINUX_OFF)) && args+=(--selinux-label-disable)
  read -ra extra <<<"$EXTRA_SERVE_ARGS"
  for v in "${extra[@]}"; do args+=("--extra-arg=$v"); done
  for v in $(compgen -v CONTAINER_ENV_ || true); do args+=(--env "${v#CONTAINER_ENV_}=${!v}"); done
  qualify "${args[@]}"
}

pull_image() {
  say "pulling $IMAGE_REF"
  "$CLI" pull "$IMAGE_REF" >&2 || fail "$EX_DEPLOY" "cannot pull $IMAGE_REF (see above)" \
    "check the network and the registry login ($CLI login ${IMAGE_REF%%/*})"
}

compose_up() {
  mkdir -p "$(dirname "$COMPOSE_FILE")"
  printf '%s\n' "$1" >"$COMPOSE_FILE"
  say "starting compose project $COMPOSE_PROJECT ($COMPOSE_FILE)"
  export HF_TOKEN # the compose file refers to it as ${HF_TOKEN:-}
  compose up -d --remove-orphans >&2 || fail "$EX_DEPLOY" "compose could not start the project (see above)" \
    "read the error above; $(script_hint stop) removes what was started"
  CID=$(compose ps -q "$SERVICE")
  [ -n "$CID" ] || fail "$EX_DEPLOY" "compose started no $SERVICE container" "see: ${COMPOSE[*]} -p $COMPOSE_PROJECT logs"
}

show_log_tail() {
  say "last $LOG_TAIL_LINES log lines of $SERVICE:"
  "$CLI" logs --tail "$LOG_TAIL_LINES" "$CID" 2>&1 | sed 's/^/  | /' >&2 || true
}

wait_healthy() {
  local start=$SECONDS next=0 state restarts
  say "waiting up to $HEALTH_TIMEOUT_S s for $API_URL/health (a first start downloads the model)"
  while ! qualify deploy health --base-url "$API_URL" --quiet; do
    read -r state restarts < <("$CLI" inspect --format '{{.State.Status}} {{.RestartCount}}' "$CID" 2>/dev/null ||
      echo "missing 0")
    if [[ $state == exited || $state == dead || $state == missing ]] || ((restarts >= 3)); then
      show_log_tail
      fail "$EX_DEPLOY" "the server container stopped ($state, $restarts restarts) before it became healthy" \
        "read the log above; $(script_hint stop) removes it"
    fi
    if ((SECONDS - start >= HEALTH_TIMEOUT_S)); then
      show_log_tail
      fail "$EX_DEPLOY" "the server did not become healthy within $HEALTH_TIMEOUT_S s (it is left running)" \
        "read the log above; if it is still downloading, raise HEALTH_TIMEOUT_S in $ENV_FILE or watch $(script_hint status)" \
        "$(script_hint stop) stops it"
    fi
    if ((SECONDS >= next)); then
      say "  ... $((SECONDS - start)) s of $HEALTH_TIMEOUT_S s: container $state, /health not ready yet"
      next=$((SECONDS + 10))
    fi
    sleep 2
  done
  say "healthy after $((SECONDS - start)) s"
}

canary() {
  qualify deploy canary --base-url "$API_URL" --model "$SERVED_MODEL_NAME" >&2 || {
    show_log_tail
    fail "$EX_CHECK" "the canary chat completion failed (see above)" "read the log above; $(script_hint verify --smoke) repeats it"
  }
}

summary() {
  cat <<EOF
Serving $MODEL_ID ($MODEL_REVISION) as '$SERVED_MODEL_NAME'
  API:      $API_URL/v1   (OpenAI-compatible)
  image:    $IMAGE_REF
  target:   $TARGET on $GPU_NAME ($GPU_UUID)
  trust:    $GATE_REASON
  manage:   $(script_hint status)
            $(script_hint verify --full)
            $(script_hint stop) [--purge-cache]
EOF
}

main() {
  parse_args "$@"
  first_run_env
  load_settings
  make_tmpdir
  preflight
  trust_gate
  api_url
  local compose_text
  compose_text=$(render_compose)
  if ((DRY_RUN)); then
    ((NEED_PROBE)) && say "dry run: would run the GPU checks first: $CLI run --rm ${GPU_RUN_ARGS[*]} ... $IMAGE_REF python3 -m qualify probe --target $TARGET --only gpu"
    say "dry run: preflight and trust gate passed; the compose file start.sh would write to $COMPOSE_FILE:"
    printf '%s\n' "$compose_text"
    return 0
  fi
  pull_image
  ((NEED_PROBE)) && gpu_probe_gate
  compose_up "$compose_text"
  wait_healthy
  canary
  summary
}

main "$@"
