"""Settings of the deploy: .env, read as data (nothing is evaluated).

Order: the environment, then the settings file, then .env.example as the
defaults, so every key .env.example documents has a value. A key that
.env.example does not document is warned about and ignored.

Fail closed: a settings file named with --env-file that is missing, not a
regular file (a FIFO, a device) or unreadable is an error, never "no settings"
(the defaults would drop a key pin); a pin (RELEASE_KEY_FINGERPRINT,
RELEASE_TAG) exported empty over a file that sets it is an error; container
variables that would change what the trust gate checked (the loader path, the
GPU given) are refused.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from qualify.core.enums import ValueEnum
from qualify.deploy.ui import EX_USAGE, Stop, Ui

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / ".env.example"
CONTAINER_ENV = "CONTAINER_ENV_"
MAX_FILE_BYTES = 1 << 20
_PAIR = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)")
_BLANK = re.compile(r"\s*(#.*)?")
_QUOTED = re.compile(r"""\s*(?:"([^"]*)"|'([^']*)')\s*(#.*)?""")
INTEGERS = ("API_PORT", "MAX_MODEL_LEN", "HEALTH_TIMEOUT_S", "MIN_FREE_DISK_GIB", "LOG_TAIL_LINES")
PATHS = ("MANIFESTS_DIR", "DEPLOY_DIR", "RELEASE_PUBLIC_KEY", "EVIDENCE_SIGNING_KEY", "MODEL_PATH")
MAX_PATH_CHARS = 1024
MAX_NAME_CHARS = 255  # one path component, as Linux file systems allow
PROJECT = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
FINGERPRINT = re.compile(r"sha256:[0-9a-f]{64}")
TARGET = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")  # core/manifest.py:TARGET_NAME
PINS = ("RELEASE_KEY_FINGERPRINT", "RELEASE_TAG")
# What the gate checked and compose sets: the image's loader path (its libcuda, 803/804) and the GPU it gets.
RESERVED_CONTAINER_ENV = ("LD_LIBRARY_PATH", "LD_PRELOAD", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
                          "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_REQUIRE_CUDA", "NVIDIA_DISABLE_REQUIRE")


def path_problem(value: str) -> str:
    """Why a settings value cannot be a path ("" when it can): bounded, no control characters."""
    if len(value) > MAX_PATH_CHARS:
        return f"a path of {len(value)} characters (at most {MAX_PATH_CHARS})"
    if not value.isprintable():
        return "a path with control characters"
    long = next((part for part in value.split("/") if len(part) > MAX_NAME_CHARS), None)
    if long is not None:
        return f"a path with a name of {len(long)} characters (at most {MAX_NAME_CHARS})"
    return ""


def value_problems(values: Mapping[str, str]) -> list:
    """(key, problem) for every setting whose value cannot be used; checked before anything reads a path."""
    from qualify.release.order import tag_problem

    out = [(key, f"{values[key]!r} is not a whole number") for key in INTEGERS
           if not re.fullmatch(r"[0-9]{1,9}", values[key])]
    if not PROJECT.fullmatch(values["COMPOSE_PROJECT"]):
        out.append(("COMPOSE_PROJECT", f"{values['COMPOSE_PROJECT']!r}: use lower-case letters, digits, '-' and '_' "
                    "(at most 63)"))
    out += [(key, path_problem(values[key])) for key in PATHS if path_problem(values[key])]
    for key, kind in (("GPU_RUNTIME", RuntimeKind), ("CONTAINER_ENGINE", EngineName)):
        if values[key] not in {k.value for k in kind}:
            out.append((key, f"{values[key]!r}: one of {' | '.join(k.value for k in kind)}"))
    fraction = values["GPU_MEMORY_UTILIZATION"]
    if fraction and not re.fullmatch(r"[0-9]{0,3}(\.[0-9]{1,6})?", fraction):
        out.append(("GPU_MEMORY_UTILIZATION", f"{fraction[:40]!r}: a fraction such as 0.85, or empty for the "
                    "target's value"))
    if values["DEPLOY_TARGET"] and not TARGET.fullmatch(values["DEPLOY_TARGET"]):
        out.append(("DEPLOY_TARGET", f"{values['DEPLOY_TARGET'][:40]!r} is not a target name (e.g. cpu or sm120), or "
                    "empty for this host's"))
    if values["RELEASE_TAG"] and tag_problem(values["RELEASE_TAG"]):
        out.append(("RELEASE_TAG", tag_problem(values["RELEASE_TAG"])))
    if values["RELEASE_KEY_FINGERPRINT"] and not FINGERPRINT.fullmatch(values["RELEASE_KEY_FINGERPRINT"]):
        out.append(("RELEASE_KEY_FINGERPRINT", f"{values['RELEASE_KEY_FINGERPRINT'][:80]!r} is not sha256:<64 hex> "
                    "(the fingerprint `qualify sign generate-key` and the release's tag message print)"))
    return out


def unquote(value: str) -> str:
    """One pair of matching quotes, or an unquoted value up to ` # comment`."""
    m = _QUOTED.fullmatch(value)
    if m:
        return m.group(1) if m.group(1) is not None else m.group(2)
    return re.split(r"(?:^|\s)#", value.strip(), maxsplit=1)[0].strip()


def _read_text(path: Path) -> str:
    """A regular file's text: a FIFO or device is refused at once (never read, never waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise Stop(EX_USAGE, f"{path}: no such settings file", "check the path given to --env-file") from None
    except OSError as exc:
        raise Stop(EX_USAGE, f"{path}: the settings file cannot be opened: {exc.strerror}",
                   "make it readable, or name another with --env-file") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Stop(EX_USAGE, f"{path}: not a regular file (a FIFO, device or folder); not read as settings",
                   "name a settings file (KEY=VALUE lines) with --env-file")
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise Stop(EX_USAGE, f"{path}: the settings file cannot be read: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise Stop(EX_USAGE, f"{path}: larger than {MAX_FILE_BYTES} bytes; not a settings file")
    return data.decode("utf-8", errors="replace")


def known_keys(example: Path = EXAMPLE) -> Tuple[str, ...]:
    return tuple(m.group(1) for line in _read_text(example).splitlines() if (m := _PAIR.fullmatch(line)))


def read_file(path: Path, known: Tuple[str, ...], ui: Ui) -> Dict[str, str]:
    """KEY=VALUE lines; a line that is neither one nor blank or a comment stops the deploy."""
    out: Dict[str, str] = {}
    for n, line in enumerate(_read_text(path).splitlines(), 1):
        line = line.rstrip("\r")
        if _BLANK.fullmatch(line):
            continue
        m = _PAIR.fullmatch(line)
        if not m:
            raise Stop(EX_USAGE, f"{path}:{n}: not a KEY=VALUE line: {line}", "correct or delete that line")
        key = m.group(1)
        if key not in known and not key.startswith(CONTAINER_ENV):
            ui.warn(f"{path}:{n}: unknown setting {key} ignored (the known ones are in .env.example)")
            continue
        out.setdefault(key, unquote(m.group(2)))
    return out


class RuntimeKind(ValueEnum):
    """How the container gets its GPU (GPU_RUNTIME)."""

    AUTO = "auto"
    NVIDIA = "nvidia"  # the NVIDIA container toolkit's runtime
    CDI = "cdi"  # Container Device Interface specs
    NONE = "none"  # no GPU: tests the deploy machinery with a stand-in server only


class EngineName(ValueEnum):
    """Which container engine runs the deploy (CONTAINER_ENGINE)."""

    AUTO = "auto"
    DOCKER = "docker"
    PODMAN = "podman"


@dataclass(frozen=True)
class Settings:
    """The deploy's settings, typed, built once from .env (`load`). One field per key of .env.example, in
    lower case (tests/test_deploy.py checks that they are the same set); a path is absolute (relative ones
    are taken from the repository), an optional path is None when its key is empty."""

    env_file: Path
    model_id: str
    model_revision: str
    model_path: Optional[Path]  # MODEL_PATH: a local model folder, served offline; wins over model_id
    served_model_name: str
    max_model_len: int
    tool_call_parser: str
    extra_serve_args: Tuple[str, ...]
    hf_token: str
    release_tag: str
    image: str
    manifests_dir: Path
    release_github_repo: str
    release_key_fingerprint: str
    evidence_signing_key: Optional[Path]
    release_public_key: Optional[Path]
    deploy_target: str  # "" for this host's
    gpu_device: str
    gpu_memory_utilization: Optional[float]
    gpu_runtime: RuntimeKind
    cdi_spec_dirs: Tuple[Path, ...]
    container_engine: EngineName
    compose_project: str
    deploy_dir: Path
    bind_address: str
    api_port: int
    shm_size: str
    min_free_disk_gib: int
    health_timeout_s: int
    log_tail_lines: int
    container_env: Tuple[Tuple[str, str], ...] = ()

    @classmethod
    def from_values(cls, env_file: Path, values: Mapping[str, str],
                    container_env: Tuple[Tuple[str, str], ...] = ()) -> Settings:
        """From every known key as text, already checked by `value_problems`."""
        def path(key: str) -> Path:
            p = Path(values[key])
            return p if p.is_absolute() else REPO / p

        def optional_path(key: str) -> Optional[Path]:
            return path(key) if values[key] else None

        kw: Dict[str, Any] = {name: values[name.upper()] for name in _TEXT_FIELDS}
        kw.update({name: int(values[name.upper()]) for name in _INTEGER_FIELDS})
        fraction = values["GPU_MEMORY_UTILIZATION"]
        return cls(
            env_file=env_file, **kw,
            extra_serve_args=tuple(values["EXTRA_SERVE_ARGS"].split()),
            manifests_dir=path("MANIFESTS_DIR"), deploy_dir=path("DEPLOY_DIR"),
            evidence_signing_key=optional_path("EVIDENCE_SIGNING_KEY"),
            release_public_key=optional_path("RELEASE_PUBLIC_KEY"), model_path=optional_path("MODEL_PATH"),
            gpu_memory_utilization=float(fraction) if fraction else None,
            gpu_runtime=RuntimeKind(values["GPU_RUNTIME"]), container_engine=EngineName(values["CONTAINER_ENGINE"]),
            cdi_spec_dirs=tuple(Path(d) for d in values["CDI_SPEC_DIRS"].split()), container_env=container_env)

    @property
    def compose_file(self) -> Path:
        return self.deploy_dir / self.compose_project / "compose.json"

    def hint(self, script: str, *args: str) -> str:
        """How to run one of our scripts with the same settings file."""
        parts = [f"scripts/{script}.sh"]
        if self.env_file != REPO / ".env":
            parts += ["--env-file", str(self.env_file)]
        return " ".join(parts + list(args))


def keys() -> Tuple[str, ...]:
    """The settings keys the typed value holds: .env.example must document exactly these."""
    return tuple(f.name.upper() for f in fields(Settings) if f.name not in ("env_file", "container_env"))


_INTEGER_FIELDS = tuple(k.lower() for k in INTEGERS)
_TEXT_FIELDS = ("model_id", "model_revision", "served_model_name", "tool_call_parser", "hf_token", "release_tag",
                "image", "release_github_repo", "release_key_fingerprint", "gpu_device", "compose_project",
                "bind_address", "shm_size", "deploy_target")


def first_run(env_file: Path, ui: Ui, explicit: bool = False) -> None:
    """The default .env is made from .env.example when missing; a file named with --env-file never is."""
    if explicit or env_file.exists() or env_file.is_symlink():
        return
    env_file.write_bytes(EXAMPLE.read_bytes())
    ui.say(f"first run: created {env_file} from .env.example; edit it to change the model, port or GPU")


def load(env_file: Path, ui: Ui, environ: Optional[Mapping[str, str]] = None, explicit: bool = False) -> Settings:
    """`explicit`: the file was named (--env-file), so it must be there and readable. The default .env may be
    missing (the defaults apply); one that is there but is no readable regular file is an error too."""
    environ = os.environ if environ is None else environ
    known = known_keys()
    present = explicit or env_file.exists() or env_file.is_symlink()
    from_file = read_file(env_file, known, ui) if present else {}
    defaults = read_file(EXAMPLE, known, ui)
    for key in PINS:
        if environ.get(key) == "" and from_file.get(key):
            raise Stop(EX_USAGE, f"{key} is exported empty, which would unpin {env_file}'s {key}={from_file[key]}",
                       f"unset {key} (or export the value you mean)")
    values = {k: environ.get(k, from_file.get(k, defaults.get(k, ""))) for k in known}
    extra = {k: v for k, v in from_file.items() if k.startswith(CONTAINER_ENV)}
    extra.update({k: v for k, v in environ.items() if k.startswith(CONTAINER_ENV)})
    reserved = sorted(k for k in extra if k[len(CONTAINER_ENV):] in RESERVED_CONTAINER_ENV)
    if reserved:
        raise Stop(EX_USAGE, f"{reserved[0]}: the container's {reserved[0][len(CONTAINER_ENV):]} is what the trust "
                   "gate checked (the image's loader path, the GPU it is given); it cannot be overridden",
                   f"remove {', '.join(reserved)} from {env_file} and the environment")
    problems = value_problems(values)
    if problems:
        key, problem = problems[0]
        more = f" (and {len(problems) - 1} more: {', '.join(k for k, _ in problems[1:])})" if len(problems) > 1 else ""
        raise Stop(EX_USAGE, f"{key} in {env_file}: {problem}{more}", f"correct it in {env_file}")
    container_env = tuple(sorted((k[len(CONTAINER_ENV):], v) for k, v in extra.items() if len(k) > len(CONTAINER_ENV)))
    return Settings.from_values(env_file, values, container_env)
