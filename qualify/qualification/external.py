"""Qualify an image this toolkit did not build (issue 34): `qualify qualify --image REF --target T`.

The probe needs nothing from our build: it runs with the image's own python3 in a container with no
network. What differs is what the manifest can say. Its subject is the image's digest (a tag is asked of
its registry once, and from then on only the digest is used); `predicate.image.origin` is `external`, with
the image's labels and `Env`; the base is `unknown`, and no build facts are invented. The profile comes
from what the image holds (vLLM or not) unless given; the probe judges each serving engine installed (vLLM,
SGLang) by its own rules. The checks judge the image by what it holds, not
against our wiring (probe `--origin external`).

External qualifications are written under build/external/, never into build/manifests/ (the release
input): a release holds one manifest per target, of our own builds (release/assess.py refuses them).
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from qualify.config.imageref import ImageRef, ImageRefError, digests_for
from qualify.config.targets import Target, TargetsFile
from qualify.core import manifest
from qualify.core.enums import Origin, Profile
from qualify.core.errors import ConfigError, EngineError, RegistryError
from qualify.core.fsutil import write_atomic
from qualify.core.report import Reporter
from qualify.host import paths, provenance, skopeo
from qualify.host.engine import Engine
from qualify.qualification import container
from qualify.qualification.stage import Qualified, validate

REPORT = Reporter("qualify")

EXTERNAL_DIR = paths.HERE.external
ORIGIN = Origin.EXTERNAL  # what --origin the probe is given and predicate.image.origin says
_IMAGE_ID = re.compile(r"(?:sha256:)?([0-9a-f]{12,64})")
# Env names whose values are credentials more often than not: the manifest is meant to be published.
_SECRET = re.compile(r"(?i)(token|secret|passw(or)?d|credential|api_?key|private_?key|auth)")


@dataclass(frozen=True)
class ExternalImage:
    """An image resolved to what it is: its digest, never a tag."""

    requested: str  # what was asked for, as given
    name: str  # the repository (the Statement's subject name)
    digest: str  # sha256:<hex>: the registry's manifest digest, or the image id of an image only this engine has
    reference: str  # what the probe runs: name@digest, or the image id
    image_id: str
    platform: str  # os/architecture as the image's config says
    resolved_by: str  # digest | registry (a tag asked of its registry) | local (a tag or id of this engine's store)
    labels: Mapping[str, str] = field(default_factory=dict)
    env: Tuple[str, ...] = ()

    def to_predicate(self) -> Dict[str, Any]:
        return {"reference": self.reference, "digest": self.digest, "id": self.image_id, "origin": ORIGIN,
                "requested": self.requested, "resolved_by": self.resolved_by, "platform": self.platform,
                "labels": dict(self.labels), "env": [_redacted(e) for e in self.env]}


def _redacted(entry: str) -> str:
    key, sep, value = entry.partition("=")
    return f"{key}=<redacted: {len(value)} characters>" if sep and value and _SECRET.search(key) else entry


def _has_registry(name: str) -> bool:
    first = name.split("/", 1)[0]
    return "/" in name and ("." in first or ":" in first or first == "localhost")


def _loopback(name: str) -> Tuple[str, ...]:
    host = name.split("/", 1)[0]
    return (host,) if host.startswith(("127.", "localhost:", "[::1]:")) else ()


def _registry_digest(ref: ImageRef) -> str:
    """What the registry serves for `name:tag` now (the sha256 of the manifest bytes it returns)."""
    what = f"resolving the tag {ref.tagged} to its digest"
    raw = skopeo.inspect_raw(f"docker://{ref.tagged}", _loopback(ref.name), what=what)
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _inspect(engine: Engine, ref: str, requested: str) -> Dict[str, Any]:
    found = engine.inspect_existing([ref])
    if not found:
        raise ConfigError(f"--image {requested}: the engine has no image {ref}",
                          hint="give repository@sha256:<digest> of a registry the engine can pull from, or a local "
                               "image id (docker image inspect --format '{{.Id}}' IMAGE)")
    return found[0]


def _pull(engine: Engine, ref: str, platform: str, requested: str) -> None:
    try:
        engine.pull(ref, platform=platform, timeout=3600)
    except EngineError as exc:
        said = exc.message.lower()
        if "no matching manifest" in said or "does not match the specified platform" in said:
            raise ConfigError(f"--image {requested}: the registry has no {platform} image under {ref}",
                              hint="qualify it for a target of a platform it has (python -m qualify targets list)"
                              ) from None
        raise EngineError(f"--image {requested}: cannot pull {ref}: {exc.message.splitlines()[-1][:300]}",
                          hint="check the reference and the engine's registry login (`docker login HOST`)") from None


def resolve(engine: Engine, requested: str, platform: str) -> ExternalImage:
    """The image `requested` names, by digest. A local image id is taken as it is; `name@sha256:` is pulled
    when absent; a tag is asked of its registry (a name with a registry host) or of the engine's store (a
    name without one: nothing else can be asked), and only the digest is used from then on."""
    text = requested.strip()
    m = _IMAGE_ID.fullmatch(text)
    if m:
        raw = _inspect(engine, text, requested)
        return _from_inspect(raw, requested, name=_local_name(raw), digest=raw["Id"], reference=raw["Id"], by="local")
    try:
        ref = ImageRef.parse(text)
    except ImageRefError as exc:
        raise ConfigError(f"--image {requested!r}: {exc}",
                          hint="give repository@sha256:<digest>, repository:tag or a local image id") from None
    if ref.digest:
        by, digest = "digest", ref.digest
    elif _has_registry(ref.name):
        try:
            by, digest = "registry", _registry_digest(ref)
        except RegistryError as exc:
            raise RegistryError(f"--image {requested}: {exc.message}", hint=exc.hint) from None
    else:
        raw = _inspect(engine, ref.tagged, requested) if engine.exists(ref.tagged) else None
        if raw is None:
            _pull(engine, ref.tagged, platform, requested)
            raw = _inspect(engine, ref.tagged, requested)
        own = digests_for(raw.get("RepoDigests") or [], ref.name)
        # An image built here and never pushed has no registry digest: its id is what it is.
        digest = own[0] if len(own) == 1 else raw["Id"]
        reference = f"{ref.name}@{digest}" if len(own) == 1 else raw["Id"]
        return _from_inspect(raw, requested, name=ref.name, digest=digest, reference=reference, by="local")
    by_digest = f"{ref.name}@{digest}"
    if not engine.exists(by_digest):
        _pull(engine, by_digest, platform, requested)
    raw = _inspect(engine, by_digest, requested)
    return _from_inspect(raw, requested, name=ref.name, digest=digest, reference=by_digest, by=by)


def _local_name(raw: Mapping[str, Any]) -> str:
    tags = [t for t in raw.get("RepoTags") or [] if t and t != "<none>:<none>"]
    return ImageRef.parse(tags[0]).name if tags else "local-image"


def _from_inspect(raw: Mapping[str, Any], requested: str, *, name: str, digest: str, reference: str,
                  by: str) -> ExternalImage:
    config = raw.get("Config") or {}
    platform = f"{raw.get('Os') or 'unknown'}/{raw.get('Architecture') or 'unknown'}"
    labels = {str(k): str(v) for k, v in (config.get("Labels") or {}).items()}
    return ExternalImage(requested=requested, name=name, digest=digest, reference=reference, image_id=raw["Id"],
                         platform=platform, resolved_by=by, labels=labels,
                         env=tuple(str(e) for e in config.get("Env") or ()))


def check_platform(img: ExternalImage, target: Target) -> None:
    """An image for another platform cannot run on the target's hosts: refused, not emulated into a verdict."""
    if img.platform != target.platform:
        gpus = ", ".join(target.gpus) or target.name
        raise ConfigError(f"--image {img.requested} is a {img.platform} image ({img.digest}); target {target.name} "
                          f"({gpus}) runs {target.platform}: it cannot run there",
                          hint=f"qualify it for a {img.platform} target (python -m qualify targets list), or give "
                               f"the image's {target.platform} variant")


# The profile (vllm when vLLM is installed, else smoke), then the serving engines the probe has rules for
# (vllm, sglang: probe/providers/rules.py ENGINES), as the image's python3 sees its distributions.
_ENGINES = ("vllm", "sglang")
_HAS_VLLM = ("import importlib.metadata as m, re; n = {re.sub(r'[-_.]+', '-', (d.metadata.get('Name') or '').lower()) "
             f"for d in m.distributions()}}; print(' '.join(['vllm' if 'vllm' in n else 'smoke'] + "
             f"[e for e in {_ENGINES!r} if e in n]))")


def detect(engine: Engine, img: ExternalImage) -> Tuple[Profile, Tuple[str, ...]]:
    """(vllm when the image's python3 sees a vLLM distribution, else smoke (Triton and CUDA libraries only);
    the serving engines installed, whose rules the probe applies)."""
    container.interpreter(engine, img.reference, img.platform)  # no python3, or too old: the clear error first
    proc = engine.run_container(img.reference, ["python3", "-c", _HAS_VLLM], mounts=[], env={}, network="none",
                                platform=img.platform, timeout=300, init=True)
    said = (proc.stdout.strip().splitlines()[-1:] or [""])[0].split() if proc.returncode == 0 else []
    if not said or said[0] not in ("vllm", "smoke") or not set(said[1:]) <= set(_ENGINES):
        raise EngineError(f"{img.reference}: asking its python3 which packages it has failed "
                          f"(exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-300:]}",
                          hint="give the profile with --profile vllm|smoke")
    return Profile(said[0]), tuple(said[1:])


def detect_profile(engine: Engine, img: ExternalImage) -> Profile:
    return detect(engine, img)[0]


def _detected(profile: Profile, engines: Tuple[str, ...]) -> str:
    said = "vLLM is installed" if profile == Profile.VLLM else "no vLLM installed"
    if "sglang" in engines:
        said += "; SGLang too: judged by both engines' rules" if "vllm" in engines else \
            "; SGLang is: judged by SGLang's rules"
    return said


def default_path(target: str, img: ExternalImage) -> Path:
    return EXTERNAL_DIR / f"{target}-{img.digest.split(':', 1)[1][:16]}.json"


def assemble(img: ExternalImage, run: container.ProbeRun) -> Dict[str, Any]:
    """The Statement about `img`: what the probe found, the image as its config says, and no build facts."""
    predicate = dict(run.predicate)
    predicate["image"] = img.to_predicate()
    predicate["base"] = {"kind": "unknown"}
    predicate["toolkit"] = {**predicate.get("toolkit", {}), "source_revision": provenance.revision(),
                            "probe_sha256": run.probe_sha256}
    doc = manifest.statement(img.name, img.digest, predicate)
    validate(doc)
    return doc


def qualify(tf: TargetsFile, target_name: str, requested: str, engine: Engine, *, profile: Optional[str] = None,
            gpus: Optional[str] = None, out: Optional[Path] = None) -> Qualified:
    """Resolve, check the platform, probe, write the manifest (atomically) and return its path."""
    target = tf.get(target_name)
    start = time.monotonic()
    img = resolve(engine, requested, target.platform)
    check_platform(img, target)
    REPORT.say(f"{requested} is {img.reference} ({img.platform}, resolved by {img.resolved_by})")
    try:
        if profile:
            chosen = Profile(profile)
        else:
            chosen, engines = detect(engine, img)
            REPORT.say(f"profile {chosen} (detected: {_detected(chosen, engines)})")
        emulated = target.platform != engine.native_platform()
        run = container.run_probe(engine, img.reference, container.probe_target(target, chosen.value, emulated),
                                  gpus=gpus, origin=ORIGIN)
    except EngineError as exc:  # name the image as it was asked for (a local image runs by its bare id)
        if img.requested in exc.message:
            raise
        raise EngineError(f"--image {img.requested}: {exc.message}", hint=exc.hint) from None
    doc = assemble(img, run)
    path = write_atomic(out or default_path(target.name, img), manifest.dumps(doc))
    REPORT.say(f"{path} ({time.monotonic() - start:.1f} s)")
    return Qualified(path, manifest.Manifest.from_statement(doc, str(path)))
