"""A real image registry on loopback (Debian's `docker-registry`), so that
locally made bases and built images get true repo digests.

The packaged service wants basic auth on :5000; we run our own instance with
our own config, bound to 127.0.0.1 (the engine accepts plain HTTP there).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set

from qualify.core.errors import EngineError, HostError, RegistryError
from qualify.core.fsutil import file_lock
from qualify.core.readlimit import strict_json
from qualify.core.report import Reporter
from qualify.host import clients, cmd, paths

REPORT = Reporter("registry")

DEFAULT_ADDRESS = "127.0.0.1:5555"
MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)

_CONFIG = """version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: {address}
"""


@dataclass(frozen=True)
class Registry:
    address: str = DEFAULT_ADDRESS

    @classmethod
    def from_env(cls) -> Registry:
        return cls(os.environ.get("QUALIFY_REGISTRY", DEFAULT_ADDRESS))

    @property
    def port(self) -> str:
        return self.address.rsplit(":", 1)[1]

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def answers(self, timeout: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v2/", timeout=timeout) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def ensure(self, state_dir: Optional[Path] = None, wait_s: float = 20.0) -> Registry:
        """Start our registry if nothing answers at the address yet (one starter at a time); first, repair
        what a full disk left in its storage. The process then holds a lease on it (`hold`)."""
        self.hold(state_dir)
        repair_storage(paths.registry_storage(self.port, state_dir) / "data")
        if self.answers():
            return self
        if not self.address.startswith("127.0.0.1:"):
            raise RegistryError(f"registry {self.address} does not answer", hint="start it, or unset QUALIFY_REGISTRY")
        with file_lock(paths.registry_lock(self.port, state_dir)):
            if self.answers():
                return self
            if self.gc_pending(state_dir).exists():
                REPORT.say(f"{self.address} was stopped for a garbage collection that did not finish (a clean was "
                           "killed): starting it again; the next `nox -s clean` finishes the collection")
            return self.start(state_dir, wait_s)

    # --- who uses it: clean stops it for garbage collection only when nobody does ---------------------

    def hold(self, state_dir: Optional[Path] = None) -> None:
        """A shared lease on our registry for the rest of this process (a build, a repro, a base build): the
        garbage collector, which must stop the registry, runs only while nobody holds one (`alone`), and while
        it runs a new lease waits for it."""
        path = paths.registry_users(self.port, state_dir)
        if str(path) in _SHARED:
            return
        fd = _lease(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            REPORT.say(f"waiting for the registry's garbage collection (a `clean` holds {path}) ...")
            fcntl.flock(fd, fcntl.LOCK_SH)
        _SHARED.add(str(path))

    def release(self, state_dir: Optional[Path] = None) -> None:
        """Give this process's lease back (a long-lived process done with the registry)."""
        path = str(paths.registry_users(self.port, state_dir))
        if path in _SHARED:
            fcntl.flock(_HELD[path], fcntl.LOCK_UN)
            _SHARED.discard(path)

    @contextlib.contextmanager
    def alone(self, state_dir: Optional[Path] = None) -> Iterator[bool]:
        """True for the block when no other process holds a lease (and none can take one meanwhile)."""
        path = paths.registry_users(self.port, state_dir)
        fd, shared = _lease(path), str(path) in _SHARED
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            got = True
        except BlockingIOError:
            got = False
        try:
            yield got
        finally:
            # Back to what this process held (flock converts a lock by dropping it first).
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_UN)

    def gc_pending(self, state_dir: Optional[Path] = None) -> Path:
        """Present from the moment clean decides to collect until the collection finished and the registry
        answers again: a clean that was killed or deferred leaves it, and the next clean collects."""
        return paths.registry_storage(self.port, state_dir) / "gc-pending"

    # --- a full disk ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def storage_checked(self, ref: str, state_dir: Optional[Path] = None) -> Iterator[None]:
        """A push into our registry: a failure because its storage's disk is full (the registry answers
        HTTP 500) says so, naming the storage, as the host refusing (exit 12), not as an engine failure."""
        data = paths.registry_storage(self.port, state_dir) / "data"
        log = paths.registry_storage(self.port, state_dir) / "registry.log"
        offset = _size(log)
        try:
            yield
        except EngineError as exc:
            free = _free(data) if data.is_dir() else None
            if free is None or not (free < FULL_BELOW or _says_full(log, offset)):
                raise
            raise HostError(
                f"push of {ref} failed: the loopback registry's storage {data} is full ({free / 2**20:.0f} MiB free); "
                f"the registry answered: {exc.message.splitlines()[-1][-200:]}",
                hint=f"free space on the file system holding {data} (df -h {data}); `nox -s clean -- --dry-run` lists "
                     "what this checkout can free, or point QUALIFY_STATE_DIR at a larger disk; then run the same "
                     "command again: the push sends only what the registry lacks") from None

    def start(self, state_dir: Optional[Path] = None, wait_s: float = 20.0) -> Registry:
        """Start our registry (the caller holds its lock: `ensure`, or clean after garbage collection)."""
        if not self.address.startswith("127.0.0.1:"):
            raise RegistryError(f"registry {self.address} does not answer", hint="start it, or unset QUALIFY_REGISTRY")
        binary = clients.registry_binary()
        if not os.path.exists(binary):
            raise RegistryError(
                "Debian's docker-registry is not installed", hint="run scripts/setup-host.sh (apt-get install docker-registry)"
            )
        root = paths.registry_storage(self.port, state_dir)
        root.mkdir(parents=True, exist_ok=True)
        config = root / "config.yml"
        config.write_text(_CONFIG.format(root=root / "data", address=self.address))
        log = open(root / "registry.log", "ab")
        # A new session: the registry outlives the command that started it.
        cmd.spawn([binary, "serve", str(config)], stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.answers():
                return self
            time.sleep(0.2)
        raise RegistryError(f"registry on {self.address} did not start within {wait_s:.0f} s; see {root / 'registry.log'}")

    def ref(self, repository: str) -> str:
        return f"{self.address}/{repository}"

    def manifest_digest(self, repository: str, reference: str, timeout: float = 10.0) -> Optional[str]:
        """Digest the registry serves for `repository:reference` (tag or digest); None if absent.
        Through skopeo (the one registry client; see ARCHITECTURE.md)."""
        from qualify.host import skopeo

        sep = "@" if reference.startswith("sha256:") else ":"
        try:
            raw = skopeo.inspect_raw(f"docker://{self.address}/{repository}{sep}{reference}", (self.address,))
        except RegistryError as exc:
            if "not found" in exc.message:
                return None
            raise
        return "sha256:" + hashlib.sha256(raw).hexdigest()

    def delete_tag(self, ref: str) -> None:
        """Drop a tag's manifest from its repository (other repositories keep their links).
        A scratch tag only: a registry keeps no record of who made a manifest."""
        from qualify.host import skopeo

        name, _, tag = ref.rpartition(":")
        repository = name.split("/", 1)[1]
        if self.manifest_digest(repository, tag or "latest"):
            skopeo.delete(f"docker://{ref}", (self.address,))

    def tags(self, repository: str) -> List[str]:
        from qualify.host import skopeo

        try:
            raw = skopeo.list_tags(f"docker://{self.address}/{repository}", (self.address,))
        except RegistryError as exc:
            if "not found" in exc.message:
                return []
            raise
        return strict_json(raw, f"skopeo list-tags {self.address}/{repository}", RegistryError).get("Tags") or []


# Leases this process holds: lock file -> descriptor (os.open: not inherited by the registry it starts).
_HELD: Dict[str, int] = {}
_SHARED: Set[str] = set()
FULL_BELOW = 64 << 20  # a storage with less free than this took no blob


def _lease(path: Path) -> int:
    if str(path) not in _HELD:
        path.parent.mkdir(parents=True, exist_ok=True)
        _HELD[str(path)] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    return _HELD[str(path)]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _free(path: Path) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


def _says_full(log: Path, offset: int) -> bool:
    """The registry's log, since `offset`, reports a full disk (distribution logs the write's errno)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(offset, _size(log) - (1 << 20)))
            return b"no space left on device" in fh.read(1 << 20).lower()
    except OSError:
        return False


def repair_storage(data: Path) -> List[str]:
    """Empty link files in our registry's storage: what a push into a full disk leaves (the registry wrote
    the link's name but not its digest). distribution 2.8 then answers 500 for that blob or manifest on every
    later push until the file is gone; removing it makes the blob unknown again, so the next push sends it."""
    root = data / "docker" / "registry" / "v2" / "repositories"
    removed = []
    if not root.is_dir():
        return removed
    for link in root.rglob("link"):
        try:
            if link.is_file() and not link.is_symlink() and link.stat().st_size == 0:
                link.unlink()
                removed.append(str(link.relative_to(root)))
        except OSError:
            continue
    if removed:
        REPORT.say(f"removed {len(removed)} empty link file(s) a full disk left in {root} (e.g. {removed[0]}); "
              "the next push sends those blobs again")
    return removed
