"""One class drives docker or podman (python-on-whales underneath).

Abilities are detected, not assumed (measured on Debian 12 with docker.io 20.10 and podman 4.3):
- `buildx`: docker with the buildx plugin; `SOURCE_DATE_EPOCH`,
  `rewrite-timestamp` and provenance are available.
- `buildkit`: a docker client that still carries BuildKit itself (20.10, as
  Debian ships it) with `DOCKER_BUILDKIT=1`: `--platform` works, timestamps
  are not rewritten.
- `classic`: the legacy builder; no `--platform`, does not reproduce.
- `podman`: buildah underneath; `--timestamp` makes builds reproducible.

python-on-whales' `legacy_build` cannot pass `--platform`, `--timestamp` or
`--iidfile`, and expects the classic builder's output, so the build command
line is assembled here from the client's own command prefix and streamed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set

from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException, NoSuchImage

from qualify.config.imageref import ImageRef
from qualify.core.errors import BaseImageError, BuildError, EngineError

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


def _client_binary(name: str) -> str:
    if name == "docker":
        # Debian's client matches Debian's engine and carries BuildKit itself;
        # a newer client without buildx cannot use BuildKit at all.
        if os.path.exists("/usr/bin/docker"):
            return "/usr/bin/docker"
        found = shutil.which("docker")
    else:
        found = shutil.which("podman")
    if not found:
        raise EngineError(f"{name} is not installed", hint="run scripts/setup-host.sh, or choose --engine docker|podman")
    return found


class Engine:
    """A container engine: docker or podman."""

    def __init__(self, name: str = "docker", builder: Optional[str] = None) -> None:
        if name not in ENGINES:
            raise EngineError(f"unknown engine {name!r}", hint=f"use one of {', '.join(ENGINES)}")
        if builder is not None and builder not in BUILDERS[name]:
            raise EngineError(f"{name} has no {builder!r} builder", hint=f"use one of {', '.join(BUILDERS[name])}")
        self.name = name
        self.binary = _client_binary(name)
        self.client = DockerClient(client_call=[self.binary], client_type="podman" if name == "podman" else "docker")
        # An explicit builder (e.g. classic, to show what does not reproduce) skips detection.
        self._builder: Optional[str] = builder

    # --- abilities -------------------------------------------------------------

    def check(self) -> Engine:
        """Fail early, with what to do, when the engine does not answer."""
        try:
            proc = subprocess.run([self.binary, "info"], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            raise EngineError(f"{self.name} info did not answer within 60 s") from None
        if proc.returncode != 0:
            hint = "run scripts/setup-host.sh (starts dockerd)" if self.name == "docker" else "check `podman info`"
            raise EngineError(f"no {self.name} engine answers: {proc.stderr.strip()[-300:]}", hint=hint)
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
        if subprocess.run([self.binary, "buildx", "version"], capture_output=True).returncode == 0:
            return "buildx"
        version = subprocess.run(
            [self.binary, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True
        ).stdout.strip()
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
        print(f"[build] {self.describe()}", file=sys.stderr, flush=True)
        print("[build] + " + " ".join(argv), file=sys.stderr, flush=True)
        recent: deque = deque(maxlen=40)
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **env}, text=True, errors="replace",
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            recent.append(line.rstrip())
            print(log_prefix + line.rstrip(), file=sys.stderr, flush=True)
        code = proc.wait()
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
        """Push `name:tag` and return the registry's manifest digest."""
        if self.name == "podman":
            with _TempFile() as digestfile:
                self._run([self.binary, "push", "--tls-verify=false", "--digestfile", str(digestfile), ref], timeout=1800)
                return digestfile.read_text().strip()
        out = self._run([self.binary, "push", ref], timeout=1800)
        for line in out.splitlines():
            if "digest: sha256:" in line:
                return line.split("digest: ", 1)[1].split()[0]
        raise EngineError(f"push of {ref} printed no digest:\n{out[-500:]}")

    def pull(self, ref: str, platform: Optional[str] = None, timeout: float = 120) -> None:
        argv = [self.binary, "pull"]
        if platform:
            argv += ["--platform", platform]
        if self.name == "podman":
            argv.append("--tls-verify=false")
        self._run(argv + [ref], timeout=timeout)

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
        out = self._stdout([self.binary, "images", "-a", "-q", "--no-trunc"])
        return {i if i.startswith("sha256:") else f"sha256:{i}" for i in out.split()}

    def inspect_raw(self, refs: Sequence[str]) -> List[dict]:
        """Inspect JSON of several images in one call (ids, parents, tags)."""
        return json.loads(self._stdout([self.binary, "image", "inspect", *refs])) if refs else []

    def remove_images(self, ids: Sequence[str]) -> str:
        """Remove exactly these images; '' or the error. No -f: an image someone else tagged or uses stays.
        --no-prune: untagged parents stay too (podman counts look-alike images from other builds as parents)."""
        if not ids:
            return ""
        proc = subprocess.run([self.binary, "image", "rm", "--no-prune", *ids], capture_output=True, text=True)
        return "" if proc.returncode == 0 else (proc.stderr or proc.stdout).strip()[-500:]

    # --- what one build made, and removing exactly that ------------------------------

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
        argv = [self.binary, "save", "-o", str(path)]
        if self.name == "podman":
            argv += ["--format", "docker-archive"]
        self._run(argv + list(refs), timeout=1800)
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
    ) -> subprocess.CompletedProcess:
        """Run a throw-away container; mounts are (host, container, 'ro'|'rw').
        `on_stderr_line` sees each stderr line as it is written (progress of long steps)."""
        argv = [self.binary, "run", "--rm"]
        if name:
            argv += ["--name", name]
        if network:
            argv += ["--network", network]
        if platform:
            argv += ["--platform", platform]
        if gpus:
            argv += ["--gpus", gpus]
        for host, inside, mode in mounts:
            argv += ["-v", f"{host}:{inside}:{mode}"]
        for key, value in sorted((env or {}).items()):
            argv += ["-e", f"{key}={value}"]
        argv += [image, *command]
        try:
            if on_stderr_line is not None:
                return _run_streaming(argv, timeout, on_stderr_line)
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            if name:
                subprocess.run([self.binary, "rm", "-f", name], capture_output=True)
            raise EngineError(f"container from {image} did not finish within {timeout:.0f} s") from None

    # --- helpers -----------------------------------------------------------------

    def _exec(self, argv: List[str], timeout: float) -> subprocess.CompletedProcess:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
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
        own = [d.split("@", 1)[1] for d in raw.get("RepoDigests") or [] if d.split("@", 1)[0] == parsed.name]
        if parsed.digest and parsed.digest in own:
            return parsed.digest
        return own[0] if own else raw["Id"]


def _run_streaming(argv: List[str], timeout: float, on_line: Callable[[str], None]) -> subprocess.CompletedProcess:
    """subprocess.run with stderr handed to `on_line` line by line while the command runs."""
    import threading

    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, bufsize=1)
    err_lines: List[str] = []
    out_chunks: List[str] = []

    def pump_err() -> None:
        for line in proc.stderr:
            err_lines.append(line)
            on_line(line.rstrip("\n"))

    threads = [threading.Thread(target=pump_err, daemon=True),
               threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True)]
    for t in threads:
        t.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    for t in threads:
        t.join(timeout=10)
    return subprocess.CompletedProcess(argv, proc.returncode, "".join(out_chunks), "".join(err_lines))


class _TempFile:
    def __enter__(self) -> Path:
        import tempfile

        fd, name = tempfile.mkstemp(prefix="qualify-")
        os.close(fd)
        self.path = Path(name)
        return self.path

    def __exit__(self, *exc) -> None:
        self.path.unlink(missing_ok=True)


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
