"""skopeo (containers/image) through the runner (host/cmd.py): the registry client for
publishing, reading manifests, tags and deletes.

Credentials and trust come only from the standard places skopeo reads itself:
the auth file (REGISTRY_AUTH_FILE, else ${XDG_RUNTIME_DIR}/containers/auth.json,
else docker's ~/.docker/config.json) and certs.d (/etc/containers/certs.d/HOST:PORT/).
Nothing here passes --creds, --authfile or --cert-dir, so no secret is ever in
an argument list or an echoed command.

TLS is verified for every registry except the build host's own loopback
registry (plain HTTP on 127.0.0.1, by design: see host/registry.py).
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shutil
import struct
import termios
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from qualify.core.errors import ExternalCommandError, RegistryError
from qualify.core.report import Progress
from qualify.host import cmd

SKOPEO = "/usr/bin/skopeo"
MAX_MANIFEST_BYTES = 4 * 1024 * 1024  # the OCI distribution spec lets registries refuse > 4 MiB
MAX_OUTPUT_BYTES = 1024 * 1024

_BLOB_PROGRESS = re.compile(r"Copying (blob|config) ([0-9a-f]{10,12}) (?:\[[^\]]*\] )?([\d.]+\s*[KMGT]?i?B|[\d.]+b) / "
                            r"([\d.]+\s*[KMGT]?i?B|[\d.]+b)")
_BLOB_SKIPPED = re.compile(r"Copying (blob|config) ([0-9a-f]{10,12}) skipped: already exists")
_BLOB_DONE = re.compile(r"Copying (blob|config) ([0-9a-f]{10,12}) done")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Messages that mean "the registry wants credentials we do not have".
_AUTH_MARKERS = ("unauthorized", "authentication required", "denied")
# The status alone, not any '401' (a digest holds one in ~1.5% of cases: 'ca1401d...' read as an auth error).
_AUTH_STATUS = re.compile(r"(?<![0-9a-f])401(?![0-9a-f])")


def binary() -> str:
    path = SKOPEO if os.path.exists(SKOPEO) else shutil.which("skopeo")
    if not path:
        raise ExternalCommandError("skopeo is not installed", hint="run scripts/setup-host.sh (apt-get install skopeo)")
    return path


def _tls_flag(option: str, ref: str, insecure_hosts: Sequence[str]) -> List[str]:
    host = ref.split("://", 1)[-1].split("/", 1)[0]
    return [f"--{option}=false"] if ref.startswith("docker://") and host in insecure_hosts else []


def explain(stderr: str, what: str) -> RegistryError:
    """A RegistryError naming the failure class, with skopeo's last words (never credentials: skopeo prints none)."""
    low = stderr.lower()
    last = stderr.strip().splitlines()[-1] if stderr.strip() else "(no output)"
    if any(m in low for m in _AUTH_MARKERS) or _AUTH_STATUS.search(low):
        return RegistryError(f"{what}: the registry refused the request without valid credentials ({last})",
                             hint="log in first (`docker login HOST` or `skopeo login HOST`); credentials are read "
                                  "from REGISTRY_AUTH_FILE or docker's config.json, never from arguments")
    if "x509" in low or "certificate" in low:
        return RegistryError(f"{what}: the registry's TLS certificate is not trusted ({last})",
                             hint="put its CA in /etc/containers/certs.d/HOST:PORT/ca.crt "
                                  "(and /etc/docker/certs.d/ for docker)")
    if "manifest unknown" in low or "not found" in low or "name unknown" in low:
        return RegistryError(f"{what}: not found in the registry ({last})")
    if "connection refused" in low or "no such host" in low or "i/o timeout" in low or "no route to host" in low:
        return RegistryError(f"{what}: the registry does not answer ({last})",
                             hint="check the address (REGISTRY/NAMESPACE, QUALIFY_REGISTRY) and that the registry runs; "
                                  "the toolkit's own loopback registry starts with any build or `nox -s clean`")
    if "no space left" in low or "disk quota" in low:
        return RegistryError(f"{what}: the disk is full ({last})",
                             hint="free space (nox -s clean -- --dry-run lists what the toolkit can free), then run "
                                  "again: what was copied already is skipped")
    if "500 internal server error" in low or "status 500" in low or "500 (internal server error)" in low:
        return RegistryError(f"{what}: the registry failed to store or serve it (HTTP 500: {last})",
                             hint="the registry's own log says why; a full disk under its storage is the usual cause "
                                  "(df -h); run again once it is fixed: blobs already there are skipped")
    return RegistryError(f"{what}: skopeo failed: {last}")


def _run(args: Sequence[str], what: str, timeout: float = 120, max_bytes: int = MAX_OUTPUT_BYTES) -> bytes:
    """Run skopeo; stdout up to `max_bytes` (more is an error, not a truncation)."""
    proc = cmd.spawn([binary(), *args], stdout=cmd.PIPE, stderr=cmd.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except cmd.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RegistryError(f"{what}: skopeo did not answer within {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise explain(err.decode("utf-8", "replace")[-4000:], what)
    if len(out) > max_bytes:
        raise RegistryError(f"{what}: the answer is {len(out)} bytes, more than the {max_bytes} allowed")
    return out


def inspect_raw(ref: str, insecure_hosts: Sequence[str] = (), what: Optional[str] = None,
                timeout: float = 120) -> bytes:
    """The manifest bytes a registry serves for `docker://...` (digest = sha256 of these bytes)."""
    return _run(["inspect", "--raw", *_tls_flag("tls-verify", ref, insecure_hosts), ref],
                what or f"reading {ref}", timeout=timeout, max_bytes=MAX_MANIFEST_BYTES)


def list_tags(repo_ref: str, insecure_hosts: Sequence[str] = ()) -> bytes:
    return _run(["list-tags", *_tls_flag("tls-verify", repo_ref, insecure_hosts), repo_ref], f"tags of {repo_ref}")


def delete(ref: str, insecure_hosts: Sequence[str] = ()) -> None:
    _run(["delete", *_tls_flag("tls-verify", ref, insecure_hosts), ref], f"deleting {ref}")


@dataclass
class CopyResult:
    seconds: float = 0.0
    skipped: List[str] = field(default_factory=list)  # short blob digests the destination already had
    copied: List[str] = field(default_factory=list)
    output: str = ""


def _size(text: str) -> float:
    m = re.match(r"([\d.]+)\s*([KMGT]?)(i?)[Bb]", text.strip())
    if not m:
        return 0.0
    return float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2)]


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return f"{n:.1f} GiB"


class _Meter:
    """Turns skopeo's progress bars (drawn on a terminal) into one line every few seconds."""

    def __init__(self, label: str, progress: Progress, every_s: float = 5.0):
        self.label, self.progress, self.every_s = label, progress, every_s
        self.done, self.total, self.skipped, self.finished = {}, {}, set(), set()
        self.start = self.last = time.monotonic()

    def feed(self, line: str) -> None:
        for m in _BLOB_PROGRESS.finditer(line):
            self.done[m.group(2)], self.total[m.group(2)] = _size(m.group(3)), _size(m.group(4))
        for m in _BLOB_SKIPPED.finditer(line):
            self.skipped.add(m.group(2))
        for m in _BLOB_DONE.finditer(line):
            self.finished.add(m.group(2))
        if time.monotonic() - self.last >= self.every_s:
            self.report()

    def report(self) -> None:
        now = time.monotonic()
        self.last = now
        blobs = set(self.total) | self.skipped | self.finished
        sent, total = sum(self.done.values()), sum(self.total.values())
        rate = sent / (now - self.start) if now - self.start > 0.5 else 0.0
        pace = f", {rate / 1e6:.0f} MB/s, {(total - sent) / rate:.0f} s left" if rate and total > sent else ""
        self.progress(f"  {self.label}: {_human(sent)} of {_human(total)} sent{pace}, {len(self.finished)} of "
                      f"{len(blobs)} blobs done, {len(self.skipped)} already there, {now - self.start:.0f} s")


def copy(src: str, dst: str, *, label: str, progress: Progress, insecure_hosts: Sequence[str] = (),
         extra: Sequence[str] = (), timeout: float = 6 * 3600) -> CopyResult:
    """`skopeo copy --preserve-digests SRC DST` with its progress bars turned into periodic lines.

    skopeo draws byte progress only on a terminal, so it runs on a pseudo-terminal
    wide enough for whole lines; the screen redraws are parsed, not shown.
    """
    args = [binary(), "copy", "--preserve-digests", "--retry-times", "3",
            *_tls_flag("src-tls-verify", src, insecure_hosts), *_tls_flag("dest-tls-verify", dst, insecure_hosts),
            *extra, src, dst]
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 240, 0, 0))
    start = time.monotonic()
    proc = cmd.spawn(args, stdout=slave, stderr=cmd.PIPE)
    os.close(slave)
    meter, buf, text = _Meter(label, progress), b"", []
    try:
        while True:
            if time.monotonic() - start > timeout:
                proc.kill()
                raise RegistryError(f"copying {label} took longer than {timeout:.0f} s; re-run to resume")
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                if time.monotonic() - meter.last >= meter.every_s:
                    meter.report()  # skopeo drew nothing for a while: say the copy goes on
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            buf += chunk
            *lines, rest = buf.split(b"\n")
            buf = rest[-MAX_OUTPUT_BYTES:]
            for raw in lines:
                line = _ANSI.sub("", raw.decode("utf-8", "replace")).strip()
                meter.feed(line)
                if line and len(text) < 5000:
                    text.append(line)
    finally:
        os.close(master)
    err = proc.stderr.read(MAX_OUTPUT_BYTES).decode("utf-8", "replace") if proc.stderr else ""
    proc.wait()
    if proc.returncode != 0:
        raise explain(err, f"copying {label} to {dst}")
    meter.report()
    result = CopyResult(seconds=round(time.monotonic() - start, 2), skipped=sorted(meter.skipped),
                        copied=sorted((set(meter.total) | meter.finished) - meter.skipped), output="\n".join(text))
    return result
