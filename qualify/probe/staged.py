"""What the host stages beside the probe for the interpreter it runs in: ZSTD and LZ4 decoders (issue 29),
so the census inside an image reads compressed fatbin containers as the host's census does, and
cryptography, so a probe that runs without the toolkit can sign its evidence (probe/sign.py).

The host mounts (or a probe bundle carries) a folder of unpacked wheels per interpreter, named
`<cache tag>-<machine>` (`cpython-311-x86_64`), and names it in QUALIFY_STAGED. `activate` puts the one for
this interpreter first on sys.path; where there is none, the census says per library what it could not
decode. The wheels are pinned by hash in `decoders.lock` beside this file, which is part of the probe's
sources digest: a probe with other decoders is another probe. Standard library only (runs in images).
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Optional

ENV = "QUALIFY_STAGED"
LOCK = "decoders.lock"
SIGNING_LOCK = "signing.lock"  # cryptography, for probe/sign.py (Python 3.11 and newer)


def tag() -> str:
    """This interpreter's folder name: `<sys.implementation.cache_tag>-<machine>`."""
    return f"{sys.implementation.cache_tag}-{platform.machine()}"


def activate(root: Optional[str] = None) -> Optional[str]:
    """The staged folder for this interpreter, now first on sys.path; None when there is none."""
    root = root if root is not None else os.environ.get(ENV, "")
    if not root:
        return None
    folder = os.path.join(root, tag())
    if not os.path.isdir(folder):
        return None
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return folder
