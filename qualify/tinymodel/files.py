"""The tiny model's committed files and their digests (standard library only).

The model is made once and kept in the repository (`qualify/tinymodel/model/`, about 2 MB), because float32
training is reproducible on one CPU, not across CPUs: the kernels torch and MKL pick differ by instruction set
and vendor, and on an AVX2-only EPYC the same seeded recipe never learned its needles (issue 48). Every machine
writes these bytes; `nox -s tiny-model-remake` is how they are made again (devtools/tiny_model_remake.py).

`tiny-model.json` (the stamp) lists every other file with its sha256; SHA256SUMS records them all, the stamp
included, so CI refuses a changed file, and `qualify tiny-model` checks each file it copies against the stamp.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Tuple

from qualify.core.errors import ConfigError
from qualify.core.readlimit import read_small, strict_json

MODEL_DIR = Path(__file__).resolve().parent / "model"
STAMP = "tiny-model.json"
STAMP_LIMIT = 1 << 16
FILE_LIMIT = 16 << 20  # the weights are 1.9 MB; nothing of the tiny model comes near this
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_HEX = re.compile(r"^[0-9a-f]{64}$")
REMAKE_HINT = ("restore it (git checkout -- qualify/tinymodel/model) or reinstall the toolkit; "
               "nox -s tiny-model-remake re-makes it")


@dataclass(frozen=True)
class Stamp:
    """What `tiny-model.json` says: the files with their sha256, and the stamp's own bytes."""

    files: Tuple[Tuple[str, str], ...]  # (name, sha256), sorted by name
    raw: bytes

    @property
    def digests(self) -> Dict[str, str]:
        return dict(self.files)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()


def parse_stamp(raw: bytes, where: Path) -> Stamp:
    doc = strict_json(raw, f"{where}", ConfigError)
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict) or not files:
        raise ConfigError(f"{where}: no `files` table of names and sha256", hint=REMAKE_HINT)
    for name, digest in files.items():
        if not (isinstance(name, str) and _NAME.match(name) and name != STAMP):
            raise ConfigError(f"{where}: file name {name!r} is not a plain file name", hint=REMAKE_HINT)
        if not (isinstance(digest, str) and _HEX.match(digest)):
            raise ConfigError(f"{where}: files[{name!r}] is not a sha256 (64 lower-case hex digits)", hint=REMAKE_HINT)
    return Stamp(tuple(sorted(files.items())), raw)


def read_stamp(folder: Path) -> Stamp:
    path = folder / STAMP
    return parse_stamp(read_small(path, STAMP_LIMIT, "the tiny model's stamp", ConfigError, missing_hint=REMAKE_HINT),
                       path)


def committed() -> Stamp:
    """The stamp of the files in the repository."""
    return read_stamp(MODEL_DIR)


def read_checked(folder: Path, name: str, want: str) -> bytes:
    """The bytes of `folder/name`, bounded, when their sha256 is `want`; else a ConfigError naming the file."""
    path = folder / name
    data = read_small(path, FILE_LIMIT, "tiny model file", ConfigError, missing_hint=REMAKE_HINT)
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        raise ConfigError(f"{path}: sha256 {got}, the stamp records {want}: the file was changed or damaged",
                          hint=REMAKE_HINT)
    return data


def differences(made: Mapping[str, str], want: Mapping[str, str]) -> Dict[str, str]:
    """Per file name, how `made` (name -> sha256) differs from `want`: 'differs', 'missing', 'extra'."""
    out: Dict[str, str] = {}
    for name in sorted(set(made) | set(want)):
        if name not in made:
            out[name] = "missing"
        elif name not in want:
            out[name] = "extra"
        elif made[name] != want[name]:
            out[name] = "differs"
    return out
