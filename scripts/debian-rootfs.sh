#!/usr/bin/env bash
# Make a normalised Debian rootfs tarball with debootstrap (the first half of
# the hermetic base; the CUDA toolchain wheels are added by images/hermetic/Dockerfile).
#
# usage: scripts/debian-rootfs.sh --arch amd64|arm64 --suite bookworm --mirror URL --out FILE.tar [--include pkg,pkg]
#                                 [--work-dir DIR]
#
# The root is made in DIR/rootfs.<pid>.XXXXXX (default: $TMPDIR or /tmp; the toolkit passes its state
# folder's work/, where the next run and `nox -s clean` remove what a kill -9 left, proc mount included) and
# removed on exit, after unmounting what debootstrap's second stage mounted in it.
#
# Reproducibility: package versions come from the mirror at build time (record
# them: the tarball carries /var/lib/dpkg/status); everything time- or
# host-dependent is removed or normalised: apt caches and lists, logs,
# machine-id, ld.so.cache, and every mtime is set to SOURCE_DATE_EPOCH; the
# tar stream is sorted with numeric owners.
set -euo pipefail

arch="" suite="bookworm" mirror="http://deb.debian.org/debian" out="" include="" workdir="${TMPDIR:-/tmp}"
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="$2"; shift 2 ;;
    --suite) suite="$2"; shift 2 ;;
    --mirror) mirror="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --include) include="$2"; shift 2 ;;
    --work-dir) workdir="$2"; shift 2 ;;
    *) echo "debian-rootfs: unknown argument: $1" >&2; exit 2 ;;
  esac
done
if [ -z "$arch" ] || [ -z "$out" ]; then
  echo "debian-rootfs: --arch and --out are required" >&2; exit 2
fi
command -v debootstrap >/dev/null || { echo "debian-rootfs: debootstrap missing; run scripts/setup-host.sh" >&2; exit 3; }
epoch="${SOURCE_DATE_EPOCH:-0}"

mkdir -p "$workdir"
work=$(mktemp -d "$workdir/rootfs.$$.XXXXXX")
root="$work/root"
cleanup() {
  # debootstrap's second stage mounts proc (and sysfs) in the root and unmounts them only when it ends itself.
  local point
  while read -r point; do
    umount "$point" 2>/dev/null || umount --lazy "$point" 2>/dev/null || true
  done < <(awk -v r="$root" '$5 == r || index($5, r "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r)
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

host_arch=$(dpkg --print-architecture)
if [ "$arch" != "$host_arch" ]; then
  # Second stage runs under qemu-user-static through binfmt_misc.
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || { echo "debian-rootfs: qemu-aarch64 binfmt not registered; run scripts/setup-host.sh" >&2; exit 3; }
fi
inc=(--include="${include}")
[ -n "$include" ] || inc=()
echo "[debian-rootfs] debootstrap $suite $arch from $mirror" >&2
debootstrap --variant=minbase --arch="$arch" "${inc[@]}" "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -30 "$work/debootstrap.log" >&2; echo "debian-rootfs: debootstrap failed" >&2; exit 4; }

# Remove what differs between two runs of the same inputs.
rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/log/* \
       "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old "$root"/tmp/* \
       "$root"/etc/ld.so.cache "$root"/var/cache/ldconfig/aux-cache "$root"/debootstrap
find "$root" -name '__pycache__' -type d -prune -exec rm -rf {} +
: > "$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
printf 'deb %s %s main\n' "$mirror" "$suite" > "$root/etc/apt/sources.list"
printf 'nameserver 127.0.0.1\n' > "$root/etc/resolv.conf"
: > "$root/etc/hostname"

find "$root" -depth -newermt "@$epoch" -print0 | xargs -0r touch --no-dereference --date="@$epoch"
mkdir -p "$(dirname "$out")"
# Written inside the work folder (so a kill leaves nothing beside the cache), then moved into place.
tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$root" -cf "$work/out.tar" .
mv "$work/out.tar" "$out"
echo "[debian-rootfs] wrote $out ($(du -h "$out" | cut -f1))" >&2
