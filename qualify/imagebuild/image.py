"""Build one target's image: base by digest, hash-locked payload, wiring, labels.

Steps (each small and testable): resolve the base -> prepare the wheelhouse
-> stage the build context -> build -> push to the loopback registry -> write
the build record. Qualification runs afterwards (qualify/qualification/).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Type

from qualify.config.imageref import ImageRef
from qualify.config.targets import DEFAULT_BUILD, PROFILES, REPO_ROOT, BuildSettings, Target, TargetsFile
from qualify.core import arch, fsutil
from qualify.core.errors import BuildError, ConfigError, QualifyError
from qualify.core.fsutil import write_json
from qualify.core.readlimit import read_small, strict_json
from qualify.core.report import Reporter
from qualify.host import ledger, paths, provenance
from qualify.host.engine import BuildRequest, Engine
from qualify.host.registry import Registry
from qualify.imagebuild import buildcache, hermetic, locks, wheelhouse

REPORT = Reporter("build")

IMAGES_DIR = REPO_ROOT / "images"
# Files of images/ that go into every build context.
_CONTEXT_FILES = ("Dockerfile", "ensure-python.sh", "install-layer.sh", "runtime-user/add-user.sh",
                  "smoke/smoke_ext.cu", "triton-allocator/blackwell_triton_allocator.py",
                  "triton-allocator/blackwell_triton_allocator.pth")
# The Dockerfile's payload slots: `RUN --mount=type=bind,source=payload/<n>,...`, one per layer.
_SLOT_RE = re.compile(r"^RUN --mount=type=bind,source=payload/(\d+),", re.M)


@dataclass(frozen=True)
class BuildOptions:
    target: str
    base: str = "pinned"
    profile: str = "vllm"
    engine: str = "docker"
    no_cache: bool = False
    keep_cache: bool = False  # prune none of this checkout's build cache (it is still recorded, for `clean`)
    cache_budget_gb: Optional[float] = None  # older build cache kept; None: [build] cache_budget_gb of targets.toml
    # Both builds of a repro run get the same epoch, whatever happens to HEAD meanwhile.
    source_date_epoch: Optional[str] = None
    # A scratch build (repro): tag `<profile>-<base>-<suffix>`, its own context, no build record.
    tag_suffix: str = ""


# A build record is a few kB; anything larger is not one.
RECORD_LIMIT = 1 << 20
_RECORD_TEXT = ("target", "profile", "base_kind", "platform", "base_image", "image_reference", "image_tag",
                "image_id", "engine", "builder")
_DIGEST_REF = re.compile(r"[^@\s]+@sha256:[0-9a-f]{64}")
_WHEEL_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!-]{0,250}\.whl")
_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class BuildRecord:
    """What one build made, as build/images/<target>-<profile>-<base>.json holds it (`to_json`, `parse`)."""

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
    # Seconds of each step: base, wheels, build (export: its BuildKit export step), cache, push.
    steps: Dict[str, float] = field(default_factory=dict)
    # The wheel files the payload installed (file name -> sha256 hex), for SLSA provenance and the SBOM.
    wheels: Dict[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        return ImageRef.parse(self.image_reference).digest or ""

    def to_json(self) -> Dict[str, object]:
        return asdict(self)

    @classmethod
    def parse(cls, data: bytes, where: str, error: Type[QualifyError] = ConfigError) -> BuildRecord:
        """The record in `data` (strict JSON), every key known and of its type; `error` names the file and key."""
        hint = "rebuild the target (python -m qualify build TARGET) to write the record again"
        doc = strict_json(data, where, error)
        if not isinstance(doc, dict):
            raise error(f"{where}: a build record is a JSON object", hint=hint)
        unknown = sorted(set(doc) - {f.name for f in fields(cls)})
        missing = sorted({f.name for f in fields(cls)} - {"steps", "wheels"} - set(doc))
        if unknown or missing:
            raise error(f"{where}: not a build record (unknown keys: {', '.join(unknown) or 'none'}; missing: "
                        f"{', '.join(missing) or 'none'})", hint=hint)
        for key in _RECORD_TEXT:
            if not isinstance(doc[key], str):
                raise error(f"{where}: key {key!r}: {doc[key]!r} is not a string", hint=hint)
        if not _DIGEST_REF.fullmatch(doc["image_reference"]):
            raise error(f"{where}: key 'image_reference': {doc['image_reference']!r} is not name@sha256:<64 hex>",
                        hint=hint)
        if not _number(doc["build_seconds"]):
            raise error(f"{where}: key 'build_seconds': {doc['build_seconds']!r} is not a number", hint=hint)
        labels, steps = doc["labels"], doc.get("steps", {})
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise error(f"{where}: key 'labels' is not an object of strings", hint=hint)
        if not isinstance(steps, dict) or not all(_number(v) for v in steps.values()):
            raise error(f"{where}: key 'steps' is not an object of numbers", hint=hint)
        wheels = doc.get("wheels", {})
        if not isinstance(wheels, dict) or not all(_WHEEL_FILE.fullmatch(k) and isinstance(v, str) and _HEX.fullmatch(v)
                                                   for k, v in wheels.items()):
            raise error(f"{where}: key 'wheels' is not an object of wheel file names to sha256 hex digests", hint=hint)
        return cls(**{k: doc[k] for k in _RECORD_TEXT}, labels=dict(labels), build_seconds=float(doc["build_seconds"]),
                   steps={k: float(v) for k, v in steps.items()}, wheels=dict(wheels))


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def record_path(target: str, profile: str, base_kind: str) -> Path:
    return paths.HERE.build_record(target, profile, base_kind)


def read_record(path: Path, error: Type[QualifyError] = ConfigError) -> BuildRecord:
    """The build record at `path`: a regular file, bounded in size, parsed strictly."""
    return BuildRecord.parse(read_small(path, RECORD_LIMIT, "build record", error), str(path), error)


def load_record(target: str, profile: str, base_kind: str) -> Optional[BuildRecord]:
    """This checkout's record of the newest build of target/profile/base; None when there is none."""
    path = record_path(target, profile, base_kind)
    return read_record(path) if path.exists() else None


def image_repository(target: Target) -> str:
    return f"blackwell/{target.name}"


_TRITON_ARGS = ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH", "TRITON_CUOBJDUMP_PATH", "TRITON_NVDISASM_PATH")


def build_args(target: Target, base: ImageRef, epoch: str) -> Dict[str, str]:
    """Every ARG the Dockerfile declares; a cpu target's GPU ones are empty (no CUDA, no arch list)."""
    return {
        "BASE_IMAGE": base.by_digest,
        "SYSTEM_PACKAGES": " ".join(target.system_packages),
        "TORCH_CUDA_ARCH_LIST": target.torch_cuda_arch_list,
        "NVCC_GENCODE": " ".join(arch.gencode_flags(target.torch_cuda_arch_list)) if not target.is_cpu else "",
        "SOURCE_DATE_EPOCH": epoch,
        "RUNTIME_USER": target.user.name,
        "RUNTIME_UID": str(target.user.uid),
        # What nvidia/cuda's bases say, less their per-brand exceptions (forward compatibility, which
        # our images do not put on the loader path).
        "NVIDIA_REQUIRE_CUDA": f"cuda>={target.cuda}" if target.cuda else "",
        **{name: "" for name in _TRITON_ARGS},
        **target.triton_env,
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
        paths.LABEL_CAPABILITY: target.capability_text,
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


@dataclass(frozen=True)
class PayloadSlice:
    """The lock's packages one payload layer installs, and their wheels."""

    layer: str
    pins: Tuple[wheelhouse.Pin, ...]
    wheels: Tuple[Path, ...]


def payload_slices(lock: Path, wheels: Path, settings: BuildSettings = DEFAULT_BUILD) -> List[PayloadSlice]:
    """The lock cut along [build] layers: each package in the first layer whose patterns match it."""
    pins = wheelhouse.parse_lock(lock)
    by_name: Dict[str, List[Path]] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        by_name.setdefault(wheelhouse.wheel_name(wheel.name), []).append(wheel)
    out = []
    for layer in settings.layers:
        mine = tuple(p for p in pins if settings.layer_of(p.name) == layer.name)
        out.append(PayloadSlice(layer.name, mine, tuple(w for p in mine for w in by_name.get(p.name, []))))
    return out


def payload_slots(dockerfile: Path = IMAGES_DIR / "Dockerfile") -> int:
    return len(_SLOT_RE.findall(dockerfile.read_text(encoding="utf-8")))


def _slices_for_slots(lock: Path, wheels: Path, settings: BuildSettings) -> List[PayloadSlice]:
    slices = payload_slices(lock, wheels, settings)
    slots = payload_slots()
    if len(slices) > slots:
        raise ConfigError(f"images/targets.toml: [build] layers lists {len(slices)} layers; images/Dockerfile has "
                          f"{slots} payload slots (RUN --mount=...,source=payload/<n>)",
                          hint="join layers in targets.toml, or add a slot to the Dockerfile's payload stage")
    return slices


def _requirements(pins: Sequence[wheelhouse.Pin]) -> str:
    """A slice of the lock, still pinned by hash (pip --require-hashes refuses anything else)."""
    return "".join(f"{p.name}=={p.version} " + " ".join(f"--hash=sha256:{h}" for h in sorted(p.hashes)) + "\n"
                   for p in pins)


def stage_context(name: str, lock: Path, wheels: Path, settings: BuildSettings = DEFAULT_BUILD,
                  ctx: Optional[Path] = None, omitted: Sequence[str] = ()) -> Path:
    """A build context holding exactly what the Dockerfile needs (hard links, no copies of GBs): the images/
    files, the lock, and per payload slot its wheels and its slice of the lock (payload/<n>/).

    Without `ctx`, a new directory (two checkouts may build the same target at once). With `ctx`, that
    directory is brought to the same contents in place, leaving unchanged files as they are: BuildKit then
    sends only what changed, where a new directory is gigabytes sent again (and a new cache record)."""
    slices = _slices_for_slots(lock, wheels, settings)
    if ctx is None:
        parent = paths.build_contexts()
        parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_contexts(parent, name)
        ctx = Path(tempfile.mkdtemp(prefix=f"{name}-{os.getpid()}-", dir=parent))
        ledger.record_context(ctx.name)  # this checkout's: its `clean` (and only its) may take it
    wanted: Dict[str, Callable[[Path], None]] = {}
    for rel in _CONTEXT_FILES:
        wanted[rel] = functools.partial(_place_copy, IMAGES_DIR / rel)
    # What the payload's last step (`pip check`) accepts as missing: the lock's omissions (locks.omitted).
    wanted["triton-allocator/omitted.txt"] = functools.partial(_place_text, "".join(f"{n}\n" for n in omitted))
    for n in range(1, payload_slots() + 1):
        piece = slices[n - 1] if n <= len(slices) else PayloadSlice("", (), ())
        wanted[f"payload/{n}/requirements.txt"] = functools.partial(_place_text, _requirements(piece.pins))
        for wheel in piece.wheels:
            wanted[f"payload/{n}/{wheel.name}"] = functools.partial(_place_link, wheel)
    _converge(ctx, wanted)
    return ctx


def _converge(ctx: Path, wanted: Mapping[str, Callable[[Path], None]]) -> None:
    """Make `ctx` hold exactly `wanted` (relative path -> how to place it); a killed run is finished by the next."""
    for path in sorted(ctx.rglob("*"), reverse=True):
        rel = path.relative_to(ctx).as_posix()
        if path.is_file() and not path.is_symlink() and rel in wanted:
            continue
        if path.is_dir() and not path.is_symlink() and any(w.startswith(rel + "/") for w in wanted):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    for rel, place in sorted(wanted.items()):
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        place(ctx / rel)


def _place_copy(src: Path, dst: Path) -> None:
    if dst.is_file() and dst.read_bytes() == src.read_bytes():
        return
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def _place_text(text: str, dst: Path) -> None:
    if dst.is_file() and dst.read_text(encoding="utf-8") == text:
        return  # unchanged: its mtime stays, so BuildKit does not send it again
    fsutil.write_atomic(dst, text)


def _place_link(src: Path, dst: Path) -> None:
    if dst.exists() and os.path.samefile(src, dst):
        return
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    _link_or_copy(src, tmp)
    os.replace(tmp, dst)


@contextlib.contextmanager
def build_context(name: str, lock: Path, wheels: Path, settings: BuildSettings,
                  omitted: Sequence[str] = ()) -> Iterator[Path]:
    """The context of one build: a folder kept per lock and checkout, so that an unchanged rebuild sends
    BuildKit nothing (the docker CLI keys its context cache by the folder's path); the three amd64 targets
    share it. When another build of this checkout holds it, a folder of this build's own (sent whole)."""
    parent = paths.build_contexts()
    parent.mkdir(parents=True, exist_ok=True)
    stable = parent / f"{lock.stem}-{ledger.key()}"
    with open(parent / f"{stable.name}.lock", "a") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            REPORT.say(f"{stable.name} is in use by another build of this checkout: staging a context of this "
                  "build's own (sent to the builder whole)")
            ctx = stage_context(name, lock, wheels, settings, omitted=omitted)
            try:
                yield ctx
            finally:
                shutil.rmtree(ctx, ignore_errors=True)
            return
        ledger.record_context(stable.name)
        stable.mkdir(exist_ok=True)
        yield stage_context(name, lock, wheels, settings, ctx=stable, omitted=omitted)


def _remove_stale_contexts(parent: Path, name: str) -> None:
    """Contexts of this build that a killed run left (its pid in the name, and no longer alive)."""
    from qualify.core.fsutil import pid_alive

    for stale in parent.glob(f"{name}-*"):
        pid = stale.name[len(name) + 1:].split("-", 1)[0]
        if stale.is_dir() and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
            REPORT.say(f"removed {stale.name}, the context of a build that was killed")


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
    if opts.profile not in target.profiles:
        raise ConfigError(f"target {target.name} has no {opts.profile} profile (the smoke profile is a CUDA extension "
                          "and Triton)", hint=f"use --profile {' or '.join(target.profiles)}")
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
    check_builder(engine)
    registry = (registry or Registry.from_env()).ensure()
    start = time.monotonic()
    REPORT.say(f"{target.name} ({target.description}), profile {opts.profile}, {opts.base} base, "
          f"{target.platform}")
    steps: Dict[str, float] = {}
    clock = time.monotonic()

    def lap(name: str) -> None:
        nonlocal clock
        steps[name] = round(time.monotonic() - clock, 1)
        clock = time.monotonic()

    base = resolve_base(engine, tf, target, opts, registry)
    lap("base")
    wheels = wheelhouse.prepare(lock, target.platform, python, wheelhouse.cpu_torch_sources() if target.is_cpu else None)
    lap("wheels")
    epoch = opts.source_date_epoch or provenance.source_date_epoch()
    suffix = f"-{opts.tag_suffix}" if opts.tag_suffix else ""
    key = f"{target.name}-{opts.profile}-{opts.base}{suffix}"
    tag = f"{registry.ref(image_repository(target))}:{opts.profile}-{opts.base}{suffix}"
    previous = engine.image_id(tag)  # "" on a first build
    image_labels = labels(target, opts, base, lock, epoch)
    before = buildcache.footprint(engine)
    with build_context(key, lock, wheels, tf.build, locks.omitted(target.lock_profile(opts.profile))) as ctx:
        image_id = engine.build(BuildRequest(
            context=ctx, dockerfile=ctx / "Dockerfile", tags=[tag], platform=target.platform,
            build_args=build_args(target, base, epoch), labels=image_labels, target=opts.profile,
            no_cache=opts.no_cache, source_date_epoch=epoch,
        ))
    lap("build")
    if "exporting to image" in engine.last_build_steps:
        steps["export"] = round(engine.last_build_steps["exporting to image"], 1)
    # A failed build keeps its cache: the rerun that fixes it starts from there.
    budget = tf.build.cache_budget_bytes if opts.cache_budget_gb is None else int(opts.cache_budget_gb * 10**9)
    buildcache.report(buildcache.settle(engine, before, key, image_id, tag, engine.image_id(base.by_digest),
                                        budget=None if opts.keep_cache else budget))
    _check_platform(engine, tag, target)
    lap("cache")
    # This checkout's from now on, pushed or not: a build killed during its push leaves an image that its
    # re-run and its `clean` must know as this checkout's.
    ledger.record(image_id, tag)
    with registry.storage_checked(tag):
        digest = engine.push(tag)
    lap("push")
    ledger.record(image_id, f"{tag.rsplit(':', 1)[0]}@{digest}")
    _drop_previous(engine, previous, image_id)
    record = BuildRecord(
        target=target.name, profile=opts.profile, base_kind=opts.base, platform=target.platform,
        base_image=base.by_digest, image_reference=f"{tag.rsplit(':', 1)[0]}@{digest}", image_tag=tag,
        image_id=image_id, engine=engine.name, builder=engine.builder, labels=image_labels,
        build_seconds=round(time.monotonic() - start, 1), steps=steps, wheels=wheelhouse.wheel_digests(wheels),
    )
    if not opts.tag_suffix:
        write_json(record_path(target.name, opts.profile, opts.base), record.to_json())
    REPORT.say(f"{record.image_reference}  ({record.build_seconds:.1f} s)")
    return record


def _drop_previous(engine: Engine, previous: str, image_id: str) -> None:
    """The image this tag named before a rebuild, now nameless: removed (its digest stays in the registry,
    where a release names it), so rebuilds do not leave gigabytes of dangling images behind. Only an image
    this checkout made (its ledger): another checkout that built the same tag keeps its image."""
    if not previous or previous == image_id:
        return
    if previous not in {m.image_id for m in ledger.made()}:
        REPORT.say(f"the previous image of this tag ({previous[:19]}) is not in this checkout's ledger (another "
                   "checkout built it): kept")
        return
    info = next(iter(engine.inspect_existing([previous])), None)
    if info is None or [t for t in info.get("RepoTags") or [] if not t.endswith(":<none>")]:
        return  # gone already, or still named (another tag, another checkout): not ours to take
    error = engine.remove_created([previous])
    note = f"; it stays: {error}" if error else ""
    REPORT.say(f"removed the previous image of this tag ({previous[:19]}), now unnamed{note}")


def check_builder(engine: Engine) -> None:
    """Refused before anything is built: the classic docker builder cannot build images/Dockerfile."""
    if engine.builder == "classic":
        raise ConfigError("the classic docker builder (DOCKER_BUILDKIT=0) cannot build these images: images/Dockerfile "
                          "installs each payload slice through a bind mount (RUN --mount, which only BuildKit has), so "
                          "that the wheels never become a layer of their own",
                          hint="unset DOCKER_BUILDKIT (or set it to 1) to build with BuildKit, or use --engine podman")


def _check_platform(engine: Engine, ref: str, target: Target) -> None:
    info = engine.inspect(ref)
    want = target.arch_tag
    if info is None or info.architecture != want:
        raise BuildError(f"built image {ref} is {info.architecture if info else 'missing'}, not {want}",
                         hint="the engine ignored --platform; use Debian's docker client with BuildKit or podman")
