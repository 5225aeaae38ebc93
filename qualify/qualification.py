"""Qualify a built image: run the probe in a container, wrap its predicate into
the manifest, validate it against the schema, write it once, atomically.

The container gets no network, the probe package and pyelftools mounted
read-only, and one writable directory for its output. It uses the image's
own python3, so it qualifies what users will run.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, Optional, TextIO

from . import build as build_mod
from . import manifest, provenance
from .engine import Engine
from .errors import ConfigError, EngineError, QualifyError
from .fsutil import write_atomic
from .probe.runner import ProbeTarget
from .registry import STATE_DIR
from .targets import REPO_ROOT, Target, TargetsFile

SCHEMA = REPO_ROOT / "manifests" / "manifest.schema.json"
MANIFEST_DIR = build_mod.BUILD_DIR / "manifests"  # release input: <target>.json, the latest qualified
QUALIFIED_DIR = build_mod.BUILD_DIR / "qualified"  # one per target, profile and base
PACKAGE_DIR = Path(__file__).resolve().parent
CONTAINER_ROOT = "/opt/qualify"


def probe_target(target: Target, profile: str, emulated: bool = False) -> ProbeTarget:
    return ProbeTarget(
        name=target.name, capability=str(target.capability), platform=target.platform,
        torch_cuda_arch_list=target.torch_cuda_arch_list, triton_env=target.triton.env(),
        intended_support_level=target.support_level, profile=profile,
        unified_memory=target.runtime.unified_memory,
        gpu_memory_utilization=target.runtime.gpu_memory_utilization,
        min_gpu_memory_gib=target.runtime.min_gpu_memory_gib, emulated=emulated,
    )


def probe_sources_digest() -> str:
    """What the probe is made of: a manifest from other probe code is not reused."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        h.update(str(path.relative_to(PACKAGE_DIR)).encode() + b"\0" + path.read_bytes())
    return "sha256:" + h.hexdigest()


def stage_probe(digest: str) -> Path:
    """A read-only copy of the probe (this package + pyelftools) to mount into images."""
    import elftools

    dest = STATE_DIR / "probe" / digest.split(":", 1)[1][:16]
    if (dest / "qualify" / "__init__.py").exists():
        return dest
    tmp = Path(tempfile.mkdtemp(prefix="probe-", dir=STATE_DIR))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(PACKAGE_DIR, tmp / "qualify", ignore=ignore)
    shutil.copytree(Path(elftools.__file__).parent, tmp / "elftools", ignore=ignore)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        shutil.rmtree(tmp)
    else:
        tmp.rename(dest)
    return dest


def run_probe(engine: Engine, image: str, target: Target, profile: str, timeout: float = 900) -> Dict[str, Any]:
    """The probe's predicate, from a container of `image`."""
    mount = stage_probe(probe_sources_digest())
    with tempfile.TemporaryDirectory(prefix="qualify-out-") as out:
        out_dir = Path(out)
        out_dir.chmod(0o777)
        emulated = target.platform != engine.native_platform()
        tj = json.dumps(asdict(probe_target(target, profile, emulated)), sort_keys=True)
        print(f"[qualify] probing {image} in a container (no network)", file=sys.stderr, flush=True)
        proc = engine.run_container(
            image,
            ["python3", "-m", "qualify", "probe", "--target-json", tj, "--predicate-only", "--out",
             "/out/predicate.json"],
            mounts=[(str(mount), CONTAINER_ROOT, "ro"), (str(out_dir), "/out", "rw")],
            env={"PYTHONPATH": CONTAINER_ROOT, "PYTHONDONTWRITEBYTECODE": "1"},
            network="none", platform=target.platform, timeout=timeout,
        )
        for line in proc.stderr.splitlines():
            if line.startswith("[probe]"):
                print("  " + line, file=sys.stderr, flush=True)
        result = out_dir / "predicate.json"
        if proc.returncode not in (0, 1, 3) or not result.exists():
            raise EngineError(
                f"the probe did not complete in {image} (exit {proc.returncode}):\n"
                + "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-25:]),
                hint="the image needs a python3 (3.9+); see the output above",
            )
        return json.loads(result.read_text())


def validate(doc: Dict[str, Any]) -> None:
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path)
        raise QualifyError(f"manifest does not match {SCHEMA.name} at /{where}: {first.message}")


def assemble(record: build_mod.BuildRecord, predicate: Dict[str, Any]) -> Dict[str, Any]:
    predicate = dict(predicate)
    predicate["image"] = {"reference": record.image_reference, "digest": record.digest, "id": record.image_id,
                          "tag": record.image_tag, "labels": record.labels}
    predicate["base"] = {"kind": record.base_kind, "image": record.base_image}
    predicate["build"] = {"engine": record.engine, "builder": record.builder, "seconds": record.build_seconds}
    predicate["toolkit"] = {**predicate.get("toolkit", {}), "source_revision": provenance.revision(),
                            "probe_sha256": probe_sources_digest()}
    doc = manifest.statement(record.image_reference.split("@", 1)[0], record.digest, predicate)
    validate(doc)
    return doc


def qualified_path(record: build_mod.BuildRecord) -> Path:
    return QUALIFIED_DIR / f"{record.target}-{record.profile}-{record.base_kind}.json"


def already_qualified(record: build_mod.BuildRecord) -> Optional[Path]:
    path = qualified_path(record)
    if not path.exists():
        return None
    try:
        doc = manifest.load(path)
    except QualifyError:
        return None
    same_image = manifest.subject_digest(doc) == record.digest
    same_probe = manifest.predicate(doc).get("toolkit", {}).get("probe_sha256") == probe_sources_digest()
    return path if same_image and same_probe else None


def qualify(tf: TargetsFile, record: build_mod.BuildRecord, engine: Engine, force: bool = False) -> Path:
    target = tf.get(record.target)
    existing = None if force else already_qualified(record)
    if existing:
        print(f"[qualify] {record.image_reference} already qualified by this probe: {existing}", file=sys.stderr)
        return existing
    start = time.monotonic()
    predicate = run_probe(engine, record.image_reference, target, record.profile)
    doc = assemble(record, predicate)
    data = manifest.dumps(doc)
    path = write_atomic(qualified_path(record), data)
    write_atomic(MANIFEST_DIR / f"{record.target}.json", data)
    print(f"[qualify] {path} ({time.monotonic() - start:.1f} s)", file=sys.stderr, flush=True)
    return path


def summary_line(path: Path) -> str:
    doc = manifest.load(path)
    p = manifest.predicate(doc)
    counts: Dict[str, int] = {}
    for c in p["checks"]:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    parts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    return f"{p['target']['name']}: verdict {p['verdict']}, support level {p['support_level']} ({parts})"


def _report(path: Path, file: TextIO) -> int:
    """Summary for people; exit 1 when the verdict is fail."""
    print(summary_line(path), file=file)
    print(f"manifest: {path.relative_to(REPO_ROOT)}", file=file)
    return 1 if manifest.predicate(manifest.load(path))["verdict"] == "fail" else 0


def run_after_build(tf: TargetsFile, record: build_mod.BuildRecord, engine_name: str, file: TextIO) -> int:
    return _report(qualify(tf, record, Engine(engine_name).check()), file)


def qualify_target(tf: TargetsFile, opts: build_mod.BuildOptions, force: bool, file: TextIO) -> int:
    """`nox -s qualify-<target>`: qualify the built image, building it first when missing."""
    record = build_mod.load_record(opts.target, opts.profile, opts.base)
    engine = Engine(opts.engine).check()
    if record is None or not engine.exists(record.image_reference):
        print(f"[qualify] no built {opts.profile} image of {opts.target} on the {opts.base} base: building it first",
              file=sys.stderr, flush=True)
        record = build_mod.build(tf, opts, engine)
        if record is None:
            raise ConfigError("nothing was built (dry run?)")
    return _report(qualify(tf, record, engine, force=force), file)
