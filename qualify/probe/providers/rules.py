"""A serving engine's provider-selection rules: the data file, read and validated once.

The rules themselves live in `qualify/probe/rules/<engine>-<version>.json` (vLLM's and SGLang's, as
auditwheel keeps its policies apart from its code); this module turns that file into frozen dataclasses and
says exactly where a file is wrong. The rest of the package applies them. Which file judges an image is
chosen by what the image has installed (`engines_in`): vLLM's for `vllm`, SGLang's for `sglang`, both for
an image with both.

File layout (every key below is checked; unknown keys are errors):

    {"schema_version": 1, "engine": "vllm" | "sglang" (default vllm), "<engine>": "<its release>",
     "about": "...",
     "libraries": {"<id>": {"paths": [...] | {"9.0": [...], "*": [...]},  # per capability: the library
                                                                         # the engine's loader takes there
                            "judge": "all" | "any" | "sass", "what": "..."}},
     "families": {"<id>": {"library": "<library id>", "pattern": "<regex over mangled kernel names>",
                           "what": "...", "kind": "kernel" | "symbol"}},   # symbol: a host symbol
     "tables": [{"kind": "attention" | "moe" | "linear", "variant": "...",
                 "source": "<vLLM files>", "case": "...", "notes": "...",
                 "priority": {"9.0": [names], "10": [names], "*": [names]},   # exact, major, any other
                 "providers": [{"name": "...", "caps": <gate>, "libs": ["<id>"], "needs": [<source>],
                                "packages": [...], "gate_files": [...], "has_flashinfer": bool,
                                "trtllm_on": <gate>, "optional": bool, "fallback": "...",
                                "imports": [...],  # distributions the provider imports once chosen (no gate)
                                "families": {"10.3": ["<family id>"], "12": [...]},  # exact, then major
                                "cli": "...", "note": "..."}]}],
     "serving_path": {"libraries": ["<library id>"], "coverage": ["<package folder>"], "notes": "..."},
     "selections": {"notes": "...", "by_capability": {"12.1": {"attention.bf16": "<name>"}}},
     "observed_names": {"notes": "...", "names": {"<vLLM class name>": "<name>"}}}

`serving_path` (optional): the libraries the engine loads at start-up whatever the model (census.serving-path
fails when they are absent or carry nothing for the target), and the package folders whose libraries' code
per Blackwell capability the census reports (sgl_kernel ships one library per architecture group).

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
from qualify.core.readlimit import read_small, strict_json

SCHEMA_VERSION = 1
RULES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rules")
DEFAULT_FILE = os.path.join(RULES_DIR, "vllm-0.33.json")
# engine id -> (its name for people, the distribution that installs it, the rules this probe applies to it)
ENGINES: Dict[str, Tuple[str, str, str]] = {
    "vllm": ("vLLM", "vllm", DEFAULT_FILE),
    "sglang": ("SGLang", "sglang", os.path.join(RULES_DIR, "sglang-0.5.23.json")),
}
PROVIDER_KINDS = ("attention", "moe", "linear")  # one check per kind

MAX_RULES_BYTES = 4 << 20  # a rule file is tens of kB
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
    NVCC_JIT = "nvcc-jit"  # DeepGEMM: compiled with the image's nvcc at first use
    SGLANG_JIT = "sglang-jit"  # SGLang's own kernels (sglang/kernels/jit): nvcc and ninja at first use


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

    paths: Tuple[str, ...]  # relative to site-packages; the first present is used (every capability's, in order)
    judge: Judge
    what: str
    # per capability ("9.0"), major ("12") or any other (None): the paths the engine's loader takes there
    # (sgl_kernel loads sm90/common_ops on 9.0 and sm100/common_ops on every other capability)
    by_cap: Tuple[Tuple[PriorityKey, Tuple[str, ...]], ...] = ()

    def paths_for(self, cap: Capability) -> Tuple[str, ...]:
        if not self.by_cap:
            return self.paths
        keyed = dict(self.by_cap)
        for key in ((cap.major, cap.minor), cap.major, None):
            if key in keyed:
                return keyed[key]
        return ()


@dataclass(frozen=True)
class FamilyRule:
    """A kernel family: the kernels of one library that a provider launches, found by their mangled names
    (core/kernelnames.py lists them). Patterns name architecture-specific kernels (an Sm120 mainloop, not
    a kernel that other cubins compile to an empty body)."""

    name: str
    library: LibRule
    pattern: re.Pattern[str]
    what: str
    kind: str = "kernel"  # kernel: device kernels by mangled name; symbol: a host symbol (a JIT library's dispatch)


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
    imports: Tuple[str, ...] = ()  # distributions it imports once chosen: absent, it fails at start-up (no gate)
    # per capability ("10.3") or major ("10"): the kernels it launches there
    families: Tuple[Tuple[PriorityKey, Tuple[FamilyRule, ...]], ...] = ()

    def families_for(self, cap: Capability) -> Tuple[FamilyRule, ...]:
        keyed = dict(self.families)
        for key in ((cap.major, cap.minor), cap.major):
            if key in keyed:
                return keyed[key]
        return ()


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
    version: str  # the engine release the rules are read from
    tables: Tuple[Table, ...]
    selections: Dict[str, Dict[str, str]]  # capability -> {"kind.variant": what the engine itself chose}
    observed_names: Dict[str, str]  # vLLM's class names -> ours
    path: str = ""
    families: Tuple[FamilyRule, ...] = ()
    engine: str = "vllm"
    serving: Tuple[LibRule, ...] = ()  # loaded at start-up whatever the model
    coverage: Tuple[str, ...] = ()  # package folders whose per-architecture code the census reports

    @property
    def vllm(self) -> str:
        """The release (the name from when only vLLM had rules)."""
        return self.version

    @property
    def name(self) -> str:
        return ENGINES[self.engine][0]

    @property
    def dist(self) -> str:
        return ENGINES[self.engine][1]

    @property
    def check_prefix(self) -> str:
        """providers.<kind>.<variant> for vLLM (as before SGLang had rules), providers.<engine>.… otherwise."""
        return "providers." if self.engine == "vllm" else f"providers.{self.engine}."

    def table(self, key: str) -> Optional[Table]:
        return next((t for t in self.tables if t.key == key), None)


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
    by_cap: Tuple[Tuple[PriorityKey, Tuple[str, ...]], ...] = ()
    if isinstance(d["paths"], dict):
        by_cap = tuple((_priority_key(key, at / "paths" / key), _list(v, at / "paths" / key, _text))
                       for key, v in d["paths"].items())
        paths = tuple(dict.fromkeys(p for _, ps in by_cap for p in ps))
        if any(not ps for _, ps in by_cap):
            raise (at / "paths").error("a capability's paths are empty")
    else:
        paths = _list(d["paths"], at / "paths", _text)
    if not paths:
        raise at.error("paths is empty")
    return LibRule(paths, _enum(Judge, Judge.values())(d["judge"], at / "judge"), _text(d["what"], at / "what"),
                   by_cap)


_PROVIDER_KEYS = ("caps", "libs", "needs", "packages", "gate_files", "has_flashinfer", "trtllm_on", "optional",
                  "fallback", "cli", "note", "families", "imports")


def _family(value: Any, at: _At, name: str, libraries: Mapping[str, LibRule]) -> FamilyRule:
    d = _object(value, at, ("library", "pattern", "what"), ("kind",))
    lib = _enum(str, tuple(libraries))(d["library"], at / "library")
    kind = _enum(str, ("kernel", "symbol"))(d.get("kind", "kernel"), at / "kind")
    try:
        pattern = re.compile(_text(d["pattern"], at / "pattern"))
    except re.error as exc:
        raise (at / "pattern").error(f"not a regular expression: {exc}") from None
    return FamilyRule(name, libraries[lib], pattern, _text(d["what"], at / "what"), kind)


def _provider_families(value: Any, at: _At, families: Mapping[str, FamilyRule]
                       ) -> Tuple[Tuple[PriorityKey, Tuple[FamilyRule, ...]], ...]:
    out = []
    for key, ids in _typed(value, at, dict, "an object").items():
        if key == "*":
            raise (at / key).error("families are per capability (\"10.3\") or major (\"12\"), not \"*\"")
        chosen = _list(ids, at / key, _enum(str, tuple(families)))
        out.append((_priority_key(key, at / key), tuple(families[i] for i in chosen)))
    return tuple(out)


def _provider(value: Any, at: _At, libraries: Mapping[str, LibRule],
              families: Optional[Mapping[str, FamilyRule]] = None) -> Provider:
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
        note=_text(d.get("note", ""), at / "note"),
        imports=_list(d.get("imports", []), at / "imports", _text),
        families=_provider_families(d.get("families", {}), at / "families", families or {}))


def _priority_key(text: str, at: _At) -> PriorityKey:
    if text == "*":
        return None
    if re.fullmatch(r"\d{1,2}", text):
        return int(text)
    return _pair(text, at)


def _table(value: Any, at: _At, libraries: Mapping[str, LibRule],
           families: Optional[Mapping[str, FamilyRule]] = None) -> Table:
    d = _object(value, at, ("kind", "variant", "source", "case", "priority", "providers"), ("notes",))
    providers = _list(d["providers"], at / "providers", lambda v, a: _provider(v, a, libraries, families))
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


def _serving(value: Any, at: _At, libraries: Mapping[str, LibRule]) -> Tuple[Tuple[LibRule, ...], Tuple[str, ...]]:
    d = _object(value, at, ("libraries",), ("coverage", "notes"))
    ids = _list(d["libraries"], at / "libraries", _enum(str, tuple(libraries)))
    _text(d.get("notes", ""), at / "notes")
    return tuple(libraries[i] for i in ids), _list(d.get("coverage", []), at / "coverage", _text)


def parse(data: Any, file: str = "<rules>") -> Rules:
    """Rules from the decoded JSON of a rule file; RulesError says where it is wrong."""
    at = _At(file)
    engine = data.get("engine", "vllm") if isinstance(data, dict) else "vllm"
    engine = _enum(str, tuple(ENGINES))(engine, at / "engine")
    d = _object(data, at, ("schema_version", engine, "libraries", "tables", "selections", "observed_names"),
                ("about", "families", "engine", "serving_path"))
    if d["schema_version"] != SCHEMA_VERSION:
        raise (at / "schema_version").error(f"this probe reads version {SCHEMA_VERSION}, "
                                            f"found {json.dumps(d['schema_version'])}")
    libs = _typed(d["libraries"], at / "libraries", dict, "an object")
    libraries = {k: _library(v, at / "libraries" / k) for k, v in libs.items()}
    fams = _typed(d.get("families", {}), at / "families", dict, "an object")
    families = {k: _family(v, at / "families" / k, k, libraries) for k, v in fams.items()}
    tables = _list(d["tables"], at / "tables", lambda v, a: _table(v, a, libraries, families))
    keys = [t.key for t in tables]
    if len(set(keys)) != len(keys):
        raise (at / "tables").error("a kind.variant appears twice")
    serving, coverage = _serving(d["serving_path"], at / "serving_path", libraries) if "serving_path" in d else ((), ())
    return Rules(version=_text(d[engine], at / engine), tables=tables,
                 selections=_selections(d["selections"], at / "selections", tables),
                 observed_names=_names(d["observed_names"], at / "observed_names"), path=file,
                 families=tuple(families.values()), engine=engine, serving=serving, coverage=coverage)


def load(path: str) -> Rules:
    return parse(strict_json(read_small(path, MAX_RULES_BYTES, "rule data", RulesError), path, RulesError), path)


@functools.cache
def for_engine(engine: str) -> Rules:
    """The rules this probe applies to an engine, loaded and validated once per process."""
    return load(ENGINES[engine][2])


def default() -> Rules:
    """vLLM's rules (the toolkit's own images serve vLLM)."""
    return for_engine("vllm")


def engines_in(packages: Mapping[str, str]) -> List[Rules]:
    """The rules of every engine the image has installed (`packages`: normalised distribution names), vLLM
    first; an image with both is judged by both."""
    return [for_engine(e) for e, (_, dist, _) in ENGINES.items() if dist in packages]
