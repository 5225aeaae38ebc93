"""A CycloneDX SBOM of an image, written with cyclonedx-python-lib: the wheels
from its lock (name, version, the hashes the lock allows) and the Debian
packages recorded in the image's /var/lib/dpkg/status."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

from cyclonedx.model import HashAlgorithm, HashType
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL

from qualify.core.errors import ParseError
from qualify.core.manifest import STATEMENT_TYPE
from qualify.host.engine import Engine
from qualify.imagebuild import wheelhouse

PREDICATE_TYPE = "https://cyclonedx.org/bom"  # what `cosign attest --type cyclonedx` writes
DPKG_STATUS = "/var/lib/dpkg/status"
MAX_STATUS_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    architecture: str


def parse_dpkg_status(text: str) -> List[DebPackage]:
    """Installed packages of a dpkg status file (paragraphs of `Key: value`)."""
    out = []
    for para in text.split("\n\n"):
        fields: Dict[str, str] = {}
        for line in para.splitlines():
            if line and not line[0].isspace() and ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            out.append(DebPackage(fields["Package"], fields.get("Version", ""), fields.get("Architecture", "")))
    return sorted(out, key=lambda p: (p.name, p.architecture))


def read_dpkg_status(engine: Engine, image: str) -> str:
    """The image's dpkg status file, read without running anything of the image."""
    data = engine.copy_file_out(image, DPKG_STATUS, MAX_STATUS_BYTES)
    if data is None:
        raise ParseError(f"{image}: {DPKG_STATUS} is larger than {MAX_STATUS_BYTES} bytes")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.next()
        if member is None or not member.isfile():
            raise ParseError(f"{image}: {DPKG_STATUS} is not a regular file")
        return tar.extractfile(member).read().decode("utf-8", "replace")


def bom(lock: Path, debs: List[DebPackage], image_name: str, image_digest: str) -> Bom:
    b = Bom()
    b.metadata.component = Component(name=image_name, version=image_digest, type=ComponentType.CONTAINER,
                                     bom_ref=f"{image_name}@{image_digest}")
    for pin in wheelhouse.parse_lock(lock):
        hashes = [HashType(alg=HashAlgorithm.SHA_256, content=h.split(":", 1)[1])
                  for h in sorted(pin.hashes) if h.startswith("sha256:")]
        b.components.add(Component(name=pin.name, version=pin.version, type=ComponentType.LIBRARY, hashes=hashes,
                                   purl=PackageURL("pypi", name=pin.name, version=pin.version),
                                   bom_ref=f"pypi:{pin.name}@{pin.version}"))
    for d in debs:
        b.components.add(Component(name=d.name, version=d.version, type=ComponentType.LIBRARY,
                                   purl=PackageURL("deb", namespace="debian", name=d.name, version=d.version,
                                                   qualifiers={"arch": d.architecture} if d.architecture else None),
                                   bom_ref=f"deb:{d.name}:{d.architecture}@{d.version}"))
    return b


def statement(subject_name: str, subject_digest: str, document: Bom) -> Dict:
    predicate = json.loads(JsonV1Dot6(document).output_as_string())
    return {"_type": STATEMENT_TYPE,
            "subject": [{"name": subject_name, "digest": {"sha256": subject_digest.split(":", 1)[1]}}],
            "predicateType": PREDICATE_TYPE, "predicate": predicate}
