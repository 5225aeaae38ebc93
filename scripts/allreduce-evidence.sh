#!/usr/bin/env bash
# The deploy's all-reduce gate on a host with several GPUs and no Docker: the probe's
# NCCL collectives (gpu.nccl-allreduce) run directly on the host's Python at world
# size TP, as scripts/gpu-evidence.sh runs the other GPU checks, and the result is
# written as a probe manifest recording the tensor-parallel size, the topology
# (nvidia-smi topo -m) and the bus bandwidth, judged by the targets file's floor.
#
# usage: scripts/allreduce-evidence.sh OUT_DIR [TP] [TARGET]
#   TP defaults to 2 (exactly TP GPUs must be visible: CUDA_VISIBLE_DEVICES chooses),
#   TARGET to sm120 (on a GPU outside the Blackwell targets the device check warns:
#   the collectives prove the check and the host, not the target).
#   Writes OUT_DIR/allreduce-tpTP.json (+ .txt, the `qualify show` rendering, and
#   -host.txt: nvidia-smi, the topology matrix and versions as read before the run).
#   EVIDENCE_SIGNING_KEY=HOST.key (password in COSIGN_PASSWORD) signs the manifest
#   (.sig, .sigstore.json); signing runs in QUALIFY_PYTHON (default: the repository's
#   .venv, else python3), which needs the toolkit's dependencies (cryptography).
# Needs: python3 with torch (CUDA build, its NCCL), nvidia-smi; nothing else (the
# probe is the standard library). Exit status: the probe's (0 pass or warn, 1 fail,
# 3 the collectives did not run).
set -euo pipefail
out=${1:?usage: scripts/allreduce-evidence.sh OUT_DIR [TP] [TARGET]}
tp=${2:-2}
target=${3:-sm120}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
# NVLink multicast stays off: on shared machines it can take the GPUs out of service. The probe passes
# the one definition of the collectives' environment (qualify/core/ncclenv.py) to its NCCL and P2P children.
name="allreduce-tp$tp"

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  uname -r
  nproc
  nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total,pci.bus_id --format=csv || true
  nvidia-smi topo -m || true
  python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.nccl.version(), torch.cuda.device_count())' || true
  git -C "$here" rev-parse HEAD 2>/dev/null || echo "no git: a copy of the working tree"
} > "$out/$name-host.txt" 2>&1
echo "[allreduce-evidence] host facts: $out/$name-host.txt" >&2

python3 -m qualify probe --target "$target" --only allreduce --tensor-parallel-size "$tp" --out "$out/$name.json" || status=$?
echo "[allreduce-evidence] probe exit ${status:-0}" >&2
python3 -m qualify show "$out/$name.json" > "$out/$name.txt"
python3 - "$out/$name.json" >&2 <<'EOF'
import json, sys
pred = json.load(open(sys.argv[1]))["predicate"]
check = next(c for c in pred["checks"] if c["id"] == "gpu.nccl-allreduce")
e = check.get("evidence") or {}
print(f"[allreduce-evidence] {check['status']}: {check['reason']}")
print(f"[allreduce-evidence] tensor_parallel_size {pred['gpu'].get('tensor_parallel_size')}, "
      f"topology {(pred['gpu'].get('topology') or {}).get('kind')}, "
      f"busbw {(e.get('bandwidth') or {}).get('busbw_gbs')} GB/s, floor {(e.get('floor') or {}).get('min_bus_gbps')}")
EOF
if [ -n "${EVIDENCE_SIGNING_KEY:-}" ]; then
  py=${QUALIFY_PYTHON:-$here/.venv/bin/python}
  [ -x "$py" ] || py=python3
  "$py" -m qualify sign "$out/$name.json" --key "$EVIDENCE_SIGNING_KEY" --signer builtin
  echo "[allreduce-evidence] signed with $EVIDENCE_SIGNING_KEY: $out/$name.json.sig" >&2
else
  echo "[allreduce-evidence] not signed (EVIDENCE_SIGNING_KEY is empty): sign it here with" \
    "python -m qualify sign $out/$name.json --key HOST.key" >&2
fi
exit "${status:-0}"
