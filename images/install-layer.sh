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
