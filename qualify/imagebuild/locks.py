"""Hash-locked requirements per profile, platform and Python, made with uv.

Inputs are `images/requirements/<profile>.in`; outputs are the lock files
`images/locks/<profile>-<os>-<arch>-py<python>.txt` (targets.lock_path).
Regenerating shows what changed, pin by pin, and writes atomically.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from qualify.config.targets import LOCKS_DIR, REPO_ROOT
from qualify.core.errors import ConfigError
from qualify.core.fsutil import write_atomic
from qualify.host import cmd
from qualify.imagebuild.wheelhouse import PYPI, Pin, Sources, parse_lock

REQUIREMENTS_DIR = REPO_ROOT / "images" / "requirements"
# Every `--hash=` of our locks (uv's --generate-hashes) is sha256; parse_lock keeps only the hex (Pin.hashes).
HASH_ALGORITHM = "sha256"
_HEX = re.compile(r"[0-9a-f]{64}")
_UV_PLATFORM = {"linux/amd64": "x86_64-manylinux_2_28", "linux/arm64": "aarch64-manylinux_2_28"}


@dataclass(frozen=True)
class LockChange:
    name: str
    old: Optional[str]
    new: Optional[str]


def digest_set(hexdigest: str) -> Dict[str, str]:
    """A wheel's sha256 (bare hex, as a lock and a wheelhouse hold it) as an in-toto DigestSet, {"sha256": hex}:
    the one way a lock's hashes leave for SLSA provenance and the SBOM."""
    if not _HEX.fullmatch(hexdigest):
        raise ValueError(f"not a sha256 hex digest: {hexdigest[:80]!r}")
    return {HASH_ALGORITHM: hexdigest}


def allowed_digests(pin: Pin) -> List[Dict[str, str]]:
    """One DigestSet per file the lock allows for `pin` (pip --require-hashes installs only one of them)."""
    return [digest_set(h) for h in sorted(pin.hashes)]


def input_path(profile: str) -> Path:
    path = REQUIREMENTS_DIR / f"{profile}.in"
    if not path.exists():
        raise ConfigError(f"{path}: requirements input for profile {profile!r} not found")
    return path


def omitted(profile: str) -> List[str]:
    """Requirements the lock leaves out on purpose (`images/requirements/<profile>.omit`: one name a line,
    `# why` after it); the image's `pip check` accepts exactly these as missing."""
    path = REQUIREMENTS_DIR / f"{profile}.omit"
    if not path.exists():
        return []
    names = [line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [n for n in names if n]


def hermetic_lock_path(platform: str) -> Path:
    return LOCKS_DIR / f"hermetic-cuda-{platform.replace('/', '-')}.txt"


def uv_binary() -> str:
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.exists() else shutil.which("uv")
    if not found:
        raise ConfigError("uv is not installed", hint="it is a dependency of this package: pip install -e .")
    return found


def compile_lock(profile: str, platform: str, python: str, out: Path, command_hint: str,
                 sources: Optional[Sources] = None) -> List[LockChange]:
    """Resolve `profile` for platform/python into `out`; return what changed. `sources`: where wheels come
    from besides PyPI (torch's +cpu build for the cpu target); the same in every lock of that input."""
    source = input_path(profile)
    extra = (sources or Sources()).args()
    for name in omitted(profile):
        extra += ["--no-emit-package", name]
    with tempfile.TemporaryDirectory() as tmp:
        new = Path(tmp) / out.name
        cmd.call(
            [uv_binary(), "pip", "compile", str(source.relative_to(REPO_ROOT)), "--python-version", python,
             "--python-platform", _UV_PLATFORM[platform], "--generate-hashes", "--index-url", PYPI,
             *extra, "--no-annotate", "--custom-compile-command", command_hint, "--quiet", "-o", str(new)],
            cwd=str(REPO_ROOT),
            timeout=900,
            echo=True,
        )
        changes = diff(out, new)
        write_atomic(out, new.read_bytes())
    return changes


def diff(old: Path, new: Path) -> List[LockChange]:
    before: Dict[str, str] = {p.name: p.version for p in parse_lock(old)} if old.exists() else {}
    after: Dict[str, str] = {p.name: p.version for p in parse_lock(new)}
    names = sorted(set(before) | set(after))
    return [LockChange(n, before.get(n), after.get(n)) for n in names if before.get(n) != after.get(n)]


def print_changes(path: Path, changes: List[LockChange]) -> None:
    rel = path.relative_to(REPO_ROOT)
    if not changes:
        print(f"{rel}: no version changes")
        return
    print(f"{rel}: {len(changes)} change(s)")
    for c in changes:
        if c.old is None:
            print(f"  + {c.name}=={c.new}")
        elif c.new is None:
            print(f"  - {c.name}=={c.old}")
        else:
            print(f"  ~ {c.name}: {c.old} -> {c.new}")
