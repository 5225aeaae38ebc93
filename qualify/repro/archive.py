"""Reading image archives: `docker save`, `podman save --format docker-archive`
and OCI layout tarballs, without unpacking. Layer tars are streamed; file
contents are hashed only where a comparison needs them.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

from qualify.core.errors import ParseError
from qualify.core.readlimit import strict_json

# Tar header fields that are compared through TarInfo attributes, not as raw PAX records.
_PAX_MODELLED = {"path", "linkpath", "size", "uid", "gid", "uname", "gname", "mtime"}



_CHUNK = 1 << 20



# nvcc names its intermediate files tmpxft_<pid>_<counter>; the name lands in the object's symbol table.
_MARKS = re.compile(rb"tmpxft_[0-9a-f]{8}_[0-9a-f]{8}")



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
class TarMember:
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



def open_archive(path: Path) -> ImageArchive:
    """Locate config and layers in a docker-archive or OCI layout tarball."""
    with tarfile.open(path) as outer:
        names = set(outer.getnames())
        if "manifest.json" in names:
            manifest = strict_json(_read(outer, "manifest.json"), f"{path}: manifest.json", ParseError)
            if not isinstance(manifest, list) or not manifest:
                raise ParseError(f"{path}: manifest.json lists no image")
            entry = manifest[0]
            config_name, layers, layout = entry["Config"], tuple(entry["Layers"]), "docker-archive"
        elif "index.json" in names:
            index = strict_json(_read(outer, "index.json"), f"{path}: index.json", ParseError)
            config_name, layers = _oci_image(outer, index, path)
            layout = "oci"
        else:
            raise ParseError(f"{path}: neither manifest.json (docker-archive) nor index.json (OCI layout)",
                             hint="save with `docker save` or `podman save --format docker-archive`")
        raw = _read(outer, config_name)
    return ImageArchive(path=path, layout=layout, config_digest="sha256:" + hashlib.sha256(raw).hexdigest(),
                        config=strict_json(raw, f"{path}: {config_name}", ParseError), layer_members=layers)



def _oci_image(outer: tarfile.TarFile, index: dict, path: Path) -> Tuple[str, Tuple[str, ...]]:
    for _ in range(4):  # an index may point at another index (multi-platform)
        manifests = index.get("manifests") or []
        if not manifests:
            raise ParseError(f"{path}: OCI index lists no manifest")
        name = _blob(manifests[0]["digest"])
        doc = strict_json(_read(outer, name), f"{path}: {name}", ParseError)
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



def layer_stream(archive: ImageArchive, index: int) -> Iterator[Tuple[tarfile.TarInfo, tarfile.TarFile]]:
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



def entry_of(info: tarfile.TarInfo, position: int) -> TarMember:
    pax = tuple(sorted((k, v) for k, v in info.pax_headers.items() if k not in _PAX_MODELLED))
    return TarMember(name=_name(info.name), position=position, kind=_TYPES.get(info.type, f"type-{info.type!r}"),
                 size=info.size if info.isreg() else 0, mode=info.mode & 0o7777,
                 owner=(info.uid, info.gid, info.uname or "", info.gname or ""), mtime=info.mtime,
                 link=info.linkname if (info.issym() or info.islnk()) else "",
                 device=(info.devmajor, info.devminor) if (info.ischr() or info.isblk()) else (0, 0), pax=pax)



def read_entries(stream: Iterator[Tuple[tarfile.TarInfo, tarfile.TarFile]]) -> Dict[str, TarMember]:
    """Headers only; a later member of one name replaces an earlier one, as extraction would."""
    entries: Dict[str, TarMember] = {}
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
