#!/bin/sh
# Make sure the base has python3 with venv, and the Debian packages named as
# arguments (a target's system_packages). The hermetic base already does
# (nothing runs, no network); nvidia/cuda bases need Ubuntu's packages.
set -eu
missing=""
for pkg in "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $pkg"
done
# -B: the check must not leave .pyc files (with build-time mtimes) in the layer.
if [ -z "$missing" ] && python3 -B -c 'import ensurepip, venv' >/dev/null 2>&1; then
  exit 0
fi
command -v apt-get >/dev/null || { echo "ensure-python: no python3 and no apt-get in the base" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086  # one word per package
apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates $missing >/dev/null
rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log
