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
# catatonit: podman's init for `run --init` (only recommended by podman, so not installed with it).
packages=(docker.io docker-registry debootstrap binfmt-support catatonit
          podman buildah skopeo shellcheck openssl ca-certificates curl git docker-compose
          llvm  # llvm-objcopy: the census test of libraries whose section headers were stripped
          python3-venv python-is-python3)  # the toolkit's .venv (Debian refuses system-wide pip installs); `python`

# arm64 images (their RUN steps and their qualification) run under qemu-user through binfmt_misc.
# Debian 12's qemu-user 7.2 shows arm64 programs the host's x86 /proc/cpuinfo, and `import torch`
# dies on it (issue 31); bookworm-backports' qemu-user 10 shows an arm64 one. Native arm64: none.
native_arm64=no
[ "$(uname -m)" = aarch64 ] && native_arm64=yes
# shellcheck source=/dev/null
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
backports=no
if [ "$native_arm64" = no ] && [ "$codename" = bookworm ]; then
  backports=yes  # qemu-user + qemu-user-binfmt from bookworm-backports, below
else
  packages+=(qemu-user-static)  # elsewhere the distribution's (on arm64: for amd64 images, as before)
fi

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

# --- the arm64 emulator ----------------------------------------------------------------------
binfmt=/proc/sys/fs/binfmt_misc
conf=/usr/lib/binfmt.d/qemu-aarch64.conf
from_backports() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null | grep -q '~bpo12'; }

# A local arm64 image with a shell (nothing can be pulled here): the hermetic base first, else any.
arm64_image() {
  local id
  for id in $( { /usr/bin/docker image ls -q '*/*/hermetic-cuda'; /usr/bin/docker image ls -q; } | awk '!seen[$0]++'); do
    [ "$(/usr/bin/docker image inspect -f '{{.Architecture}}' "$id" 2>/dev/null)" = arm64 ] && { echo "$id"; return 0; }
  done
  return 1
}

# What broke torch: does an arm64 container's /proc/cpuinfo describe an arm64 CPU?
# Prints the image checked; 0 yes, 1 no (the host's x86 cpuinfo), 2 no image to check with, 3 the container failed.
cpu_seen() {
  local image cpuinfo
  image=$(arm64_image) || return 2
  echo "$image"
  cpuinfo=$(timeout 120 /usr/bin/docker run --rm --network none --platform linux/arm64 "$image" cat /proc/cpuinfo 2>&1) || return 3
  grep -Eq '^CPU architecture[[:space:]]*: 8$' <<<"$cpuinfo" && grep -q '^Features' <<<"$cpuinfo" &&
    ! grep -Eq '^(vendor_id|cpu family|flags)[[:space:]]*:' <<<"$cpuinfo"
}

# The live entry is the conf file's line: same interpreter, same flags (the kernel prints them as P, O, C, F).
registered_as_conf() {
  local interp flags sorted
  [ -e "$binfmt/qemu-aarch64" ] || return 1
  IFS=: read -r _ _ _ _ _ _ interp flags < <(grep -m1 '^:' "$conf")
  sorted=$(printf '%s' "$flags" | fold -w1 | sort | tr -d '\n')
  grep -qx "interpreter $interp" "$binfmt/qemu-aarch64" &&
    [ "$(sed -n 's/^flags: //p' "$binfmt/qemu-aarch64" | fold -w1 | sort | tr -d '\n')" = "$sorted" ]
}

# qemu-user 10's packages register through systemd's binfmt.d only; without a systemd that runs it the
# old entry stays in force (flag F holds its binary open), so replace it as systemd-binfmt would.
register_from_conf() {
  if [ -e /var/lib/binfmts/qemu-aarch64 ]; then
    rm -f /var/lib/binfmts/qemu-aarch64  # update-binfmts would re-register the old emulator from it
    say "binfmt: removed the stale update-binfmts entry /var/lib/binfmts/qemu-aarch64"
  fi
  if [ -e "$binfmt/qemu-aarch64" ] && ! { echo -1 > "$binfmt/qemu-aarch64"; } 2>/dev/null; then
    say "warning: cannot unregister the old qemu-aarch64 entry (binfmt_misc read-only here?)"; return 0
  fi
  if ! { printf '%s' "$(grep -m1 '^:' "$conf")" > "$binfmt/register"; } 2>/dev/null; then
    say "warning: cannot register $conf with binfmt_misc; arm64 targets cannot build here"; return 0
  fi
  say "binfmt: qemu-aarch64 registered from $conf ($(sed -n 's/^interpreter //p' "$binfmt/qemu-aarch64"), flags $(sed -n 's/^flags: //p' "$binfmt/qemu-aarch64"))"
}

if [ "$native_arm64" = yes ]; then
  say "emulator: native arm64 host, arm64 images run without one"
else
  start=$SECONDS
  if [ "$backports" = yes ]; then
    if from_backports qemu-user && from_backports qemu-user-binfmt; then
      say "emulator: qemu-user $(dpkg-query -W -f='${Version}' qemu-user) from bookworm-backports present"
    else
      list=/etc/apt/sources.list.d/bookworm-backports.list
      if [ ! -e "$list" ]; then
        # The suite is only installed from when asked (-t): apt ranks backports below bookworm otherwise.
        echo 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main' > "$list"
        say "apt: added bookworm-backports ($list), used for qemu-user and qemu-user-binfmt only"
      fi
      say "installing from bookworm-backports: qemu-user qemu-user-binfmt"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-user qemu-user-binfmt >/dev/null
      say "emulator: qemu-user $(dpkg-query -W -f='${Version}' qemu-user) installed ($((SECONDS - start)) s)"
    fi
  fi
  if [ ! -e "$binfmt/register" ]; then
    mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null || say "warning: cannot mount binfmt_misc; arm64 builds will fail"
  fi
  if [ -e "$binfmt/register" ] && [ -e "$conf" ] && [ ! -e /usr/share/binfmts/qemu-aarch64 ]; then
    # Registered through binfmt.d only (qemu-user-binfmt 10.x): bring the live entry to the conf file's.
    if registered_as_conf; then
      say "binfmt: qemu-aarch64 registered as $conf says"
    else
      register_from_conf
    fi
  elif [ -e "$binfmt/register" ] && [ ! -e "$binfmt/qemu-aarch64" ]; then
    update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || update-binfmts --import qemu-aarch64 >/dev/null 2>&1 || true
  fi
  [ -e "$binfmt/qemu-aarch64" ] || say "warning: qemu-aarch64 is not registered with binfmt_misc; arm64 targets cannot build here"

  if [ -e "$binfmt/qemu-aarch64" ]; then
    rc=0; image=$(cpu_seen) || rc=$?
    if [ "$rc" -eq 1 ] && [ -e "$conf" ] && [ ! -e /usr/share/binfmts/qemu-aarch64 ]; then
      say "binfmt: the entry holds an older emulator open (flag F); registering it again"
      register_from_conf
      rc=0; image=$(cpu_seen) || rc=$?
    fi
    case "$rc" in
      0) say "emulator: arm64 programs see an arm64 CPU (/proc/cpuinfo in an arm64 container of $image)" ;;
      2) say "emulator: not checked, no arm64 image here yet (tests/test_emulation.py checks it)" ;;
      3) say "warning: emulator not checked: an arm64 container of $image did not run" ;;
      *) msg="arm64 programs see the host's x86 /proc/cpuinfo under $(sed -n 's/^interpreter //p' "$binfmt/qemu-aarch64"): torch cannot be imported in arm64 images"
         if [ "$backports" = yes ]; then die "$msg"; fi
         say "warning: $msg (their torch-side checks will be not-run)" ;;
    esac
  fi
fi

# Python tooling for the sessions (nox), and the toolkit in the repository's .venv: `python3 -m qualify ...`
# from the repository, the nox sessions and ./start.sh all run there (qualify/toolenv.py; it reinstalls
# only when pyproject.toml changes).
if ! python3 -m nox --version >/dev/null 2>&1; then
  say "installing nox"
  python3 -m pip install -q -r "$here/scripts/requirements-host.txt"
fi
(cd "$here" && python3 -c 'from qualify import toolenv; print(toolenv.ensure())' >/dev/null) \
  || die "the toolkit's venv could not be made in $here/.venv (see above)"
say "toolkit: $here/.venv (python3 -m qualify --help lists the commands)"
# SHA256SUMS follows every commit (scripts/git-hooks/pre-commit); a hooks path someone set stays theirs.
if git -C "$here" rev-parse --git-dir >/dev/null 2>&1; then
  hooks=$(git -C "$here" config --get core.hooksPath || true)
  if [ -z "$hooks" ]; then
    git -C "$here" config core.hooksPath scripts/git-hooks
    say "git: SHA256SUMS is regenerated at each commit (core.hooksPath scripts/git-hooks)"
  elif [ "$hooks" != scripts/git-hooks ]; then
    say "git: core.hooksPath is $hooks; run scripts/git-hooks/pre-commit from yours to keep SHA256SUMS current"
  fi
fi
say "done"
