"""What a bake run needs on disk, and what it leaves for the next stages.

`stage` lays out the build context the same way `nox -s build-<target>` does
(image.stage_context: Dockerfile, per payload layer its wheels and lock slice) and links it
at the fixed path the bake file names; `stage_probe` does the same for the
probe bundle. `record` turns bake's --metadata-file into the build record
`python -m qualify qualify` reads, so CPU qualification after a bake is the
same stage as after a build.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from qualify.config.targets import REPO_ROOT, TargetsFile, load
from qualify.core.errors import ConfigError
from qualify.core.fsutil import write_json
from qualify.core.readlimit import read_json
from qualify.imagebuild import image, wheelhouse
from qualify.scaleout.bake import BASE_KIND, CONTEXT_DIR, BakeTarget


def _link(src: Path, name: str) -> Path:
    link = REPO_ROOT / CONTEXT_DIR / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(src, link, target_is_directory=True)
    return link


def stage(tf: TargetsFile, bt: BakeTarget) -> Path:
    target = bt.target
    lock = target.lock_path(bt.profile, target.base.python)
    wheelhouse.parse_lock(lock)
    wheels = wheelhouse.prepare(lock, target.platform, target.base.python,
                                wheelhouse.cpu_torch_sources() if target.is_cpu else None)
    ctx = image.stage_context(f"{bt.name}-{BASE_KIND}-bake", lock, wheels, tf.build)  # the layers nox builds use
    return _link(ctx, bt.name)


METADATA_LIMIT = 4 << 20  # `bake --metadata-file`: a few kB per target
STAGED_DIR = "staged"  # inside the bundle: QUALIFY_STAGED of the Job (probe/staged.py)


def stage_probe() -> Path:
    """The probe bundle: the staged probe, and the decoders for the interpreters of the targets' images on
    both platforms (the bundle serves images of either; probe/staged.py picks the one that fits)."""
    import shutil

    from qualify.host import paths, workdirs
    from qualify.qualification import staging
    from qualify.qualification.container import probe_sources_digest
    from qualify.qualification.container import stage_probe as staged

    probe = staged(probe_sources_digest())
    bundle = paths.bake_probe(f"{probe.name}-{staging.root().name}")
    if not (bundle / ".complete").exists():
        bundle.parent.mkdir(parents=True, exist_ok=True)
        tmp = workdirs.make("bake-probe")  # a kill before the rename leaves it to `clean` (host/workdirs.py)
        shutil.copytree(probe, tmp / "bundle")
        pythons = load().pythons
        for platform in staging.MACHINES.values():
            staging.stage_all(platform, pythons)  # every interpreter a target's image has
        shutil.copytree(staging.root(), tmp / "bundle" / STAGED_DIR, ignore=shutil.ignore_patterns("wheels", ".*"))
        (tmp / "bundle" / ".complete").write_text("")
        if bundle.exists():
            shutil.rmtree(bundle)
        (tmp / "bundle").rename(bundle)
        shutil.rmtree(tmp, ignore_errors=True)
    return _link(bundle, "probe")


def record(tf: TargetsFile, bt: BakeTarget, metadata_file: Path, values: Mapping[str, str]) -> Path:
    """A BuildRecord from `docker buildx bake --metadata-file` for one bake target."""
    from qualify.scaleout.bake import generate, resolve

    try:
        meta = read_json(metadata_file, METADATA_LIMIT, "bake metadata file", ConfigError)[bt.name]
        digest, config = meta["containerimage.digest"], meta.get("containerimage.config.digest", "")
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"{metadata_file}: no containerimage.digest for bake target {bt.name!r} ({exc})",
                          hint="run `docker buildx bake --push --metadata-file FILE TARGET`") from None
    resolved = resolve(generate(tf), bt.name, values)
    tag = resolved["tags"][0]
    rec = image.BuildRecord(
        target=bt.target.name, profile=bt.profile, base_kind=BASE_KIND, platform=bt.target.platform,
        base_image=resolved["args"]["BASE_IMAGE"], image_reference=f"{tag.rsplit(':', 1)[0]}@{digest}",
        image_tag=tag, image_id=config, engine="docker", builder="buildx bake", labels=resolved["labels"],
        build_seconds=0.0,
    )
    path = image.record_path(rec.target, rec.profile, rec.base_kind)
    write_json(path, rec.to_json())
    return path
