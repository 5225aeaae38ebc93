"""docker-bake.json from the targets file: the same builds `nox -s build-<target>` runs.

Every bake target's build arguments and labels come from `imagebuild/image.py:plan`
(the build's own dry run), never re-derived here. Values that change with
every commit or clone (revision, source URL, epoch, the SHA256SUMS digest)
become bake variables, so the committed file changes only when the targets
file, the locks or the Dockerfile's inputs do; `python -m qualify bake --env`
prints their values for this checkout. Only the `pinned` base is baked: the
hermetic base is made on the build host itself.

The JSON is bake's documented format (docs/bake-reference.md in docker/buildx):
`variable`, `group` and `target` blocks; a target's `args`, `labels`,
`attest`, `cache-from`, `cache-to`, `context`, `dockerfile`,
`dockerfile-inline`, `inherits`, `platforms`, `tags`, `target`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping

from qualify.config.targets import PROFILES, REPO_ROOT, Target, TargetsFile
from qualify.core.errors import ConfigError
from qualify.host import paths, provenance
from qualify.host.registry import DEFAULT_ADDRESS
from qualify.imagebuild import image

BAKE_FILE = REPO_ROOT / "docker-bake.json"
CONTEXT_DIR = "build/bake"  # relative to the repository root, where bake runs
COMMON = "_common"
BASE_KIND = "pinned"
PROBE_IMAGE = "blackwell/qualify-probe"
PROBE_ROOT = "/opt/qualify-probe"  # where the probe bundle image keeps the image side

# Per-commit or per-clone values -> the bake variable that carries them.
LABEL_VARIABLES = {
    paths.OCI_SOURCE: "SOURCE_URL",
    paths.OCI_REVISION: "REVISION",
    paths.OCI_CREATED: "CREATED",
    paths.LABEL_SHA256SUMS: "SHA256SUMS_DIGEST",
}
ARG_VARIABLES = {"SOURCE_DATE_EPOCH": "SOURCE_DATE_EPOCH"}
VARIABLES = ("REGISTRY", "SOURCE_URL", "REVISION", "CREATED", "SHA256SUMS_DIGEST", "SOURCE_DATE_EPOCH", "PROBE_TAG")


@dataclass(frozen=True)
class BakeTarget:
    """One bake target: a toolkit target built with one profile."""

    target: Target
    profile: str

    @property
    def name(self) -> str:
        return f"{self.target.name}-{self.profile}"

    @property
    def context(self) -> str:
        return f"{CONTEXT_DIR}/{self.name}"

    @property
    def repository(self) -> str:
        return image.image_repository(self.target)

    @property
    def tag(self) -> str:
        # The tag `nox -s build-<target>` gives (`<profile>-<base kind>`), on the variable registry.
        return f"${{REGISTRY}}/{self.repository}:{self.profile}-{BASE_KIND}"

    @property
    def cache_ref(self) -> str:
        return f"${{REGISTRY}}/{self.repository}:buildcache-{self.profile}"


def bake_targets(tf: TargetsFile) -> List[BakeTarget]:
    return [BakeTarget(t, p) for p in PROFILES for t in tf.targets.values() if p in t.profiles]


def current_variables() -> Dict[str, str]:
    """This checkout's values of the per-commit variables (`bake --env`)."""
    from qualify.qualification.container import probe_sources_digest

    epoch = provenance.source_date_epoch()
    return {
        "REGISTRY": os.environ.get("QUALIFY_REGISTRY", DEFAULT_ADDRESS),
        "SOURCE_URL": provenance.source_url(),
        "REVISION": provenance.revision(),
        "CREATED": provenance.iso(epoch),
        "SHA256SUMS_DIGEST": provenance.sha256sums_digest(),
        "SOURCE_DATE_EPOCH": epoch,
        "PROBE_TAG": probe_tag(probe_sources_digest()),
    }


def probe_tag(probe_digest: str) -> str:
    """The probe bundle's tag names what is inside it: the image side's sources digest."""
    return "probe-" + probe_digest.split(":", 1)[1][:16]


def _escape(value: str) -> str:
    """A literal value in bake's template syntax (`${` and `%{` start templates)."""
    return value.replace("${", "$${").replace("%{", "%%{")


# Labels the build leaves out when their value is empty (no https remote: no source label). The bake file
# keeps them as variables so it does not depend on the checkout that wrote it; empty resolves to absent.
OPTIONAL_LABELS = (paths.OCI_SOURCE,)


def _templated(values: Mapping[str, str], variables: Mapping[str, str], where: str) -> Dict[str, str]:
    missing = sorted(set(variables) - set(values) - set(OPTIONAL_LABELS))
    if missing:
        # The build changed its labels or arguments: the variable table here must follow.
        raise ConfigError(f"{where}: the build no longer sets {', '.join(missing)}",
                          hint="update LABEL_VARIABLES / ARG_VARIABLES in qualify/scaleout/bake.py")
    keys = sorted(set(values) | (set(variables) & set(OPTIONAL_LABELS)))
    return {k: (f"${{{variables[k]}}}" if k in variables else _escape(values[k])) for k in keys}


def _target_block(tf: TargetsFile, bt: BakeTarget) -> Dict[str, Any]:
    plan = image.plan(tf, image.BuildOptions(target=bt.target.name, base=BASE_KIND, profile=bt.profile))
    return {
        "context": bt.context,
        "args": _templated(plan.build_args, ARG_VARIABLES, f"build arguments of {bt.name}"),
        "labels": _templated(plan.labels, LABEL_VARIABLES, f"labels of {bt.name}"),
        "platforms": [plan.platform],
        "target": plan.profile,
        "tags": [bt.tag],
        "cache-from": [f"type=registry,ref={bt.cache_ref}"],
        # mode=max keeps the venv and ext-builder stages too: they are the slow ones.
        "cache-to": [f"type=registry,ref={bt.cache_ref},mode=max"],
    }


def _hoist_common(blocks: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """What every target shares moves to `_common` (bake's `inherits`), derived, not listed."""
    common: Dict[str, Any] = {
        "dockerfile": "Dockerfile",
        # Provenance and an SBOM attached to each image by BuildKit (needs a registry output: --push).
        "attest": ["type=provenance,mode=max", "type=sbom"],
    }
    for key in ("args", "labels"):
        maps = [b[key] for b in blocks.values()]
        shared = {k: v for k, v in maps[0].items() if all(m.get(k) == v for m in maps[1:])}
        if shared:
            common[key] = shared
        for b in blocks.values():
            b[key] = {k: v for k, v in b[key].items() if k not in shared}
    for b in blocks.values():
        b["inherits"] = [COMMON]
    return common


def _probe_block(target: Target) -> Dict[str, Any]:
    """The probe bundle for Kubernetes' initContainer: the image side on the target's own base.

    FROM the same base digest as the image under test, so a node pulls only the
    probe's layer; COPY only (no RUN), so arm64 bundles need no emulator.
    """
    return {
        "context": f"{CONTEXT_DIR}/probe",
        "dockerfile-inline": _escape(f"FROM {target.base.image.by_digest}\nCOPY . {PROBE_ROOT}/\n"),
        "platforms": [target.platform],
        "tags": [f"${{REGISTRY}}/{PROBE_IMAGE}:${{PROBE_TAG}}-{target.name}"],
    }


def generate(tf: TargetsFile) -> Dict[str, Any]:
    bts = bake_targets(tf)
    blocks = {bt.name: _target_block(tf, bt) for bt in bts}
    targets = {COMMON: _hoist_common(blocks), **blocks}
    for t in tf.targets.values():
        targets[f"probe-{t.name}"] = _probe_block(t)
    groups = {p: {"targets": [bt.name for bt in bts if bt.profile == p]} for p in PROFILES}
    groups["probe"] = {"targets": [f"probe-{t.name}" for t in tf.targets.values()]}
    groups["default"] = {"targets": ["vllm"]}
    variables = {name: {"default": DEFAULT_ADDRESS if name == "REGISTRY" else ""} for name in VARIABLES}
    return {"group": groups, "target": targets, "variable": variables}


def dumps(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


# --- reading back (tests and `bake --check`) ---------------------------------


def resolve(doc: Mapping[str, Any], name: str, values: Mapping[str, str]) -> Dict[str, Any]:
    """A target as bake would resolve it: `inherits` merged (maps merged, later wins), `${VAR}` filled.

    Only what this module emits is handled: plain `${NAME}` references and `$${` escapes.
    """
    block = doc["target"][name]
    merged: Dict[str, Any] = {}
    for parent in block.get("inherits", []):
        for key, value in resolve(doc, parent, values).items():
            merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    for key, value in block.items():
        if key == "inherits":
            continue
        merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    filled = _fill(merged, values)
    if "labels" in filled:  # an optional label bake would set empty is one the build leaves out
        filled["labels"] = {k: v for k, v in filled["labels"].items() if v or k not in OPTIONAL_LABELS}
    return filled


def _fill(value: Any, values: Mapping[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _fill(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, values) for v in value]
    if isinstance(value, str):
        out = value.replace("$${", "\0").replace("%%{", "\1")
        for name, val in values.items():
            out = out.replace(f"${{{name}}}", val)
        if "${" in out:
            raise ConfigError(f"unresolved bake variable in {value!r}")
        return out.replace("\0", "${").replace("\1", "%{")
    return value


def check(path: Path, tf: TargetsFile) -> None:
    """Refuse a committed bake file that is not what the targets file gives now."""
    want = dumps(generate(tf))
    have = path.read_text(encoding="utf-8") if path.exists() else ""
    if have != want:
        raise ConfigError(f"{path} is not what {tf.path} gives now",
                          hint="run `nox -s bake` (python -m qualify bake) and commit the result")
