"""What an image's filesystem says it holds, read in one pass over the whole exported filesystem (a created,
never started container: nothing of the image runs, and a foreign platform needs no emulation):

- dpkg's database (`/var/lib/dpkg/status`, and `status.d/*` where a distroless base keeps it),
- every Python distribution's metadata wherever it is (`*.dist-info/METADATA`, `*.egg-info/PKG-INFO`, an
  `*.egg-info` file, or an unpacked egg's `*.egg/EGG-INFO/PKG-INFO`): the payload's venv, the system's Python,
  any other environment (setuptools' own test data among them: syft lists it, so do we, with its location),
- wheel files lying in the image (Debian's `/usr/share/python-wheels`, ensurepip's bundled ones): their sha256,
  which is the hash of what `python3 -m venv` installed from them,
- the hermetic base's record of the CUDA wheels it unpacked into `/usr/local/cuda-<ver>/`
  (imagebuild/hermetic.py writes it: `wheels/wheels.json`).

Every member kept is bounded; members that cannot be read as what their name says are reported, not skipped
silently (a damaged METADATA is a problem, never an absent package)."""

from __future__ import annotations

import email.parser
import hashlib
import re
import tarfile
from dataclasses import dataclass, field
from typing import IO, List, Optional, Tuple

from qualify.core.errors import ParseError
from qualify.core.readlimit import strict_json
from qualify.imagebuild import hermetic
from qualify.imagebuild.wheelhouse import normalise

DPKG_STATUS = "/var/lib/dpkg/status"
DPKG_STATUS_D = "/var/lib/dpkg/status.d/"
MAX_STATUS_BYTES = 32 * 1024 * 1024
MAX_METADATA_BYTES = 1024 * 1024  # the headers come first; a long description after them is not needed
MAX_RECORD_BYTES = 1024 * 1024
# an unpacked egg (`x.egg/EGG-INFO/`) too: pkg_resources still imports them, and syft counts them
_METADATA = re.compile(r".*/[^/]+\.dist-info/METADATA|.*/[^/]+\.egg-info/PKG-INFO|.*/[^/]+\.egg-info"
                       r"|.*/[^/]+\.egg/EGG-INFO/PKG-INFO")
_CUDA_RECORD = re.compile(rf"/usr/local/cuda-[0-9][0-9.]*/{re.escape(hermetic.WHEELS_RECORD)}")
_WHEEL = re.compile(r".*/([A-Za-z0-9][A-Za-z0-9_.+]*)-([^-/]+)(?:-[^-/]+){2,3}\.whl")
_HEX = re.compile(r"[0-9a-f]{64}")
OS_RELEASE = ("/etc/os-release", "/usr/lib/os-release")  # the first is often a link to the second


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    architecture: str
    where: str = DPKG_STATUS


@dataclass(frozen=True)
class PythonDist:
    """One installed Python distribution: its normalised name, version and metadata folder (or file)."""

    name: str
    version: str
    location: str  # /opt/venv/lib/python3.11/site-packages/triton-3.8.0.dist-info

    @property
    def environment(self) -> str:
        return self.location.rsplit("/", 1)[0]


@dataclass(frozen=True)
class WheelFile:
    path: str
    name: str
    version: str
    sha256: str


@dataclass(frozen=True)
class CudaWheel:
    """A CUDA wheel the hermetic base unpacked (its own record of it)."""

    file: str
    name: str
    version: str
    sha256: str
    files: int
    root: str  # /usr/local/cuda-13.0


@dataclass(frozen=True)
class ImageContents:
    debs: Tuple[DebPackage, ...] = ()
    python: Tuple[PythonDist, ...] = ()
    wheel_files: Tuple[WheelFile, ...] = ()
    cuda_wheels: Tuple[CudaWheel, ...] = ()
    problems: Tuple[str, ...] = field(default=())
    members: int = 0
    os_id: str = ""  # /etc/os-release's ID and VERSION_ID: debian 12, ubuntu 24.04
    os_version: str = ""


def parse_dpkg_status(text: str, where: str = DPKG_STATUS) -> List[DebPackage]:
    """Installed packages of a dpkg status file (paragraphs of `Key: value`)."""
    out = []
    for para in text.split("\n\n"):
        fields = {}
        for line in para.splitlines():
            if line and not line[0].isspace() and ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        # status.d/ (distroless) holds one paragraph per installed package, without a Status field.
        installed = fields.get("Status", "").endswith(" installed") or (
            "Status" not in fields and where.startswith(DPKG_STATUS_D))
        if fields.get("Package") and installed:
            out.append(DebPackage(fields["Package"], fields.get("Version", ""), fields.get("Architecture", ""), where))
    return sorted(out, key=lambda p: (p.name, p.architecture))


def parse_metadata(data: bytes, location: str) -> PythonDist:
    """Name and Version of a core-metadata file (RFC 822 headers: METADATA, PKG-INFO)."""
    headers = email.parser.BytesHeaderParser().parsebytes(data)
    name, version = (headers.get("Name") or "").strip(), (headers.get("Version") or "").strip()
    if not name or not version:
        raise ParseError(f"{location}: no Name or Version header (not a Python distribution's metadata)")
    return PythonDist(normalise(name), version, location)


def parse_cuda_record(data: bytes, where: str) -> List[CudaWheel]:
    doc = strict_json(data, where, ParseError)
    wheels = doc.get("wheels") if isinstance(doc, dict) and doc.get("schema") == hermetic.WHEELS_SCHEMA else None
    if not isinstance(wheels, list):
        raise ParseError(f"{where}: not a {hermetic.WHEELS_SCHEMA} record")
    root = where[: -len(hermetic.WHEELS_RECORD) - 1]
    out = []
    for i, w in enumerate(wheels):
        ok = isinstance(w, dict) and all(isinstance(w.get(k), str) and w.get(k) for k in ("file", "name", "version")) \
            and isinstance(w.get("sha256"), str) and _HEX.fullmatch(w["sha256"]) and isinstance(w.get("files"), int)
        if not ok:
            raise ParseError(f"{where}: wheels[{i}] is not a wheel's file, name, version, sha256 and files")
        out.append(CudaWheel(w["file"], normalise(w["name"]), w["version"], w["sha256"], w["files"], root))
    return out


def parse_os_release(text: str) -> Tuple[str, str]:
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip().strip('"').strip("'")
    return fields.get("ID", ""), fields.get("VERSION_ID", "")


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo, limit: int) -> bytes:
    src = tar.extractfile(member)
    return src.read(limit) if src else b""


def _sha256(tar: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    h = hashlib.sha256()
    src = tar.extractfile(member)
    while src and (chunk := src.read(1 << 20)):
        h.update(chunk)
    return h.hexdigest()


def read_contents(stream: IO[bytes], what: str) -> ImageContents:
    """One pass over the tar stream of an image's filesystem (`Engine.exported_filesystem`)."""
    debs, python, wheel_files, cuda, problems = [], [], [], [], []
    os_release = {}
    count = 0
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            count += 1
            name = member.name[2:] if member.name.startswith("./") else member.name
            path = "/" + name.lstrip("/")
            if not member.isfile():
                continue
            try:
                if path == DPKG_STATUS or path.startswith(DPKG_STATUS_D):
                    if member.size > MAX_STATUS_BYTES:
                        raise ParseError(f"{path}: {member.size} bytes, more than the {MAX_STATUS_BYTES} read")
                    debs += parse_dpkg_status(_read(tar, member, MAX_STATUS_BYTES).decode("utf-8", "replace"), path)
                elif path in OS_RELEASE:
                    os_release[path] = parse_os_release(_read(tar, member, 64 * 1024).decode("utf-8", "replace"))
                elif _CUDA_RECORD.fullmatch(path):
                    if member.size > MAX_RECORD_BYTES:
                        raise ParseError(f"{path}: {member.size} bytes, more than the {MAX_RECORD_BYTES} read")
                    cuda += parse_cuda_record(_read(tar, member, MAX_RECORD_BYTES), path)
                elif _METADATA.fullmatch(path):
                    location = path.rsplit("/", 1)[0] if not path.endswith(".egg-info") else path
                    python.append(parse_metadata(_read(tar, member, MAX_METADATA_BYTES), location))
                elif (m := _WHEEL.fullmatch(path)) is not None:
                    wheel_files.append(WheelFile(path, normalise(m.group(1)), m.group(2), _sha256(tar, member)))
            except ParseError as exc:
                problems.append(exc.message)
    if not count:
        raise ParseError(f"{what}: its exported filesystem is empty")
    return ImageContents(tuple(sorted(debs, key=lambda d: (d.name, d.architecture, d.where))),
                         tuple(sorted(python, key=lambda d: (d.location, d.name))),
                         tuple(sorted(wheel_files, key=lambda w: w.path)),
                         tuple(sorted(cuda, key=lambda w: (w.root, w.name))), tuple(problems), count,
                         *next((os_release[p] for p in OS_RELEASE if p in os_release), ("", "")))


def cuda_wheel_for(contents: ImageContents, dist: PythonDist) -> Optional[CudaWheel]:
    """The hermetic base's record of the wheel whose .dist-info `dist` is (hermetic.cuda_layout_tar puts them
    beside the record), or None."""
    for w in contents.cuda_wheels:
        if dist.environment == f"{w.root}/{hermetic.WHEELS_DIR}" and (dist.name, dist.version) == (w.name, w.version):
            return w
    return None
