"""`python -m qualify clean [--all]`: remove what the toolkit made on this host, and nothing else.

What this checkout made, by construction rather than by guess:
- images in repositories of its own registry (`<QUALIFY_REGISTRY>/blackwell/...`) that this checkout's
  builds recorded in its ledger (host/ledger.py; an image is recorded when its build gives it, before the
  push): another checkout's images on a shared host, and any image named anywhere else, stay (`--all`
  takes every toolkit image in the registry's namespace);
- of that registry's `blackwell/` manifests, the ones this checkout pushed, and the blobs only they
  referenced (the registry's own garbage collector, run while our registry is stopped, as its
  documentation asks; only when no other command holds a lease on the registry, and never left stopped:
  a collection that did not finish, because clean was killed or deferred, is finished by the next clean);
- the BuildKit cache records this checkout's builds made (host/cacheledger.py), except those the newest
  build of another checkout uses (`--all`: every checkout's); records no toolkit build made stay;
- from the state directory (QUALIFY_STATE_DIR), as host/cleanstate.py says: this checkout's build
  contexts, and work folders whose run is over; shared caches only with --all; never `trust/` (the
  promoter's high-water marks) or the ledgers and locks (paths.STATE_NEVER_REMOVED), not even with --all.

Released images (digests named by a release's manifests under manifests/<tag>/) and the hermetic base
stay unless --all; the debootstrap rootfs cache goes only with --all.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, List, Optional, Set

from qualify.config.imageref import digests_for
from qualify.config.targets import REPO_ROOT
from qualify.core import killpoint, manifest
from qualify.core.errors import QualifyError, RegistryError
from qualify.core.fsutil import file_lock, write_atomic
from qualify.core.report import Reporter
from qualify.host import cleanstate, clients, cmd, paths, skopeo, workcontainers, workdirs
from qualify.host.engine import Engine
from qualify.host.registry import Registry

REPORT = Reporter("clean")

NAMESPACE = "blackwell"
HERMETIC_REPOSITORY = f"{NAMESPACE}/hermetic-cuda"


@dataclass
class CleanReport:
    """What was (or, in a dry run, would be) removed, and the space it freed."""

    dry_run: bool
    images: List[str] = field(default_factory=list)
    containers: List[str] = field(default_factory=list)  # work containers a killed run left (host/workcontainers.py)
    kept_images: List[str] = field(default_factory=list)
    other_checkouts: List[str] = field(default_factory=list)  # toolkit images this checkout did not make
    registry_manifests: List[str] = field(default_factory=list)
    cache_records: List[str] = field(default_factory=list)  # BuildKit cache record ids
    cache_bytes: int = 0  # their size as the builder lists it
    cache_images: List[str] = field(default_factory=list)  # podman's layer cache: the intermediate images kept
    directories: List[str] = field(default_factory=list)
    kept_state: List[str] = field(default_factory=list)  # state-folder entries kept, and why
    notes: List[str] = field(default_factory=list)  # what clean found and recovered, or left for later
    freed_state_bytes: int = 0
    freed_registry_bytes: int = 0
    freed_engine_bytes: int = 0

    @property
    def freed_bytes(self) -> int:
        return self.freed_state_bytes + self.freed_registry_bytes + self.freed_engine_bytes

    def lines(self) -> List[str]:
        verb = "would remove" if self.dry_run else "removed"
        gb = 1e9
        out = [f"clean: {verb} {len(self.images)} image(s), {len(self.registry_manifests)} registry manifest(s), "
               f"{len(self.cache_records)} build-cache record(s) ({self.cache_bytes / gb:.2f} GB), "
               + (f"{len(self.cache_images)} cached build step image(s), " if self.cache_images else "")
               + f"{len(self.directories)} state folder(s)"]
        out += [f"  container {c}" for c in self.containers]
        out += [f"  image {i}" for i in self.images]
        out += [f"  registry {m}" for m in self.registry_manifests]
        out += [f"  folder {d}" for d in self.directories]
        out += [f"  kept (released or hermetic base; --all removes it): {k}" for k in self.kept_images]
        out += [f"  kept: {k}" for k in self.kept_state]
        out += [f"  note: {n}" for n in self.notes]
        if self.other_checkouts:
            out.append(f"  kept: {len(self.other_checkouts)} toolkit image(s) this checkout did not make (another "
                       f"checkout's, or built before it kept a ledger; --all removes them): "
                       + ", ".join(self.other_checkouts[:3]) + (" ..." if len(self.other_checkouts) > 3 else ""))
        if not self.dry_run:
            out.append(f"freed {self.freed_bytes / gb:.2f} GB: engine {self.freed_engine_bytes / gb:.2f} GB, "
                       f"registry {self.freed_registry_bytes / gb:.2f} GB, state {self.freed_state_bytes / gb:.2f} GB")
        return out

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "freed_bytes": self.freed_bytes}, indent=2, sort_keys=True)


def released_digests(releases_dir: Path) -> Set[str]:
    """Image digests named by the manifests of every release folder (manifests/<tag>/*.json)."""
    found: Set[str] = set()
    if not releases_dir.is_dir():
        return found
    for path in sorted(releases_dir.glob("*/*.json")):
        try:
            found.add(manifest.Manifest.load(path).digest)
        except QualifyError:
            continue  # release.json, promotion and publication records, too large a file: not manifests
    return found


@dataclass(frozen=True)
class Mine:
    """What this checkout's ledger says it made: image ids and pushed digests (None: --all, everything)."""

    ids: Optional[Set[str]]
    digests: Optional[Set[str]]

    def image(self, image_id: str, digests: Set[str]) -> bool:
        return self.ids is None or image_id in self.ids or bool(digests & (self.digests or set()))

    def manifest(self, digest: str) -> bool:
        return self.digests is None or digest in self.digests


def clean(engine: Engine, registry: Registry, releases_dir: Path, everything: bool = False, dry_run: bool = False,
          state_dir: Optional[Path] = None, checkout: Path = REPO_ROOT) -> CleanReport:
    from qualify.host import ledger

    state_dir = paths.state_dir() if state_dir is None else state_dir
    keep = set() if everything else released_digests(releases_dir)
    made = ledger.made(state_dir, checkout)
    mine = Mine(None, None) if everything else Mine({m.image_id for m in made},
                                                    set(digests_for(m.reference for m in made)))
    report = CleanReport(dry_run=dry_run)
    engine_free = _free(engine.storage_root())
    # Before the images: a container a killed publish left keeps its image from being removed.
    left = workcontainers.sweep(engine.binary, None if everything else checkout, dry_run)
    report.containers = [f"{c.name} ({c.id[:12]}, from {c.image}; left by a killed {c.purpose} step)" for c in left]
    _clean_images(engine, registry, keep, everything, report, mine, {c.name for c in left})
    _clean_build_cache(engine, everything, report, state_dir)
    _clean_registry(registry, keep, everything, report, state_dir, mine)
    _clean_state(state_dir, everything, report, checkout)
    if not dry_run:
        report.freed_engine_bytes = max(0, _free(engine.storage_root()) - engine_free)
    return report


# --- images ---------------------------------------------------------------------------


def _clean_images(engine: Engine, registry: Registry, keep: Set[str], everything: bool, report: CleanReport,
                  mine: Mine, going: Set[str] = frozenset()) -> None:
    prefix = f"{registry.address}/{NAMESPACE}/"
    doomed: List[str] = []
    for info in engine.inspect_existing(sorted(engine.image_ids())):
        names = [t for t in (info.get("RepoTags") or []) + (info.get("RepoDigests") or []) if t.startswith(prefix)]
        if not names:
            continue  # not named in our registry: not ours
        foreign = [t for t in info.get("RepoTags") or [] if not t.startswith(prefix) and not t.endswith(":<none>")]
        digests = set(digests_for(info.get("RepoDigests") or []))
        hermetic = any(n.startswith(f"{registry.address}/{HERMETIC_REPOSITORY}") for n in names)
        if not hermetic and not mine.image(info["Id"], digests):
            report.other_checkouts.append(names[0])
            continue
        if foreign or (not everything and (digests & keep or hermetic)):
            report.kept_images.append(names[0] + (f" (also named {foreign[0]})" if foreign else ""))
            continue
        doomed.append(info["Id"])
        report.images.append(names[0])
    # An image a container uses cannot go (a run at work, or a container that is not this checkout's): kept,
    # saying which, rather than aborting the rest of clean.
    for image_id, names in sorted(workcontainers.users(engine.binary, doomed, going).items()):
        at = doomed.index(image_id)
        del doomed[at]
        report.notes.append(f"kept image {report.images.pop(at)}: used by container(s) {', '.join(names[:3])} "
                                 "(remove them, then run clean again)")
    if doomed and not report.dry_run:
        error = engine.remove_created(doomed)
        if error:
            raise QualifyError(f"some toolkit images could not be removed: {error}",
                               hint="a container may still use them: `docker ps -a`, then run clean again")


# --- build cache ----------------------------------------------------------------------


def _clean_build_cache(engine: Engine, everything: bool, report: CleanReport, state_dir: Path) -> None:
    from qualify.host import cacheledger

    with cacheledger.locked(state_dir):
        if everything:
            books = [cacheledger.read(p) for p in cacheledger.ledgers(Path(state_dir))]
            owned, spared = {i for b in books for i in b.owned}, frozenset()
            steps, spared_steps = {i for b in books for i in b.kept_images()}, frozenset()
        else:
            owned, spared = set(cacheledger.load(state_dir).owned), cacheledger.kept_by_others(state_dir)
            steps = set(cacheledger.load(state_dir).kept_images())
            spared_steps = cacheledger.images_kept_by_others(state_dir)
        _clean_cache_images(engine, steps - spared_steps, report, state_dir)
        if not owned:
            return
        cache = engine.build_cache()
        doomed = sorted(i for i in owned if i in cache and i not in spared)
        report.cache_records = doomed
        report.cache_bytes = sum(cache[i].size for i in doomed)
        if report.dry_run or not doomed:
            return
        engine.remove_build_cache(doomed)
        left = set(engine.build_cache())
        book = cacheledger.load(state_dir)
        book.owned = [i for i in book.owned if i in left]
        book.latest = {k: [i for i in v if i in left] for k, v in book.latest.items()}
        cacheledger.save(book, state_dir)


def _clean_cache_images(engine: Engine, doomed: Set[str], report: CleanReport, state_dir: Path) -> None:
    """Podman's layer cache: the intermediate images the newest builds kept (imagebuild/buildcache.py)."""
    from qualify.host import cacheledger

    present = sorted(doomed & engine.image_ids())
    report.cache_images = present
    if report.dry_run or not present:
        return
    error = engine.remove_created(present)
    left = engine.image_ids()
    book = cacheledger.load(state_dir)
    book.images = {k: [i for i in v if i in left] for k, v in book.images.items()}
    cacheledger.save(book, state_dir)
    if error:
        report.notes.append(f"some cached build steps stay: {error}")


# --- registry -------------------------------------------------------------------------


def _clean_registry(registry: Registry, keep: Set[str], everything: bool, report: CleanReport, state_dir: Path,
                    mine: Mine) -> None:
    data = paths.registry_storage(registry.port, state_dir)
    storage = data / "data" / "docker" / "registry" / "v2" / "repositories"
    pending = registry.gc_pending(state_dir).is_file()
    if not storage.is_dir() and not pending:
        return  # a registry we did not start: its storage is not ours to collect
    for repository, digest in _stored_manifests(storage):
        if not everything and (digest in keep or repository == HERMETIC_REPOSITORY or not mine.manifest(digest)):
            continue
        report.registry_manifests.append(f"{registry.address}/{repository}@{digest}")
    stopped = not registry.answers()
    if pending:
        report.notes.append(f"found a garbage collection of {registry.address} that did not finish (a clean was killed, "
                            "or it was deferred)" + ("; the registry was left stopped" if stopped else "")
                            + ("" if report.dry_run else ": collecting now"))
    if report.dry_run or not (report.registry_manifests or pending):
        return
    before = _size(data)
    if report.registry_manifests:
        if stopped:
            registry.ensure(state_dir)  # the deletes go through its API
        for ref in report.registry_manifests:
            skopeo.delete(f"docker://{ref}", (registry.address,))
    _collect_garbage(registry, data, state_dir, report)
    report.freed_registry_bytes = max(0, before - _size(data))


def _stored_manifests(storage: Path) -> Iterator[tuple]:
    """(repository, digest) of every manifest revision in our registry's `blackwell/` repositories, tagged
    or not (the API lists tags only; older builds' manifests are untagged once the tag moves)."""
    for revisions in sorted((storage / NAMESPACE).glob("*/_manifests/revisions/sha256")):
        repository = f"{NAMESPACE}/{revisions.parents[2].name}"
        for rev in sorted(revisions.iterdir()):
            if (rev / "link").is_file():
                yield repository, f"sha256:{rev.name}"


def _collect_garbage(registry: Registry, data: Path, state_dir: Path, report: CleanReport) -> None:
    """The registry's garbage collector must not run while the registry serves pushes: stop ours, collect,
    start it again, all under the lock that guards its start-up, and only when no other command holds a lease
    on it (a build, a push: a registry another command is using is never stopped). The marker written first
    stays until the registry answers again, so a clean killed midway is finished by the next one; a Ctrl-C or
    SIGTERM starts the registry again before clean exits."""
    config = data / "config.yml"
    marker = registry.gc_pending(state_dir)
    write_atomic(marker, f"{os.getpid()}\n")
    with registry.alone(state_dir) as alone:
        if not alone:
            report.notes.append(f"{registry.address} is in use by another command (a build or a push holds "
                                f"{paths.registry_users(registry.port, state_dir)}): not stopped; its garbage "
                                "collection waits for the next clean")
            return
        with file_lock(paths.registry_lock(registry.port, state_dir)), _sigterm_unwinds():
            done = False
            try:
                REPORT.say(f"stopping {registry.address} for its garbage collection (the registry's own: "
                           "docker-registry garbage-collect) ...")
                for pid in _serving(config):
                    os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + 20
                while registry.answers(timeout=0.5) and time.monotonic() < deadline:
                    time.sleep(0.2)
                killpoint.reached("clean:collecting")
                binary = clients.registry_binary()
                proc = cmd.ask([binary, "garbage-collect", str(config)], timeout=1800)
                if proc.returncode != 0:
                    raise RegistryError(f"registry garbage-collect failed: {proc.stderr.strip()[-300:]}",
                                        hint="the registry was started again; run clean again to retry")
                done = True
            finally:
                if not registry.answers():
                    registry.start(state_dir)
                    REPORT.say(f"started {registry.address} again")
                if done:
                    marker.unlink(missing_ok=True)


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """While the registry is stopped, SIGTERM unwinds as an interruption does, so it is started again."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt("terminated")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _serving(config: Path) -> List[int]:
    """Pids of `docker-registry serve <config>` (the registry we started)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and str(config).encode() in argv:
            pids.append(int(proc.name))
    return pids


# --- state directory ------------------------------------------------------------------


def _clean_state(state_dir: Path, everything: bool, report: CleanReport, checkout: Path) -> None:
    plan = cleanstate.plan(Path(state_dir), everything, checkout)
    report.directories = [f"{e.path} ({e.size / 1e9:.2f} GB): {e.why}" for e in plan.removed]
    report.kept_state = [f"{e.path} ({e.size / 1e9:.2f} GB): {e.why}" for e in plan.kept]
    if report.dry_run:
        return
    freed, failed = cleanstate.apply(plan, Path(state_dir))
    report.freed_state_bytes = freed
    report.notes += [f"{e.path} stays: {e.why}" for e in failed]


def _size(path: Path) -> int:
    return workdirs.disk_bytes(path)


def _free(root: Path) -> int:
    try:
        return shutil.disk_usage(root).free
    except OSError:
        return 0


def print_report(report: CleanReport, as_json: bool, file=sys.stdout) -> None:
    print(report.to_json() if as_json else "\n".join(report.lines()), file=file)


def default_releases_dir() -> Path:
    return paths.HERE.releases
