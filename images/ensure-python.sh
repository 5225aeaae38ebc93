#!/bin/sh
# Make sure the base has python3 with venv. The hermetic base already does
# (nothing runs, no network); nvidia/cuda bases need Ubuntu's packages.
set -eu
# -B: the check must not leave .pyc files (with build-time mtimes) in the layer.
if python3 -B -c 'import ensurepip, venv' >/dev/null 2>&1; then
  exit 0
fi
command -v apt-get >/dev/null || { echo "ensure-python: no python3 and no apt-get in the base" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates >/dev/null
rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log
