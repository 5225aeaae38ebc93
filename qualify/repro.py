"""Bit-for-bit reproducibility: build twice from clean state, compare, explain.

Two halves:
- the comparison: two image tarballs (`docker save`, `podman save --format
  docker-archive`, or OCI layout tarballs) -> which config fields and which
  layers differ, and inside each differing layer which files differ and how
  (content, mtime, owner, mode, order, added, removed; xattr and header for
  the rarer tar fields). Layer tars are streamed, never unpacked; file
  contents are hashed only where both sides have a regular file of one size.
- the driver: build #1 (no cache), save, remove what that build created, build
  #2 (no cache, same SOURCE_DATE_EPOCH), save, compare image ids and pushed
  manifest digests. `diffoci` is used for the file report when it is on PATH.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from . import build, hermetic, provenance, rootfs
from .engine import BuildRequest, Engine
from .errors import EngineError, ParseError
from .imageref import ImageRef
from .registry import STATE_DIR, Registry
from .targets import TargetsFile

# Most telling first: a content change is a real difference, an mtime usually the builder's clock.
KINDS = ("content", "added", "removed", "mode", "owner", "xattr", "header", "order", "mtime")
SCRATCH_SUFFIX = "repro"
# Tar header fields that are compared through TarInfo attributes, not as raw PAX records.
_PAX_MODELLED = {"path", "linkpath", "size", "uid", "gid", "uname", "gname", "mtime"}
_CHUNK = 1 << 20
# nvcc names its intermediate files tmpxft_<pid>_<counter>; the name lands in the object's symbol table.
_MARKS = re.compile(rb"tmpxft_[0-9a-f]{8}_[0-9a-f]{8}")


# --- data ----------------------------------------------------------------------


@dataclass(frozen=True)
class FileDiff:
    path: str
    kind: str  # one of KINDS
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
        return {k: out[k] for k in KINDS if k in out}


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


@dataclass(frozen=True)
class Content:
    """A regular file's digest, and build-time names found in it (they explain a content difference)."""

    sha256: str
    marks: Tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageArchive:
    """What a saved image tarball holds, located without unpacking it."""

    path: Path
    layout: str  # docker-archive | oci
    config_digest: str
    config: dict
    layer_members: Tuple[str, ...]  # member names of the layer blobs, in order

    @property
    def diff_ids(self) -> List[str]:
        return list((self.config.get("rootfs") or {}).get("diff_ids") or [])

    def layer_steps(self) -> List[str]:
        """The history entry (build step) that made each layer."""
        steps = [h.get("created_by", "") for h in self.config.get("history") or [] if not h.get("empty_layer")]
        return steps if len(steps) == len(self.layer_members) else [""] * len(self.layer_members)


@dataclass(frozen=True)
class Entry:
    """One tar member's header, normalised for comparison."""

    name: str
    position: int
    kind: str  # file, dir, symlink, hardlink, char, block, fifo
    size: int
    mode: int
    owner: Tuple[int, int, str, str]
    mtime: float
    link: str
    device: Tuple[int, int]
    pax: Tuple[Tuple[str, str], ...]  # records not modelled above (xattrs, atime, ctime, ...)


# --- reading archives -----------------------------------------------------------


def open_archive(path: Path) -> ImageArchive:
    """Locate config and layers in a docker-archive or OCI layout tarball."""
    with tarfile.open(path) as outer:
        names = set(outer.getnames())
        if "manifest.json" in names:
            manifest = json.loads(_read(outer, "manifest.json"))
            if not isinstance(manifest, list) or not manifest:
                raise ParseError(f"{path}: manifest.json lists no image")
            entry = manifest[0]
            config_name, layers, layout = entry["Config"], tuple(entry["Layers"]), "docker-archive"
        elif "index.json" in names:
            config_name, layers = _oci_image(outer, json.loads(_read(outer, "index.json")), path)
            layout = "oci"
        else:
            raise ParseError(f"{path}: neither manifest.json (docker-archive) nor index.json (OCI layout)",
                             hint="save with `docker save` or `podman save --format docker-archive`")
        raw = _read(outer, config_name)
    return ImageArchive(path=path, layout=layout, config_digest="sha256:" + hashlib.sha256(raw).hexdigest(),
                        config=json.loads(raw), layer_members=layers)


def _oci_image(outer: tarfile.TarFile, index: dict, path: Path) -> Tuple[str, Tuple[str, ...]]:
    for _ in range(4):  # an index may point at another index (multi-platform)
        manifests = index.get("manifests") or []
        if not manifests:
            raise ParseError(f"{path}: OCI index lists no manifest")
        doc = json.loads(_read(outer, _blob(manifests[0]["digest"])))
        if "layers" in doc:
            return _blob(doc["config"]["digest"]), tuple(_blob(layer["digest"]) for layer in doc["layers"])
        index = doc
    raise ParseError(f"{path}: OCI index nesting too deep")


def _blob(digest: str) -> str:
    algorithm, hexdigest = digest.split(":", 1)
    return f"blobs/{algorithm}/{hexdigest}"


def _read(outer: tarfile.TarFile, name: str) -> bytes:
    try:
        fh = outer.extractfile(name)
    except KeyError:
        raise ParseError(f"{outer.name}: member {name} is missing") from None
    if fh is None:
        raise ParseError(f"{outer.name}: member {name} is not a file")
    with fh:
        return fh.read()


def _layer_stream(archive: ImageArchive, index: int) -> Iterator[Tuple[tarfile.TarInfo, tarfile.TarFile]]:
    """Stream the members of one layer (gzip detected); the layer is never unpacked."""
    with tarfile.open(archive.path) as outer:
        try:
            fh = outer.extractfile(archive.layer_members[index])
        except KeyError:
            fh = None
        if fh is None:
            raise ParseError(f"{archive.path}: layer {archive.layer_members[index]} is missing or not a file")
        try:
            with tarfile.open(fileobj=fh, mode="r|*") as layer:
                for info in layer:
                    yield info, layer
        except tarfile.ReadError as exc:
            raise ParseError(f"{archive.path}: layer {index} cannot be read as tar ({exc}); "
                             "zstd layers are not supported", hint="save with docker-archive format") from None


def _name(raw: str) -> str:
    name = raw[2:] if raw.startswith("./") else raw
    return name.rstrip("/") or "."


_TYPES = {tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file", tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "symlink",
          tarfile.LNKTYPE: "hardlink", tarfile.CHRTYPE: "char", tarfile.BLKTYPE: "block", tarfile.FIFOTYPE: "fifo",
          tarfile.CONTTYPE: "file"}


def entry_of(info: tarfile.TarInfo, position: int) -> Entry:
    pax = tuple(sorted((k, v) for k, v in info.pax_headers.items() if k not in _PAX_MODELLED))
    return Entry(name=_name(info.name), position=position, kind=_TYPES.get(info.type, f"type-{info.type!r}"),
                 size=info.size if info.isreg() else 0, mode=info.mode & 0o7777,
                 owner=(info.uid, info.gid, info.uname or "", info.gname or ""), mtime=info.mtime,
                 link=info.linkname if (info.issym() or info.islnk()) else "",
                 device=(info.devmajor, info.devminor) if (info.ischr() or info.isblk()) else (0, 0), pax=pax)


def read_entries(stream: Iterator[Tuple[tarfile.TarInfo, tarfile.TarFile]]) -> Dict[str, Entry]:
    """Headers only; a later member of one name replaces an earlier one, as extraction would."""
    entries: Dict[str, Entry] = {}
    for position, (info, _) in enumerate(stream):
        entry = entry_of(info, position)
        entries[entry.name] = entry
    return entries


def hash_members(stream: Iterator[Tuple[tarfile.TarInfo, tarfile.TarFile]], wanted: Set[str]) -> Dict[str, Content]:
    """Digest of the regular members named in `wanted` (streamed, in chunks)."""
    out: Dict[str, Content] = {}
    for info, layer in stream:
        name = _name(info.name)
        if name not in wanted or not info.isreg():
            continue
        out[name] = _content(layer.extractfile(info))
    return out


def _content(fh) -> Content:
    h = hashlib.sha256()
    marks: Set[str] = set()
    tail = b""
    while fh is not None:
        block = fh.read(_CHUNK)
        if not block:
            break
        h.update(block)
        window = tail + block  # a name may straddle two chunks
        marks.update(m.decode() for m in _MARKS.findall(window))
        tail = window[-40:]
    return Content(h.hexdigest(), tuple(sorted(marks)))


# --- comparing -------------------------------------------------------------------


def _iso(mtime: float) -> str:
    stamp = dt.datetime.fromtimestamp(mtime, dt.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S") + (f".{stamp.microsecond:06d}" if stamp.microsecond else "") + "Z"


def _owner(owner: Tuple[int, int, str, str]) -> str:
    uid, gid, uname, gname = owner
    names = f" ({uname or '-'}/{gname or '-'})" if uname or gname else ""
    return f"{uid}:{gid}{names}"


def _describe(e: Entry) -> str:
    if e.kind == "file":
        return f"file, {e.size} B"
    if e.kind in ("symlink", "hardlink"):
        return f"{e.kind} -> {e.link}"
    return e.kind


def compare_entries(a: Dict[str, Entry], b: Dict[str, Entry], hashes_a: Dict[str, Content],
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


def _entry_diffs(name: str, ea: Entry, eb: Entry, hashes_a: Dict[str, Content],
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


def _order_diff(a: Dict[str, Entry], b: Dict[str, Entry]) -> Optional[FileDiff]:
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
    entries_a = read_entries(_layer_stream(a, ia)) if a is not None else {}
    entries_b = read_entries(_layer_stream(b, ib)) if b is not None else {}
    # Hash only where the headers cannot tell: both regular files of one size.
    same_size = {n for n, e in entries_a.items()
                 if e.kind == "file" and n in entries_b and entries_b[n].kind == "file" and entries_b[n].size == e.size}
    hashes_a = hash_members(_layer_stream(a, ia), same_size) if same_size else {}
    hashes_b = hash_members(_layer_stream(b, ib), same_size) if same_size else {}
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


# --- explaining -------------------------------------------------------------------

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
_CONFIG_HINTS = {
    ".container": "random id of the build container (docker-format config): podman build --format oci has none",
    ".parent": "id of the previous build step's image: differs whenever an earlier step differs",
    ".config.Image": "id of the previous build step's image: differs whenever an earlier step differs",
    ".container_config.Image": "id of the previous build step's image",
    ".created": "image creation time: clamp it (podman --timestamp, buildx SOURCE_DATE_EPOCH)",
    ".container_config.Hostname": "random hostname of the build container",
}


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
    ranked = sorted(layer.files, key=lambda f: (KINDS.index(f.kind), f.path))
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
        ranked = sorted(layer.files, key=lambda f: (KINDS.index(f.kind), f.path))
        layers.append({"index": layer.index, "a": layer.a, "b": layer.b, "created_by": layer.created_by,
                       "counts": layer.counts(), "note": layer.note, "files_total": len(ranked),
                       "files": [dataclasses.asdict(f) for f in ranked[:max_files]]})
    return {"a_config": comparison.a_config, "b_config": comparison.b_config, "identical": comparison.identical,
            "layers_a": comparison.layers_a, "layers_b": comparison.layers_b,
            "config": [dataclasses.asdict(d) for d in comparison.config], "layers": layers}


# --- the double build --------------------------------------------------------------


@dataclass(frozen=True)
class BuildRun:
    n: int
    image_id: str
    manifest_digest: str  # as pushed to the loopback registry ('' when not pushed)
    reference: str  # what was built (registry/name@digest or tag)
    seconds: float
    archive: Optional[Path]


@dataclass
class Outcome:
    subject: str  # what was built twice
    builder: str
    epoch: str
    runs: List[BuildRun]
    comparison: Optional[Comparison] = None
    diffoci: str = ""  # diffoci's report, or why it was not used
    notes: List[str] = field(default_factory=list)
    unit: str = "image"  # what the digests are of: image (config digest) or tarball (file sha256)

    @property
    def reproducible(self) -> bool:
        one, two = self.runs
        same_manifest = not (one.manifest_digest and two.manifest_digest) or one.manifest_digest == two.manifest_digest
        return one.image_id == two.image_id and same_manifest


def say(message: str) -> None:
    print(f"[repro] {message}", file=sys.stderr, flush=True)


class _Step:
    """Prints a step and how long it took."""

    def __init__(self, label: str) -> None:
        self.label = label

    def __enter__(self) -> _Step:
        self.start = time.monotonic()
        say(f"{self.label} ...")
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.monotonic() - self.start
        if exc[0] is None:
            say(f"{self.label}: done in {self.seconds:.1f} s")


def clean_state_note(engine: Engine) -> str:
    if engine.builder in ("podman", "classic"):
        return (f"{engine.name}: --no-cache, and each build's own images (final, stages, intermediate layers) "
                "are removed by id before the next build")
    return ("docker: each build's own image is removed by id; BuildKit's cache is shared and cannot be pruned for "
            "one build only, so --no-cache is what keeps the second build clean")


@dataclass(frozen=True)
class Built:
    """What one build gave."""

    image_id: str
    manifest_digest: str = ""  # '' when not pushed
    reference: str = ""
    labels: Tuple[Tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Plan:
    """What to build twice, and how to recognise what the builds made."""

    subject: str
    epoch: str
    tag: str  # the scratch tag every build gets
    base_ref: str  # the base (an input, never removed); '' for FROM scratch
    build_once: Callable[[int], Built]


def double(plan: Plan, engine: Engine, workdir: Path, keep: bool = False) -> Outcome:
    """Build twice from clean state: build, save, remove what the build made; then compare."""
    outcome = Outcome(subject=plan.subject, builder=engine.describe(), epoch=plan.epoch, runs=[],
                      notes=[n for n in (cannot_reproduce_note(engine), clean_state_note(engine)) if n])
    builds: List[Built] = []
    for n in (1, 2):
        before = engine.image_ids()
        with _Step(f"build {n}/2 (no cache, SOURCE_DATE_EPOCH={plan.epoch})") as step, \
                _CleanOnFailure(engine, before, plan.tag, plan.base_ref):
            built = plan.build_once(n)
        builds.append(built)
        # Looked up after the build: that is when the engine has pulled the base.
        base_id = _image_id(engine, plan.base_ref) if plan.base_ref else ""
        run = _save_and_clean(engine, n, built.image_id, plan.tag, before, base_id, workdir,
                              save=n == 1 or keep or built.image_id != builds[0].image_id)
        outcome.runs.append(dataclasses.replace(run, manifest_digest=built.manifest_digest,
                                                reference=built.reference or plan.tag, seconds=round(step.seconds, 1)))
    if builds[0].labels != builds[1].labels:
        outcome.notes.append("the two builds got different labels (did the checkout change meanwhile?)")
    _compare(outcome, keep)
    return outcome


def double_build(tf: TargetsFile, opts: build.BuildOptions, engine: Engine, registry: Registry, workdir: Path,
                 keep: bool = False) -> Outcome:
    """A target's image, built twice under a scratch tag (the build record and real tag are left alone)."""
    epoch = opts.source_date_epoch or provenance.source_date_epoch()
    opts = dataclasses.replace(opts, no_cache=True, source_date_epoch=epoch, tag_suffix=SCRATCH_SUFFIX)
    target = tf.get(opts.target)
    base = build.resolve_base(engine, tf, target, opts, registry)  # an input: made once if missing

    def build_once(_n: int) -> Built:
        record = build.build(tf, opts, engine, registry)
        return Built(record.image_id, record.digest, record.image_reference, tuple(sorted(record.labels.items())))

    return double(Plan(subject=f"{target.name} ({opts.profile} profile, {opts.base} base, {target.platform})",
                       epoch=epoch, base_ref=base.by_digest, build_once=build_once,
                       tag=f"{registry.ref(build.image_repository(target))}:{opts.profile}-{opts.base}-{SCRATCH_SUFFIX}"),
                  engine, workdir, keep)


def double_build_base(tf: TargetsFile, target_name: str, engine: Engine, registry: Registry, workdir: Path,
                      keep: bool = False) -> Outcome:
    """The hermetic base built twice under a scratch repository (the real tag is left alone)."""
    target = tf.get(target_name)
    scratch = dataclasses.replace(tf, hermetic=dataclasses.replace(
        tf.hermetic, repository=f"{tf.hermetic.repository}-{SCRATCH_SUFFIX}"))
    tag = hermetic.base_tag(scratch, target, registry)

    def build_once(_n: int) -> Built:
        _delete_tag(registry, ImageRef.parse(tag))  # else ensure_base finds build 1 and does not build
        ref = hermetic.ensure_base(_NoCache(engine), scratch, target, registry)
        return Built(_image_id(engine, tag), ref.digest or "", str(ref))

    return double(Plan(subject=f"hermetic base for {target.platform} ({scratch.hermetic.repository})",
                       epoch=rootfs.source_date_epoch(), tag=tag, base_ref="", build_once=build_once),
                  engine, workdir, keep)


def double_build_dockerfile(engine: Engine, context: Path, tag: str, platform: str, epoch: str, base_ref: str,
                            workdir: Path, keep: bool = False) -> Outcome:
    """Any Dockerfile (context/Dockerfile) built twice, not pushed: for small checks and tests."""
    request = BuildRequest(context=context, dockerfile=context / "Dockerfile", tags=[tag], platform=platform,
                           no_cache=True, source_date_epoch=epoch)
    return double(Plan(subject=f"{context / 'Dockerfile'} as {tag}", epoch=epoch, tag=tag, base_ref=base_ref,
                       build_once=lambda _n: Built(engine.build(request))), engine, workdir, keep)


def exit_status(outcomes: Sequence[Outcome]) -> int:
    """0 only when every image checked is reproducible."""
    return 0 if outcomes and all(o.reproducible for o in outcomes) else 1


class _CleanOnFailure:
    """A failed build still removes what it made (it has no final image: stages and layers only)."""

    def __init__(self, engine: Engine, before: Set[str], tag: str, base_ref: str) -> None:
        self.engine, self.before, self.tag, self.base_ref = engine, before, tag, base_ref

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            return
        final = _image_id(self.engine, self.tag) if self.tag else ""
        base_id = _image_id(self.engine, self.base_ref) if self.base_ref else ""
        created = created_images(self.engine, self.before, final if final and final not in self.before else "",
                                 self.tag, base_id)
        say(f"build failed: removing the {len(created)} image(s) it made")
        error = remove_created(self.engine, created)
        if error:
            say(f"warning: some stay: {error}")


class _NoCache:
    """The engine, with every build uncached (hermetic.ensure_base builds with the cache)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def build(self, req, **kwargs) -> str:
        return self._engine.build(dataclasses.replace(req, no_cache=True), **kwargs)


def check_rootfs(tf: TargetsFile, target_name: str, workdir: Path) -> Outcome:
    """debootstrap again into a scratch cache and compare with the cached rootfs tarball the base uses."""
    target = tf.get(target_name)
    args = (target.arch_tag, tf.hermetic.suite, tf.hermetic.mirror, hermetic.PACKAGES)
    cached = rootfs.debian_rootfs(*args)
    with _Step("debootstrap rootfs again (scratch cache)") as step:
        fresh = rootfs.debian_rootfs(*args, cache_dir=workdir)
    runs = [BuildRun(1, "sha256:" + _sha256(cached), "", str(cached), 0.0, cached),
            BuildRun(2, "sha256:" + _sha256(fresh), "", str(fresh), round(step.seconds, 1), fresh)]
    outcome = Outcome(subject=f"debian rootfs tarball ({target.arch_tag}, {tf.hermetic.suite}): the cached one "
                              "against a fresh debootstrap", builder="scripts/debian-rootfs.sh",
                      epoch=rootfs.source_date_epoch(), runs=runs, unit="tarball")
    if runs[0].image_id != runs[1].image_id:
        outcome.comparison = compare_tarballs(cached, fresh)
        outcome.notes.append("packages come from the mirror at build time: a moved mirror shows in var/lib/dpkg/status")
    fresh.unlink(missing_ok=True)
    return outcome


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


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return _content(fh).sha256


def _compare(outcome: Outcome, keep: bool) -> None:
    one, two = outcome.runs
    if one.image_id != two.image_id and one.archive and two.archive:
        outcome.diffoci = _diffoci(one.reference, two.reference)
        with _Step("comparing the two image tarballs"):
            outcome.comparison = compare_archives(one.archive, two.archive, progress=say)
    if not keep:
        for run in outcome.runs:
            if run.archive:
                run.archive.unlink(missing_ok=True)


def _diffoci(ref_a: str, ref_b: str) -> str:
    """diffoci's strict report of the two pushed images, or why there is none."""
    binary = shutil.which("diffoci")
    if binary is None:
        return ("diffoci: not found on PATH (it cannot be installed on this host); the file report below is "
                "qualify's own tar comparison")
    if "@" not in ref_a or "@" not in ref_b:
        return "diffoci: the images were not pushed, so it has nothing to pull; qualify's own report follows"
    proc = subprocess.run([binary, "diff", ref_a, ref_b], capture_output=True, text=True, timeout=1800,
                          stdin=subprocess.DEVNULL)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode not in (0, 1) or not lines:
        return f"diffoci failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}; qualify's own report follows"
    shown = lines[:60] + ([f"... {len(lines) - 60} more lines"] if len(lines) > 60 else [])
    return "diffoci diff (strict):\n" + "\n".join("  " + line for line in shown)


def _image_id(engine: Engine, ref: str) -> str:
    info = _inspect(engine, [ref])
    return _full(info[0]["Id"]) if info else ""


def _inspect(engine: Engine, refs: Sequence[str]) -> List[dict]:
    """Inspect JSON of the refs that still exist (others may remove images meanwhile)."""
    try:
        return engine.inspect_raw(refs)
    except EngineError:
        out = []
        for ref in refs:
            try:
                out.extend(engine.inspect_raw([ref]))
            except EngineError:
                continue
        return out


def _full(image_id: str) -> str:
    return image_id if not image_id or image_id.startswith("sha256:") else f"sha256:{image_id}"


def _save_and_clean(engine: Engine, n: int, image_id: str, tag: str, before: Set[str], base_id: str, workdir: Path,
                    save: bool) -> BuildRun:
    archive = workdir / f"build{n}.tar" if save else None
    try:
        if archive is not None:
            _check_space(engine, image_id, workdir)
            with _Step(f"saving build {n} ({engine.name} save)"):
                engine.save([image_id], archive)
    finally:
        created = created_images(engine, before, image_id, tag, base_id)
        with _Step(f"removing the {len(created)} image(s) build {n} created"):
            error = remove_created(engine, created)
        if error:
            say(f"warning: some images of build {n} stay: {error}")
    return BuildRun(n, image_id, "", tag, 0.0, archive)


def _check_space(engine: Engine, image_id: str, workdir: Path) -> None:
    """Refuse clearly, before writing, when the tarball cannot fit (a full disk also breaks others' builds)."""
    info = _inspect(engine, [image_id])
    size = int(info[0].get("Size") or 0) if info else 0
    free = shutil.disk_usage(workdir).free
    if size and free < size + (1 << 30):
        raise EngineError(f"saving the image needs about {size / 2**30:.1f} GiB and {workdir} has "
                          f"{free / 2**30:.1f} GiB free (keeping 1 GiB spare)",
                          hint="free disk space, or point QUALIFY_STATE_DIR at a larger disk")


def created_images(engine: Engine, before: Set[str], final_id: str, tag: str, base_id: str) -> List[str]:
    """Images this build made: new since `before`, untagged (or carrying only our scratch tag), and the final
    image, a step on its way (its layers a prefix of the final's) or a stage on the base (the base's layers a
    prefix of its own). Judged by layers, not parent links: podman derives parents from shared layers and
    may name an older look-alike image."""
    new = sorted(engine.image_ids() - before)
    if not new:
        return []
    info = {_full(d["Id"]): d for d in _inspect(engine, new)}
    final_layers = _layers(info[final_id]) if final_id in info else []
    base_info = _inspect(engine, [base_id]) if base_id else []
    base_layers = _layers(base_info[0]) if base_info else []
    ours = []
    for image, data in info.items():
        tags = [t for t in data.get("RepoTags") or [] if t != tag and not t.endswith(":<none>")]
        if tags or image == base_id:
            continue  # someone else's name on it, or the base (an input, pulled by this build)
        layers = _layers(data)
        on_the_way = bool(final_layers and layers) and layers == final_layers[:len(layers)]
        on_the_base = bool(base_layers) and layers[:len(base_layers)] == base_layers
        if image == final_id or on_the_way or on_the_base:
            ours.append(image)
    return ours


def _layers(inspect: dict) -> List[str]:
    return list((inspect.get("RootFS") or {}).get("Layers") or [])


def remove_created(engine: Engine, ids: Sequence[str]) -> str:
    """Remove exactly `ids`, children before parents (an image with children cannot go first)."""
    remaining = set(ids)
    error = ""
    for _ in range(4):  # a second round only for what a misjudged order left
        present = remaining & engine.image_ids()
        if not present:
            return ""
        error = engine.remove_images(_removal_order(_inspect(engine, sorted(present))))
        if (remaining & engine.image_ids()) == present:
            return error or "no progress"
    return error


def _removal_order(infos: Sequence[dict]) -> List[str]:
    """Deepest first: by parent links inside the set, then history length (podman), then layer count."""
    parent = {_full(d["Id"]): _full(d.get("Parent") or "") for d in infos}
    weight = {_full(d["Id"]): (len(d.get("History") or []), len(_layers(d))) for d in infos}

    def depth(image: str) -> int:
        seen = set()
        while parent.get(image) in parent and image not in seen:
            seen.add(image)
            image = parent[image]
        return len(seen)

    return sorted(parent, key=lambda i: (-depth(i), -weight[i][0], -weight[i][1], i))


def _delete_tag(registry: Registry, ref: ImageRef) -> None:
    """Drop a scratch tag's manifest from its repository (other repositories keep their links)."""
    repository = ref.name.split("/", 1)[1]
    digest = registry.manifest_digest(repository, ref.tag or "latest")
    if not digest:
        return
    req = urllib.request.Request(f"{registry.url}/v2/{repository}/manifests/{digest}", method="DELETE")
    try:
        urllib.request.urlopen(req, timeout=10).close()
    except (urllib.error.URLError, OSError) as exc:
        say(f"warning: could not delete scratch tag {ref}: {exc}")


def scratch_dir() -> Path:
    """Tarballs go beside the engine's storage (same disk, /var/lib), not into a small /tmp."""
    root = STATE_DIR / "repro"
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="run-", dir=root))


# --- output ---------------------------------------------------------------------------


def outcome_lines(outcome: Outcome, max_files: int = 12) -> List[str]:
    one, two = outcome.runs
    lines = [f"repro: {outcome.subject}", f"  builder: {outcome.builder}", f"  SOURCE_DATE_EPOCH={outcome.epoch}"]
    for run in outcome.runs:
        pushed = f"  manifest {run.manifest_digest}" if run.manifest_digest else ""
        lines.append(f"  build {run.n}: {outcome.unit} {run.image_id}{pushed}  ({run.seconds:.1f} s)")
    if outcome.reproducible:
        lines.append(f"reproducible: {one.image_id} (both builds)")
        if one.manifest_digest:
            lines.append(f"  pushed manifest digest {one.manifest_digest} (both builds)")
    else:
        if one.image_id != two.image_id:
            lines.append(f"NOT reproducible: {outcome.unit} {one.image_id} != {two.image_id}")
        else:
            lines.append(f"NOT reproducible as pushed: same image {one.image_id}, but manifest digests "
                         f"{one.manifest_digest} != {two.manifest_digest} (layers compressed differently at push)")
        if outcome.diffoci:
            lines.append(outcome.diffoci)
        if outcome.comparison is not None:
            lines.extend(render(outcome.comparison, max_files))
    lines.extend(f"  note: {note}" for note in outcome.notes)
    return lines


def outcome_json(outcome: Outcome) -> dict:
    return {"subject": outcome.subject, "builder": outcome.builder, "source_date_epoch": outcome.epoch,
            "reproducible": outcome.reproducible, "unit": outcome.unit,
            "builds": [{"n": r.n, "image_id": r.image_id, "manifest_digest": r.manifest_digest,
                        "reference": r.reference, "seconds": r.seconds,
                        "archive": str(r.archive) if r.archive and r.archive.exists() else None} for r in outcome.runs],
            "diffoci": outcome.diffoci, "notes": outcome.notes,
            "comparison": comparison_json(outcome.comparison) if outcome.comparison else None}


def cannot_reproduce_note(engine: Engine) -> Optional[str]:
    """What the engine cannot do, said before the builds start."""
    if engine.reproducible:
        return None
    if engine.builder == "classic":
        return ("the classic docker builder cannot reproduce an image: it stamps every file and the config with "
                "the build clock and has no SOURCE_DATE_EPOCH support; building twice anyway to show the differences")
    return (f"the {engine.builder} builder does not rewrite timestamps (no SOURCE_DATE_EPOCH support); building "
            "twice anyway to show the differences; use --engine podman or a docker client with buildx")

