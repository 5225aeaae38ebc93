"""Debian root filesystems made with debootstrap (scripts/debian-rootfs.sh),
cached by everything that goes into them, so a rerun costs nothing."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Optional, Sequence

from qualify.config.targets import REPO_ROOT
from qualify.core.report import Reporter
from qualify.host import cmd, paths, workdirs

REPORT = Reporter("rootfs")

SCRIPT = REPO_ROOT / "scripts" / "debian-rootfs.sh"
# Fixed so that two hosts make the same tarball from the same mirror state.
DEFAULT_EPOCH = "1764374400"  # 2025-11-29T00:00:00Z


def source_date_epoch() -> str:
    return os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH)


def debian_rootfs(arch: str, suite: str, mirror: str, packages: Sequence[str], cache_dir: Optional[Path] = None) -> Path:
    """Path of a normalised rootfs tarball for `arch` holding `packages`."""
    key = hashlib.sha256(
        "\n".join([SCRIPT.read_text(), arch, suite, mirror, ",".join(sorted(packages)), source_date_epoch()]).encode()
    ).hexdigest()[:16]
    out = paths.rootfs_cache(cache_dir) / f"debian-{suite}-{arch}-{key}.tar"
    if out.exists():
        return out
    workdirs.sweep(("rootfs",), root=cache_dir)  # what a killed debootstrap left (its proc mount too)
    REPORT.say(f"debootstrap {suite} {arch} (+{len(packages)} packages); about 1 min, more under qemu")
    start = time.monotonic()
    cmd.call(
        ["bash", str(SCRIPT), "--arch", arch, "--suite", suite, "--mirror", mirror, "--out", str(out),
         "--include", ",".join(sorted(packages)), "--work-dir", str(paths.work_dirs(cache_dir))],
        env={"SOURCE_DATE_EPOCH": source_date_epoch()},
        timeout=1800,
    )
    REPORT.say(f"{out.name} in {time.monotonic() - start:.0f} s")
    return out
