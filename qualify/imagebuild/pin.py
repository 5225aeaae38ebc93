"""`nox -s pin`: re-resolve each base tag to its current digest and rewrite
images/targets.toml with tomlkit (comments, order and layout are kept).

Resolution asks the registry itself through skopeo (`inspect --raw`: the
bytes served for the tag, so a multi-arch tag gives its index digest).
Every tag is resolved before anything is written: one unreachable registry
changes nothing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import tomlkit

from qualify.config.imageref import ImageRef
from qualify.config.targets import DEFAULT_TARGETS_FILE, load
from qualify.core.errors import ConfigError, RegistryError
from qualify.core.fsutil import write_atomic
from qualify.host import tables

DOCKER_HUB = "registry-1.docker.io"


@dataclass(frozen=True)
class PinChange:
    target: str
    tag: str
    old: str
    new: str

    @property
    def changed(self) -> bool:
        return self.old != self.new


def split_registry(name: str) -> tuple:
    """(registry host, repository) of an image name, Docker Hub's defaults applied."""
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return DOCKER_HUB, name if "/" in name else f"library/{name}"


def resolve(ref: ImageRef, timeout: float = 20.0) -> str:
    """The digest the registry serves now for `ref`'s tag (the index digest for a multi-arch tag:
    skopeo inspect --raw returns the bytes the registry serves; tokens and TLS are skopeo's business)."""
    from qualify.host import skopeo

    if not ref.tag:
        raise ConfigError(f"{ref}: no tag to re-resolve (pin needs name:tag@sha256:...)")
    host, repo = split_registry(ref.name)
    local = (host,) if host.startswith(("127.0.0.1", "localhost")) else ()
    try:
        raw = skopeo.inspect_raw(f"docker://{host}/{repo}:{ref.tag}", local, what=f"resolving {ref.tagged}",
                                 timeout=timeout)
    except RegistryError as exc:
        low = exc.message.lower()
        verb = "cannot reach" if any(m in low for m in ("connection refused", "no such host", "timeout",
                                                        "did not answer", "network is unreachable")) else "cannot use"
        raise RegistryError(f"{verb} {host} to resolve {ref.tagged}: {exc.message}",
                            hint="nothing was changed; run `nox -s pin` where the registry is reachable") from None
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def plan(path: Path, names: Sequence[str], resolver=resolve) -> List[PinChange]:
    tf = load(path)
    chosen = list(names) or list(tf.targets)
    changes = []
    for name in chosen:
        base = tf.get(name).base.image
        new = resolver(base)
        changes.append(PinChange(name, base.tagged, base.digest or "", new))
    return changes


def apply(path: Path, changes: Sequence[PinChange], today: Optional[str] = None) -> None:
    """Rewrite only the changed digests and their dates."""
    doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    date = today or dt.date.today().isoformat()
    for change in changes:
        if not change.changed:
            continue
        base = doc["targets"][change.target]["base"]
        base["image"] = f"{change.tag}@{change.new}"
        base["pinned"] = date
    write_atomic(path, tomlkit.dumps(doc))
    load(path)  # what we wrote must still validate


def pin(path: Path = DEFAULT_TARGETS_FILE, names: Sequence[str] = (), resolver=resolve,
        today: Optional[str] = None) -> List[PinChange]:
    changes = plan(path, names, resolver)
    if any(c.changed for c in changes):
        apply(path, changes, today)
    return changes


def table(changes: Sequence[PinChange]) -> str:
    rows = [[c.target, c.tag, c.old[:19], c.new[:19], "CHANGED" if c.changed else "unchanged"] for c in changes]
    return tables.table(rows, ["target", "tag", "old digest", "new digest", "status"], rule=False)


def as_json(changes: Sequence[PinChange]) -> List[Dict[str, object]]:
    return [{"target": c.target, "tag": c.tag, "old": c.old, "new": c.new, "changed": c.changed} for c in changes]
