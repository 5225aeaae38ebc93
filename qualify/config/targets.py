"""Load and validate `images/targets.toml` into frozen dataclasses.

The file is read once here; nothing else parses it. Every refusal names the
file, the target and the key, and says what to do.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import tomllib

from qualify.config import ptxtable
from qualify.config.imageref import ImageRef, ImageRefError

# The typed values live in config/model.py; every stage imports them from here.
from qualify.config.model import (  # noqa: E402,F401
    DEFAULT_BUILD,
    LOCKS_DIR,
    REPO_ROOT,
    BasePin,
    BuildSettings,
    Hermetic,
    PayloadLayer,
    Runtime,
    RuntimeUser,
    Target,
    TargetsFile,
    TritonWiring,
    lock_path,
)
from qualify.core import arch, driver, topology
from qualify.core.enums import Accelerator, BaseKind, Profile, SupportLevel
from qualify.core.errors import ConfigError
from qualify.core.manifest import TARGET_NAME, TARGET_NAME_MAX
from qualify.core.ptxjit import PtxJitFloor
from qualify.core.readlimit import TARGETS_LIMIT, read_small

DEFAULT_TARGETS_FILE = REPO_ROOT / "images" / "targets.toml"

PLATFORMS = ("linux/amd64", "linux/arm64")
# The closed vocabularies live in core/enums.py; these are the values a targets file may use.
INTENDED_LEVELS = (SupportLevel.BASELINE.value, SupportLevel.OPTIMIZED.value, SupportLevel.EXPERIMENTAL.value)
PROFILES = Profile.values()
BASE_KINDS = BaseKind.values()

# Allowed keys per table, with their types. An unknown key is an error.
_TOP_KEYS = {"schema": int, "hermetic": dict, "promotion": dict, "allreduce": dict, "build": dict, "drivers": dict,
             "ptx_jit": dict, "defaults": dict, "targets": dict}
_ALLREDUCE_KEYS = {"floors": list}
_FLOOR_KEYS = {"topology": str, "gpus": int, "min_bus_gbps": float}
MAX_BUS_GBPS = 100000.0  # no link is near this: larger is a typo
_PROMOTION_KEYS = {"consecutive_passes": int, "level_checks": dict}
_BUILD_KEYS = {"cache_budget_gb": float, "layers": list}
_LAYER_KEYS = {"name": str, "packages": list}
_LAYER_NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,31}")
_PACKAGE_PATTERN_RE = re.compile(r"[a-z0-9*?][a-z0-9*?-]{0,99}")  # a normalised name, or an fnmatch pattern of one
MAX_CACHE_BUDGET_GB = 10000
_HERMETIC_KEYS = {"suite": str, "mirror": str, "python": str, "repository": str}
_DEFAULT_KEYS = {"cuda": str, "triton": dict, "runtime": dict, "user": dict}
_TARGET_KEYS = {
    "description": str,
    "accelerator": str,
    "system_packages": list,
    "gpus": list,
    "platform": str,
    "capability": str,
    "cuda": str,
    "torch_cuda_arch_list": str,
    "support_level": str,
    "base": dict,
    "triton": dict,
    "runtime": dict,
    "user": dict,
}
_BASE_KEYS = {"image": str, "python": str, "source": str, "pinned": str}
_TRITON_KEYS = {"ptxas": str, "ptxas_blackwell": str, "cuobjdump": str, "nvdisasm": str}
_RUNTIME_KEYS = {"gpu_memory_utilization": float, "unified_memory": bool, "min_gpu_memory_gib": int,
                 "host_reserve_gib": int, "kv_cache_gib": int, "server_memory_gib": int}
_RUNTIME_OPTIONAL = frozenset({"kv_cache_gib", "server_memory_gib"})  # the cpu target's memory (preflight)
# What a GPU target has and a cpu target must not name (its images carry no GPU code).
_GPU_ONLY_KEYS = ("gpus", "capability", "torch_cuda_arch_list", "cuda", "triton")
_DEB_PACKAGE_RE = re.compile(r"[a-z0-9][a-z0-9+.-]{1,62}")
_USER_KEYS = {"name": str, "uid": int}
_USER_NAME_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")  # what passwd and useradd accept
_CUDA_RE = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}")

# Values that become paths, image tags or tool arguments (issue 15 item 5).
_SUITE_RE = re.compile(r"[a-z][a-z0-9.-]{0,31}")  # a Debian suite or codename; never an option
_MIRROR_RE = re.compile(r"https?://[A-Za-z0-9.:\[\]-]+(/[A-Za-z0-9._~%/+-]*)?")
_PYTHON_RE = re.compile(r"3\.[0-9]{1,2}")
_REPOSITORY_RE = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*")
_TOOL_PATH_RE = re.compile(r"/[A-Za-z0-9._/+-]*")
MAX_GPU_MEMORY_GIB = 4096  # no GPU or unified pool is near this; larger is a typo


# --- loading -----------------------------------------------------------------


def load(path: Optional[Path] = None) -> TargetsFile:
    path = Path(path or DEFAULT_TARGETS_FILE)
    data = read_small(path, TARGETS_LIMIT, "targets file", ConfigError)
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML: arrays or tables nested too deeply") from None
    return parse(raw, path)


class _Problems:
    """Collects every refusal in the file, so `targets check` reports them all at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.errors: List[ConfigError] = []

    @contextmanager
    def each(self) -> Iterator[None]:
        try:
            yield
        except ConfigError as exc:
            self.errors.extend(getattr(exc, "parts", None) or [exc])  # flat: one line per problem

    def raise_any(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            lines = [str(e).replace("\n", "\n    ") for e in self.errors]
            combined = ConfigError(f"{self.path}: {len(self.errors)} problems:\n  - " + "\n  - ".join(lines))
            combined.parts = list(self.errors)
            raise combined


def parse(raw: Mapping[str, Any], path: Path) -> TargetsFile:
    problems = _Problems(path)
    with problems.each():
        _check_keys(raw, _TOP_KEYS, path, "top level")
    with problems.each():
        if raw.get("schema") != 1:
            raise ConfigError(f"{path}: key 'schema' must be 1 (found {raw.get('schema')!r})")
    hermetic = None
    with problems.each():
        hermetic = _parse_hermetic(_table(raw, "hermetic", path, "top level"), path)
    defaults: Mapping[str, Any] = {}
    with problems.each():
        defaults = _table(raw, "defaults", path, "top level")
        _check_keys(defaults, _DEFAULT_KEYS, path, "[defaults]")
    drivers: Mapping[str, driver.DriverVersion] = {}
    with problems.each():
        drivers = _parse_drivers(_table(raw, "drivers", path, "top level"), path)
    targets = {}
    with problems.each():
        targets_raw = _table(raw, "targets", path, "top level")
        if not targets_raw:
            raise ConfigError(f"{path}: [targets] is empty")
        for name, table in targets_raw.items():
            with problems.each():
                _check_name(name, path)
                if not isinstance(table, dict):
                    raise ConfigError(f"{path}: target {name!r} must be a table")
                targets[name] = _parse_target(name, table, defaults, drivers, path)
    passes, level_checks = 7, {}
    with problems.each():
        promotion = raw.get("promotion") or {}
        _check_keys(promotion, _PROMOTION_KEYS, path, "[promotion]")
        passes = promotion.get("consecutive_passes", 7)
        if not 1 <= passes <= 1000:
            raise ConfigError(f"{path}: [promotion] consecutive_passes must be from 1 to 1000 (found {passes})")
        level_checks = _parse_level_checks(promotion.get("level_checks") or {}, path)
    build = DEFAULT_BUILD
    with problems.each():
        if "build" in raw:
            build = _parse_build(_table(raw, "build", path, "top level"), path)
    floors: Tuple[topology.AllReduceFloor, ...] = ()
    with problems.each():
        if "allreduce" in raw:
            floors = _parse_allreduce(_table(raw, "allreduce", path, "top level"), path)
    ptx_jit: Tuple[PtxJitFloor, ...] = ()
    with problems.each():
        if "ptx_jit" in raw:
            ptx_jit = ptxtable.parse(_table(raw, "ptx_jit", path, "top level"), drivers, path)
    problems.raise_any()
    return TargetsFile(path, 1, hermetic, targets, passes, build, drivers, floors, level_checks, ptx_jit)


def _parse_level_checks(table: Mapping[str, Any], path: Path) -> Dict[str, Tuple[str, ...]]:
    """[promotion] level_checks (issue 39): per level, the serving checks a run of a serving target needs;
    `qualify release` signs them into release.json's policy, the only place promote reads them from."""
    from qualify.probe.servematrix import CHECK_IDS

    out = {}
    for level, checks in table.items():
        where = f"{path}: [promotion] level_checks: {level!r}"
        if level not in INTENDED_LEVELS:
            raise ConfigError(f"{where} is not a level ({', '.join(INTENDED_LEVELS)})")
        if not isinstance(checks, list) or any(c not in CHECK_IDS for c in checks) or len(set(checks)) != len(checks):
            raise ConfigError(f"{where} must list distinct serving check ids",
                              hint=f"the checks qualify serve-check judges: {', '.join(CHECK_IDS)}")
        out[level] = tuple(checks)
    return out


def _check_name(name: str, path: Path) -> None:
    """Target names become image repositories, file and folder names: a strict pattern."""
    if not TARGET_NAME.fullmatch(name):
        raise ConfigError(f"{path}: target name {name!r} is not allowed",
                          hint=f"use 1-{TARGET_NAME_MAX} of a-z, 0-9 and '-', starting with a letter or digit (e.g. sm120)")


def _check_text(path: Path, where: str, key: str, value: str, pattern: re.Pattern[str], what: str) -> None:
    if not pattern.fullmatch(value):
        raise ConfigError(f"{path}: {where}: key {key!r}: {value!r} is not {what}")


def _parse_hermetic(table: Mapping[str, Any], path: Path) -> Hermetic:
    _check_keys(table, _HERMETIC_KEYS, path, "[hermetic]", required=True)
    where = "[hermetic]"
    _check_text(path, where, "suite", table["suite"], _SUITE_RE, "a Debian suite name (e.g. bookworm)")
    _check_text(path, where, "mirror", table["mirror"], _MIRROR_RE, "an http(s) URL without spaces or control characters")
    _check_text(path, where, "python", table["python"], _PYTHON_RE, "a Python version such as 3.11")
    _check_text(path, where, "repository", table["repository"], _REPOSITORY_RE, "an image repository name")
    return Hermetic(**{k: table[k] for k in _HERMETIC_KEYS})


def _parse_build(table: Mapping[str, Any], path: Path) -> BuildSettings:
    _check_keys(table, _BUILD_KEYS, path, "[build]", required=True)
    budget = table["cache_budget_gb"]
    if not 0 <= budget <= MAX_CACHE_BUDGET_GB:
        raise ConfigError(f"{path}: [build]: key 'cache_budget_gb': {budget} is outside 0..{MAX_CACHE_BUDGET_GB}",
                          hint="the size in GB of build cache the toolkit may keep beyond its newest builds' own")
    layers: List[PayloadLayer] = []
    for n, entry in enumerate(table["layers"], 1):
        where = f"[build] layers[{n}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: {where} must be a table with 'name' and 'packages'")
        _check_keys(entry, _LAYER_KEYS, path, where, required=True)
        _check_text(path, where, "name", entry["name"], _LAYER_NAME_RE, "a layer name (a-z, 0-9, '-')")
        if entry["name"] in {layer.name for layer in layers}:
            raise ConfigError(f"{path}: {where}: layer name {entry['name']!r} is used twice")
        patterns = entry["packages"]
        if not patterns or not all(isinstance(p, str) and _PACKAGE_PATTERN_RE.fullmatch(p) for p in patterns):
            raise ConfigError(f"{path}: {where}: key 'packages' must be a non-empty list of normalised package names "
                              "or patterns (a-z, 0-9, '-', '*', '?'), e.g. \"nvidia-*\"")
        layers.append(PayloadLayer(entry["name"], tuple(patterns)))
    if not layers or "*" not in layers[-1].packages:
        raise ConfigError(f"{path}: [build] layers: the last layer must take every package the others do not",
                          hint='give the last layer packages = ["*"]')
    return BuildSettings(int(budget * 10**9), tuple(layers))


def _parse_allreduce(table: Mapping[str, Any], path: Path) -> Tuple[topology.AllReduceFloor, ...]:
    """[allreduce] floors: the all-reduce bus bandwidth a multi-GPU deployment must reach, per topology."""
    _check_keys(table, _ALLREDUCE_KEYS, path, "[allreduce]", required=True)
    floors: List[topology.AllReduceFloor] = []
    for n, entry in enumerate(table["floors"], 1):
        where = f"[allreduce] floors[{n}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: {where} must be a table with topology, gpus and min_bus_gbps")
        _check_keys(entry, _FLOOR_KEYS, path, where, required=True)
        if entry["topology"] not in topology.TOPOLOGIES:
            raise ConfigError(f"{path}: {where}: key 'topology': {entry['topology']!r} is not one of "
                              f"{', '.join(topology.TOPOLOGIES)}", hint=_did_you_mean(entry["topology"],
                                                                                      topology.TOPOLOGIES))
        if not 2 <= entry["gpus"] <= 1024:
            raise ConfigError(f"{path}: {where}: key 'gpus': {entry['gpus']} is outside 2..1024 (an all-reduce "
                              "needs two GPUs)")
        if not 0 < entry["min_bus_gbps"] <= MAX_BUS_GBPS:
            raise ConfigError(f"{path}: {where}: key 'min_bus_gbps': {entry['min_bus_gbps']} is outside "
                              f"0 (exclusive)..{MAX_BUS_GBPS:g}")
        if any(f.topology == entry["topology"] and f.gpus == entry["gpus"] for f in floors):
            raise ConfigError(f"{path}: {where}: a second floor for {entry['topology']} at {entry['gpus']} GPUs")
        floors.append(topology.AllReduceFloor(entry["topology"], entry["gpus"], float(entry["min_bus_gbps"])))
    missing = [t for t in topology.TOPOLOGIES if not any(f.topology == t and f.gpus == 2 for f in floors)]
    if missing:
        raise ConfigError(f"{path}: [allreduce] floors: no floor for 2 GPUs of {', '.join(missing)}",
                          hint="every topology needs an entry with gpus = 2, so that every set of GPUs has a floor")
    return tuple(floors)


def _parse_drivers(table: Mapping[str, Any], path: Path) -> Dict[str, driver.DriverVersion]:
    """[drivers]: CUDA version -> the oldest Linux driver that runs it (NVIDIA's CUDA release notes)."""
    if not table:
        raise ConfigError(f"{path}: [drivers] is empty", hint='name the driver floor of each CUDA the targets use, '
                          'e.g. "13.0" = "580.65.06"')
    out = {}
    for cuda, floor in table.items():
        if not _CUDA_RE.fullmatch(cuda):
            raise ConfigError(f"{path}: [drivers]: key {cuda!r} is not a CUDA version such as \"13.0\"")
        try:
            out[cuda] = driver.DriverVersion.parse(floor if isinstance(floor, str) else repr(floor))
        except ValueError as exc:
            raise ConfigError(f"{path}: [drivers]: key {cuda!r}: {exc}") from None
    return out


def _parse_target(name: str, table: Mapping[str, Any], defaults: Mapping[str, Any],
                  drivers: Mapping[str, driver.DriverVersion], path: Path) -> Target:
    """One target; every independent problem in it is reported, not only the first."""
    where = f"target {name!r}"
    if table.get("accelerator", Accelerator.CUDA.value) == Accelerator.CPU.value:
        return _parse_cpu_target(name, table, defaults, path)
    merged = dict(table)
    merged.setdefault("cuda", defaults.get("cuda"))
    _check_keys(merged, _TARGET_KEYS, path, where, required=True,
                optional={"triton", "runtime", "user", "accelerator", "system_packages"})
    problems = _Problems(path)
    if "accelerator" in merged:
        with problems.each():
            _one_of(merged, "accelerator", Accelerator.values(), path, where, "{value} is not an accelerator")
    values: Dict[str, Any] = {}
    with problems.each():
        values["platform"] = _one_of(merged, "platform", PLATFORMS, path, where, "unknown platform {value}")
    with problems.each():
        values["capability"] = _capability_and_arch_list(merged, path, where)
    with problems.each():
        values["support_level"] = _one_of(merged, "support_level", INTENDED_LEVELS, path, where,
                                          "{value} is not an intended level")
    with problems.each():
        values["gpus"] = _gpus(merged, path, where)
    with problems.each():
        values["base"] = _parse_base(name, merged["base"], path)
    with problems.each():
        values["triton"] = _triton(merged, defaults, path, where)
    with problems.each():
        values["runtime"] = _runtime(merged, defaults, path, where)
    with problems.each():
        values["user"] = _user(merged, defaults, path, where)
    with problems.each():
        values["driver_floor"] = _driver_floor(merged["cuda"], drivers, path, where)
    with problems.each():
        values["system_packages"] = _system_packages(merged, path, where)
    problems.raise_any()
    return Target(name=name, description=merged["description"], cuda=merged["cuda"],
                  torch_cuda_arch_list=merged["torch_cuda_arch_list"], **values)


def _parse_cpu_target(name: str, table: Mapping[str, Any], defaults: Mapping[str, Any], path: Path) -> Target:
    """A target with no GPU: vLLM's CPU build. What only a GPU target has is refused by name."""
    where = f"target {name!r}"
    _check_keys(table, _TARGET_KEYS, path, where)
    named = [k for k in _GPU_ONLY_KEYS if k in table]
    if named:
        raise ConfigError(f"{path}: {where}: a cpu target has no GPU, so no {', '.join(repr(k) for k in named)}",
                          hint="remove those keys, or make it a GPU target (no 'accelerator' key)")
    missing = [k for k in ("description", "platform", "support_level", "base") if k not in table]
    if missing:
        raise ConfigError(f"{path}: {where}: missing key(s): {', '.join(missing)}")
    problems = _Problems(path)
    values: Dict[str, Any] = {}
    with problems.each():
        values["platform"] = _one_of(table, "platform", PLATFORMS, path, where, "unknown platform {value}")
    with problems.each():
        values["support_level"] = _one_of(table, "support_level", INTENDED_LEVELS, path, where,
                                          "{value} is not an intended level")
    with problems.each():
        values["base"] = _parse_base(name, table["base"], path)
    with problems.each():
        values["runtime"] = _runtime(table, defaults, path, where)
        if not values["runtime"].kv_cache_gib or not values["runtime"].server_memory_gib:
            raise ConfigError(f"{path}: {where}: a cpu target needs runtime.kv_cache_gib and runtime.server_memory_gib",
                              hint="the host memory vLLM's CPU build reserves for its KV cache, and what the server "
                              "needs besides (preflight checks both)")
    with problems.each():
        values["user"] = _user(table, defaults, path, where)
    with problems.each():
        values["system_packages"] = _system_packages(table, path, where)
    problems.raise_any()
    return Target(name=name, description=table["description"], gpus=(), capability=None, cuda="",
                  torch_cuda_arch_list="", triton=None, driver_floor=None, accelerator=Accelerator.CPU, **values)


def _system_packages(table: Mapping[str, Any], path: Path, where: str) -> Tuple[str, ...]:
    names = table.get("system_packages", [])
    bad = [n for n in names if not isinstance(n, str) or not _DEB_PACKAGE_RE.fullmatch(n)]
    if bad:
        raise ConfigError(f"{path}: {where}: key 'system_packages': {bad[0]!r} is not a Debian package name")
    return tuple(names)


def _one_of(merged: Mapping[str, Any], key: str, allowed: Sequence[str], path: Path, where: str, what: str) -> str:
    """merged[key] when it is one of `allowed`; else an error naming the file, the target, the key and the value."""
    value = merged[key]
    if value not in allowed:
        raise ConfigError(f"{path}: {where}: key {key!r}: {what.format(value=repr(value))}",
                          hint=f"use one of {', '.join(allowed)}")
    return value


def _capability_and_arch_list(merged: Mapping[str, Any], path: Path, where: str) -> arch.Capability:
    try:
        cap = arch.Capability.parse(merged["capability"])
    except arch.ArchError as exc:
        raise ConfigError(f"{path}: {where}: key 'capability': {exc}") from None
    arch_list = merged["torch_cuda_arch_list"]
    if any(not entry.strip() or entry != entry.strip() for entry in arch_list.split(";")):
        raise ConfigError(f"{path}: {where}: key 'torch_cuda_arch_list' {arch_list!r} has an empty or padded entry",
                          hint="write entries separated by single ';', e.g. \"12.0;12.0a\"")
    problems = arch.arch_list_problems(arch_list, cap)
    if problems:
        raise ConfigError(
            f"{path}: {where}: key 'torch_cuda_arch_list' {arch_list!r} "
            f"does not match capability {cap}: " + "; ".join(problems)
        )
    return cap




def _gpus(merged: Mapping[str, Any], path: Path, where: str) -> Tuple[str, ...]:
    gpus = merged["gpus"]
    if not gpus or not all(isinstance(g, str) and g for g in gpus):
        raise ConfigError(f"{path}: {where}: key 'gpus' must be a non-empty list of GPU names")
    return tuple(gpus)


def _triton(merged: Mapping[str, Any], defaults: Mapping[str, Any], path: Path, where: str) -> TritonWiring:
    triton_table = {**defaults.get("triton", {}), **merged.get("triton", {})}
    _check_keys(triton_table, _TRITON_KEYS, path, f"{where} [triton] (with [defaults.triton])", required=True)
    for key, value in triton_table.items():
        if not _TOOL_PATH_RE.fullmatch(value):
            raise ConfigError(f"{path}: {where}: key 'triton.{key}': {value!r} must be an absolute path "
                              "(letters, digits, '.', '_', '-', '+', '/')")
    return TritonWiring(**triton_table)


def _runtime(merged: Mapping[str, Any], defaults: Mapping[str, Any], path: Path, where: str) -> Runtime:
    runtime_table = {**defaults.get("runtime", {}), **merged.get("runtime", {})}
    _check_keys(runtime_table, _RUNTIME_KEYS, path, f"{where} [runtime] (with [defaults.runtime])", required=True,
                optional=_RUNTIME_OPTIONAL)
    fraction = runtime_table["gpu_memory_utilization"]
    if not 0.05 <= fraction <= 0.98:
        raise ConfigError(f"{path}: {where}: key 'runtime.gpu_memory_utilization': {fraction} is outside 0.05..0.98")
    gib = runtime_table["min_gpu_memory_gib"]
    if not 1 <= gib <= MAX_GPU_MEMORY_GIB:
        raise ConfigError(f"{path}: {where}: key 'runtime.min_gpu_memory_gib': {gib} is outside 1..{MAX_GPU_MEMORY_GIB}")
    reserve = runtime_table["host_reserve_gib"]
    if not 0 <= reserve <= MAX_GPU_MEMORY_GIB:
        raise ConfigError(f"{path}: {where}: key 'runtime.host_reserve_gib': {reserve} is outside 0..{MAX_GPU_MEMORY_GIB}")
    for key in sorted(_RUNTIME_OPTIONAL & set(runtime_table)):
        if not 1 <= runtime_table[key] <= MAX_GPU_MEMORY_GIB:
            raise ConfigError(f"{path}: {where}: key 'runtime.{key}': {runtime_table[key]} is outside 1..{MAX_GPU_MEMORY_GIB}")
    return Runtime(**runtime_table)


def _user(merged: Mapping[str, Any], defaults: Mapping[str, Any], path: Path, where: str) -> RuntimeUser:
    table = {**defaults.get("user", {}), **merged.get("user", {})}
    _check_keys(table, _USER_KEYS, path, f"{where} [user] (with [defaults.user])", required=True)
    _check_text(path, where, "user.name", table["name"], _USER_NAME_RE, "a user name (a-z, 0-9, '_', '-')")
    if not 1 <= table["uid"] <= 60000:
        raise ConfigError(f"{path}: {where}: key 'user.uid': {table['uid']} is outside 1..60000",
                          hint="the server runs as a regular user, never root (uid 0)")
    return RuntimeUser(table["name"], table["uid"])


def _driver_floor(cuda: str, drivers: Mapping[str, driver.DriverVersion], path: Path, where: str) -> driver.DriverVersion:
    if not isinstance(cuda, str) or not _CUDA_RE.fullmatch(cuda):
        raise ConfigError(f"{path}: {where}: key 'cuda': {cuda!r} is not a CUDA version such as \"13.0\"")
    if cuda not in drivers:
        raise ConfigError(f"{path}: {where}: CUDA {cuda} has no driver floor in [drivers]",
                          hint=f"add \"{cuda}\" = \"<driver>\" from NVIDIA's CUDA {cuda} release notes")
    return drivers[cuda]


def _parse_base(name: str, table: Any, path: Path) -> BasePin:
    where = f"target {name!r}"
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {where}: key 'base' must be a table")
    _check_keys(table, _BASE_KEYS, path, f"{where} [base]", required=True)
    _check_text(path, where, "base.python", table["python"], _PYTHON_RE, "a Python version such as 3.12")
    text = table["image"]
    try:
        ref = ImageRef.parse(text)
    except ImageRefError as exc:
        raise ConfigError(f"{path}: {where}: key 'base.image': {exc}") from None
    if not ref.pinned:
        raise ConfigError(
            f"{path}: {where}: key 'base.image': {text!r} is a floating tag, not pinned by digest",
            hint=f"write it as {ref.tagged}@sha256:<digest>; `nox -s pin -- {name}` resolves it where a registry is reachable",
        )
    try:
        _dt.date.fromisoformat(table["pinned"])
    except ValueError:
        raise ConfigError(f"{path}: {where}: key 'base.pinned': {table['pinned']!r} is not a date (YYYY-MM-DD)") from None
    return BasePin(ref, table["python"], table["source"], table["pinned"])


def _table(raw: Mapping[str, Any], key: str, path: Path, where: str) -> Mapping[str, Any]:
    value = raw.get(key)
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {where}: key {key!r} must be a table")
    return value


def _check_keys(
    table: Mapping[str, Any],
    allowed: Mapping[str, type],
    path: Path,
    where: str,
    *,
    required: bool = False,
    optional: frozenset = frozenset(),
) -> None:
    for key, value in table.items():
        if key not in allowed:
            raise ConfigError(
                f"{path}: {where}: unknown key {key!r}",
                hint=_did_you_mean(key, allowed) or f"allowed keys: {', '.join(allowed)}",
            )
        expected = allowed[key]
        ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise ConfigError(
                f"{path}: {where}: key {key!r} must be {expected.__name__}, found {type(value).__name__} {value!r}"
            )
    if required:
        missing = [k for k in allowed if k not in table and k not in optional]
        if missing:
            raise ConfigError(f"{path}: {where}: missing key(s): {', '.join(missing)}")


def _did_you_mean(word: str, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f"did you mean {close[0]!r}?" if close else ""
