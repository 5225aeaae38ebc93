"""vLLM's provider-selection rules: the data file, read and validated once.

The rules themselves live in `qualify/probe/rules/vllm-<version>.json` (as
auditwheel keeps its policies apart from its code); this module turns that
file into frozen dataclasses and says exactly where a file is wrong. The
rest of the package applies them.

File layout (every key below is checked; unknown keys are errors):

    {"schema_version": 1, "vllm": "0.33.0", "about": "...",
     "libraries": {"<id>": {"paths": [...], "judge": "all" | "any" | "sass", "what": "..."}},
     "tables": [{"kind": "attention" | "moe" | "linear", "variant": "...",
                 "source": "<vLLM files>", "case": "...", "notes": "...",
                 "priority": {"9.0": [names], "10": [names], "*": [names]},   # exact, major, any other
                 "providers": [{"name": "...", "caps": <gate>, "libs": ["<id>"], "needs": [<source>],
                                "packages": [...], "gate_files": [...], "has_flashinfer": bool,
                                "trtllm_on": <gate>, "optional": bool, "fallback": "...",
                                "cli": "...", "note": "..."}]}],
     "selections": {"notes": "...", "by_capability": {"12.1": {"attention.bf16": "<name>"}}},
     "observed_names": {"notes": "...", "names": {"<vLLM class name>": "<name>"}}}

    <gate>: {"lo": "8.0", "hi": "12.1", "majors": [10], "exact": ["9.0"]}, all optional.

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, TypeVar, Union

from qualify.core.arch import Capability
from qualify.core.enums import ValueEnum
from qualify.core.errors import ConfigError

SCHEMA_VERSION = 1
RULES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rules")
DEFAULT_FILE = os.path.join(RULES_DIR, "vllm-0.33.json")
PROVIDER_KINDS = ("attention", "moe", "linear")  # one check per kind

T = TypeVar("T")
Pair = Tuple[int, int]
PriorityKey = Union[Pair, int, None]  # exact capability, major, or any other


class RulesError(ConfigError):
    """A rule data file that cannot be read or does not validate."""


class Judge(ValueEnum):
    """How a library's census record decides whether its kernels run.

    all: the library's worst unit (every compiled unit must run: a
    single-purpose library); any: the best code anywhere in it (vLLM's _C
    dispatches per capability, so units for other GPUs are never launched);
    sass: the best SASS only (arch-specific CUTLASS kernels, which PTX cannot
    stand in for).
    """

    ALL = "all"
    ANY = "any"
    SASS = "sass"


class Source(ValueEnum):
    """Run-time kernel sources other than prebuilt libraries."""

    TRITON = "triton"  # JIT by Triton (its ptxas wiring is the triton.* checks' job)
    FLASHINFER_JIT = "flashinfer-jit"  # flashinfer-jit-cache, else nvcc + ninja at first use
    FLASHINFER_CUBIN = "flashinfer-cubin"  # trtllm-gen cubins: flashinfer-cubin, else downloaded at first use
    CUTE_DSL = "cute-dsl"  # compiled at first use by nvidia-cutlass-dsl (no nvcc)
    NVRTC_JIT = "nvrtc-jit"  # Humming: NVRTC (or nvcc) at first use


# --- the typed rules ----------------------------------------------------------


@dataclass(frozen=True)
class CapRule:
    """A capability gate as vLLM writes it: bounds, then majors or exact pairs."""

    lo: Pair = (0, 0)
    hi: Pair = (99, 9)
    majors: Tuple[int, ...] = ()
    exact: Tuple[Pair, ...] = ()

    def admits(self, cap: Capability) -> bool:
        pair = (cap.major, cap.minor)
        if not self.lo <= pair <= self.hi:
            return False
        if not self.majors and not self.exact:
            return True
        return cap.major in self.majors or pair in self.exact

    def describe(self) -> str:
        parts = [f"{a}.{b}" for a, b in self.exact] + [f"{m}.x" for m in self.majors]
        text = " or ".join(parts) if parts else "any capability"
        bounds = []
        if self.lo != (0, 0):
            bounds.append(f">= {self.lo[0]}.{self.lo[1]}")
        if self.hi != (99, 9):
            bounds.append(f"<= {self.hi[0]}.{self.hi[1]}")
        return text + (f" ({', '.join(bounds)})" if bounds else "")


@dataclass(frozen=True)
class LibRule:
    """A prebuilt library carrying a provider's kernels."""

    paths: Tuple[str, ...]  # relative to site-packages; the first present is used
    judge: Judge
    what: str


@dataclass(frozen=True)
class Provider:
    name: str
    caps: CapRule  # vLLM's capability gate
    libs: Tuple[LibRule, ...] = ()
    needs: Tuple[Source, ...] = ()
    packages: Tuple[str, ...] = ()  # distributions vLLM's gate imports
    gate_files: Tuple[str, ...] = ()  # files vLLM's gate imports or looks for
    has_flashinfer: bool = False  # vLLM's gate also calls has_flashinfer()
    trtllm_on: Optional[CapRule] = None  # switches to trtllm-gen cubins when vLLM sees flashinfer-cubin
    optional: bool = False  # an extra: its absence is normal, not worth flagging
    fallback: str = ""  # why it is a slow path ("" when it is not)
    cli: str = ""  # the override that selects it
    note: str = ""


@dataclass(frozen=True)
class Table:
    kind: str
    variant: str
    source: str  # the vLLM files the rules come from
    case: str  # what configuration the rules assume
    priority: Tuple[Tuple[PriorityKey, Tuple[str, ...]], ...]
    providers: Tuple[Provider, ...]
    notes: str = ""

    @property
    def key(self) -> str:
        return f"{self.kind}.{self.variant}"

    def order(self, cap: Capability) -> Tuple[str, ...]:
        keyed = dict(self.priority)
        for key in ((cap.major, cap.minor), cap.major, None):
            if key in keyed:
                return keyed[key]
        return ()

    def provider(self, name: str) -> Provider:
        return next(p for p in self.providers if p.name == name)


@dataclass(frozen=True)
class Rules:
    vllm: str  # the vLLM release the rules are read from
    tables: Tuple[Table, ...]
    selections: Dict[str, Dict[str, str]]  # capability -> {"kind.variant": what vLLM itself chose}
    observed_names: Dict[str, str]  # vLLM's class names -> ours
    path: str = ""


# --- reading and validating ---------------------------------------------------


@dataclass(frozen=True)
class _At:
    """Where in the file a value is, for error messages."""

    file: str
    where: str = ""

    def __truediv__(self, key: Union[str, int]) -> _At:
        step = f"[{key}]" if isinstance(key, int) else (f".{key}" if self.where else str(key))
        return _At(self.file, self.where + step)

    def error(self, message: str) -> RulesError:
        return RulesError(f"{self.file}: {self.where or 'top level'}: {message}",
                          hint="fix the rule data file (its layout: qualify/probe/providers/rules.py)")


def _object(value: Any, at: _At, required: Tuple[str, ...], optional: Tuple[str, ...] = ()) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise at.error(f"expected an object, found {type(value).__name__}")
    missing = [k for k in required if k not in value]
    unknown = sorted(k for k in value if k not in required + optional)
    if missing:
        raise at.error(f"missing key(s) {', '.join(missing)}")
    if unknown:
        raise at.error(f"unknown key(s) {', '.join(unknown)}")
    return value


def _typed(value: Any, at: _At, kind: type, name: str) -> Any:
    # bool is an int in Python: a JSON true must not pass for a number.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise at.error(f"expected {name}, found {json.dumps(value)}")
    return value


def _text(value: Any, at: _At) -> str:
    return _typed(value, at, str, "a string")


def _list(value: Any, at: _At, item: Callable[[Any, _At], T]) -> Tuple[T, ...]:
    return tuple(item(v, at / i) for i, v in enumerate(_typed(value, at, list, "a list")))


def _enum(kind: Callable[[str], T], choices: Tuple[str, ...]) -> Callable[[Any, _At], T]:
    def read(value: Any, at: _At) -> T:
        if value not in choices:
            raise at.error(f"{json.dumps(value)} is not one of {', '.join(choices)}")
        return kind(value)
    return read


def _pair(value: Any, at: _At) -> Pair:
    if not isinstance(value, str) or not re.fullmatch(r"\d{1,2}\.\d", value):
        raise at.error(f"expected a capability such as \"12.1\", found {json.dumps(value)}")
    cap = Capability.parse(value)
    return (cap.major, cap.minor)


def _major(value: Any, at: _At) -> int:
    return _typed(value, at, int, "a major version number")


def _gate(value: Any, at: _At) -> CapRule:
    d = _object(value, at, (), ("lo", "hi", "majors", "exact"))
    return CapRule(lo=_pair(d["lo"], at / "lo") if "lo" in d else (0, 0),
                   hi=_pair(d["hi"], at / "hi") if "hi" in d else (99, 9),
                   majors=_list(d.get("majors", []), at / "majors", _major),
                   exact=_list(d.get("exact", []), at / "exact", _pair))


def _library(value: Any, at: _At) -> LibRule:
    d = _object(value, at, ("paths", "judge", "what"))
    paths = _list(d["paths"], at / "paths", _text)
    if not paths:
        raise at.error("paths is empty")
    return LibRule(paths, _enum(Judge, Judge.values())(d["judge"], at / "judge"), _text(d["what"], at / "what"))


_PROVIDER_KEYS = ("caps", "libs", "needs", "packages", "gate_files", "has_flashinfer", "trtllm_on", "optional",
                  "fallback", "cli", "note")


def _provider(value: Any, at: _At, libraries: Mapping[str, LibRule]) -> Provider:
    d = _object(value, at, ("name",), _PROVIDER_KEYS)
    lib_ids = _list(d.get("libs", []), at / "libs", _enum(str, tuple(libraries)))
    return Provider(
        name=_text(d["name"], at / "name"), caps=_gate(d.get("caps", {}), at / "caps"),
        libs=tuple(libraries[i] for i in lib_ids),
        needs=_list(d.get("needs", []), at / "needs", _enum(Source, Source.values())),
        packages=_list(d.get("packages", []), at / "packages", _text),
        gate_files=_list(d.get("gate_files", []), at / "gate_files", _text),
        has_flashinfer=_typed(d.get("has_flashinfer", False), at / "has_flashinfer", bool, "true or false"),
        trtllm_on=_gate(d["trtllm_on"], at / "trtllm_on") if "trtllm_on" in d else None,
        optional=_typed(d.get("optional", False), at / "optional", bool, "true or false"),
        fallback=_text(d.get("fallback", ""), at / "fallback"), cli=_text(d.get("cli", ""), at / "cli"),
        note=_text(d.get("note", ""), at / "note"))


def _priority_key(text: str, at: _At) -> PriorityKey:
    if text == "*":
        return None
    if re.fullmatch(r"\d{1,2}", text):
        return int(text)
    return _pair(text, at)


def _table(value: Any, at: _At, libraries: Mapping[str, LibRule]) -> Table:
    d = _object(value, at, ("kind", "variant", "source", "case", "priority", "providers"), ("notes",))
    providers = _list(d["providers"], at / "providers", lambda v, a: _provider(v, a, libraries))
    names = [p.name for p in providers]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise (at / "providers").error(f"provider(s) named twice: {', '.join(doubled)}")
    priority: List[Tuple[PriorityKey, Tuple[str, ...]]] = []
    for text, order in _typed(d["priority"], at / "priority", dict, "an object").items():
        where = at / "priority" / text
        priority.append((_priority_key(text, where), _list(order, where, _enum(str, tuple(names)))))
    return Table(kind=_enum(str, PROVIDER_KINDS)(d["kind"], at / "kind"), variant=_text(d["variant"], at / "variant"),
                 source=_text(d["source"], at / "source"), case=_text(d["case"], at / "case"),
                 priority=tuple(priority), providers=providers, notes=_text(d.get("notes", ""), at / "notes"))


def _selections(value: Any, at: _At, tables: Tuple[Table, ...]) -> Dict[str, Dict[str, str]]:
    by_key = {t.key: t for t in tables}
    d = _object(value, at, ("by_capability",), ("notes",))
    out: Dict[str, Dict[str, str]] = {}
    for cap, chosen in _typed(d["by_capability"], at / "by_capability", dict, "an object").items():
        where = at / "by_capability" / cap
        _pair(cap, where)
        out[cap] = {}
        for key, name in _typed(chosen, where, dict, "an object").items():
            table = _enum(by_key.get, tuple(by_key))(key, where / key)
            out[cap][key] = _enum(str, tuple(p.name for p in table.providers))(name, where / key)
    return out


def _names(value: Any, at: _At) -> Dict[str, str]:
    d = _object(value, at, ("names",), ("notes",))
    names = _typed(d["names"], at / "names", dict, "an object")
    return {k: _text(v, at / "names" / k) for k, v in names.items()}


def parse(data: Any, file: str = "<rules>") -> Rules:
    """Rules from the decoded JSON of a rule file; RulesError says where it is wrong."""
    at = _At(file)
    d = _object(data, at, ("schema_version", "vllm", "libraries", "tables", "selections", "observed_names"),
                ("about",))
    if d["schema_version"] != SCHEMA_VERSION:
        raise (at / "schema_version").error(f"this probe reads version {SCHEMA_VERSION}, "
                                            f"found {json.dumps(d['schema_version'])}")
    libs = _typed(d["libraries"], at / "libraries", dict, "an object")
    libraries = {k: _library(v, at / "libraries" / k) for k, v in libs.items()}
    tables = _list(d["tables"], at / "tables", lambda v, a: _table(v, a, libraries))
    keys = [t.key for t in tables]
    if len(set(keys)) != len(keys):
        raise (at / "tables").error("a kind.variant appears twice")
    return Rules(vllm=_text(d["vllm"], at / "vllm"), tables=tables,
                 selections=_selections(d["selections"], at / "selections", tables),
                 observed_names=_names(d["observed_names"], at / "observed_names"), path=file)


def _unique_keys(path: str) -> Callable[[List[Tuple[str, Any]]], Dict[str, Any]]:
    def build(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
        seen: Dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:  # json.load would silently keep the last one
                raise RulesError(f"{path}: key {json.dumps(key)} appears twice in one object")
            seen[key] = value
        return seen
    return build


def load(path: str) -> Rules:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh, object_pairs_hook=_unique_keys(path))
    except OSError as exc:
        raise RulesError(f"{path}: cannot read the rule data: {exc.strerror or exc}") from None
    except ValueError as exc:  # JSONDecodeError and bad UTF-8
        raise RulesError(f"{path}: not JSON: {exc}") from None
    return parse(data, path)


@functools.cache
def default() -> Rules:
    """The rules this probe applies, loaded and validated once per process."""
    return load(DEFAULT_FILE)
