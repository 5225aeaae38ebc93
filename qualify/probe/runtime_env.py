"""What the image runs as and with: its user, its CUDA, and where its loader finds libcuda.

Three facts the deploy needs from the image (issue 32): the user the server
runs as (vLLM's own images are non-root; ours must be too), the CUDA the image
carries (the host driver must be at least its floor), and whether CUDA's
forward-compatibility libcuda (`compat/`) is on the loader path, which breaks
on a host driver that differs from it (error 803/804). They go into the
predicate's `runtime` section; the checks say what each finding breaks and
what fixes it.

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any, Dict, List, Mapping, Optional

from qualify.core import driver
from qualify.probe.model import FAIL, PASS, WARN, CheckResult

USER_ID, COMPAT_ID = "env.runtime-user", "env.cuda-compat"
LD_SO_CONF = "/etc/ld.so.conf"
# Where glibc looks after LD_LIBRARY_PATH and ld.so.conf (the trusted directories), both platforms.
DEFAULT_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
                "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
COMPAT_GLOBS = ("/usr/local/cuda*/compat/libcuda.so.*", "/usr/local/cuda*/compat/lib*/libcuda.so.*",
                "/usr/local/cuda*/targets/*/lib/compat/libcuda.so.*")
_LIBCUDA_VERSION = re.compile(r"libcuda\.so\.([0-9]{3,4}(?:\.[0-9]{1,3}){1,2})$")
MAX_CONF_FILES, MAX_CONF_BYTES = 256, 1 << 16


def in_container() -> bool:
    """Docker writes /.dockerenv, podman /run/.containerenv: the probe runs in an image, not on a host."""
    return os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv")


def user() -> Dict[str, Any]:
    uid, gid = os.getuid(), os.getgid()
    name = None
    try:
        import pwd  # POSIX only; every image is Linux

        name = pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        pass
    return {"uid": uid, "gid": gid, "name": name, "home": os.environ.get("HOME"), "in_container": in_container()}


def _read_conf(path: str, seen: List[str]) -> List[str]:
    """ld.so.conf's directories, following `include` globs (bounded: files and bytes)."""
    if path in seen or len(seen) >= MAX_CONF_FILES:
        return []
    seen.append(path)
    try:
        with open(path, "rb") as fh:
            text = fh.read(MAX_CONF_BYTES).decode("utf-8", "replace")
    except OSError:
        return []
    dirs: List[str] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("include "):
            pattern = line.split(None, 1)[1]
            pattern = pattern if pattern.startswith("/") else os.path.join(os.path.dirname(path), pattern)
            for inc in sorted(glob.glob(pattern)):
                dirs += _read_conf(inc, seen)
        elif line.startswith("/"):
            dirs.append(line)
    return dirs


def loader_path(environ: Optional[Mapping[str, str]] = None, conf: str = LD_SO_CONF) -> List[Dict[str, str]]:
    """The directories the dynamic loader searches, in its order, each with where it was named."""
    env = os.environ if environ is None else environ
    out: List[Dict[str, str]] = []
    for d in (env.get("LD_LIBRARY_PATH") or "").split(":"):
        if d:
            out.append({"dir": d, "from": "LD_LIBRARY_PATH"})
    out += [{"dir": d, "from": conf} for d in _read_conf(conf, [])]
    out += [{"dir": d, "from": "default"} for d in DEFAULT_DIRS]
    return out


def _is_compat(path: str) -> bool:
    return "/compat" in os.path.realpath(path) or "/compat" in path


def libcuda(environ: Optional[Mapping[str, str]] = None, conf: str = LD_SO_CONF) -> Dict[str, Any]:
    """CUDA's compat libraries in the image, and the libcuda.so.1 the loader would find first.

    In a container the NVIDIA toolkit adds the host driver's libcuda to the default directories
    at start; whatever the image puts before them wins."""
    compat = []
    for pattern in COMPAT_GLOBS:
        for p in sorted(glob.glob(pattern)):
            m = _LIBCUDA_VERSION.search(p)
            if m and not os.path.islink(p):
                compat.append({"path": p, "version": m.group(1)})
    first = None
    searched = loader_path(environ, conf)
    for entry in searched:
        candidate = os.path.join(entry["dir"], "libcuda.so.1")
        if os.path.exists(candidate):
            real = os.path.realpath(candidate)
            m = _LIBCUDA_VERSION.search(real)
            first = {"path": candidate, "resolves_to": real, "named_by": entry["from"],
                     "compat": _is_compat(candidate), "stub": "/stubs/" in real,
                     "version": m.group(1) if m else None}
            break
    return {"compat": compat, "first": first,
            "loader_path": [e["dir"] for e in searched if e["from"] != "default"]}


def image_cuda(pkgs: Mapping[str, str], toolkit: Mapping[str, Any], torch_view: Mapping[str, Any]) -> Dict[str, Any]:
    """The CUDA the image's code was built for: torch's, else the runtime wheel's, else the toolkit's."""
    candidates = ((torch_view.get("cuda"), "torch.version.cuda"),
                  (pkgs.get("nvidia-cuda-runtime") or pkgs.get("nvidia-cuda-runtime-cu13"), "nvidia-cuda-runtime"),
                  (((toolkit.get("ptxas") or {}).get("version")), "the toolkit's ptxas"))
    for value, source in candidates:
        m = re.match(r"([0-9]{1,2})\.([0-9]{1,2})", str(value or ""))
        if m:
            return {"version": f"{m.group(1)}.{m.group(2)}", "from": source}
    return {"version": None, "from": None}


def user_check(facts: Mapping[str, Any], enforce: bool) -> CheckResult:
    """Our images must not run as root (`enforce`); an image we did not build, or a probe run on a host,
    is told, not failed."""
    title = "The server runs as a non-root user"
    who = f"{facts.get('name') or 'uid'} (uid {facts.get('uid')})"
    if facts.get("uid") != 0:
        return CheckResult(USER_ID, title, PASS, f"the image runs as {who}", required=enforce, evidence=dict(facts))
    reason = ("the image runs as root (uid 0). What it breaks: a compromised server process owns the container "
              "and everything mounted into it (the model cache, the GPU device). Fix: add a user and set USER "
              "(vLLM's own images run as a non-root user)")
    return CheckResult(USER_ID, title, FAIL if enforce else WARN, reason, required=enforce, evidence=dict(facts))


def compat_check(facts: Mapping[str, Any]) -> CheckResult:
    """CUDA's forward-compatibility libcuda on the loader path works only against one driver."""
    title = "libcuda comes from the host driver, not CUDA's compat/ libraries"
    first, compat = facts.get("first"), facts.get("compat") or []
    evidence = dict(facts)
    if first and first.get("stub"):
        return CheckResult(COMPAT_ID, title, WARN,
                           f"the loader finds the CUDA stub library first ({first['path']} -> {first['resolves_to']}, "
                           f"named by {first['named_by']}). What it breaks: every CUDA call fails with error 34 "
                           "(CUDA driver is a stub library). Fix: take the stubs directory off LD_LIBRARY_PATH "
                           "(it is for linking only)", required=False, evidence=evidence)
    if first and first.get("compat"):
        version = first.get("version") or "of unknown version"
        floor = driver.DriverVersion.maybe(first.get("version"))
        return CheckResult(COMPAT_ID, title, WARN,
                           f"the loader finds CUDA's forward-compatibility libcuda {version} first ({first['path']}, "
                           f"named by {first['named_by']}). What it breaks: on a host driver newer than it CUDA fails "
                           "with error 803, and GeForce / RTX workstation / GB10 GPUs do not support forward "
                           f"compatibility at all (error 804); it works only on data-center GPUs with a driver older "
                           f"than {floor or version}. Fix: {driver.DROP_COMPAT_FIX}", required=False, evidence=evidence)
    if compat:
        where = ", ".join(c["path"] for c in compat[:3])
        return CheckResult(COMPAT_ID, title, PASS, f"CUDA's compat libraries are in the image ({where}) but not on "
                           "the loader path: libcuda comes from the host driver", required=False, evidence=evidence)
    return CheckResult(COMPAT_ID, title, PASS, "no forward-compatibility libcuda in the image: libcuda comes from the "
                       "host driver (mounted by the NVIDIA container toolkit)", required=False, evidence=evidence)
