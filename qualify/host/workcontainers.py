"""Containers the toolkit creates for a moment (publish's SBOM step exports a created, never started container
of the release image: `Engine.exported_filesystem`), made so that a kill -9 of the process that made one
leaves nothing `clean` trips over.

A `finally` removes the container on every exit the process lives through (an error, Ctrl-C, SIGTERM); a
kill -9 or a power cut leaves it, and an image with a container, even a never started one, cannot be removed
(`clean` aborted: "image is being used by stopped container"). So each one is labelled with the checkout that
made it and the process that made it (boot id, pid and that pid's start time: a reused pid is another
process), and the next export of this checkout and `clean` remove those whose process is gone. A container
whose process still runs (a publish at work) is never touched; without /proc to ask, none is.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import AbstractSet, Dict, List, Optional, Sequence

from qualify.config.targets import REPO_ROOT
from qualify.host import cmd

PURPOSE = "org.blackwell-qualify.work"  # what it is for: "export"
CHECKOUT = "org.blackwell-qualify.checkout"  # a hash of the checkout's path (as host/paths.py names ledgers)
PROCESS = "org.blackwell-qualify.process"  # "<boot id>:<pid>:<start time>" of the process that created it
_TIMEOUT = 60


@dataclass(frozen=True)
class Leftover:
    """A work container whose process is gone."""

    id: str
    name: str
    image: str
    purpose: str

    def line(self) -> str:
        return (f"container {self.name} ({self.id[:12]}, from {self.image}) was left by this checkout's "
                f"{self.purpose} step, whose process was killed: removed")


def checkout_key(checkout: Path = REPO_ROOT) -> str:
    return hashlib.sha256(str(Path(checkout).resolve()).encode()).hexdigest()[:16]


def this_process() -> str:
    return _identity(os.getpid()) or f"-:{os.getpid()}:-"


def labels(purpose: str, checkout: Path = REPO_ROOT) -> List[str]:
    """`--label` arguments for a work container this process creates now."""
    return ["--label", f"{PURPOSE}={purpose}", "--label", f"{CHECKOUT}={checkout_key(checkout)}",
            "--label", f"{PROCESS}={this_process()}"]


def sweep(binary: str, checkout: Optional[Path] = REPO_ROOT, dry_run: bool = False) -> List[Leftover]:
    """Remove the work containers of `checkout` (None: of every checkout) whose process is gone."""
    found = leftovers(binary, checkout)
    if not dry_run:
        for c in found:
            _call([binary, "rm", "-f", c.id])
    return found


def leftovers(binary: str, checkout: Optional[Path] = REPO_ROOT) -> List[Leftover]:
    argv = [binary, "ps", "-a", "--no-trunc", "--filter", f"label={PURPOSE}"]
    if checkout is not None:
        argv += ["--filter", f"label={CHECKOUT}={checkout_key(checkout)}"]
    fmt = "{{.ID}}\t{{.Names}}\t{{.Image}}\t" + "\t".join(f'{{{{.Label "{k}"}}}}' for k in (PURPOSE, PROCESS))
    out = _call([*argv, "--format", fmt])
    found = []
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 5 and parts[0] and _gone(parts[4]):
            found.append(Leftover(parts[0], parts[1], parts[2], parts[3] or "run"))
    return found


def users(binary: str, image_ids: Sequence[str], ignore: AbstractSet[str] = frozenset()) -> Dict[str, List[str]]:
    """image id -> names of the containers (any, running or not) made from it, for the ids asked about; the
    containers named in `ignore` (leftovers a dry run would remove) do not count."""
    wanted = set(image_ids)
    ids = _call([binary, "ps", "-a", "-q", "--no-trunc"]).split()
    if not ids or not wanted:
        return {}
    out: Dict[str, List[str]] = {}
    for line in _call([binary, "inspect", "--format", "{{.Image}}\t{{.Name}}", *ids]).splitlines():
        image, _, name = line.partition("\t")
        if image in wanted and name.lstrip("/") not in ignore:
            out.setdefault(image, []).append(name.lstrip("/"))
    return out


def _gone(process: str) -> bool:
    """The process a label names has ended (on this boot); unknown (no /proc, no label) is not gone."""
    boot, _, rest = process.partition(":")
    pid, _, start = rest.partition(":")
    if not pid.isdigit() or boot == "-" or start == "-" or not Path("/proc/self/stat").exists():
        return False
    if boot != _boot_id():
        return True  # made before this host last started: its process is gone
    return _identity(int(pid)) != process


def _identity(pid: int) -> str:
    """`<boot id>:<pid>:<start time>` of a running (not zombie) process, '' when there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace").rpartition(")")[2].split()
    except OSError:
        return ""
    if len(fields) < 20 or fields[0] == "Z":
        return ""
    return f"{_boot_id()}:{pid}:{fields[19]}"  # field 22 of stat: start time in clock ticks since boot


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip() or "-"
    except OSError:
        return "-"


def _call(argv: List[str]) -> str:
    done = cmd.ask(argv, timeout=_TIMEOUT)  # never raises: a failure is an empty answer
    return done.stdout if done.returncode == 0 else ""
