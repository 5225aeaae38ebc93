"""The hermetic base: Debian (debootstrap) + CUDA 13 toolchain wheels, pushed
to the loopback registry and used by its real repo digest.

For hosts that cannot pull nvidia/cuda. Nothing runs inside the image while
it is built: the wheels are unpacked on the host into the /usr/local/cuda
layout and added as a tar, so arm64 needs no emulation and the result is
reproducible (normalised times, sorted entries, numeric owners).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import zipfile
from pathlib import Path
from typing import Iterable

from qualify.config.imageref import ImageRef
from qualify.config.targets import REPO_ROOT, Target, TargetsFile
from qualify.core import fsutil
from qualify.core.report import Reporter
from qualify.host import paths, workdirs
from qualify.host.engine import BuildRequest, Engine
from qualify.host.registry import Registry
from qualify.imagebuild import locks, rootfs, wheelhouse

REPORT = Reporter("hermetic")

DOCKERFILE = REPO_ROOT / "images" / "hermetic" / "Dockerfile"
# What the base needs beyond minbase: Python for the payload, a host compiler
# for nvcc, CA certificates for anyone who later fetches over TLS.
PACKAGES = ("python3", "python3-venv", "g++", "libc6-dev", "ca-certificates")
LAYOUT_VERSION = "2"  # 2: the wheels' .dist-info and wheels.json
_WHEEL_PREFIX = "nvidia/cu13/"
_TARGET_DIR = {"amd64": "x86_64-linux", "arm64": "sbsa-linux"}
# What the base says of the wheels it unpacked (under /usr/local/cuda-<ver>/): their .dist-info folders and
# our record of them (publish/imagefs.py reads it for the SBOM).
WHEELS_DIR = "wheels"
WHEELS_RECORD = f"{WHEELS_DIR}/wheels.json"
WHEELS_SCHEMA = "https://blackwell-qualify.dev/cuda-wheels/v1"
# The wheels ship only versioned sonames; builds link against the plain names.
_LIB_LINKS = {"libcudart.so": "libcudart.so.13", "libnvvm.so": "libnvvm.so.4"}


def _tarinfo(name: str, *, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, size: int = 0,
             link: str = "", epoch: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = link
    info.mtime = epoch
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _dist_info(item: zipfile.ZipInfo) -> bool:
    """A member of the wheel's own `<name>-<version>.dist-info/` (its RECORD excepted: it lists paths under
    site-packages, where nothing of these wheels is)."""
    top, _, rest = item.filename.partition("/")
    return top.endswith(".dist-info") and "/" not in top and bool(rest) and rest != "RECORD" and not item.is_dir()


def cuda_layout_tar(wheels: Iterable[Path], arch: str, cuda: str, out: Path, epoch: int) -> Path:
    """Unpack `nvidia/cu13/*` of each wheel into `cuda-<ver>/` inside a deterministic tar, with what the image
    then says it holds: each wheel's `.dist-info` (where scanners such as syft read a Python package's name and
    version) and `wheels.json` (each wheel's file name, name, version and sha256; the SBOM reads it), both
    under `cuda-<ver>/wheels/`."""
    root = f"cuda-{cuda}"
    files = {}
    record = []
    for wheel in sorted(wheels):
        count = 0
        with zipfile.ZipFile(wheel) as zf:
            for item in zf.infolist():
                if _dist_info(item):
                    files[f"{root}/{WHEELS_DIR}/{item.filename}"] = (wheel, item.filename, 0o644)
                if item.is_dir() or not item.filename.startswith(_WHEEL_PREFIX):
                    continue
                rel = item.filename[len(_WHEEL_PREFIX):]
                if rel.startswith(".metadata/"):
                    continue
                unix_mode = (item.external_attr >> 16) & 0o777
                files[f"{root}/{rel}"] = (wheel, item.filename, 0o755 if unix_mode & 0o111 else 0o644)
                count += 1
        name, version = wheel.name.split("-")[:2]
        record.append({"file": wheel.name, "name": wheelhouse.normalise(name), "version": version,
                       "sha256": fsutil.sha256_file(wheel), "files": count})
    files[f"{root}/{WHEELS_RECORD}"] = (fsutil.canonical_json({"schema": WHEELS_SCHEMA, "cuda": cuda, "wheels": record}),
                                        "", 0o644)
    dirs = set()
    for name in files:
        parts = name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    links = {
        "cuda": root,
        f"{root}/lib64": "lib",
        f"{root}/targets/{_TARGET_DIR[arch]}/include": "../../include",
        f"{root}/targets/{_TARGET_DIR[arch]}/lib": "../../lib",
    }
    links.update({f"{root}/lib/{k}": v for k, v in _LIB_LINKS.items() if f"{root}/lib/{v}" in files})
    dirs.update({f"{root}/targets", f"{root}/targets/{_TARGET_DIR[arch]}"})
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        entries = sorted(list(dirs) + list(files) + list(links))
        for name in entries:
            if name in links:
                tar.addfile(_tarinfo(name, kind=tarfile.SYMTYPE, mode=0o777, link=links[name], epoch=epoch))
            elif name in dirs:
                tar.addfile(_tarinfo(name, kind=tarfile.DIRTYPE, mode=0o755, epoch=epoch))
            else:
                wheel, member, mode = files[name]
                if isinstance(wheel, bytes):
                    data = wheel
                else:
                    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                        data = src.read()
                tar.addfile(_tarinfo(name, mode=mode, size=len(data), epoch=epoch), io.BytesIO(data))
    os.replace(tmp, out)
    return out


def packages(target: Target) -> tuple:
    """Debian packages of the target's base: the common ones and the target's own (system_packages)."""
    return PACKAGES + tuple(p for p in target.system_packages if p not in PACKAGES)


def _key(tf: TargetsFile, target: Target, lock: Path) -> str:
    h = hashlib.sha256()
    for part in (LAYOUT_VERSION, tf.hermetic.suite, tf.hermetic.mirror, ",".join(packages(target)), target.cuda,
                 rootfs.source_date_epoch(), rootfs.SCRIPT.read_text(), DOCKERFILE.read_text(),
                 "" if target.is_cpu else lock.read_text(), Path(__file__).read_text()):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:12]


def base_tag(tf: TargetsFile, target: Target, registry: Registry) -> str:
    """`<cuda>-<suite>-<arch>-<key>`; a cpu target's base carries no CUDA: `cpu-<suite>-<arch>-<key>`."""
    lock = locks.hermetic_lock_path(target.platform)
    return (f"{registry.ref(tf.hermetic.repository)}:"
            f"{target.cuda or target.accelerator.value}-{tf.hermetic.suite}-{target.arch_tag}-{_key(tf, target, lock)}")


def ensure_base(engine: Engine, tf: TargetsFile, target: Target, registry: Registry) -> ImageRef:
    """The hermetic base for the target's platform, by repo digest; built only when missing, once."""
    registry.ensure()
    tag = base_tag(tf, target, registry)
    with fsutil.file_lock(paths.host_lock(f"hermetic-{target.arch_tag}")):  # one debootstrap at a time
        workdirs.sweep(("hermetic",))  # the build context of a base build that was killed
        return _ensure_base(engine, tf, target, registry, tag)


def _ensure_base(engine: Engine, tf: TargetsFile, target: Target, registry: Registry, tag: str) -> ImageRef:
    ref = ImageRef.parse(tag)
    repository = ref.name.split("/", 1)[1]
    digest = registry.manifest_digest(repository, ref.tag)
    if digest:
        REPORT.say(f"{tag} is in the registry ({digest[:19]}...)")
        return ref.with_digest(digest)
    lock = locks.hermetic_lock_path(target.platform)
    wheels_dir = None if target.is_cpu else wheelhouse.prepare(lock, target.platform, None)
    epoch = int(rootfs.source_date_epoch())
    rootfs_tar = rootfs.debian_rootfs(target.arch_tag, tf.hermetic.suite, tf.hermetic.mirror, packages(target))
    with workdirs.scratch("hermetic") as ctx:
        shutil.copy2(DOCKERFILE, ctx / "Dockerfile")
        os.link(rootfs_tar, ctx / "rootfs.tar")
        if wheels_dir is None:  # a cpu target's base: no CUDA toolchain (an empty tar keeps one Dockerfile)
            with tarfile.open(ctx / "cuda.tar", "w", format=tarfile.PAX_FORMAT):
                pass
        else:
            with REPORT.step("unpacking the CUDA wheels into the /usr/local/cuda layout"):
                cuda_layout_tar(sorted(wheels_dir.glob("*.whl")), target.arch_tag, target.cuda, ctx / "cuda.tar", epoch)
        labels = {
            paths.OCI_TITLE: "blackwell-qualify hermetic CUDA base",
            paths.OCI_CREATED: _iso(epoch),
            # FROM scratch: no base image, so no base.name; what the rootfs is made of, in our own key.
            paths.LABEL_ROOTFS: f"debootstrap {tf.hermetic.suite} from {tf.hermetic.mirror}",
            paths.LABEL_CUDA: target.cuda,
            paths.LABEL_CUDA_LOCK_SHA256: fsutil.sha256_file(lock),
        }
        if target.is_cpu:
            del labels[paths.LABEL_CUDA], labels[paths.LABEL_CUDA_LOCK_SHA256]
            labels[paths.OCI_TITLE] = "blackwell-qualify hermetic base (no CUDA)"
        engine.build(BuildRequest(context=ctx, dockerfile=ctx / "Dockerfile", tags=[tag], platform=target.platform,
                                  labels=labels, source_date_epoch=str(epoch)))
    with registry.storage_checked(tag):
        digest = engine.push(tag)
    REPORT.say(f"pushed {tag} as {digest}")
    return ref.with_digest(digest)


def _iso(epoch: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
