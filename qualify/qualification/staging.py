"""What is staged beside the probe for an image's interpreter (host side of probe/staged.py): the ZSTD and
LZ4 decoders the census needs (decoders.lock), and cryptography, with which a probe that runs without the
toolkit (a Kubernetes Job) signs its own evidence (signing.lock, probe/sign.py).

Why staged wheels and not the host reading the image's files: the probe then runs the same census in an
image, a deploy's GPU gate, a Kubernetes Job and a bare GPU host, with nothing but the image's own
interpreter and what is mounted read-only beside the probe; reading an image's files from the host needs
its file system on the host (podman can mount an image; Docker 20.10 cannot mount a created container,
so there it is a running container's overlay directory or a copy of gigabytes). Measured on the sm120
vLLM image: ARCHITECTURE.md.

The wheels are pinned by hash in qualify/probe/*.lock (part of probe_sha256), downloaded once into the
state folder, checked against their lock, and unpacked into
`<STATE_DIR>/probe-staged/<locks digest>/<cache tag>-<machine>/` without the parts nothing imports
(zstandard's cffi backend: 12 of its 23 MB).

What a probe run mounts is never taken from a folder anyone could have changed since (issue 37: a probe
planted in the state folder forged GPU evidence): each run gets a private folder (`private_run`: 0700, under
`<STATE_DIR>/probe-runs/`, refused when that is writable by others), the image side and pyelftools are copied
into it from this checkout and the digest of the copy is what the run records (`copy_probe`), and the
decoders are unpacked into it from wheels whose sha256 is checked against their lock on every run
(`decoders_into`). The shared stage (`stage`, for bundles) is checked before use the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import tempfile
import zipfile
from pathlib import Path
from typing import Iterator, Optional, Sequence

from qualify.core import fsutil
from qualify.core.errors import EngineError, LockError
from qualify.core.report import Reporter
from qualify.host import paths, workdirs
from qualify.imagebuild import wheelhouse
from qualify.probe import identity, staged

REPORT = Reporter("qualify")

_HERE = Path(staged.__file__).parent
# (lock, the Python minor versions it has wheels for)
LOCKS = ((_HERE / staged.LOCK, range(9, 14)), (_HERE / staged.SIGNING_LOCK, range(11, 14)))
MACHINES = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}
_TAG = re.compile(r"cpython-3(\d{1,2})-(x86_64|aarch64)")
SKIP = ("zstandard/_cffi", "zstandard/backend_cffi")  # the census imports the C backend only


def _minor(tag: str) -> int:
    m = _TAG.fullmatch(tag)
    return int(m.group(1)) if m else -1


def supported(tag: str) -> bool:
    return _minor(tag) in LOCKS[0][1]


def root() -> Path:
    h = hashlib.sha256()
    for lock, _ in LOCKS:
        h.update(lock.read_bytes())
    return paths.staged_decoders(h.hexdigest()[:12])


def stage(tag: str) -> Optional[Path]:
    """The unpacked decoders for interpreter `tag` (`cpython-311-x86_64`) in the shared stage, for a probe
    bundle; None when there are no wheels for it (another implementation, an older or newer Python): its census
    reads `unknown`. Unpacked again on every call from wheels checked against their lock now: a folder in the
    state directory is never taken as what the lock pins (a `.complete` marker proves nothing)."""
    if not supported(tag):
        return None
    dest = root() / tag
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = workdirs.make("decoders")  # a kill before the rename leaves it to `clean` (host/workdirs.py)
    try:
        for wheel in _wheels(tag):
            _unpack(wheel, tmp)
        fsutil.readable_by_all(tmp)  # mounted into images whose user is not root
        if dest.exists() or dest.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{tag}-old-", dir=dest.parent))
            os.replace(dest, old / tag)
            shutil.rmtree(old, ignore_errors=True)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    REPORT.say(f"decoders (and signing) for {tag}: staged in {dest}")
    return dest


def _wheels(tag: str) -> list:
    """The lock-checked wheels for interpreter `tag`, each hashed against its lock now (never a stamp)."""
    m = _TAG.fullmatch(tag)
    python, machine = f"3.{m.group(1)}", m.group(2)
    out = []
    for lock, minors in LOCKS:
        if _minor(tag) not in minors:
            continue
        folder = wheelhouse.prepare_into(lock, MACHINES[machine], python, root() / "wheels" / f"{tag}-{lock.stem}")
        wheelhouse.verify(folder, wheelhouse.parse_lock(lock), lock)
        out += sorted(folder.glob("*.whl"))
    return sorted(out)


def decoders_into(tag: str, into: Path) -> Optional[Path]:
    """The decoders for interpreter `tag` unpacked into `into/<tag>/` from wheels checked against their lock
    on this call; None when there are none for it."""
    if not supported(tag):
        return None
    dest = into / tag
    dest.mkdir(parents=True)
    for wheel in _wheels(tag):
        _unpack(wheel, dest)
    fsutil.readable_by_all(into)
    return dest


# --- the probe's own files ------------------------------------------------------------------------


def elftools_folder() -> Path:
    import elftools

    return Path(elftools.__file__).parent


def tree_digest(root: Path) -> str:
    """sha256 over every file under `root` (relative path and bytes, no byte-code), in name order."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")):
        if path.is_symlink():
            raise EngineError(f"{path}: a symbolic link in the probe's files; refused")
        if path.is_file():
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def copy_probe(dest: Path) -> str:
    """The image side and pyelftools copied into `dest` (created), readable by all; the sources digest of the
    copy, which is what a run from it records (identity.sources_digest over the copied files)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    (dest / "qualify").mkdir(parents=True)
    for name in identity.IMAGE_SIDE:
        src = identity.PACKAGE_ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / "qualify" / name, ignore=ignore, symlinks=True)
        else:
            shutil.copy2(src, dest / "qualify" / name)
    shutil.copytree(elftools_folder(), dest / "elftools", ignore=ignore, symlinks=True)
    fsutil.readable_by_all(dest)  # the image's user is not root
    return identity.sources_digest(dest / "qualify")


def _writable_by_others(path: Path) -> str:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if st.st_uid not in (os.geteuid(), 0):
        return f"{path} belongs to uid {st.st_uid}, not to this user"
    if st.st_mode & 0o022 and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return f"{path} is writable by its group or by others (mode {stat.filemode(st.st_mode)})"
    return ""


def stage_problem(stage: Path, digest: str) -> str:
    """Why a shared probe stage is not exactly this checkout's probe ("" when it is): every entry ours and
    not writable by others, the image side's digest `digest`, pyelftools the host's own."""
    for path in [stage, *stage.rglob("*")]:
        why = _writable_by_others(path)
        if why:
            return why
    try:
        found = identity.sources_digest(stage / "qualify")
    except OSError as exc:
        return f"its files cannot be read: {exc.strerror}"
    if found != digest:
        return f"its image side is {found}, not this checkout's {digest}"
    if not (stage / "elftools").is_dir() or tree_digest(stage / "elftools") != tree_digest(elftools_folder()):
        return "its pyelftools is not the one this host has"
    return ""


@contextlib.contextmanager
def private_run() -> Iterator[Path]:
    """A folder only this user can reach (0700), for one probe run's mounts; removed afterwards."""
    parent = paths.probe_runs()
    parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    for folder in (parent, parent.parent):
        why = _writable_by_others(folder)
        if why:
            raise EngineError(f"refusing to stage the probe: {why}", hint=f"chmod go-w {folder} (and check who "
                              "changed it: what is mounted into the probe must be this checkout's)")
    run = Path(tempfile.mkdtemp(prefix=f"run.{os.getpid()}.", dir=str(parent)))  # pid-named: clean sweeps a killed run's
    try:
        yield run
    finally:
        shutil.rmtree(run, ignore_errors=True)


def _unpack(wheel: Path, into: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if name.startswith("/") or ".." in Path(name).parts:
                raise LockError(f"{wheel.name}: unsafe member {name!r}")
            if name.startswith(SKIP) or ".dist-info/" in name:
                continue
            zf.extract(info, into)


def stage_all(platform_: str, pythons: Sequence[str]) -> Path:
    """A folder with the decoders for `pythons` on `platform_` (a probe bundle: the interpreter of the image
    it serves is not known when it is built)."""
    machine = next(m for m, p in MACHINES.items() if p == platform_)
    for python in pythons:
        stage(f"cpython-3{python.split('.')[1]}-{machine}")
    return root()
