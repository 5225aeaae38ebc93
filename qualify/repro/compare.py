"""Explaining differences between two image archives: which config fields and
which layers differ, and inside each differing layer which files differ and
how (content, mtime, owner, mode, order, added, removed; xattr and header for
the rarer tar fields), each with the usual cause and what to do.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from qualify.repro.archive import (
    Content,
    ImageArchive,
    TarMember,
    hash_members,
    layer_stream,
    open_archive,
    read_entries,
)

# Most telling first: a content change is a real difference, an mtime usually the builder's clock.
DIFF_KINDS = ("content", "added", "removed", "mode", "owner", "xattr", "header", "order", "mtime")



@dataclass(frozen=True)
class FileDiff:
    path: str
    kind: str  # one of DIFF_KINDS
    a: str = ""  # the value in build 1 (human-readable)
    b: str = ""  # the value in build 2



@dataclass
class LayerDiff:
    index: int  # 0-based position in the image's layer list
    a: Optional[str]  # diff id (uncompressed digest) in build 1; None when the layer is only in build 2
    b: Optional[str]
    created_by: str = ""  # the build step that made the layer (from the config history)
    files: List[FileDiff] = field(default_factory=list)
    note: str = ""

    def counts(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for f in self.files:
            out[f.kind] = out.get(f.kind, 0) + 1
        return {k: out[k] for k in DIFF_KINDS if k in out}



@dataclass(frozen=True)
class ConfigDiff:
    path: str  # e.g. `.created`, `.history[3].created`
    a: str
    b: str



@dataclass
class Comparison:
    a_config: str  # sha256 of the config blob in the archive
    b_config: str
    layers_a: int
    layers_b: int
    config: List[ConfigDiff] = field(default_factory=list)
    layers: List[LayerDiff] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.a_config == self.b_config and not self.layers



def _iso(mtime: float) -> str:
    stamp = dt.datetime.fromtimestamp(mtime, dt.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S") + (f".{stamp.microsecond:06d}" if stamp.microsecond else "") + "Z"



def _owner(owner: Tuple[int, int, str, str]) -> str:
    uid, gid, uname, gname = owner
    names = f" ({uname or '-'}/{gname or '-'})" if uname or gname else ""
    return f"{uid}:{gid}{names}"



def _describe(e: TarMember) -> str:
    if e.kind == "file":
        return f"file, {e.size} B"
    if e.kind in ("symlink", "hardlink"):
        return f"{e.kind} -> {e.link}"
    return e.kind



def compare_entries(a: Dict[str, TarMember], b: Dict[str, TarMember], hashes_a: Dict[str, Content],
                    hashes_b: Dict[str, Content]) -> List[FileDiff]:
    """Every way two layers' entries differ (content judged by the hashes given)."""
    diffs: List[FileDiff] = []
    for name in sorted(set(a) | set(b)):
        ea, eb = a.get(name), b.get(name)
        if ea is None:
            diffs.append(FileDiff(name, "added", "", _describe(eb)))
            continue
        if eb is None:
            diffs.append(FileDiff(name, "removed", _describe(ea), ""))
            continue
        diffs.extend(_entry_diffs(name, ea, eb, hashes_a, hashes_b))
    order = _order_diff(a, b)
    if order:
        diffs.append(order)
    return diffs



def _entry_diffs(name: str, ea: TarMember, eb: TarMember, hashes_a: Dict[str, Content],
                 hashes_b: Dict[str, Content]) -> List[FileDiff]:
    out = []
    if ea.kind != eb.kind or ea.link != eb.link or ea.size != eb.size or ea.device != eb.device:
        out.append(FileDiff(name, "content", _describe(ea), _describe(eb)))
    elif ea.kind == "file" and hashes_a.get(name) != hashes_b.get(name):
        ca, cb = hashes_a.get(name, Content("?")), hashes_b.get(name, Content("?"))
        out.append(FileDiff(name, "content", _describe_content(ca, cb, ea.size), _describe_content(cb, ca, eb.size)))
    if ea.mode != eb.mode:
        out.append(FileDiff(name, "mode", f"{ea.mode:04o}", f"{eb.mode:04o}"))
    if ea.owner != eb.owner:
        out.append(FileDiff(name, "owner", _owner(ea.owner), _owner(eb.owner)))
    xa = {k: v for k, v in ea.pax if k.startswith("SCHILY.xattr.")}
    xb = {k: v for k, v in eb.pax if k.startswith("SCHILY.xattr.")}
    if xa != xb:
        keys = sorted(k for k in set(xa) | set(xb) if xa.get(k) != xb.get(k))
        out.append(FileDiff(name, "xattr", ", ".join(k[13:] for k in keys if k in xa) or "-",
                            ", ".join(k[13:] for k in keys if k in xb) or "-"))
    ha = {k: v for k, v in ea.pax if not k.startswith("SCHILY.xattr.")}
    hb = {k: v for k, v in eb.pax if not k.startswith("SCHILY.xattr.")}
    if ha != hb:
        keys = sorted(k for k in set(ha) | set(hb) if ha.get(k) != hb.get(k))
        out.append(FileDiff(name, "header", "; ".join(f"{k}={ha.get(k, '-')}" for k in keys),
                            "; ".join(f"{k}={hb.get(k, '-')}" for k in keys)))
    if ea.mtime != eb.mtime:
        out.append(FileDiff(name, "mtime", _iso(ea.mtime), _iso(eb.mtime)))
    return out



def _describe_content(this: Content, other: Content, size: int) -> str:
    marks = [m for m in this.marks if m not in other.marks]
    return f"sha256:{this.sha256[:16]}… {size} B" + (f", holds {', '.join(marks[:3])}" if marks else "")



def _order_diff(a: Dict[str, TarMember], b: Dict[str, TarMember]) -> Optional[FileDiff]:
    """The first entry out of place when both layers hold the same names in another order."""
    common = set(a) & set(b)
    seq_a = sorted(common, key=lambda n: a[n].position)
    seq_b = sorted(common, key=lambda n: b[n].position)
    if seq_a == seq_b:
        return None
    moved = sum(1 for x, y in zip(seq_a, seq_b) if x != y)
    first = next(i for i, (x, y) in enumerate(zip(seq_a, seq_b)) if x != y)
    name = seq_a[first]
    return FileDiff(name, "order", f"entry {first} of {len(seq_a)}",
                    f"entry {seq_b.index(name)} ({moved} entries in other positions)")



def compare_layer(a: Optional[ImageArchive], ia: int, b: Optional[ImageArchive], ib: int) -> List[FileDiff]:
    """Files that differ between layer `ia` of `a` and layer `ib` of `b` (a missing side is empty)."""
    entries_a = read_entries(layer_stream(a, ia)) if a is not None else {}
    entries_b = read_entries(layer_stream(b, ib)) if b is not None else {}
    # Hash only where the headers cannot tell: both regular files of one size.
    same_size = {n for n, e in entries_a.items()
                 if e.kind == "file" and n in entries_b and entries_b[n].kind == "file" and entries_b[n].size == e.size}
    hashes_a = hash_members(layer_stream(a, ia), same_size) if same_size else {}
    hashes_b = hash_members(layer_stream(b, ib), same_size) if same_size else {}
    return compare_entries(entries_a, entries_b, hashes_a, hashes_b)



def compare_configs(a: object, b: object, path: str = "") -> List[ConfigDiff]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: List[ConfigDiff] = []
        for key in sorted(set(a) | set(b)):
            out.extend(compare_configs(a.get(key), b.get(key), f"{path}.{key}"))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out.extend(compare_configs(x, y, f"{path}[{i}]"))
        return out
    if a == b:
        return []
    return [ConfigDiff(path or ".", _short(a), _short(b))]



def _short(value: object, width: int = 100) -> str:
    text = "-" if value is None else (value if isinstance(value, str) else json.dumps(value, sort_keys=True))
    return text if len(text) <= width else text[: width - 1] + "…"



def compare_archives(path_a: Path, path_b: Path, progress: Callable[[str], None] = lambda _: None) -> Comparison:
    a, b = open_archive(path_a), open_archive(path_b)
    result = Comparison(a_config=a.config_digest, b_config=b.config_digest,
                        layers_a=len(a.layer_members), layers_b=len(b.layer_members))
    if a.config_digest == b.config_digest:
        return result
    # rootfs.diff_ids are not "config" for the reader: the layer report below explains them.
    result.config = [d for d in compare_configs(a.config, b.config) if not d.path.startswith(".rootfs.")]
    ids_a, ids_b = _layer_ids(a), _layer_ids(b)
    steps_a, steps_b = a.layer_steps(), b.layer_steps()
    for i in range(max(len(ids_a), len(ids_b))):
        da = ids_a[i] if i < len(ids_a) else None
        db = ids_b[i] if i < len(ids_b) else None
        if da == db:
            continue
        step = (steps_b[i] if i < len(steps_b) else "") or (steps_a[i] if i < len(steps_a) else "")
        progress(f"layer {i}: reading both sides")
        start = time.monotonic()
        files = compare_layer(a if da else None, i, b if db else None, i)
        note = "" if files else ("entries and headers are identical: the tar streams differ in format, padding or "
                                 "fields tarfile does not expose")
        result.layers.append(LayerDiff(index=i, a=da, b=db, created_by=step, files=files, note=note))
        progress(f"layer {i}: {len(files)} differences in {time.monotonic() - start:.1f} s")
    return result



def _layer_ids(archive: ImageArchive) -> List[str]:
    """Uncompressed layer digests from the config; member names when the config lacks them."""
    ids = archive.diff_ids
    return ids if len(ids) == len(archive.layer_members) else list(archive.layer_members)



_CONFIG_HINTS = {
    ".container": "random id of the build container (docker-format config): podman build --format oci has none",
    ".parent": "id of the previous build step's image: differs whenever an earlier step differs",
    ".config.Image": "id of the previous build step's image: differs whenever an earlier step differs",
    ".container_config.Image": "id of the previous build step's image",
    ".created": "image creation time: clamp it (podman --timestamp, buildx SOURCE_DATE_EPOCH)",
    ".container_config.Hostname": "random hostname of the build container",
}



# (predicate, why): the usual causes, so a report says what to do, not only what differs.
_HINTS: Tuple[Tuple[Callable[[FileDiff], bool], str], ...] = (
    (lambda d: d.kind == "content" and d.path.endswith(".pyc"),
     "byte-compiled file: export SOURCE_DATE_EPOCH before pip/compileall (hash-based pycs) or do not ship pycs"),
    (lambda d: d.kind == "content" and "tmpxft_" in d.a + d.b,
     "nvcc's temporary file name (tmpxft_<pid>_<n>) is in the object's symbol table and the pid varies: link "
     "with -Xlinker --discard-all (drops local symbols) or strip --strip-unneeded"),
    (lambda d: d.kind == "content" and (d.path.endswith((".so", ".o", ".a")) or ".so." in d.path),
     "compiled object: compare the two with diffoscope (--keep keeps the tarballs)"),
    (lambda d: d.path.endswith(("etc/machine-id", "var/lib/dbus/machine-id")), "machine id: truncate it in the step"),
    (lambda d: d.path.startswith(("var/log/", "var/cache/", "root/.cache/", "tmp/")),
     "log or cache written by the build step: remove it in the same step"),
    (lambda d: d.kind == "mtime",
     "file time from the build clock: the builder does not clamp times (podman --timestamp, buildx "
     "rewrite-timestamp=true do)"),
    (lambda d: d.kind == "order", "tar entry order: the builder does not sort layer entries"),
    (lambda d: d.kind == "owner", "owner from the build host: use numeric, fixed owners (COPY --chown)"),
)


def hint_for_file(diff: FileDiff) -> str:
    return next((why for test, why in _HINTS if test(diff)), "")



def hint_for_config(diff: ConfigDiff) -> str:
    if diff.path in _CONFIG_HINTS:
        return _CONFIG_HINTS[diff.path]
    if diff.path.startswith(".history[") and diff.path.endswith(".created"):
        return "build step time"
    if diff.path.startswith(".history[") and diff.path.endswith(".comment"):
        return "the builder records the previous step's image id"
    if diff.path.startswith(".history[") and diff.path.endswith(".created_by"):
        return "the step names the copied content by its hash: see the layer below"
    if diff.path.startswith(".container_config."):
        return "the build container's settings"
    return ""



def _config_groups(diffs: Sequence[ConfigDiff]) -> List[Tuple[str, List[ConfigDiff]]]:
    """Diffs of one field across list items (history[3].created, history[4].created, ...) as one group."""
    groups: Dict[str, List[ConfigDiff]] = {}
    for d in diffs:
        groups.setdefault(re.sub(r"\[\d+\]", "[*]", d.path), []).append(d)
    out: List[Tuple[str, List[ConfigDiff]]] = []
    for key, items in groups.items():
        out.extend([(key, items)] if len(items) > 2 else [(d.path, [d]) for d in items])
    return out



def render(comparison: Comparison, max_files: int = 12) -> List[str]:
    """The difference report, most telling differences first, as lines."""
    lines: List[str] = []
    if comparison.config:
        groups = _config_groups(comparison.config)
        lines.append(f"config: {len(comparison.config)} field(s) differ")
        for key, items in groups[:max_files]:
            d = items[0]
            why = hint_for_config(d)
            what = f"{d.a} | {d.b}" if len(items) == 1 else f"{len(items)} entries differ, e.g. {d.path}: {d.a} | {d.b}"
            lines.append(f"  {key}: {what}" + (f"   [{why}]" if why else ""))
        if len(groups) > max_files:
            lines.append(f"  ... {len(groups) - max_files} more (--json for all)")
    total = max(comparison.layers_a, comparison.layers_b)
    lines.append(f"layers: {len(comparison.layers)} of {total} differ")
    for layer in comparison.layers:
        lines.extend(_render_layer(layer, max_files))
    return lines



def _render_layer(layer: LayerDiff, max_files: int) -> List[str]:
    where = {(True, False): " (only in build 1)", (False, True): " (only in build 2)"}.get(
        (layer.a is not None, layer.b is not None), "")
    step = _short(layer.created_by.replace("/bin/sh -c ", ""), 90)
    counts = ", ".join(f"{k} {n}" for k, n in layer.counts().items())
    files = len({f.path for f in layer.files})
    lines = [f"  layer {layer.index}{where}: {step or '(no history)'}",
             f"    {_digest(layer.a)} | {_digest(layer.b)}",
             f"    {files} file(s) differ" + (f": {counts}" if counts else "")]
    if layer.note:
        lines.append(f"    note: {layer.note}")
    ranked = sorted(layer.files, key=lambda f: (DIFF_KINDS.index(f.kind), f.path))
    hints: Dict[str, None] = {}
    for f in ranked[:max_files]:
        lines.append(f"    {f.kind:<8} {f.path}: {f.a or '-'} | {f.b or '-'}")
        why = hint_for_file(f)
        if why:
            hints[why] = None
    if len(ranked) > max_files:
        lines.append(f"    ... {len(ranked) - max_files} more (--json for all)")
    lines.extend(f"    why: {why}" for why in hints)
    return lines



def _digest(value: Optional[str]) -> str:
    return "-" if value is None else (value[:19] + "…" if value.startswith("sha256:") else value)



def comparison_json(comparison: Comparison, max_files: int = 1000) -> dict:
    layers = []
    for layer in comparison.layers:
        ranked = sorted(layer.files, key=lambda f: (DIFF_KINDS.index(f.kind), f.path))
        layers.append({"index": layer.index, "a": layer.a, "b": layer.b, "created_by": layer.created_by,
                       "counts": layer.counts(), "note": layer.note, "files_total": len(ranked),
                       "files": [dataclasses.asdict(f) for f in ranked[:max_files]]})
    return {"a_config": comparison.a_config, "b_config": comparison.b_config, "identical": comparison.identical,
            "layers_a": comparison.layers_a, "layers_b": comparison.layers_b,
            "config": [dataclasses.asdict(d) for d in comparison.config], "layers": layers}



def compare_tarballs(a: Path, b: Path) -> Comparison:
    """Two plain tar files compared as one layer each (a rootfs tarball)."""
    wrap = [ImageArchive(path=p, layout="tar", config_digest="", config={}, layer_members=()) for p in (a, b)]

    def stream(archive: ImageArchive) -> Iterator[Tuple[tarfile.TarInfo, tarfile.TarFile]]:
        with tarfile.open(archive.path, mode="r|*") as tar:
            for info in tar:
                yield info, tar

    ea, eb = read_entries(stream(wrap[0])), read_entries(stream(wrap[1]))
    same = {n for n, e in ea.items() if e.kind == "file" and n in eb and eb[n].size == e.size}
    files = compare_entries(ea, eb, hash_members(stream(wrap[0]), same), hash_members(stream(wrap[1]), same))
    return Comparison(a_config="", b_config="", layers_a=1, layers_b=1,
                      layers=[LayerDiff(index=0, a=str(a), b=str(b), created_by="rootfs tarball", files=files)])
