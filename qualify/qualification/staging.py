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
"""

from __future__ import annotations

import hashlib
import re
import shutil
import zipfile
from pathlib import Path
from typing import Optional

from qualify.core import fsutil
from qualify.core.errors import LockError
from qualify.core.report import Reporter
from qualify.host import paths, workdirs
from qualify.imagebuild import wheelhouse
from qualify.probe import staged

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
    """The unpacked decoders for interpreter `tag` (`cpython-311-x86_64`), staged once; None when there are
    no wheels for it (another implementation, an older or newer Python): its census reads `unknown`."""
    if not supported(tag):
        return None
    m = _TAG.fullmatch(tag)
    python, machine = f"3.{m.group(1)}", m.group(2)
    dest = root() / tag
    if (dest / ".complete").exists():
        return dest if fsutil.others_can_read(dest) else fsutil.readable_by_all(dest)
    folders = [wheelhouse.prepare_into(lock, MACHINES[machine], python, root() / "wheels" / f"{tag}-{lock.stem}")
               for lock, minors in LOCKS if _minor(tag) in minors]
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = workdirs.make("decoders")  # a kill before the rename leaves it to `clean` (host/workdirs.py)
    try:
        for wheel in sorted(w for folder in folders for w in folder.glob("*.whl")):
            _unpack(wheel, tmp)
        (tmp / ".complete").write_text("")
        fsutil.readable_by_all(tmp)  # mounted into images whose user is not root
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    REPORT.say(f"decoders (and signing) for {tag}: staged in {dest}")
    return dest


def _unpack(wheel: Path, into: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if name.startswith("/") or ".." in Path(name).parts:
                raise LockError(f"{wheel.name}: unsafe member {name!r}")
            if name.startswith(SKIP) or ".dist-info/" in name:
                continue
            zf.extract(info, into)


def stage_all(platform_: str, pythons=("3.11", "3.12")) -> Path:
    """A folder with the decoders for `pythons` on `platform_` (a probe bundle: the interpreter of the image
    it serves is not known when it is built)."""
    machine = next(m for m, p in MACHINES.items() if p == platform_)
    for python in pythons:
        stage(f"cpython-3{python.split('.')[1]}-{machine}")
    return root()
