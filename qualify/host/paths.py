"""Every path the toolkit writes or reads back outside the repository's inputs, and every label key its images
carry: the state folder's parts, a checkout's records (`build/`) and release folders (`manifests/`).

Spelled once, here, so that a stage never composes `repo / "build" / "images" / ...` itself (issue 28 found
five spellings). Functions read `STATE_DIR` when called, so one setting (QUALIFY_STATE_DIR, or a test that
sets `paths.STATE_DIR`) moves every state path together.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from qualify.config.targets import REPO_ROOT

# The state folder: build contexts, wheelhouses, staged probes, the loopback registry's storage, locks.
STATE_DIR = Path(os.environ.get("QUALIFY_STATE_DIR", "/var/lib/blackwell-qualify"))

# What `nox -s clean` (host/clean.py) may do with each part of the state folder; every checkout on the host
# shares it, so clean takes only what is this checkout's or nobody's:
# - per checkout: removed only by the checkout whose ledger (host/ledger.py) names the entry;
STATE_PER_CHECKOUT = ("contexts",)
# - work folders of running commands (`<kind>.<pid>.<random>`, host/workdirs.py): removed once their process is
#   gone, whichever checkout ran it (nobody can use them any more);
STATE_WORK = ("work", "repro", "probe-runs")
# - shared, content-addressed caches any checkout's next build reuses: only with --all;
STATE_SHARED = ("wheelhouse", "probe", "probe-staged", "bake-probe")
# - slow to make again (debootstrap): only with --all;
STATE_SLOW = ("rootfs",)
# - never removed, not even with --all: the ledgers that say what each checkout made, the host-wide locks, the
#   registry's storage (garbage-collected, never removed), and state a later command trusts, such as a
#   promoter's or a deploy's high-water marks (anti-rollback: removing them would let an older release back
#   in). A folder added to the state folder for such state is named here.
STATE_NEVER_REMOVED = ("checkouts", "locks", "trust")


def state(*parts: str, root: Optional[Path] = None) -> Path:
    """A path in the state folder (`root`, else STATE_DIR as set now)."""
    return Path(root if root is not None else STATE_DIR).joinpath(*parts)


def build_contexts(root: Optional[Path] = None) -> Path:
    return state("contexts", root=root)


def probe_stage(sources_digest: str, root: Optional[Path] = None) -> Path:
    """The image side, copied read-only for containers, by its sources' digest."""
    return state("probe", sources_digest.split(":", 1)[-1][:16], root=root)


def probe_runs(root: Optional[Path] = None) -> Path:
    """Private folders, one per probe run, holding exactly the bytes that run mounts (qualification/staging.py)."""
    return state("probe-runs", root=root)


def trust_state(root: Optional[Path] = None) -> Path:
    """The promoter's high-water marks: QUALIFY_TRUST_DIR, else STATE_DIR/trust (STATE_NEVER_REMOVED)."""
    chosen = os.environ.get("QUALIFY_TRUST_DIR", "")
    return Path(chosen) if chosen and root is None else state("trust", root=root)


def staged_decoders(key: str, root: Optional[Path] = None) -> Path:
    return state("probe-staged", key, root=root)


def bake_probe(name: str, root: Optional[Path] = None) -> Path:
    return state("bake-probe", name, root=root)


def repro_scratch(root: Optional[Path] = None) -> Path:
    return state("repro", root=root)


def work_dirs(root: Optional[Path] = None) -> Path:
    """Work folders of running commands (host/workdirs.py), on the state folder's disk rather than /tmp."""
    return state("work", root=root)


def never_removed(root: Optional[Path] = None) -> tuple:
    """The paths `clean` never removes, even with --all (STATE_NEVER_REMOVED, and every registry's storage)."""
    base = Path(root if root is not None else STATE_DIR)
    return tuple(base / n for n in STATE_NEVER_REMOVED) + tuple(sorted(base.glob("registry-*")))


def wheelhouse(name: str, root: Optional[Path] = None) -> Path:
    return state("wheelhouse", name, root=root)


def rootfs_cache(root: Optional[Path] = None) -> Path:
    return state("rootfs", root=root)


def host_lock(name: str, root: Optional[Path] = None) -> Path:
    """A file lock shared by every checkout on this host (hermetic bases)."""
    return state("locks", f"{name}.lock", root=root)


def registry_storage(port: str, root: Optional[Path] = None) -> Path:
    """Our loopback registry's config and data, per port."""
    return state(f"registry-{port}", root=root)


def registry_lock(port: str, root: Optional[Path] = None) -> Path:
    """Held while the registry starts or its garbage collector runs."""
    return state(f"registry-{port}.lock", root=root)


def registry_users(port: str, root: Optional[Path] = None) -> Path:
    """Every command that uses our registry holds a shared lock on this file; clean stops the registry for its
    garbage collector only when it can lock it alone (host/registry.py: `hold`, `alone`)."""
    return state(f"registry-{port}.users", root=root)


def checkouts(root: Optional[Path] = None) -> Path:
    """One folder per checkout that built on this host: its ledgers."""
    return state("checkouts", root=root)


def ledger(checkout: Path, root: Optional[Path] = None) -> Path:
    """What one checkout made on this host (host/ledger.py), named by a hash of the checkout's path, so that
    removing the checkout's `build/` folder keeps it."""
    key = hashlib.sha256(str(Path(checkout).resolve()).encode()).hexdigest()[:16]
    return checkouts(root) / key / "made.jsonl"


def build_record_name(target: str, profile: str, base_kind: str) -> str:
    """A build record's file name in a folder of records (build/images/, or publish's --build-dir)."""
    return f"{target}-{profile}-{base_kind}.json"


@dataclass(frozen=True)
class Checkout:
    """One checkout's records and release folders."""

    root: Path

    @property
    def build_dir(self) -> Path:
        """Per-checkout output (ignored by git)."""
        return self.root / "build"

    @property
    def build_records(self) -> Path:
        return self.build_dir / "images"

    def build_record(self, target: str, profile: str, base_kind: str) -> Path:
        return self.build_records / build_record_name(target, profile, base_kind)

    @property
    def release_inputs(self) -> Path:
        """`build/manifests/<target>.json`: the latest qualified manifest per target, what `release` reads."""
        return self.build_dir / "manifests"

    def release_input(self, target: str) -> Path:
        return self.release_inputs / f"{target}.json"

    @property
    def qualified_dir(self) -> Path:
        return self.build_dir / "qualified"

    def qualified(self, target: str, profile: str, base_kind: str) -> Path:
        """One manifest per target, profile and base."""
        return self.qualified_dir / f"{target}-{profile}-{base_kind}.json"

    @property
    def external(self) -> Path:
        """`build/external/`: qualifications of images we did not build, never a release input."""
        return self.build_dir / "external"

    @property
    def releases(self) -> Path:
        """`manifests/`: release folders (`manifests/<tag>/`), committed."""
        return self.root / "manifests"

    def release_dir(self, tag: str) -> Path:
        return self.releases / tag

    @property
    def hosts_file(self) -> Path:
        """The enrolled GPU hosts, signed with the release key."""
        return self.releases / "hosts.json"

    @property
    def schema(self) -> Path:
        return self.releases / "manifest.schema.json"

    @property
    def sums(self) -> Path:
        return self.root / "SHA256SUMS"


HERE = Checkout(REPO_ROOT)

# Label keys. Ours, under one prefix; the OCI ones as the image-spec annotations name them.
LABEL_PREFIX = "dev.blackwell-qualify"


def label(name: str) -> str:
    return f"{LABEL_PREFIX}.{name}"


LABEL_TARGET = label("target")
LABEL_CAPABILITY = label("capability")
LABEL_PLATFORM = label("platform")
LABEL_ARCH_LIST = label("torch-cuda-arch-list")
LABEL_PROFILE = label("profile")
LABEL_BASE_KIND = label("base-kind")
LABEL_INTENDED_LEVEL = label("intended-support-level")
LABEL_LOCK_SHA256 = label("lock.sha256")
LABEL_SHA256SUMS = label("sha256sums")
LABEL_ROOTFS = label("rootfs")
LABEL_CUDA = label("cuda")
LABEL_CUDA_LOCK_SHA256 = label("cuda-lock.sha256")

OCI_TITLE = "org.opencontainers.image.title"
OCI_DESCRIPTION = "org.opencontainers.image.description"
OCI_SOURCE = "org.opencontainers.image.source"
OCI_REVISION = "org.opencontainers.image.revision"
OCI_VERSION = "org.opencontainers.image.version"
OCI_CREATED = "org.opencontainers.image.created"
OCI_BASE_NAME = "org.opencontainers.image.base.name"
OCI_BASE_DIGEST = "org.opencontainers.image.base.digest"
OCI_REF_NAME = "org.opencontainers.image.ref.name"
