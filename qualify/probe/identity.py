"""What the probe is made of: the sha256 over the image side's own files.

The image side computes it itself (standard library only), so a probe run
anywhere, in a qualification container, a deploy's GPU gate, a Kubernetes
Job or directly on a GPU host, records which probe produced its evidence;
the host side (qualification/container.py) uses the same function to decide
whether a cached qualification is still this probe's.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterator

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
IMAGE_SIDE = ("__init__.py", "core", "probe")  # what goes into images; nothing else is hashed or mounted


def image_side_files(root: Path) -> Iterator[Path]:
    """Every file that goes into images (code and the rule data beside it), no byte-code."""
    for name in IMAGE_SIDE:
        path = root / name
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                              and p.suffix not in (".pyc", ".pyo"))
        else:
            yield path


def sources_digest(root: Path = PACKAGE_ROOT) -> str:
    h = hashlib.sha256()
    for path in image_side_files(root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return "sha256:" + h.hexdigest()
