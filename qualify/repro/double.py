"""Bit-for-bit reproducibility, the driver: build #1 (no cache), save, remove
what that build created, build #2 (no cache, same SOURCE_DATE_EPOCH), save,
compare image ids and pushed manifest digests; explain differences with
compare.py. `diffoci` is used for the file report when it is on PATH.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Set, Tuple

from qualify.config.imageref import try_parse
from qualify.config.targets import TargetsFile
from qualify.core.errors import EngineError, RegistryError
from qualify.core.fsutil import sha256_file
from qualify.core.report import Reporter
from qualify.host import cmd, paths, provenance
from qualify.host.engine import BuildRequest, Engine
from qualify.host.registry import Registry
from qualify.imagebuild import hermetic, image, rootfs
from qualify.repro.compare import Comparison, compare_archives, compare_tarballs, comparison_json, render

REPORT = Reporter("repro")

SCRATCH_SUFFIX = "repro"




@dataclass(frozen=True)
class BuildRun:
    n: int
    image_id: str
    manifest_digest: str  # as pushed to the loopback registry ('' when not pushed)
    reference: str  # what was built (registry/name@digest or tag)
    seconds: float
    archive: Optional[Path]



@dataclass
class ReproResult:
    subject: str  # what was built twice
    builder: str
    epoch: str
    runs: List[BuildRun]
    comparison: Optional[Comparison] = None
    diffoci: str = ""  # diffoci's report, or why it was not used
    notes: List[str] = field(default_factory=list)
    unit: str = "image"  # what the digests are of: image (config digest) or tarball (file sha256)

    @property
    def reproducible(self) -> bool:
        one, two = self.runs
        same_manifest = not (one.manifest_digest and two.manifest_digest) or one.manifest_digest == two.manifest_digest
        return one.image_id == two.image_id and same_manifest



def say(message: str) -> None:
    REPORT.say(f"{message}")



class _Step:
    """Prints a step and how long it took."""

    def __init__(self, label: str) -> None:
        self.label = label

    def __enter__(self) -> _Step:
        self.start = time.monotonic()
        say(f"{self.label} ...")
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.monotonic() - self.start
        if exc[0] is None:
            say(f"{self.label}: done in {self.seconds:.1f} s")



def clean_state_note(engine: Engine) -> str:
    if engine.builder in ("podman", "classic"):
        return (f"{engine.name}: --no-cache, and each build's own images (final, stages, intermediate layers) "
                "are removed by id before the next build")
    return ("docker: each build's own image is removed by id; BuildKit's cache is shared and cannot be pruned for "
            "one build only, so --no-cache is what keeps the second build clean")



@dataclass(frozen=True)
class Built:
    """What one build gave."""

    image_id: str
    manifest_digest: str = ""  # '' when not pushed
    reference: str = ""
    labels: Tuple[Tuple[str, str], ...] = ()



@dataclass(frozen=True)
class Plan:
    """What to build twice, and how to recognise what the builds made."""

    subject: str
    epoch: str
    tag: str  # the scratch tag every build gets
    base_ref: str  # the base (an input, never removed); '' for FROM scratch
    build_once: Callable[[int], Built]



def double(plan: Plan, engine: Engine, workdir: Path, keep: bool = False) -> ReproResult:
    """Build twice from clean state: build, save, remove what the build made; then compare."""
    outcome = ReproResult(subject=plan.subject, builder=engine.describe(), epoch=plan.epoch, runs=[],
                      notes=[n for n in (cannot_reproduce_note(engine), clean_state_note(engine)) if n])
    builds: List[Built] = []
    for n in (1, 2):
        before = engine.image_ids()
        with _Step(f"build {n}/2 (no cache, SOURCE_DATE_EPOCH={plan.epoch})") as step, \
                _CleanOnFailure(engine, before, plan.tag, plan.base_ref):
            built = plan.build_once(n)
        builds.append(built)
        # Looked up after the build: that is when the engine has pulled the base.
        base_id = engine.image_id(plan.base_ref) if plan.base_ref else ""
        run = _save_and_clean(engine, n, built.image_id, plan.tag, before, base_id, workdir,
                              save=n == 1 or keep or built.image_id != builds[0].image_id)
        outcome.runs.append(dataclasses.replace(run, manifest_digest=built.manifest_digest,
                                                reference=built.reference or plan.tag, seconds=round(step.seconds, 1)))
    if builds[0].labels != builds[1].labels:
        outcome.notes.append("the two builds got different labels (did the checkout change meanwhile?)")
    _compare(outcome, keep)
    return outcome



def double_build(tf: TargetsFile, opts: image.BuildOptions, engine: Engine, registry: Registry, workdir: Path,
                 keep: bool = False) -> ReproResult:
    """A target's image, built twice under a scratch tag (the build record and real tag are left alone)."""
    epoch = opts.source_date_epoch or provenance.source_date_epoch()
    # keep_cache: the double build removes what each build made itself, by id, between the builds.
    opts = dataclasses.replace(opts, no_cache=True, keep_cache=True, source_date_epoch=epoch, tag_suffix=SCRATCH_SUFFIX)
    target = tf.get(opts.target)
    base = image.resolve_base(engine, tf, target, opts, registry)  # an input: made once if missing

    def build_once(_n: int) -> Built:
        record = image.build(tf, opts, engine, registry)
        return Built(record.image_id, record.digest, record.image_reference, tuple(sorted(record.labels.items())))

    return double(Plan(subject=f"{target.name} ({opts.profile} profile, {opts.base} base, {target.platform})",
                       epoch=epoch, base_ref=base.by_digest, build_once=build_once,
                       tag=f"{registry.ref(image.image_repository(target))}:{opts.profile}-{opts.base}-{SCRATCH_SUFFIX}"),
                  engine, workdir, keep)



def double_build_base(tf: TargetsFile, target_name: str, engine: Engine, registry: Registry, workdir: Path,
                      keep: bool = False) -> ReproResult:
    """The hermetic base built twice under a scratch repository (the real tag is left alone)."""
    target = tf.get(target_name)
    scratch = dataclasses.replace(tf, hermetic=dataclasses.replace(
        tf.hermetic, repository=f"{tf.hermetic.repository}-{SCRATCH_SUFFIX}"))
    tag = hermetic.base_tag(scratch, target, registry)

    def build_once(_n: int) -> Built:
        try:
            registry.delete_tag(tag)  # else ensure_base finds build 1 and does not build
        except RegistryError as exc:
            say(f"warning: {exc}")
        ref = hermetic.ensure_base(_NoCache(engine), scratch, target, registry)
        return Built(engine.image_id(tag), ref.digest or "", str(ref))

    return double(Plan(subject=f"hermetic base for {target.platform} ({scratch.hermetic.repository})",
                       epoch=rootfs.source_date_epoch(), tag=tag, base_ref="", build_once=build_once),
                  engine, workdir, keep)



def double_build_dockerfile(engine: Engine, context: Path, tag: str, platform: str, epoch: str, base_ref: str,
                            workdir: Path, keep: bool = False) -> ReproResult:
    """Any Dockerfile (context/Dockerfile) built twice, not pushed: for small checks and tests."""
    request = BuildRequest(context=context, dockerfile=context / "Dockerfile", tags=[tag], platform=platform,
                           no_cache=True, source_date_epoch=epoch)
    return double(Plan(subject=f"{context / 'Dockerfile'} as {tag}", epoch=epoch, tag=tag, base_ref=base_ref,
                       build_once=lambda _n: Built(engine.build(request))), engine, workdir, keep)



def exit_status(outcomes: Sequence[ReproResult]) -> int:
    """0 only when every image checked is reproducible."""
    return 0 if outcomes and all(o.reproducible for o in outcomes) else 1



class _CleanOnFailure:
    """A failed build still removes what it made (it has no final image: stages and layers only)."""

    def __init__(self, engine: Engine, before: Set[str], tag: str, base_ref: str) -> None:
        self.engine, self.before, self.tag, self.base_ref = engine, before, tag, base_ref

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            return
        final = self.engine.image_id(self.tag) if self.tag else ""
        base_id = self.engine.image_id(self.base_ref) if self.base_ref else ""
        created = self.engine.created_images(self.before, final if final and final not in self.before else "",
                                 self.tag, base_id)
        say(f"build failed: removing the {len(created)} image(s) it made")
        error = self.engine.remove_created(created)
        if error:
            say(f"warning: some stay: {error}")



class _NoCache:
    """The engine, with every build uncached (hermetic.ensure_base builds with the cache)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def build(self, req, **kwargs) -> str:
        return self._engine.build(dataclasses.replace(req, no_cache=True), **kwargs)



def check_rootfs(tf: TargetsFile, target_name: str, workdir: Path) -> ReproResult:
    """debootstrap again into a scratch cache and compare with the cached rootfs tarball the base uses."""
    target = tf.get(target_name)
    args = (target.arch_tag, tf.hermetic.suite, tf.hermetic.mirror, hermetic.PACKAGES)
    cached = rootfs.debian_rootfs(*args)
    with _Step("debootstrap rootfs again (scratch cache)") as step:
        fresh = rootfs.debian_rootfs(*args, cache_dir=workdir)
    runs = [BuildRun(1, "sha256:" + sha256_file(cached), "", str(cached), 0.0, cached),
            BuildRun(2, "sha256:" + sha256_file(fresh), "", str(fresh), round(step.seconds, 1), fresh)]
    outcome = ReproResult(subject=f"debian rootfs tarball ({target.arch_tag}, {tf.hermetic.suite}): the cached one "
                              "against a fresh debootstrap", builder="scripts/debian-rootfs.sh",
                      epoch=rootfs.source_date_epoch(), runs=runs, unit="tarball")
    if runs[0].image_id != runs[1].image_id:
        outcome.comparison = compare_tarballs(cached, fresh)
        outcome.notes.append("packages come from the mirror at build time: a moved mirror shows in var/lib/dpkg/status")
    fresh.unlink(missing_ok=True)
    return outcome



def _compare(outcome: ReproResult, keep: bool) -> None:
    one, two = outcome.runs
    if one.image_id != two.image_id and one.archive and two.archive:
        outcome.diffoci = _diffoci(one.reference, two.reference)
        with _Step("comparing the two image tarballs"):
            outcome.comparison = compare_archives(one.archive, two.archive, progress=say)
    if not keep:
        for run in outcome.runs:
            if run.archive:
                run.archive.unlink(missing_ok=True)



def _diffoci(ref_a: str, ref_b: str) -> str:
    """diffoci's strict report of the two pushed images, or why there is none."""
    binary = shutil.which("diffoci")
    if binary is None:
        return ("diffoci: not found on PATH (it cannot be installed on this host); the file report below is "
                "qualify's own tar comparison")
    if not all(r is not None and r.pinned for r in (try_parse(ref_a), try_parse(ref_b))):
        return "diffoci: the images were not pushed, so it has nothing to pull; qualify's own report follows"
    proc = cmd.ask([binary, "diff", ref_a, ref_b], timeout=1800)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode not in (0, 1) or not lines:
        return f"diffoci failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}; qualify's own report follows"
    shown = lines[:60] + ([f"... {len(lines) - 60} more lines"] if len(lines) > 60 else [])
    return "diffoci diff (strict):\n" + "\n".join("  " + line for line in shown)



def _save_and_clean(engine: Engine, n: int, image_id: str, tag: str, before: Set[str], base_id: str, workdir: Path,
                    save: bool) -> BuildRun:
    archive = workdir / f"build{n}.tar" if save else None
    try:
        if archive is not None:
            _check_space(engine, image_id, workdir)
            with _Step(f"saving build {n} ({engine.name} save)"):
                engine.save([image_id], archive)
    finally:
        created = engine.created_images(before, image_id, tag, base_id)
        with _Step(f"removing the {len(created)} image(s) build {n} created"):
            error = engine.remove_created(created)
        if error:
            say(f"warning: some images of build {n} stay: {error}")
    return BuildRun(n, image_id, "", tag, 0.0, archive)



def _check_space(engine: Engine, image_id: str, workdir: Path) -> None:
    """Refuse clearly, before writing, when the tarball cannot fit (a full disk also breaks others' builds)."""
    info = engine.inspect_existing([image_id])
    size = int(info[0].get("Size") or 0) if info else 0
    free = shutil.disk_usage(workdir).free
    if size and free < size + (1 << 30):
        raise EngineError(f"saving the image needs about {size / 2**30:.1f} GiB and {workdir} has "
                          f"{free / 2**30:.1f} GiB free (keeping 1 GiB spare)",
                          hint="free disk space, or point QUALIFY_STATE_DIR at a larger disk")



def scratch_dir() -> Path:
    """Tarballs go beside the engine's storage (same disk, /var/lib), not into a small /tmp. Named by this
    process (`run.<pid>.<random>`, as host/workdirs.py names work folders): `clean` removes the folders whose
    run is over (a killed run's, and those --keep kept)."""
    root = paths.repro_scratch()
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"run.{os.getpid()}.", dir=root))



def outcome_lines(outcome: ReproResult, max_files: int = 12) -> List[str]:
    one, two = outcome.runs
    lines = [f"repro: {outcome.subject}", f"  builder: {outcome.builder}", f"  SOURCE_DATE_EPOCH={outcome.epoch}"]
    for run in outcome.runs:
        pushed = f"  manifest {run.manifest_digest}" if run.manifest_digest else ""
        lines.append(f"  build {run.n}: {outcome.unit} {run.image_id}{pushed}  ({run.seconds:.1f} s)")
    if outcome.reproducible:
        lines.append(f"reproducible: {one.image_id} (both builds)")
        if one.manifest_digest:
            lines.append(f"  pushed manifest digest {one.manifest_digest} (both builds)")
    else:
        if one.image_id != two.image_id:
            lines.append(f"NOT reproducible: {outcome.unit} {one.image_id} != {two.image_id}")
        else:
            lines.append(f"NOT reproducible as pushed: same image {one.image_id}, but manifest digests "
                         f"{one.manifest_digest} != {two.manifest_digest} (layers compressed differently at push)")
        if outcome.diffoci:
            lines.append(outcome.diffoci)
        if outcome.comparison is not None:
            lines.extend(render(outcome.comparison, max_files))
    lines.extend(f"  note: {note}" for note in outcome.notes)
    return lines



def outcome_json(outcome: ReproResult) -> dict:
    return {"subject": outcome.subject, "builder": outcome.builder, "source_date_epoch": outcome.epoch,
            "reproducible": outcome.reproducible, "unit": outcome.unit,
            "builds": [{"n": r.n, "image_id": r.image_id, "manifest_digest": r.manifest_digest,
                        "reference": r.reference, "seconds": r.seconds,
                        "archive": str(r.archive) if r.archive and r.archive.exists() else None} for r in outcome.runs],
            "diffoci": outcome.diffoci, "notes": outcome.notes,
            "comparison": comparison_json(outcome.comparison) if outcome.comparison else None}



def cannot_reproduce_note(engine: Engine) -> Optional[str]:
    """What the engine cannot do, said before the builds start."""
    if engine.reproducible:
        return None
    if engine.builder == "classic":
        return ("the classic docker builder cannot reproduce an image: it stamps every file and the config with "
                "the build clock and has no SOURCE_DATE_EPOCH support; building twice anyway to show the differences")
    return (f"the {engine.builder} builder does not rewrite timestamps (no SOURCE_DATE_EPOCH support); building "
            "twice anyway to show the differences; use --engine podman or a docker client with buildx")
