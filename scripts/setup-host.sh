#!/usr/bin/env bash
# Host set-up for building and qualifying Blackwell images (Debian/Ubuntu, as root).
# Idempotent: installs only what is missing, starts dockerd only when no engine answers.
set -euo pipefail

say() { printf '[setup-host] %s\n' "$*"; }
die() { printf '[setup-host] error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (it installs distribution packages and starts dockerd)"
command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian and Ubuntu hosts"

here=$(cd "$(dirname "$0")/.." && pwd)
# Debian's own client talks to Debian's 20.10 engine with BuildKit; a newer client without buildx cannot.
packages=(docker.io docker-registry debootstrap qemu-user-static binfmt-support
          podman buildah skopeo shellcheck openssl ca-certificates curl git docker-compose
          llvm)  # llvm-objcopy: the census test of libraries whose section headers were stripped

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Debian starts the packaged registry on :5000 with basic auth; we run our own on loopback instead.
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  say "distribution packages: all present"
fi

# The packaged registry service is not ours; stop it if a service manager started it.
if command -v systemctl >/dev/null && systemctl is-active --quiet docker-registry 2>/dev/null; then
  systemctl stop docker-registry || true
fi

engine_answers() { timeout 10 /usr/bin/docker info >/dev/null 2>&1; }
if engine_answers; then
  say "docker engine: answering ($(/usr/bin/docker version --format '{{.Server.Version}}' 2>/dev/null))"
else
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    say "starting docker.service"
    systemctl start docker || true
  fi
  if ! engine_answers; then
    say "starting dockerd in the background (log: /var/log/dockerd.log)"
    nohup dockerd >/var/log/dockerd.log 2>&1 &
  fi
  for _ in $(seq 1 60); do engine_answers && break; sleep 1; done
  engine_answers || die "dockerd did not answer within 60 s; see /var/log/dockerd.log"
  say "docker engine: started ($(/usr/bin/docker version --format '{{.Server.Version}}'))"
fi

# arm64 RUN steps execute under qemu; register it with binfmt_misc when it is not yet.
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || say "warning: cannot mount binfmt_misc; arm64 builds will fail"
fi
if [ -e /proc/sys/fs/binfmt_misc/register ] && [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || update-binfmts --import qemu-aarch64 >/dev/null 2>&1 || true
fi
if [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  say "binfmt: qemu-aarch64 registered"
else
  say "warning: qemu-aarch64 is not registered with binfmt_misc; arm64 targets cannot build here"
fi

# Python tooling for the sessions; the package itself is installed by nox into its own venvs.
if ! python3 -m nox --version >/dev/null 2>&1; then
  say "installing nox"
  python3 -m pip install -q -r "$here/scripts/requirements-host.txt"
fi
say "done"
