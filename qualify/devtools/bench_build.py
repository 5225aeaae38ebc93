"""Benchmark the image build (`nox -s bench-build`, by hand, not in CI): where the time of a build goes.

    python -m qualify.devtools.bench_build [--target sm120] [--second sm100] [--profile smoke|vllm|all]
                                           [--skip-download] [--skip-pull] [--keep] [--engine docker|podman]
                                           [--no-disk-check]

Rows, each measured here, on the hermetic base (made first when missing, untimed):
1. smoke, first build (`--no-cache`: every step runs; base and wheelhouse present) and its push;
2. smoke, no-change rebuild (served from the build cache the first build left);
3. vLLM: wheel download into a scratch folder (the lock's wheels from PyPI, hashes checked; the shared
   wheelhouse is left alone), first build split into image build, export (BuildKit's export step) and
   push, then the no-change rebuild (the build alone, as `--no-qualify` runs it);
4. the second amd64 target (`--second`) built after the first: its build and its push;
5. the image: size, layer count and the largest layer (sizes as the registry stores them, compressed);
6. pull of the image from the loopback registry into a clean engine: a second dockerd of the bench's own
   (its own data root under the state folder, no network of its own), started, timed, stopped, removed.

Before anything is built, the free disk the run needs is worked out from what it will hold (the image,
podman's temporary copies of the layers while it pushes, the registry's copy, the wheels: bench_disk.py),
and a run that does not fit stops at once with the number and what is short (`--no-disk-check` skips it).

Builds use a scratch tag (`<profile>-hermetic-bench`): no real tag moves and no build record is written.
At the end the bench removes its images from the engine and its manifests from the registry (the blobs
stay until `nox -s clean` collects the registry), and lets the next build prune its cache to the budget.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional

from qualify.config import targets
from qualify.core.errors import QualifyError
from qualify.core.report import Reporter
from qualify.devtools import bench_disk
from qualify.host import cacheledger, clients, cmd, paths, provenance, skopeo, tables
from qualify.host.engine import Engine
from qualify.host.registry import Registry
from qualify.imagebuild import buildcache, download_progress, hermetic, image, wheelhouse

REPORT = Reporter("bench-build")

SUFFIX = "bench"
BRIDGE_ADDRESS = "169.254.213.1/30"  # link-local: no route to or from anything; the pull needs none
DOCKERD = "/usr/sbin/dockerd"  # where Debian's docker.io puts it (the client is /usr/bin/docker)


@dataclass(frozen=True)
class Row:
    step: str
    seconds: Optional[float]
    note: str = ""

    def cells(self) -> List[str]:
        return [self.step, "-" if self.seconds is None else f"{self.seconds:.1f}", self.note]


def say(text: str) -> None:
    REPORT.say(f"{text}")


def build(tf, target: str, profile: str, engine: Engine, registry: Registry, no_cache: bool) -> image.BuildRecord:
    opts = image.BuildOptions(target=target, base="hermetic", profile=profile, no_cache=no_cache, tag_suffix=SUFFIX)
    return image.build(tf, opts, engine, registry)


def cold_and_rebuild(tf, target: str, profile: str, engine: Engine, registry: Registry,
                     made: List[image.BuildRecord], rows: List[Row]) -> image.BuildRecord:
    """A first build with no cache, then the same build again (nothing changed): rows for both; the first's record."""
    say(f"{profile}: first build (no cache)")
    cold = build(tf, target, profile, engine, registry, no_cache=True)
    made.append(cold)
    rows += build_rows(f"{profile} first build", cold)
    again = build(tf, target, profile, engine, registry, no_cache=False)
    rows.append(Row(f"{profile} no-change rebuild", again.build_seconds, f"push {again.steps.get('push', 0):.1f} s"))
    return cold


def build_rows(name: str, record: image.BuildRecord) -> List[Row]:
    s = record.steps
    return [Row(f"{name}: whole build", record.build_seconds),
            Row(f"{name}:   image build (the engine's build)", s.get("build"), f"of which export {s.get('export', 0):.1f} s"),
            Row(f"{name}:   cache bookkeeping", s.get("cache")),
            Row(f"{name}:   push to the loopback registry", s.get("push"))]


def download(lock: Path, platform: str, python: str) -> Row:
    scratch = Path(tempfile.mkdtemp(prefix="bench-wheels-", dir=paths.state()))
    try:
        start = time.monotonic()
        wheelhouse.prepare_into(lock, platform, python, scratch / "w")
        seconds = time.monotonic() - start
        size = sum(p.stat().st_size for p in (scratch / "w").glob("*.whl"))
        return Row("vllm: wheel download (PyPI, hashes checked)", seconds, f"{size / 1e9:.2f} GB")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def image_rows(record: image.BuildRecord, registry: Registry) -> List[Row]:
    raw = json.loads(skopeo.inspect_raw(f"docker://{record.image_reference}", (registry.address,)))
    sizes = [int(layer.get("size", 0)) for layer in raw.get("layers", [])]
    nonempty = [s for s in sizes if s > 32]  # an empty layer is a 32-byte gzip of an empty tar
    return [Row("image: layers (compressed, as stored)", None,
                f"{len(sizes)} layers ({len(nonempty)} not empty), {sum(sizes) / 1e9:.2f} GB compressed, "
                f"largest {max(sizes, default=0) / 1e9:.2f} GB")]


@contextlib.contextmanager
def scratch_engine() -> Iterator[str]:
    """A second dockerd with a data root of its own: a clean engine to pull into. Yields its socket address."""
    if not os.path.exists(DOCKERD):
        raise QualifyError(f"{DOCKERD} not found: the pull into a clean engine needs Debian's docker.io",
                           hint="run with --skip-pull")
    root = paths.state("bench-engine")
    shutil.rmtree(root, ignore_errors=True)  # a killed run's
    run = Path(tempfile.mkdtemp(prefix="qualify-bench-engine-", dir="/run" if os.access("/run", os.W_OK) else None))
    sock = f"unix://{run}/docker.sock"
    log = open(run / "dockerd.log", "w")
    # A bridge of its own: with `--bridge none` dockerd deletes the host's docker0 at start (the host's own
    # engine then fails every RUN step: "could not find bridge docker0"), so the bench never passes it.
    bridge = f"qbench{os.getpid() % 10**6}"
    proc = None
    try:
        cmd.call(["ip", "link", "add", bridge, "type", "bridge"], timeout=30)
        cmd.call(["ip", "addr", "add", BRIDGE_ADDRESS, "dev", bridge], timeout=30)
        proc = subprocess.Popen([DOCKERD, "--data-root", str(root / "data"), "--exec-root", str(run / "exec"),
                                 "--pidfile", str(run / "docker.pid"), "--host", sock, "--bridge", bridge,
                                 "--iptables=false", "--ip-masq=false", "--storage-driver", "overlay2"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while cmd.call([clients.DEBIAN_DOCKER, "-H", sock, "info"], check=False, timeout=30).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise QualifyError(f"the bench's own dockerd did not start: {cmd.tail((run / 'dockerd.log').read_text())}")
            time.sleep(0.5)
        yield sock
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        cmd.call(["ip", "link", "del", bridge], check=False, timeout=30)
        log.close()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(run, ignore_errors=True)


def pull_row(record: image.BuildRecord, size: int) -> Row:
    free = shutil.disk_usage(paths.state()).free
    need = 1.6 * size  # the unpacked layers, plus the compressed downloads while they unpack
    if free < need:
        return Row("pull into a clean engine", None, f"not run: {free / 1e9:.1f} GB free, needs ~{need / 1e9:.0f} GB")
    with scratch_engine() as sock:
        start = time.monotonic()
        cmd.call([clients.DEBIAN_DOCKER, "-H", sock, "pull", "-q", record.image_reference], timeout=3600)
        seconds = time.monotonic() - start
    return Row("pull into a clean engine (second dockerd)", seconds, record.image_reference.rsplit("/", 1)[-1][:40])


def image_size(engine: Engine, record: image.BuildRecord) -> int:
    """By image id: by registry digest neither engine found it (both printed 0.00 GB)."""
    info = engine.inspect(record.image_id)
    return info.size if info else 0


def drop_images_and_cache(engine: Engine, records: List[image.BuildRecord]) -> None:
    """The bench's images out of the engine and the cache records only its builds use pruned: the disk
    they held is what the pull into a clean engine needs (a vLLM image is 12.5 GB)."""
    for record in records:
        engine.remove_created([record.image_id])
    with cacheledger.locked():
        book = cacheledger.load()
        mine = {i for k, v in book.latest.items() if k.endswith(f"-{SUFFIX}") for i in v}
        book.latest = {k: v for k, v in book.latest.items() if not k.endswith(f"-{SUFFIX}")}
        steps = {i for k, v in book.images.items() if k.endswith(f"-{SUFFIX}") for i in v}
        book.images = {k: v for k, v in book.images.items() if not k.endswith(f"-{SUFFIX}")}
        engine.remove_created(sorted(steps - book.kept_images() - cacheledger.images_kept_by_others()))
        cache = engine.build_cache()
        keep = buildcache.with_ancestors(book.kept() | cacheledger.kept_by_others(), cache)
        engine.remove_build_cache(sorted((mine & set(book.owned)) - keep))
        left = set(engine.build_cache())
        book.owned = [i for i in book.owned if i in left]
        cacheledger.save(book)


def delete_manifests(registry: Registry, records: List[image.BuildRecord]) -> None:
    """What the bench pushed, by digest (the blobs stay until `nox -s clean` collects the registry)."""
    for ref in sorted({r.image_reference for r in records}):
        try:
            skopeo.delete(f"docker://{ref}", (registry.address,))
        except QualifyError as exc:
            say(f"warning: {exc}")


def check_disk(tf, target, profiles: List[str], engine: Engine, registry: Registry, download: bool) -> None:
    """Refuse now, before building, when the run will not fit on disk (qualify/devtools/bench_disk.py): first
    from the index's sizes where a wheelhouse is missing (before downloading it), then from the wheels."""
    label = f"bench-build --engine {engine.name} --profile {'all' if len(profiles) > 1 else profiles[0]}"
    python = target.python_for("hermetic", tf.hermetic)
    locks = {p: target.lock_path(p, python) for p in profiles}
    houses = {p: wheelhouse.wheelhouse_dir(lock, target.platform, python) for p, lock in locks.items()}
    base_missing = not engine.exists(hermetic.base_tag(tf, target, registry))

    def plan(sizes) -> List[bench_disk.Phase]:
        phases: List[bench_disk.Phase] = []
        held: tuple = ()
        missing = base_missing
        for profile in profiles:
            layers, wheel_bytes = sizes[profile]
            extra = () if (houses[profile] / ".verified.json").exists() else (
                bench_disk.Need("the wheelhouse (kept)", wheel_bytes, houses[profile].parent),)
            mine = bench_disk.profile_phases(profile, engine.name, engine.storage_root(),
                                             paths.registry_storage(registry.port), paths.state(), layers, wheel_bytes,
                                             missing, download and profile == "vllm", (*held, *extra))
            phases += mine
            held, missing = bench_disk.lasting(mine[-1]), False
        return phases

    if not all((h / ".verified.json").exists() for h in houses.values()):
        estimated = {}
        for profile, lock in locks.items():
            total = download_progress.fetch_total(wheelhouse.PYPI, wheelhouse.parse_lock(lock), target.platform,
                                                  python, wheelhouse.CA_BUNDLE) or 0
            installed = int(total * bench_disk.INSTALLED_PER_WHEEL)
            largest = int(installed * bench_disk.LARGEST_LAYER_SHARE)
            estimated[profile] = ([largest, installed - largest], total)
        if all(total for _layers, total in estimated.values()):
            bench_disk.refuse_if_short(label, plan(estimated), estimated=True)
        say("preparing the wheelhouses the builds need (untimed)")
    sizes = {}
    for profile, lock in locks.items():
        slices = image.payload_slices(lock, wheelhouse.prepare(lock, target.platform, python), tf.build)
        sizes[profile] = ([bench_disk.installed_bytes(s.wheels) for s in slices],
                          sum(w.stat().st_size for s in slices for w in s.wheels))
    phases = plan(sizes)
    bench_disk.refuse_if_short(label, phases)
    worst = max(phases, key=lambda p: sum(n.bytes for n in p.needs))
    say(f"disk: {label} needs {bench_disk.peak(phases) / 1e9:.1f} GB at its peak ({worst.name}); "
        f"{shutil.disk_usage(paths.state()).free / 1e9:.1f} GB free where the state folder is")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="bench-build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="sm120")
    parser.add_argument("--second", default="sm100", help="another target of the same platform")
    parser.add_argument("--profile", choices=("smoke", "vllm", "all"), default="all")
    parser.add_argument("--skip-download", action="store_true", help="do not time the vLLM wheel download")
    parser.add_argument("--skip-pull", action="store_true", help="do not time the pull into a clean engine")
    parser.add_argument("--keep", action="store_true", help="leave the bench's images and manifests")
    parser.add_argument("--engine", choices=("docker", "podman"), default="docker",
                        help="the engine that builds and pushes (podman pushes through containers/image's gzip)")
    parser.add_argument("--no-disk-check", action="store_true",
                        help="start even when the free disk looks too small (the estimate errs long)")
    args = parser.parse_args(argv)
    tf = targets.load()
    engine, registry = Engine(args.engine).check(), Registry.from_env().ensure()
    first, second = tf.get(args.target), tf.get(args.second)
    if first.platform != second.platform:
        raise QualifyError(f"--second {second.name} is {second.platform}, {first.name} {first.platform}",
                           hint="name another target of the same platform")
    profiles = ["smoke", "vllm"] if args.profile == "all" else [args.profile]
    if not args.no_disk_check:
        check_disk(tf, first, profiles, engine, registry, not args.skip_download)
    rows: List[Row] = []
    made: List[image.BuildRecord] = []
    try:
        if args.profile in ("smoke", "all"):
            cold_and_rebuild(tf, first.name, "smoke", engine, registry, made, rows)
        if args.profile in ("vllm", "all"):
            python = first.python_for("hermetic", tf.hermetic)
            lock = first.lock_path("vllm", python)
            if not args.skip_download:
                say("vllm: wheel download into a scratch folder")
                rows.append(download(lock, first.platform, python))
            cold = cold_and_rebuild(tf, first.name, "vllm", engine, registry, made, rows)
            say(f"vllm: {second.name} after {first.name}")
            other = build(tf, second.name, "vllm", engine, registry, no_cache=False)
            made.append(other)
            rows += build_rows(f"vllm {second.name} after {first.name}", other)
            rows += image_rows(cold, registry)
            size = image_size(engine, cold)
            rows.append(Row("image: size in the engine", None, f"{size / 1e9:.2f} GB"))
            if not args.skip_pull and engine.name == "docker":
                drop_images_and_cache(engine, made)  # the disk the pull needs
                say("vllm: pull into a clean engine")
                rows.append(pull_row(cold, size))
    finally:
        if not args.keep and made:
            drop_images_and_cache(engine, made)
            delete_manifests(registry, made)
    print(f"bench-build at {provenance.revision()[:12] or 'unknown revision'}, {os.cpu_count()} cores, "
          f"{engine.describe()}")
    print(tables.table([r.cells() for r in rows], ["step", "seconds", "note"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
