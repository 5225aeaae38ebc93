#!/usr/bin/env bash
# GPU evidence on a host with a GPU and no Docker: run the probe directly on the
# host's Python, with the same checks and manifest as inside an image.
#
# usage: scripts/gpu-evidence.sh OUT_DIR [TARGET] [EXTRA_CAPABILITIES]
#   TARGET defaults to sm120; EXTRA_CAPABILITIES (default 10.0,12.0,12.1) are
#   also cross-compiled with Triton, without needing those GPUs.
#   EVIDENCE_SIGNING_KEY=HOST.key (password in COSIGN_PASSWORD) signs the manifest
#   with this host's key, so `qualify promote` counts it once the host is enrolled.
# Needs: python3 with torch + triton, nvidia-smi, and a CUDA 13 ptxas at
# /usr/local/cuda/bin/ptxas (the wiring targets.toml names). Nothing of the
# toolkit's host side: every step runs with the standard library and what
# QUALIFY_STAGED holds (`python3 -m qualify probe-bundle --python X.Y --out DIR`
# on a host with the toolkit: pyelftools, the fatbin decoders, and cryptography
# with PyNaCl to sign). Signing uses, in this order: QUALIFY_PYTHON (a Python
# with the toolkit installed), this python3 when it can import cryptography and
# PyNaCl (staged or its own), the repository's .venv; with none of them it says
# so and exits 2, the evidence written but unsigned.
set -euo pipefail
out=${1:?usage: scripts/gpu-evidence.sh OUT_DIR [TARGET] [EXTRA_CAPABILITIES]}
target=${2:-sm120}
extra=${3:-10.0,12.0,12.1}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"

# The allocator hook goes where the interpreter processes .pth files at start-up
# (a venv's site-packages; user site is off in venvs), as it does in our images.
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp "$here/images/triton-allocator/blackwell_triton_allocator.py" "$here/images/triton-allocator/blackwell_triton_allocator.pth" "$site/"
echo "[gpu-evidence] allocator hook installed in $site" >&2

# The wiring the targets file asks for (as the image's ENV sets it).
eval "$(python3 -m qualify targets show "$target" | python3 -c 'import json,sys,shlex; d=json.load(sys.stdin); print("\n".join(f"export {k}={shlex.quote(v)}" for k,v in d["triton_env"].items()))')"
env | grep '^TRITON_' >&2

python3 -m qualify probe --target "$target" --cross-compile "$extra" --out "$out/probe-$target.json" || status=$?
echo "[gpu-evidence] probe exit ${status:-0}" >&2
python3 -m qualify show "$out/probe-$target.json" > "$out/probe-$target.txt"
if [ -n "${EVIDENCE_SIGNING_KEY:-}" ]; then
  manifest="$out/probe-$target.json"
  can_sign='from qualify.probe import staged; staged.activate(); import cryptography, nacl'
  if [ -n "${QUALIFY_PYTHON:-}" ]; then
    "$QUALIFY_PYTHON" -m qualify sign "$manifest" --key "$EVIDENCE_SIGNING_KEY" --signer builtin
  elif python3 -c "$can_sign" 2>/dev/null; then
    python3 -m qualify.probe.sign --key "$EVIDENCE_SIGNING_KEY" "$manifest"
  elif [ -x "$here/.venv/bin/python" ]; then
    "$here/.venv/bin/python" -m qualify sign "$manifest" --key "$EVIDENCE_SIGNING_KEY" --signer builtin
  else
    # No Python here can sign: the probe's signer says which one it needs, and how to stage it.
    python3 -m qualify.probe.sign --key "$EVIDENCE_SIGNING_KEY" "$manifest" || exit 2
  fi
  echo "[gpu-evidence] signed with $EVIDENCE_SIGNING_KEY: $manifest.sig" >&2
else
  echo "[gpu-evidence] not signed (EVIDENCE_SIGNING_KEY is empty): qualify promote counts only evidence an enrolled host signed" >&2
fi
exit 0
