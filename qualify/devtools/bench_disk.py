"""The free disk a `nox -s bench-build` run needs, worked out before it builds anything, from what it will hold.

A vLLM run holds, at its peak, the image in the engine's storage, the registry's copy of it and, with
podman, the push's temporary copies of the layers: containers/image's storage source writes each layer's
uncompressed tar to a temporary file (TMPDIR, else /var/tmp) before it sends it, several layers at once,
which is what filled this host after 85 s of the podman push (docs/performance.md). Each need is counted on the file
system that holds its folder; where several fall on one file system they add up. A run that does not
fit stops at once, saying how much it needs, where, and how much is short.

The sizes come from the lock's own wheels (the wheelhouse is prepared first when missing: the build needs
it anyway): the installed size of a layer from its wheels' zip directories, times INSTALLED_PER_ZIP for
the bytecode pip compiles; the registry's copy from the wheels' size, times COMPRESSED_PER_WHEEL.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from qualify.core.errors import QualifyError

# Measured: the vLLM lock's wheels (4.75 GB) pushed as 6.3 GB of gzip layers beside a 0.25 GB base (1.27);
# the smoke lock's 0.25 GB as 0.28 GB (1.1). Rounded up.
COMPRESSED_PER_WHEEL = 1.35
# The zip's contents plus the .pyc files pip compiles at install: smoke 1.03 (triton: little Python); a vLLM
# payload has far more Python. Rounded up.
INSTALLED_PER_ZIP = 1.2
# Before the wheels are here, the installed size from their download size: vLLM's 4.75 GB install as 11.4 GB
# ([build] layers' comment in images/targets.toml): 2.4.
INSTALLED_PER_WHEEL = 2.5
# and the largest layer before the slices are known: nvidia's 4.6 of those 11.4 GB.
LARGEST_LAYER_SHARE = 0.4
BASE_BYTES = 1 << 30  # the hermetic base an engine lacks (696 MB measured), pulled before the first build
PUSH_COPIES = "the push's temporary copies of the layers (containers/image)"


@dataclass(frozen=True)
class Need:
    what: str
    bytes: int
    folder: Path


@dataclass(frozen=True)
class Phase:
    name: str
    needs: Tuple[Need, ...]


def installed_bytes(wheels: Sequence[Path]) -> int:
    """What the wheels take once installed: the sizes in their zip directories (read, not extracted)."""
    total = 0
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            total += sum(info.file_size for info in z.infolist())
    return int(total * INSTALLED_PER_ZIP)


def push_temp_folder() -> Path:
    """Where containers/image puts its temporary copies of big blobs: TMPDIR, else /var/tmp."""
    return Path(os.environ.get("TMPDIR") or "/var/tmp")


def profile_phases(profile: str, engine: str, storage: Path, registry: Path, scratch: Path, layers: Sequence[int],
                   wheel_bytes: int, base_missing: bool, download: bool, held: Sequence[Need] = ()) -> List[Phase]:
    """The phases of one profile's run, each with everything on disk at its peak. `layers`: the installed
    bytes of each payload layer; `scratch`: where the timed download goes; `held`: what earlier profiles of
    the run left (their images and registry copies)."""
    base = [Need("the hermetic base, which this engine lacks", BASE_BYTES, storage)] if base_missing else []
    phases = []
    if download:
        phases.append(Phase(f"{profile}: the timed wheel download (pip's temporary copy and the scratch folder)",
                            (*held, Need("the wheels, twice", 2 * wheel_bytes, scratch))))
    image_need = Need(f"the {profile} image in {engine}'s storage", sum(layers), storage)
    built = [*held, *base, image_need]
    if engine == "docker":  # BuildKit keeps a copy of the context (the wheels: hard links here) in its cache
        built.append(Need("the build context in BuildKit's cache", wheel_bytes, storage))
    phases.append(Phase(f"{profile}: the build", (*built, Need("the layer being committed", max(layers, default=0),
                                                                 storage))))
    pushed = [*built, Need(f"the registry's copy of the {profile} image", int(wheel_bytes * COMPRESSED_PER_WHEEL),
                           registry)]
    if engine == "podman":
        # The payload's layers: the base's are in the registry already, and containers/image skips a blob it finds there.
        pushed.append(Need(PUSH_COPIES, sum(layers),
                           push_temp_folder()))
    phases.append(Phase(f"{profile}: the push", tuple(pushed)))
    return phases


def _device(folder: Path) -> Tuple[int, Path]:
    """The file system of `folder` (or of its nearest existing parent: it may be made later) and its mount point."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    dev = os.stat(probe).st_dev
    while probe != probe.parent and os.stat(probe.parent).st_dev == dev:
        probe = probe.parent
    return dev, probe


def shortfalls(phases: Sequence[Phase]) -> List[str]:
    """Per file system that some phase overfills, the phase that needs the most there: what it holds, where,
    and how much is short."""
    worst: Dict[int, Tuple[int, Phase, List[Need], Path]] = {}
    for phase in phases:
        by_fs: Dict[int, List[Need]] = {}
        mounts: Dict[int, Path] = {}
        for need in phase.needs:
            dev, mount = _device(need.folder)
            by_fs.setdefault(dev, []).append(need)
            mounts[dev] = mount
        for dev, needs in by_fs.items():
            total = sum(n.bytes for n in needs)
            if dev not in worst or total > worst[dev][0]:
                worst[dev] = (total, phase, needs, mounts[dev])
    out = []
    for total, phase, needs, mount in worst.values():
        free = shutil.disk_usage(mount).free
        if total > free:
            parts = "; ".join(f"{n.what} {n.bytes / 1e9:.1f} GB ({n.folder})" for n in needs)
            out.append(f"at its peak ({phase.name}) it needs {total / 1e9:.1f} GB free on {mount}, which has "
                       f"{free / 1e9:.1f} GB: {(total - free) / 1e9:.1f} GB short. It holds then: {parts}")
    return out


def peak(phases: Sequence[Phase]) -> int:
    return max((sum(n.bytes for n in p.needs) for p in phases), default=0)


def refuse_if_short(label: str, phases: Sequence[Phase], estimated: bool = False) -> None:
    short = shortfalls(phases)
    if short:
        how = " (estimated from the index's sizes: the wheels are not here yet)" if estimated else ""
        podman = any(n.what == PUSH_COPIES for p in phases for n in p.needs)
        raise QualifyError(f"{label} does not fit on this host's disk{how}: " + "\n  ".join(short),
                           hint="free disk (`nox -s clean -- --dry-run` lists what this checkout can free)"
                                + (", point TMPDIR at a larger file system for podman's push" if podman else "")
                                + ", or run a smaller --profile")


def lasting(phase: Phase) -> Tuple[Need, ...]:
    """What a profile leaves for the next one of the run: its image, context and registry copy."""
    return tuple(n for n in phase.needs if n.what not in TRANSIENT)


TRANSIENT = frozenset({"the layer being committed", PUSH_COPIES, "the wheels, twice"})
