"""SLSA Provenance v1 (https://slsa.dev/provenance/v1) for a built image, from
its build record (build/images/*.json) and its lock file."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

from qualify.config.imageref import ImageRef
from qualify.core import manifest as mf
from qualify.core.errors import ConfigError
from qualify.host import paths
from qualify.imagebuild import locks, wheelhouse
from qualify.imagebuild.image import BuildRecord

PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://blackwell-qualify.dev/build/image/v1"
BUILDER_ID = "https://blackwell-qualify.dev/builder/qualify-build/v1"
_GIT_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


@dataclass(frozen=True)
class BuildFacts:
    """What a provenance statement says, gathered by the caller from the build record."""

    target: str
    profile: str
    base_kind: str
    platform: str
    base_image: str  # name@sha256:...
    lock: Path
    revision: str
    source_url: str  # empty when the repository has no remote URL
    engine: str
    builder: str
    toolkit_version: str
    build_seconds: float
    wheels: Dict[str, str] = field(default_factory=dict)  # the build record's: wheel file -> sha256 installed


def installed_wheels(lock: Path, wheels: Dict[str, str]) -> Dict[str, List[tuple]]:
    """Per pin of the lock (by name), the (file name, sha256) of the wheels the build installed for it, each
    one the lock allows; an empty list where the build record does not say (a record of an older toolkit)."""
    out: Dict[str, List[tuple]] = {}
    for pin in wheelhouse.parse_lock(lock):
        mine = sorted((f, h) for f, h in wheels.items() if wheelhouse.wheel_name(f) == pin.name)
        for name, digest in mine:
            if digest not in pin.hashes:
                raise ConfigError(f"{lock}: the build installed {name} (sha256 {digest[:12]}...), a file the lock does "
                                  f"not allow for {pin.name}=={pin.version}",
                                  hint="the build record and the lock disagree: publish from the build's own checkout")
        out[pin.name] = mine
    return out


def _wheel_dependencies(lock: Path, wheels: Dict[str, str]) -> List[Dict]:
    # The wheel the build installed; where the build record does not say, every file the lock allows
    # (pip --require-hashes installs only one of them).
    installed = installed_wheels(lock, wheels)
    out = []
    for pin in wheelhouse.parse_lock(lock):
        uri = f"pkg:pypi/{pin.name}@{pin.version}"
        if installed[pin.name]:
            out += [{"uri": uri, "name": f, "digest": locks.digest_set(h)} for f, h in installed[pin.name]]
        else:
            out += [{"uri": uri, "digest": d} for d in locks.allowed_digests(pin)]
    return out


def predicate(facts: BuildFacts) -> Dict:
    base = ImageRef.parse(facts.base_image)
    base_name, base_digest = base.tagged, base.digest or ""
    deps: List[Dict] = [
        {"uri": f"oci://{base_name}", "name": "base image", "digest": locks.digest_set(base_digest.split(":", 1)[-1])},
        {"uri": f"file:images/locks/{facts.lock.name}", "name": "lock file",
         "digest": locks.digest_set(hashlib.sha256(facts.lock.read_bytes()).hexdigest())},
    ]
    commit = facts.revision.removesuffix("-dirty")
    source: Dict = {"uri": f"git+{facts.source_url}" if facts.source_url else "git+local", "name": "source revision"}
    if _GIT_COMMIT.fullmatch(commit):
        source["digest"] = {"gitCommit": commit}
    else:  # built outside a git checkout: no commit, so no digest (a DigestSet value is a hex digest)
        source["annotations"] = {"revision": facts.revision}
    if facts.revision.endswith("-dirty"):
        source.setdefault("annotations", {})["dirty"] = True
    deps.append(source)
    deps += _wheel_dependencies(facts.lock, facts.wheels)
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"target": facts.target, "profile": facts.profile, "base": facts.base_kind,
                                   "platform": facts.platform},
            "internalParameters": {"engine": facts.engine, "builder": facts.builder},
            "resolvedDependencies": deps,
        },
        "runDetails": {
            "builder": {"id": BUILDER_ID, "version": {"blackwell-qualify": facts.toolkit_version}},
            "metadata": {"invocationId": f"{facts.target}-{facts.profile}-{facts.base_kind}@{commit}"},
        },
    }


def statement(subject_name: str, subject_digest: str, facts: BuildFacts) -> Dict:
    return mf.statement(subject_name, subject_digest, predicate(facts)) | {"predicateType": PREDICATE_TYPE}


def facts_from_record(record: BuildRecord, lock: Path, toolkit_version: str) -> BuildFacts:
    labels = record.labels
    return BuildFacts(
        target=record.target, profile=record.profile, base_kind=record.base_kind,
        platform=record.platform, base_image=record.base_image, lock=lock,
        revision=labels.get(paths.OCI_REVISION, "unknown"),
        source_url=labels.get(paths.OCI_SOURCE, ""), engine=record.engine,
        builder=record.builder, toolkit_version=toolkit_version, build_seconds=record.build_seconds,
        wheels=dict(record.wheels),
    )
