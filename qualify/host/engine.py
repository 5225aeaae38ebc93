"""One class drives docker or podman (python-on-whales underneath).

Abilities are detected, not assumed (measured on Debian 12 with docker.io 20.10 and podman 4.3):
- `buildx`: docker with the buildx plugin; `SOURCE_DATE_EPOCH`,
  `rewrite-timestamp` and provenance are available.
- `buildkit`: a docker client that still carries BuildKit itself (20.10, as
  Debian ships it) with `DOCKER_BUILDKIT=1`: `--platform` works, timestamps
  are not rewritten.
- `classic`: the legacy builder; no `--platform`, does not reproduce.
- `podman`: buildah underneath; `--timestamp` makes builds reproducible.

python-on-whales does every engine call it can express: `info`, `pull`,
`image list`, `image rm`, `save`, `image inspect`. Docker pushes go through the
Engine API (docker-py), whose stream carries bytes per layer; the CLI's, which
python-on-whales reads, carries none when not on a terminal. The command line is ours, in one place each, only where
it cannot:
- builds: `legacy_build` cannot pass `--platform`, `--timestamp` or
  `--iidfile` and expects the classic builder's output (and buildx, which it
  wraps, is not installable on Debian 12's docker.io);
- podman against our plain-HTTP loopback registry: `--tls-verify=false` on
  push/pull and `--digestfile` on push are not among its options, nor
  `save --format docker-archive`;
- throw-away containers: `container.run` has no timeout and does not return
  the exit status and stderr of a successful run, which the probe protocol uses;
- raw `image inspect` JSON for build clean-up: podman's `History`, which its
  models leave out, orders removals.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Dict, FrozenSet, Iterator, List, Mapping, Optional, Sequence, Set

from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException, NoSuchImage

from qualify.config.imageref import ImageRef, digests_for
from qualify.core import killpoint
from qualify.core.errors import BaseImageError, BuildError, EngineError
from qualify.core.readlimit import strict_json
from qualify.core.report import Reporter, emit
from qualify.host import buildkit, clients, cmd, workcontainers
from qualify.host.progress import BuildSteps, PushProgress

REPORT = Reporter("build")

ENGINES = ("docker", "podman")
BUILDERS = {"docker": ("buildx", "buildkit", "classic"), "podman": ("podman",)}


@dataclass(frozen=True)
class BuildRequest:
    context: Path
    dockerfile: Path
    tags: Sequence[str]
    platform: str
    build_args: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    target: Optional[str] = None
    no_cache: bool = False
    source_date_epoch: Optional[str] = None
    insecure_registry: bool = True  # our registry is plain HTTP on loopback


@dataclass(frozen=True)
class ImageInfo:
    id: str
    architecture: str
    labels: Dict[str, str]
    repo_digests: List[str]
    size: int


class Engine:
    """A container engine: docker or podman."""

    def __init__(self, name: str = "docker", builder: Optional[str] = None, binary: Optional[str] = None) -> None:
        """`binary`: the client to call (the deploy's preflight found one answering); else found on PATH."""
        if name not in ENGINES:
            raise EngineError(f"unknown engine {name!r}", hint=f"use one of {', '.join(ENGINES)}")
        if builder is not None and builder not in BUILDERS[name]:
            raise EngineError(f"{name} has no {builder!r} builder", hint=f"use one of {', '.join(BUILDERS[name])}")
        self.name = name
        self.binary = binary or clients.build_client(name)
        self.client = DockerClient(client_call=[self.binary], client_type="podman" if name == "podman" else "docker")
        # An explicit builder (e.g. classic, to show what does not reproduce) skips detection.
        self._builder: Optional[str] = builder
        self.last_build_steps: Dict[str, float] = {}  # BuildKit step name -> seconds, of the last build
        self.last_cache_hits: FrozenSet[str] = frozenset()  # image ids podman served the last build's steps from

    # --- abilities -------------------------------------------------------------

    def check(self) -> Engine:
        """Fail early, with what to do, when the engine does not answer."""
        try:
            self.client.system.info()
        except DockerException as exc:
            hint = "run scripts/setup-host.sh (starts dockerd)" if self.name == "docker" else "check `podman info`"
            raise EngineError(f"no {self.name} engine answers: {_tail(exc)}", hint=hint) from None
        return self

    @property
    def builder(self) -> str:
        if self._builder is None:
            self._builder = self._detect_builder()
        return self._builder

    def _detect_builder(self) -> str:
        if self.name == "podman":
            return "podman"
        if os.environ.get("DOCKER_BUILDKIT") == "0":
            return "classic"  # the user asked for the legacy builder
        if cmd.ask([self.binary, "buildx", "version"]).returncode == 0:
            return "buildx"
        version = cmd.ask([self.binary, "version", "--format", "{{.Client.Version}}"]).stdout.strip()
        major = int(version.split(".", 1)[0]) if version[:1].isdigit() else 0
        # Clients before 23.0 build with BuildKit themselves when DOCKER_BUILDKIT=1.
        return "buildkit" if 0 < major < 23 else "classic"

    @property
    def reproducible(self) -> bool:
        return self.builder in ("podman", "buildx")

    def describe(self) -> str:
        notes = {
            "buildx": "docker buildx (BuildKit; SOURCE_DATE_EPOCH with rewrite-timestamp)",
            "buildkit": "docker with built-in BuildKit (DOCKER_BUILDKIT=1; timestamps not rewritten)",
            "classic": "docker classic builder (no --platform; not reproducible)",
            "podman": "podman/buildah (--timestamp: reproducible)",
        }
        return f"{self.binary}: {notes[self.builder]}"

    # --- build -------------------------------------------------------------------

    def build_command(self, req: BuildRequest, iidfile: Path) -> tuple:
        """(argv, extra env) for one build."""
        env: Dict[str, str] = {}
        if self.builder == "buildx":
            argv = [self.binary, "buildx", "build", "--progress=plain"]
            if req.source_date_epoch is not None:
                env["SOURCE_DATE_EPOCH"] = req.source_date_epoch
                # --load is short for --output type=docker; the rewrite needs the long form, and only one output.
                argv += ["--output", "type=docker,rewrite-timestamp=true"]
            else:
                argv.append("--load")
            argv += ["--provenance=false"]
        elif self.builder == "buildkit":
            env["DOCKER_BUILDKIT"] = "1"
            env["BUILDKIT_PROGRESS"] = "plain"
            argv = [self.binary, "build"]
        elif self.builder == "classic":
            env["DOCKER_BUILDKIT"] = "0"
            argv = [self.binary, "build"]
        else:
            # OCI, not docker format: a docker-format config records the build
            # container's random id and the parent image id, so two clean builds
            # of the same inputs never give the same image id.
            argv = [self.binary, "build", "--format", "oci", "--layers"]
            if req.source_date_epoch is not None:
                argv += ["--timestamp", req.source_date_epoch]
            if req.insecure_registry:
                argv += ["--tls-verify=false"]
        if self.builder != "classic":
            argv += ["--platform", req.platform]
        argv += ["--file", str(req.dockerfile), "--iidfile", str(iidfile)]
        if req.no_cache:
            argv.append("--no-cache")
        if req.target:
            argv += ["--target", req.target]
        for key, value in sorted(req.build_args.items()):
            argv += ["--build-arg", f"{key}={value}"]
        for key, value in sorted(req.labels.items()):
            argv += ["--label", f"{key}={value}"]
        for tag in req.tags:
            argv += ["--tag", tag]
        argv.append(str(req.context))
        return argv, env

    def build(self, req: BuildRequest, log_prefix: str = "  | ") -> str:
        """Build and return the image id; streams progress, raises BuildError with the tail."""
        if self.builder == "classic" and req.platform != self.native_platform():
            raise BuildError(
                f"the classic docker builder cannot build for {req.platform} (engine is {self.native_platform()})",
                hint="use a BuildKit-capable client (Debian's /usr/bin/docker 20.10, or buildx) or --engine podman",
            )
        iidfile = req.context / ".iidfile"
        iidfile.unlink(missing_ok=True)
        argv, env = self.build_command(req, iidfile)
        REPORT.say(f"{self.describe()}")
        REPORT.say("+ " + " ".join(argv))
        recent: deque = deque(maxlen=40)
        steps = BuildSteps()
        proc = cmd.spawn(argv, stdout=cmd.PIPE, stderr=cmd.STDOUT, env={**os.environ, **env}, text=True,
                         errors="replace")
        assert proc.stdout is not None
        for line in proc.stdout:
            recent.append(line.rstrip())
            steps.feed(line.rstrip())
            emit(log_prefix + line.rstrip())
        code = proc.wait()
        self.last_build_steps = dict(steps.seconds)
        self.last_cache_hits = frozenset(steps.cache_hits)
        if code != 0:
            raise BuildError(
                f"{self.name} build failed (exit {code}); last lines:\n" + "\n".join(recent),
                hint="the failing step is shown above; rerun with the same command to reproduce",
            )
        image_id = iidfile.read_text().strip()
        iidfile.unlink(missing_ok=True)
        return image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"

    # --- images ------------------------------------------------------------------

    def native_platform(self) -> str:
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
        return f"linux/{arch}"

    def inspect(self, ref: str) -> Optional[ImageInfo]:
        try:
            img = self.client.image.inspect(ref)
        except (NoSuchImage, DockerException):
            return None
        labels = dict((img.config.labels or {}) if img.config else {})
        return ImageInfo(
            id=img.id,
            architecture=img.architecture or "",
            labels=labels,
            repo_digests=list(img.repo_digests or []),
            size=int(img.size or 0),
        )

    def exists(self, ref: str) -> bool:
        return self.inspect(ref) is not None

    def push(self, ref: str) -> str:
        """Push `name:tag` and return the registry's manifest digest, saying how it goes."""
        info = self.inspect(ref)
        progress = PushProgress(ref, info.size if info else 0)
        try:
            if self.name == "podman":
                with tempfile.TemporaryDirectory(prefix="qualify-push-") as tmp:
                    digestfile = Path(tmp) / "digest"
                    self._run([self.binary, "push", "--tls-verify=false", "--digestfile", str(digestfile), ref],
                              timeout=1800)
                    digest = digestfile.read_text().strip()
            else:
                digest = self._push_by_api(ref, progress)
        except BaseException:
            progress.stopped()  # never "done" before the error or "interrupted"
            raise
        progress.done()
        return digest

    def _push_by_api(self, ref: str, progress: PushProgress) -> str:
        """Docker's push through the Engine API, whose stream carries each layer's bytes (`progressDetail`);
        the CLI prints none when not on a terminal. Credentials come from docker's config.json, as for the CLI."""
        import docker
        from docker.errors import DockerException as ApiError

        repository, _, tag = ref.rpartition(":")
        if not repository or "/" in tag:
            repository, tag = ref, "latest"
        digest = ""
        try:
            api = docker.APIClient(version="auto", **docker.utils.kwargs_from_env())
            for message in api.push(repository, tag=tag, stream=True, decode=True):
                killpoint.reached("push:streaming")  # the interruption tests: a build killed during its push
                if message.get("error"):
                    raise EngineError(f"push of {ref} failed: {str(message['error'])[-300:]}")
                detail = message.get("progressDetail") or {}
                progress.event(str(message.get("id") or ""), str(message.get("status") or ""),
                               detail.get("current"), detail.get("total"))
                aux = message.get("aux") or {}
                digest = str(aux.get("Digest") or digest)
        except ApiError as exc:
            raise EngineError(f"push of {ref} failed: the engine API said {str(exc)[-300:]}",
                              hint="is dockerd running and DOCKER_HOST (if set) pointing at it?") from None
        if not digest.startswith("sha256:"):
            raise EngineError(f"push of {ref} printed no digest")
        return digest

    def pull(self, ref: str, platform: Optional[str] = None, timeout: float = 120) -> None:
        if self.name == "podman":
            argv = [self.binary, "pull", "--tls-verify=false"] + (["--platform", platform] if platform else [])
            self._run(argv + [ref], timeout=timeout)
            return
        try:
            self.client.image.pull(ref, platform=platform, quiet=True)
        except DockerException as exc:
            raise EngineError(f"pull of {ref} failed: {_tail(exc)}") from None

    def ensure_base(self, ref: ImageRef, platform: str) -> None:
        """The base must be present or pullable by digest; refuse clearly otherwise."""
        if self.exists(ref.by_digest) or self.exists(str(ref)):
            return
        try:
            self.pull(ref.by_digest, platform=platform)
        except EngineError as exc:
            raise BaseImageError(
                f"cannot pull the pinned base {ref.by_digest} for {platform}: {str(exc).splitlines()[-1][:300]}",
                hint="on a host that cannot reach a public registry, build on the hermetic base: "
                "nox -s build-<target> -- --base hermetic",
            ) from None

    def image_ids(self) -> Set[str]:
        """Full ids of every image in the store, intermediate (build cache) images included."""
        try:
            return {_full_id(image.id) for image in self.client.image.list(all=True)}
        except DockerException as exc:
            raise EngineError(f"{self.name} image list failed: {_tail(exc)}") from None

    def inspect_raw(self, refs: Sequence[str]) -> List[dict]:
        """Inspect JSON of several images in one call (ids, parents, tags)."""
        if not refs:
            return []
        return strict_json(self._stdout([self.binary, "image", "inspect", *refs]), f"{self.name} image inspect",
                           EngineError)

    def remove_images(self, ids: Sequence[str]) -> str:
        """Remove exactly these images; '' or the error. No -f: an image someone else tagged or uses stays.
        --no-prune: untagged parents stay too (podman counts look-alike images from other builds as parents)."""
        if not ids:
            return ""
        try:
            self.client.image.remove(list(ids), prune=False)
        except DockerException as exc:
            return _tail(exc, 500)
        return ""

    # --- what one build made, and removing exactly that ------------------------------

    def build_cache(self) -> Dict[str, buildkit.CacheEntry]:
        """BuildKit's cache records by id ({} where the builder keeps none apart from images).
        `system df -v` is the only listing with ids (python-on-whales' disk_free has totals only)."""
        if self.name != "docker" or self.builder == "classic":
            return {}
        return buildkit.parse_listing(self._disk_usage([self.binary, "system", "df", "-v", "--format",
                                                        "{{json .BuildCache}}"]))

    def _disk_usage(self, argv: List[str]) -> str:
        """`system df`'s stdout. The daemon runs one disk-usage operation at a time and
        refuses another ("a disk usage operation is already running": two builds
        finishing together, or a user's own `docker system df`), so a refused call
        waits and asks again, for up to ~30 s in all."""
        for delay in _DISK_USAGE_RETRIES:
            try:
                return self._stdout(argv)
            except EngineError as exc:
                if _DISK_USAGE_BUSY not in str(exc):
                    raise
            time.sleep(delay)
        return self._stdout(argv)

    def remove_build_cache(self, ids: Sequence[str]) -> int:
        """Remove exactly these cache records (`--all` lets a record go although images were made from it);
        bytes reclaimed. A record with children stays until they are gone, so this works in rounds."""
        reclaimed, remaining = 0, set(ids)
        for _ in range(10):
            for cache_id in sorted(remaining):  # BuildKit takes one value per filter key
                out = self._run([self.binary, "builder", "prune", "--all", "--force", "--filter", f"id={cache_id}"])
                total = [line for line in out.splitlines() if line.startswith("Total reclaimed space:")]
                reclaimed += buildkit.parse_size(total[-1].split(":", 1)[1].strip()) if total else 0
            left = remaining & set(self.build_cache())
            if not left or left == remaining:  # all gone, or no progress (in use by another build)
                break
            remaining = left
        return reclaimed

    def storage_root(self) -> Path:
        """Where the engine keeps images and cache (for free-space reports)."""
        fmt = "{{.DockerRootDir}}" if self.name == "docker" else "{{.Store.GraphRoot}}"
        out = self._stdout([self.binary, "info", "--format", fmt]).strip()
        return Path(out or ("/var/lib/docker" if self.name == "docker" else "/var/lib/containers/storage"))


    def inspect_existing(self, refs: Sequence[str]) -> List[dict]:
        """Inspect JSON of the refs that still exist (others may remove images meanwhile)."""
        try:
            return self.inspect_raw(refs)
        except EngineError:
            out: List[dict] = []
            for ref in refs:
                try:
                    out.extend(self.inspect_raw([ref]))
                except EngineError:
                    continue
            return out

    def image_id(self, ref: str) -> str:
        """The full id of `ref`, or '' when it does not exist."""
        info = self.inspect_existing([ref])
        return _full_id(info[0]["Id"]) if info else ""

    def created_images(self, before: Set[str], final_id: str, tag: str, base_id: str) -> List[str]:
        """Images one build made: new since `before`, untagged (or carrying only our scratch tag), and the final
        image, a step on its way (its layers a prefix of the final's) or a stage on the base (the base's layers a
        prefix of its own). Judged by layers, not parent links: podman derives parents from shared layers and
        may name an older look-alike image."""
        new = sorted(self.image_ids() - before)
        if not new:
            return []
        info = {_full_id(d["Id"]): d for d in self.inspect_existing(new)}
        final_layers = _layers(info[final_id]) if final_id in info else []
        base_info = self.inspect_existing([base_id]) if base_id else []
        base_layers = _layers(base_info[0]) if base_info else []
        ours = []
        for image, data in info.items():
            tags = [t for t in data.get("RepoTags") or [] if t != tag and not t.endswith(":<none>")]
            if tags or image == base_id:
                continue  # someone else's name on it, or the base (an input, pulled by this build)
            layers = _layers(data)
            on_the_way = bool(final_layers and layers) and layers == final_layers[:len(layers)]
            on_the_base = bool(base_layers) and layers[:len(base_layers)] == base_layers
            if image == final_id or on_the_way or on_the_base:
                ours.append(image)
        return ours

    def remove_created(self, ids: Sequence[str]) -> str:
        """Remove exactly `ids`, children before parents (an image with children cannot go first)."""
        remaining = set(ids)
        error = ""
        for _ in range(4):  # a second round only for what a misjudged order left
            present = remaining & self.image_ids()
            if not present:
                return ""
            error = self.remove_images(_removal_order(self.inspect_existing(sorted(present))))
            if (remaining & self.image_ids()) == present:
                return error or "no progress"
        return error

    def save(self, refs: Sequence[str], path: Path) -> Path:
        if self.name == "podman":
            self._run([self.binary, "save", "-o", str(path), "--format", "docker-archive", *refs], timeout=1800)
            return path
        try:
            self.client.image.save(list(refs), output=path)
        except DockerException as exc:
            raise EngineError(f"{self.name} save failed: {_tail(exc)}") from None
        return path

    # --- containers ----------------------------------------------------------------

    def run_container(
        self,
        image: str,
        command: Sequence[str],
        *,
        mounts: Sequence[tuple] = (),
        env: Optional[Mapping[str, str]] = None,
        network: Optional[str] = "none",
        platform: Optional[str] = None,
        timeout: float = 600,
        name: Optional[str] = None,
        gpus: Optional[str] = None,
        on_stderr_line: Optional[Callable[[str], None]] = None,
        init: bool = False,
        devices: Sequence[str] = (),
        options: Sequence[str] = (),
    ) -> cmd.Result:
        """Run a throw-away container; mounts are (host, container, 'ro'|'rw'); `options` are more `run` options
        (the deploy's gate: the server's shared memory, IPC namespace and limits).
        `on_stderr_line` sees each stderr line as it is written (progress of long steps).
        `init`: the engine's init process is PID 1 (docker-init, podman's catatonit) and reaps the command's
        children; a command that is PID 1 itself ignores signals it has no handler for, so one that crashes
        under qemu-user does not exit."""
        argv = [self.binary, "run", "--rm"]
        if init:
            argv.append("--init")
        if name:
            argv += ["--name", name]
        if network:
            argv += ["--network", network]
        if platform:
            argv += ["--platform", platform]
        if gpus:
            argv += ["--gpus", gpus]
        for device in devices:  # e.g. a CDI device, nvidia.com/gpu=0
            argv += ["--device", device]
        argv += list(options)
        for host, inside, mode in mounts:
            argv += ["-v", f"{host}:{inside}:{mode}"]
        for key, value in sorted((env or {}).items()):
            argv += ["-e", f"{key}={value}"]
        argv += [image, *command]
        try:
            if on_stderr_line is not None:
                return cmd.streamed(argv, timeout, on_stderr_line)
            return cmd.captured(argv, timeout=timeout)
        except cmd.TimeoutExpired:
            if name:
                cmd.ask([self.binary, "rm", "-f", name])
            raise EngineError(f"container from {image} did not finish within {timeout:.0f} s") from None

    @contextlib.contextmanager
    def exported_filesystem(self, image: str) -> Iterator[IO[bytes]]:
        """The image's whole filesystem as a tar stream (`export` of a created, never started container: no
        emulation for a foreign platform, nothing of the image runs). The reader bounds what it keeps."""
        cid = self._stdout([self.binary, "create", *workcontainers.labels("export"), image, "true"]).strip()
        try:  # a kill -9 from here on leaves the container: the next export and `clean` remove it (workcontainers)
            killpoint.reached("export:created")
            with tempfile.TemporaryFile() as err:
                proc = cmd.spawn([self.binary, "export", cid], stdout=cmd.PIPE, stderr=err)
                try:
                    yield proc.stdout
                    proc.stdout.read()  # to its end: the exit status is then the whole export's
                except BaseException:
                    proc.kill()
                    raise
                finally:
                    proc.stdout.close()
                    proc.wait(timeout=600)
                if proc.returncode != 0:
                    err.seek(0)
                    raise EngineError(f"{image}: cannot export its filesystem: "
                                      f"{err.read(4096).decode('utf-8', 'replace').strip()}")
        finally:
            cmd.ask([self.binary, "rm", "-f", cid], timeout=60)

    # --- helpers -----------------------------------------------------------------

    def _exec(self, argv: List[str], timeout: float) -> cmd.Result:
        try:
            proc = cmd.captured(argv, timeout=timeout)
        except cmd.TimeoutExpired:
            raise EngineError(f"timed out after {timeout:.0f} s: {' '.join(argv)}") from None
        if proc.returncode != 0:
            raise EngineError(f"failed (exit {proc.returncode}): {' '.join(argv)}\n{(proc.stderr or proc.stdout)[-1500:]}")
        return proc

    def _stdout(self, argv: List[str], timeout: float = 120) -> str:
        """stdout alone (parsed output must not pick up warnings from stderr)."""
        return self._exec(argv, timeout).stdout

    def _run(self, argv: List[str], timeout: float = 300) -> str:
        """Everything the command printed (push writes its digest line to either stream)."""
        proc = self._exec(argv, timeout)
        return proc.stdout + proc.stderr

    def repo_digest(self, ref: str) -> str:
        """`sha256:...` a registry serves for the local image `ref`: the repo digest for the
        reference's own repository when there is one (what `name@sha256:` pins), else its id."""
        parsed = ImageRef.parse(ref)
        raw = self.inspect_raw([ref])[0]
        own = digests_for(raw.get("RepoDigests") or [], parsed.name)
        if parsed.digest and parsed.digest in own:
            return parsed.digest
        return own[0] if own else raw["Id"]


_DISK_USAGE_BUSY = "a disk usage operation is already running"
_DISK_USAGE_RETRIES = (0.25, 0.5, 1, 2, 4, 8, 8, 8)  # seconds between attempts

def _tail(exc: DockerException, chars: int = 300) -> str:
    """What the engine said, briefly (python-on-whales keeps its stderr)."""
    said = (getattr(exc, "stderr", None) or getattr(exc, "stdout", None) or str(exc)).strip()
    return said[-chars:]


def _full_id(image_id: str) -> str:
    return image_id if not image_id or image_id.startswith("sha256:") else f"sha256:{image_id}"


def _layers(inspect: dict) -> List[str]:
    return list((inspect.get("RootFS") or {}).get("Layers") or [])


def _removal_order(infos: Sequence[dict]) -> List[str]:
    """Deepest first: by parent links inside the set, then history length (podman), then layer count."""
    parent = {_full_id(d["Id"]): _full_id(d.get("Parent") or "") for d in infos}
    weight = {_full_id(d["Id"]): (len(d.get("History") or []), len(_layers(d))) for d in infos}

    def depth(image: str) -> int:
        seen = set()
        while parent.get(image) in parent and image not in seen:
            seen.add(image)
            image = parent[image]
        return len(seen)

    return sorted(parent, key=lambda i: (-depth(i), -weight[i][0], -weight[i][1], i))
