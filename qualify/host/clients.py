"""Where the container engine's programs are found: the one place (house rule 'clients').

Build, qualification and deploy used to find the docker client by two rules (the build preferred Debian's
`/usr/bin/docker`, the deploy took PATH's first), and serve-check by a third. One list now, with one order:
PATH's `docker` first, then Debian's, each once (a newer client on PATH may lack compose, so the deploy
asks each in turn). Each caller then chooses from that list by what it needs, and says why:
- a build takes Debian's client when it is in the list: it matches Debian's engine and carries BuildKit
  itself (a newer client without buildx cannot use BuildKit at all);
- the deploy takes the first client that answers `info`, and compose from the first that has it.
The GPU runtime (the nvidia runtime, CDI specs) is found here too, as the engine reports it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple

from qualify.core.errors import EngineError
from qualify.host import cmd

DEBIAN_DOCKER = "/usr/bin/docker"
DEBIAN_REGISTRY = "/usr/bin/docker-registry"
KINDS = ("docker", "podman")
CDI_PATTERNS = ("*.yaml", "*.yml", "*.json")
CDI_READ_LIMIT = 1 << 22  # a spec is a few KB; reading more of a stray file says nothing more


def clients(kind: str) -> List[str]:
    """The clients of `kind` on this host, in the one order, each once (by real path)."""
    if kind not in KINDS:
        raise EngineError(f"unknown container engine {kind!r}", hint=f"choose one of {', '.join(KINDS)}")
    names: Tuple[str, ...] = ("docker", DEBIAN_DOCKER) if kind == "docker" else ("podman",)
    seen: List[str] = []
    for name in names:
        found = cmd.which(name)
        if found and os.path.realpath(found) not in [os.path.realpath(x) for x in seen]:
            seen.append(found)
    return seen


def build_client(kind: str) -> str:
    """The client a build calls (see the module docstring for why Debian's docker is preferred)."""
    found = clients(kind)
    if not found:
        raise EngineError(f"{kind} is not installed", hint="run scripts/setup-host.sh, or choose --engine docker|podman")
    debian = [c for c in found if os.path.realpath(c) == os.path.realpath(DEBIAN_DOCKER)]
    return debian[0] if debian else found[0]


def any_client() -> Optional[str]:
    """The first client of either kind (docker first), for reading a container's log and memory."""
    for kind in KINDS:
        found = clients(kind)
        if found:
            return found[0]
    return None


def _works(argv: Sequence[str], timeout: float = 60) -> Tuple[bool, str]:
    proc = cmd.ask(argv, timeout=timeout)
    return proc.returncode == 0, (proc.stderr or proc.stdout).strip()


def answering(kind: str) -> Tuple[Optional[str], str]:
    """The first client of `kind` whose `info` works, or None and the last one's error."""
    error = ""
    for c in clients(kind):
        ok, error = _works([c, "info"])
        if ok:
            return c, ""
    return None, error


def compose(kind: str) -> Optional[Tuple[str, ...]]:
    """The compose command for `kind`: the plugin of any client, else the standalone program."""
    if kind == "docker":
        for c in clients("docker"):
            if _works([c, "compose", "version"])[0]:
                return (c, "compose")
    standalone = {"docker": "docker-compose", "podman": "podman-compose"}[kind]
    if shutil.which(standalone) and _works([standalone, "version"])[0]:
        return (standalone,)
    return None


def registry_binary() -> str:
    """Debian's docker-registry (the loopback registry builds push to)."""
    return shutil.which("docker-registry") or DEBIAN_REGISTRY


# --- the GPU runtime ----------------------------------------------------------------------------


def nvidia_runtime_present(kind: str, cli: str) -> bool:
    """Docker with the nvidia runtime registered (or its hook installed); podman takes GPUs through CDI."""
    if kind != "docker":
        return False
    runtimes = cmd.ask([cli, "info", "--format", "{{json .Runtimes}}"])
    if runtimes.returncode == 0 and '"nvidia"' in runtimes.stdout:
        return True
    return shutil.which("nvidia-container-runtime-hook") is not None


def cdi_spec_files(dirs: Iterable[Path]) -> List[Path]:
    """The CDI specs under `dirs` that name NVIDIA GPUs (an unreadable file is skipped, not an error)."""
    out = []
    for d in dirs:
        for pattern in CDI_PATTERNS:
            for f in sorted(Path(d).glob(pattern)):
                try:
                    if f.is_file() and "nvidia.com/gpu" in f.read_text(errors="replace")[:CDI_READ_LIMIT]:
                        out.append(f)
                except OSError:
                    continue
    return out
