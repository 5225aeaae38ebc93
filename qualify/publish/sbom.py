"""A CycloneDX SBOM of an image, written with cyclonedx-python-lib, from what its whole filesystem holds
(publish/imagefs.py): dpkg's packages, every Python distribution of every environment, and the CUDA wheels
the hermetic base unpacked into /usr/local/cuda. Each component says where it was found
(`blackwell-qualify:location`, `blackwell-qualify:found-by`) and, where a hash is known, of which file
(`blackwell-qualify:hash-of`): the wheel the build installed (its build record), the wheel file in the image
a venv was made from, or the CUDA wheel the base unpacked."""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Tuple

from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL

from qualify.core import manifest as mf
from qualify.core.errors import ConfigError
from qualify.core.readlimit import strict_json
from qualify.imagebuild import wheelhouse
from qualify.publish.imagefs import CudaWheel, ImageContents, PythonDist, cuda_wheel_for

PREDICATE_TYPE = "https://cyclonedx.org/bom"  # what `cosign attest --type cyclonedx` writes
# The Dockerfile's payload venv (VIRTUAL_ENV=/opt/venv): where the build's wheels (its build record) went.
PAYLOAD_VENV = "/opt/venv/"
PROPERTY = "blackwell-qualify:"

FOUND_DPKG = "dpkg status"
FOUND_DIST_INFO = "python metadata"
FOUND_CUDA = "hermetic CUDA wheel record"


def _props(**values: str) -> List[Property]:
    return [Property(name=PROPERTY + k.replace("_", "-"), value=v) for k, v in values.items() if v]


def _sha256(hexdigest: str) -> List[HashType]:
    return [HashType(alg=HashAlgorithm.SHA_256, content=hexdigest)]


def _installed_by_build(built: Mapping[str, str]) -> Dict[Tuple[str, str], Tuple[str, str]]:
    """(name, version) -> (wheel file, sha256) of the wheels the build installed into the payload venv."""
    out = {}
    for filename, digest in built.items():
        name, version = filename.split("-")[:2]
        out[(wheelhouse.normalise(name), version)] = (filename, digest)
    return out


def _python_component(dist: PythonDist, contents: ImageContents, built: Mapping[Tuple[str, str], Tuple[str, str]],
                      cuda: Optional[CudaWheel]) -> Component:
    key = (dist.name, dist.version)
    hashes, hash_of, found = [], "", FOUND_DIST_INFO
    if cuda is not None:
        hashes, hash_of, found = _sha256(cuda.sha256), cuda.file, FOUND_CUDA
    elif dist.location.startswith(PAYLOAD_VENV) and key in built:
        hash_of, digest = built[key]
        hashes, hash_of = _sha256(digest), f"{hash_of} (installed by the build: its build record)"
    else:
        wheel = next((w for w in contents.wheel_files if (w.name, w.version) == key), None)
        if wheel is not None:  # e.g. pip and setuptools, which `python3 -m venv` installs from Debian's wheels
            hashes, hash_of = _sha256(wheel.sha256), f"{wheel.path} (the wheel of this name and version in the image)"
    extra = {"unpacked_into": cuda.root, "files": str(cuda.files)} if cuda else {}
    return Component(name=dist.name, version=dist.version, type=ComponentType.LIBRARY, hashes=hashes,
                     purl=PackageURL("pypi", name=dist.name, version=dist.version),
                     bom_ref=f"pypi:{dist.name}@{dist.version}:{dist.location}",
                     properties=_props(location=dist.location, found_by=found, hash_of=hash_of, **extra))


def bom(contents: ImageContents, image_name: str, image_digest: str, built_wheels: Mapping[str, str]) -> Bom:
    """`built_wheels`: the build record's wheels (file name -> sha256 hex), installed into the payload venv."""
    b = Bom()
    repository, _, _ = image_name.rpartition("/")
    root = Component(name=image_name, version=image_digest, type=ComponentType.CONTAINER,
                     purl=PackageURL("oci", name=image_name.rsplit("/", 1)[-1], version=image_digest,
                                     qualifiers={"repository_url": image_name} if repository else None),
                     bom_ref=f"{image_name}@{image_digest}")
    b.metadata.component = root
    built = _installed_by_build(built_wheels)
    components = []
    seen_cuda = set()
    for dist in contents.python:
        cuda = cuda_wheel_for(contents, dist)
        if cuda is not None:
            seen_cuda.add(cuda)
        components.append(_python_component(dist, contents, built, cuda))
    for w in contents.cuda_wheels:
        if w not in seen_cuda:  # recorded, but its .dist-info is not beside the record (an older hermetic base)
            components.append(Component(name=w.name, version=w.version, type=ComponentType.LIBRARY, hashes=_sha256(w.sha256),
                                        purl=PackageURL("pypi", name=w.name, version=w.version),
                                        bom_ref=f"pypi:{w.name}@{w.version}:{w.root}",
                                        properties=_props(location=w.root, found_by=FOUND_CUDA, hash_of=w.file,
                                                          unpacked_into=w.root, files=str(w.files))))
    distro = f"{contents.os_id}-{contents.os_version}" if contents.os_id and contents.os_version else ""
    for d in contents.debs:
        qualifiers = {k: v for k, v in (("arch", d.architecture), ("distro", distro)) if v}
        components.append(Component(
            name=d.name, version=d.version, type=ComponentType.LIBRARY,
            purl=PackageURL("deb", namespace=contents.os_id or "debian", name=d.name, version=d.version,
                            qualifiers=qualifiers or None),
            bom_ref=f"deb:{d.name}:{d.architecture}@{d.version}", properties=_props(location=d.where, found_by=FOUND_DPKG)))
    for c in components:
        b.components.add(c)
    b.register_dependency(root, components)  # the image holds every component (cyclonedx warns without it)
    return b


def to_json(document: Bom) -> Dict:
    return strict_json(JsonV1Dot6(document).output_as_string(), "the SBOM cyclonedx-python-lib wrote", ConfigError)


def statement(subject_name: str, subject_digest: str, document: Bom) -> Dict:
    return mf.statement(subject_name, subject_digest, to_json(document)) | {"predicateType": PREDICATE_TYPE}
