"""Build one target's image: base by digest, hash-locked payload, wiring, labels.

Steps (each small and testable): resolve the base -> prepare the wheelhouse
-> stage the build context -> build -> push to the loopback registry -> write
the build record. Qualification runs afterwards (qualify/qualification/).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Optional

from qualify.config.imageref import ImageRef
from qualify.config.targets import PROFILES, REPO_ROOT, Target, TargetsFile
from qualify.core import arch, fsutil
from qualify.core.errors import BuildError, ConfigError
from qualify.core.fsutil import write_json
from qualify.host import ledger, paths, provenance
from qualify.host.engine import BuildRequest, Engine
from qualify.host.registry import Registry
from qualify.imagebuild import buildcache, hermetic, wheelhouse

IMAGES_DIR = REPO_ROOT / "images"
# Files of images/ that go into every build context.
_CONTEXT_FILES = ("Dockerfile", "ensure-python.sh", "smoke/smoke_ext.cu",
                  "triton-allocator/blackwell_triton_allocator.py", "triton-allocator/blackwell_triton_allocator.pth")


@dataclass(frozen=True)
class BuildOptions:
    target: str
    base: str = "pinned"
    profile: str = "vllm"
    engine: str = "docker"
    no_cache: bool = False
    keep_cache: bool = False  # keep the build cache and intermediate images this build makes
    # Both builds of a repro run get the same epoch, whatever happens to HEAD meanwhile.
    source_date_epoch: Optional[str] = None
    # A scratch build (repro): tag `<profile>-<base>-<suffix>`, its own context, no build record.
    tag_suffix: str = ""


@dataclass(frozen=True)
class BuildRecord:
    target: str
    profile: str
    base_kind: str
    platform: str
    base_image: str  # name@sha256:...
    image_reference: str  # registry/name@sha256:... (what manifests and start.sh use)
    image_tag: str
    image_id: str
    engine: str
    builder: str
    labels: Dict[str, str]
    build_seconds: float

    @property
    def digest(self) -> str:
        return self.image_reference.split("@", 1)[1]


def record_path(target: str, profile: str, base_kind: str) -> Path:
    return paths.HERE.build_record(target, profile, base_kind)


def load_record(target: str, profile: str, base_kind: str) -> Optional[BuildRecord]:
    path = record_path(target, profile, base_kind)
    if not path.exists():
        return None
    return BuildRecord(**json.loads(path.read_text()))


def image_repository(target: Target) -> str:
    return f"blackwell/{target.name}"


def build_args(target: Target, base: ImageRef, epoch: str) -> Dict[str, str]:
    return {
        "BASE_IMAGE": base.by_digest,
        "TORCH_CUDA_ARCH_LIST": target.torch_cuda_arch_list,
        "NVCC_GENCODE": " ".join(arch.gencode_flags(target.torch_cuda_arch_list)),
        "SOURCE_DATE_EPOCH": epoch,
        **target.triton.env(),
    }


def labels(target: Target, opts: BuildOptions, base: ImageRef, lock: Path, epoch: str) -> Dict[str, str]:
    out = {
        paths.OCI_TITLE: f"blackwell-{target.name}-{opts.profile}",
        paths.OCI_DESCRIPTION: f"{target.description}: {opts.profile} profile",
        paths.OCI_SOURCE: provenance.source_url(),
        paths.OCI_REVISION: provenance.revision(),
        paths.OCI_VERSION: provenance.toolkit_version(),
        paths.OCI_CREATED: provenance.iso(epoch),
        paths.OCI_BASE_NAME: provenance.qualified_name(base.tagged),
        paths.OCI_BASE_DIGEST: base.digest or "",
        paths.LABEL_TARGET: target.name,
        paths.LABEL_CAPABILITY: str(target.capability),
        paths.LABEL_PLATFORM: target.platform,
        paths.LABEL_ARCH_LIST: target.torch_cuda_arch_list,
        paths.LABEL_PROFILE: opts.profile,
        paths.LABEL_BASE_KIND: opts.base,
        paths.LABEL_INTENDED_LEVEL: target.support_level,
        paths.LABEL_LOCK_SHA256: fsutil.sha256_file(lock),
        paths.LABEL_SHA256SUMS: provenance.sha256sums_digest(),
    }
    if not out[paths.OCI_SOURCE]:
        del out[paths.OCI_SOURCE]  # no network remote: absent, never a local path
    return out


def resolve_base(engine: Engine, tf: TargetsFile, target: Target, opts: BuildOptions, registry: Registry) -> ImageRef:
    if opts.base == "hermetic":
        return hermetic.ensure_base(engine, tf, target, registry)
    engine.ensure_base(target.base.image, target.platform)
    return target.base.image


def stage_context(name: str, lock: Path, wheels: Path) -> Path:
    """A build context holding exactly what the Dockerfile needs (hard links, no copies of GBs).
    Each build gets its own directory: two checkouts may build the same target at once."""
    parent = paths.build_contexts()
    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_contexts(parent, name)
    ctx = Path(tempfile.mkdtemp(prefix=f"{name}-{os.getpid()}-", dir=parent))
    (ctx / "wheelhouse").mkdir()
    for rel in _CONTEXT_FILES:
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(IMAGES_DIR / rel, ctx / rel)
    shutil.copy2(lock, ctx / "requirements.txt")
    for wheel in sorted(wheels.glob("*.whl")):
        _link_or_copy(wheel, ctx / "wheelhouse" / wheel.name)
    return ctx


def _remove_stale_contexts(parent: Path, name: str) -> None:
    """Contexts of this build that a killed run left (its pid in the name, and no longer alive)."""
    from qualify.core.fsutil import pid_alive

    for stale in parent.glob(f"{name}-*"):
        pid = stale.name[len(name) + 1:].split("-", 1)[0]
        if stale.is_dir() and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
            print(f"[build] removed {stale.name}, the context of a build that was killed", file=sys.stderr, flush=True)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@dataclass(frozen=True)
class BuildPlan:
    """What a build would do, resolved without building (`--dry-run` prints it, like `bake --print`)."""

    target: str
    profile: str
    base_kind: str
    platform: str
    base: str  # name@sha256:..., or what a hermetic base not built yet will be
    lock: str
    build_args: Dict[str, str]
    labels: Dict[str, str]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


@dataclass(frozen=True)
class _UnbuiltBase:
    """The hermetic base before it exists: its name is known, its digest is not."""

    tagged: str
    digest: str = ""

    @property
    def by_digest(self) -> str:
        return f"{self.tagged.rsplit(':', 1)[0]}@<digest once built>"


def _checked_lock(tf: TargetsFile, target: Target, opts: BuildOptions) -> Path:
    if opts.profile not in PROFILES:
        raise ConfigError(f"unknown profile {opts.profile!r}", hint="use --profile smoke or --profile vllm")
    lock = target.lock_path(opts.profile, target.python_for(opts.base, tf.hermetic))
    wheelhouse.parse_lock(lock)  # refuse a missing or unhashed lock before any engine call
    return lock


def plan(tf: TargetsFile, opts: BuildOptions) -> BuildPlan:
    """The build's arguments and labels, with no engine, registry or network call."""
    target = tf.get(opts.target)
    lock = _checked_lock(tf, target, opts)
    if opts.base == "pinned":
        base = target.base.image
    else:
        base = _UnbuiltBase(hermetic.base_tag(tf, target, Registry.from_env()))
    epoch = opts.source_date_epoch or provenance.source_date_epoch()
    return BuildPlan(target=target.name, profile=opts.profile, base_kind=opts.base, platform=target.platform,
                     base=base.by_digest, lock=str(lock.relative_to(REPO_ROOT)),
                     build_args=build_args(target, base, epoch), labels=labels(target, opts, base, lock, epoch))


def build(tf: TargetsFile, opts: BuildOptions, engine: Optional[Engine] = None,
          registry: Optional[Registry] = None) -> BuildRecord:
    target = tf.get(opts.target)
    lock = _checked_lock(tf, target, opts)
    python = target.python_for(opts.base, tf.hermetic)
    engine = (engine or Engine(opts.engine)).check()
    registry = (registry or Registry.from_env()).ensure()
    start = time.monotonic()
    print(f"[build] {target.name} ({target.description}), profile {opts.profile}, {opts.base} base, "
          f"{target.platform}", file=sys.stderr, flush=True)
    base = resolve_base(engine, tf, target, opts, registry)
    wheels = wheelhouse.prepare(lock, target.platform, python)
    epoch = opts.source_date_epoch or provenance.source_date_epoch()
    suffix = f"-{opts.tag_suffix}" if opts.tag_suffix else ""
    ctx = stage_context(f"{target.name}-{opts.profile}-{opts.base}{suffix}", lock, wheels)
    tag = f"{registry.ref(image_repository(target))}:{opts.profile}-{opts.base}{suffix}"
    previous = engine.image_id(tag)  # "" on a first build
    image_labels = labels(target, opts, base, lock, epoch)
    before = None if opts.keep_cache else buildcache.footprint(engine)
    image_id = engine.build(BuildRequest(
        context=ctx, dockerfile=ctx / "Dockerfile", tags=[tag], platform=target.platform,
        build_args=build_args(target, base, epoch), labels=image_labels, target=opts.profile,
        no_cache=opts.no_cache, source_date_epoch=epoch,
    ))
    shutil.rmtree(ctx, ignore_errors=True)  # links into the wheelhouse; kept only when the build failed
    if before is not None:  # a failed build keeps its cache: the rerun that fixes it starts from there
        buildcache.report(buildcache.remove_what_the_build_made(engine, before, image_id, tag, engine.image_id(base.by_digest)))
    _check_platform(engine, tag, target)
    digest = engine.push(tag)
    ledger.record(image_id, f"{tag.rsplit(':', 1)[0]}@{digest}")
    _drop_previous(engine, previous, image_id)
    record = BuildRecord(
        target=target.name, profile=opts.profile, base_kind=opts.base, platform=target.platform,
        base_image=base.by_digest, image_reference=f"{tag.rsplit(':', 1)[0]}@{digest}", image_tag=tag,
        image_id=image_id, engine=engine.name, builder=engine.builder, labels=image_labels,
        build_seconds=round(time.monotonic() - start, 1),
    )
    if not opts.tag_suffix:
        write_json(record_path(target.name, opts.profile, opts.base), asdict(record))
    print(f"[build] {record.image_reference}  ({record.build_seconds:.1f} s)", file=sys.stderr, flush=True)
    return record


def _drop_previous(engine: Engine, previous: str, image_id: str) -> None:
    """The image this tag named before a rebuild, now nameless: removed (its digest stays in the registry,
    where a release names it), so rebuilds do not leave gigabytes of dangling images behind."""
    if not previous or previous == image_id:
        return
    info = next(iter(engine.inspect_existing([previous])), None)
    if info is None or [t for t in info.get("RepoTags") or [] if not t.endswith(":<none>")]:
        return  # gone already, or still named (another tag, another checkout): not ours to take
    error = engine.remove_created([previous])
    note = f"; it stays: {error}" if error else ""
    print(f"[build] removed the previous image of this tag ({previous[:19]}), now unnamed{note}", file=sys.stderr,
          flush=True)


def _check_platform(engine: Engine, ref: str, target: Target) -> None:
    info = engine.inspect(ref)
    want = target.arch_tag
    if info is None or info.architecture != want:
        raise BuildError(f"built image {ref} is {info.architecture if info else 'missing'}, not {want}",
                         hint="the engine ignored --platform; use Debian's docker client with BuildKit or podman")
