"""SLSA Provenance v1 (https://slsa.dev/provenance/v1) for a built image, from
its build record (build/images/*.json) and its lock file."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

from qualify.core.manifest import STATEMENT_TYPE
from qualify.host import paths
from qualify.imagebuild import wheelhouse
from qualify.imagebuild.image import BuildRecord

PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://blackwell-qualify.dev/build/image/v1"
BUILDER_ID = "https://blackwell-qualify.dev/builder/qualify-build/v1"


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


def _wheel_dependencies(lock: Path) -> List[Dict]:
    # Every hash the lock allows: pip --require-hashes installs only a wheel with one of them.
    out = []
    for pin in wheelhouse.parse_lock(lock):
        for h in sorted(pin.hashes):
            algo, _, value = h.partition(":")
            out.append({"uri": f"pkg:pypi/{pin.name}@{pin.version}", "digest": {algo: value}})
    return out


def predicate(facts: BuildFacts) -> Dict:
    base_name, _, base_digest = facts.base_image.partition("@")
    deps: List[Dict] = [
        {"uri": f"oci://{base_name}", "name": "base image", "digest": {"sha256": base_digest.split(":", 1)[-1]}},
        {"uri": f"file:images/locks/{facts.lock.name}", "name": "lock file",
         "digest": {"sha256": hashlib.sha256(facts.lock.read_bytes()).hexdigest()}},
    ]
    commit = facts.revision.removesuffix("-dirty")
    source = {"uri": f"git+{facts.source_url}" if facts.source_url else "git+local", "name": "source revision",
              "digest": {"gitCommit": commit}}
    if facts.revision.endswith("-dirty"):
        source["annotations"] = {"dirty": True}
    deps.append(source)
    deps += _wheel_dependencies(facts.lock)
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
    return {"_type": STATEMENT_TYPE,
            "subject": [{"name": subject_name, "digest": {"sha256": subject_digest.split(":", 1)[1]}}],
            "predicateType": PREDICATE_TYPE, "predicate": predicate(facts)}


def facts_from_record(record: BuildRecord, lock: Path, toolkit_version: str) -> BuildFacts:
    labels = record.labels
    return BuildFacts(
        target=record.target, profile=record.profile, base_kind=record.base_kind,
        platform=record.platform, base_image=record.base_image, lock=lock,
        revision=labels.get(paths.OCI_REVISION, "unknown"),
        source_url=labels.get(paths.OCI_SOURCE, ""), engine=record.engine,
        builder=record.builder, toolkit_version=toolkit_version, build_seconds=record.build_seconds,
    )
