"""The serving correctness matrix as data: `qualify/probe/rules/serve-matrix-v<N>.json`, read and validated once.

`python -m qualify serve-check` (deploy/servecheck/) sends these prompts to a running server and judges the
answers by these tolerances and thresholds; `qualify tiny-model` (tinymodel/) trains its model on the same
prompts; `qualify promote` (release/serving.py) reads which checks a level needs. None of them spells a prompt,
a tolerance or a threshold itself.

The file lives beside vLLM's provider rules on the image side, so the probe digest every manifest records
(probe_sha256) covers it: a serve-check record names the digest of the probe sources it ran with, and promote
counts only records whose probe is the release's own. Nothing inside an image reads it.

File layout (every key is checked; unknown keys are errors):

    {"schema_version": 1, "matrix_version": N, "about": "...",
     "checks": {"serve.determinism": {"title", "prompts", "max_tokens", "repeats", "logprob_tolerance", "why"},
                "serve.niah": {"title", "hay", "needle" ({word}), "question", "words", "context_fractions",
                               "depths", "seed", "max_tokens", "why"},
                "serve.tools": {"title", "prompt", "tool", "expect", "max_tokens", "why"},
                "serve.soak": {"title", "prompts", "concurrency", "requests", "warmup_requests", "max_seconds",
                               "max_tokens", "max_memory_growth_mib", "max_memory_growth_fraction", "why"},
                "serve.providers": {"title", "log_rules": [{"kind", "pattern", "name"?, "note"?}], "compared", "why"},
                "serve.accuracy": {"title", "prompts", "tokens", "top_logprobs", "repeats", "min_top1_agreement",
                                   "max_mean_kl", "why"}}}

Standard library only, Python 3.9 compatible (it sits on the image side).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from qualify.core.errors import ConfigError
from qualify.core.readlimit import read_small, strict_json

SCHEMA_VERSION = 1
RULES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rules")
DEFAULT_FILE = os.path.join(RULES_DIR, "serve-matrix-v1.json")
MAX_BYTES = 1 << 20
CHECK_IDS = ("serve.determinism", "serve.niah", "serve.tools", "serve.soak", "serve.providers", "serve.accuracy")
LOG_KINDS = ("attention", "moe", "linear", "quantization", "dtype", "kv_cache_dtype")


class MatrixError(ConfigError):
    """A matrix data file that cannot be read or does not validate."""


@dataclass(frozen=True)
class Determinism:
    title: str
    prompts: Tuple[str, ...]
    max_tokens: int
    repeats: int
    logprob_tolerance: float
    why: str


@dataclass(frozen=True)
class Niah:
    title: str
    hay: Tuple[str, ...]
    needle: str
    question: str
    words: Tuple[str, ...]
    context_fractions: Tuple[float, ...]
    depths: Tuple[float, ...]
    seed: int
    max_tokens: int
    why: str


@dataclass(frozen=True)
class Tools:
    title: str
    prompt: str
    tool: Mapping[str, Any]
    expect: Mapping[str, Any]
    max_tokens: int
    why: str

    @property
    def name(self) -> str:
        return str(self.tool["function"]["name"])

    @property
    def schema(self) -> Mapping[str, Any]:
        return self.tool["function"]["parameters"]


@dataclass(frozen=True)
class Soak:
    title: str
    prompts: Tuple[str, ...]
    concurrency: int
    requests: int
    warmup_requests: int
    max_seconds: float
    max_tokens: int
    max_memory_growth_mib: float
    max_memory_growth_fraction: float
    why: str


@dataclass(frozen=True)
class LogRule:
    kind: str
    pattern: re.Pattern[str]
    name: str = ""  # a fixed name when the line implies it; else the pattern's `name` group
    note: str = ""


@dataclass(frozen=True)
class Providers:
    title: str
    log_rules: Tuple[LogRule, ...]
    compared: Tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Accuracy:
    title: str
    prompts: Tuple[str, ...]
    tokens: int
    top_logprobs: int
    repeats: int
    min_top1_agreement: float
    max_mean_kl: float
    why: str


@dataclass(frozen=True)
class Matrix:
    version: int
    sha256: str  # of the file's bytes
    path: str
    determinism: Determinism
    niah: Niah
    tools: Tools
    soak: Soak
    providers: Providers
    accuracy: Accuracy
    # Which checks a level needs is not here: the release's signed policy says (trust/policy.py: level_checks,
    # from images/targets.toml's [promotion] level_checks, the one source).

    def title(self, check_id: str) -> str:
        return {"serve.determinism": self.determinism.title, "serve.niah": self.niah.title,
                "serve.tools": self.tools.title, "serve.soak": self.soak.title,
                "serve.providers": self.providers.title, "serve.accuracy": self.accuracy.title}[check_id]

    def prompts(self) -> Tuple[str, ...]:
        """Every plain prompt the matrix sends (the tiny model answers each), in a stable order."""
        seen: List[str] = []
        for p in self.determinism.prompts + self.soak.prompts + self.accuracy.prompts:
            if p not in seen:
                seen.append(p)
        return tuple(seen)


# --- reading ------------------------------------------------------------------------------


class _At:
    def __init__(self, file: str, where: str = "") -> None:
        self.file, self.where = file, where

    def __truediv__(self, key: str) -> _At:
        return _At(self.file, f"{self.where}.{key}" if self.where else key)

    def error(self, message: str) -> MatrixError:
        return MatrixError(f"{self.file}: {self.where or 'top level'}: {message}",
                           hint="fix the matrix data file (its layout: qualify/probe/servematrix.py)")


def _obj(value: Any, at: _At, keys: Tuple[str, ...], optional: Tuple[str, ...] = ()) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise at.error(f"expected an object, found {type(value).__name__}")
    missing = [k for k in keys if k not in value]
    unknown = sorted(k for k in value if k not in keys + optional)
    if missing or unknown:
        raise at.error("missing key(s) " + ", ".join(missing) if missing else "unknown key(s) " + ", ".join(unknown))
    return value


def _text(doc: Mapping[str, Any], key: str, at: _At) -> str:
    value = doc[key]
    if not isinstance(value, str) or not value.strip():
        raise (at / key).error("expected a non-empty string")
    return value


def _texts(doc: Mapping[str, Any], key: str, at: _At) -> Tuple[str, ...]:
    value = doc[key]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise (at / key).error("expected a non-empty list of non-empty strings")
    if len(set(value)) != len(value):
        raise (at / key).error("lists a value twice")
    return tuple(value)


def _int(doc: Mapping[str, Any], key: str, at: _At, lo: int, hi: int) -> int:
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise (at / key).error(f"expected an integer from {lo} to {hi}, found {value!r}")
    return value


def _num(doc: Mapping[str, Any], key: str, at: _At, lo: float, hi: float) -> float:
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise (at / key).error(f"expected a number from {lo:g} to {hi:g}, found {value!r}")
    return float(value)


def _fractions(doc: Mapping[str, Any], key: str, at: _At) -> Tuple[float, ...]:
    value = doc[key]
    if not isinstance(value, list) or not value or any(isinstance(v, bool) or not isinstance(v, (int, float))
                                                        or not 0 < v <= 1 for v in value):
        raise (at / key).error("expected a non-empty list of numbers in (0, 1]")
    return tuple(float(v) for v in value)


def _determinism(doc: Any, at: _At) -> Determinism:
    d = _obj(doc, at, ("title", "prompts", "max_tokens", "repeats", "logprob_tolerance", "why"))
    return Determinism(_text(d, "title", at), _texts(d, "prompts", at), _int(d, "max_tokens", at, 1, 4096),
                       _int(d, "repeats", at, 2, 100), _num(d, "logprob_tolerance", at, 0, 10), _text(d, "why", at))


def _niah(doc: Any, at: _At) -> Niah:
    d = _obj(doc, at, ("title", "hay", "needle", "question", "words", "context_fractions", "depths", "seed",
                       "max_tokens", "why"))
    needle = _text(d, "needle", at)
    if needle.count("{word}") != 1:
        raise (at / "needle").error("must hold {word} exactly once")
    words = _texts(d, "words", at)
    if any(not re.fullmatch(r"[a-z]+", w) for w in words) or len(words) < 4:
        raise (at / "words").error("expected at least 4 lower-case words of letters only")
    hay = _texts(d, "hay", at)
    if any(re.search(rf"\b{w}\b", " ".join(hay + (d["question"],)), re.IGNORECASE) for w in words):
        raise (at / "hay").error("a needle word appears in the hay or the question")
    return Niah(_text(d, "title", at), hay, needle, _text(d, "question", at), words,
                _fractions(d, "context_fractions", at), _fractions(d, "depths", at), _int(d, "seed", at, 0, 2 ** 31),
                _int(d, "max_tokens", at, 1, 1024), _text(d, "why", at))


def _tools(doc: Any, at: _At) -> Tools:
    d = _obj(doc, at, ("title", "prompt", "tool", "expect", "max_tokens", "why"))
    tool = d["tool"]
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or tool.get("type") != "function" or not isinstance(fn.get("name"), str) \
            or not isinstance(fn.get("parameters"), dict):
        raise (at / "tool").error("expected an OpenAI tool: {type: function, function: {name, parameters}}")
    if not isinstance(d["expect"], dict):
        raise (at / "expect").error("expected an object of argument values")
    return Tools(_text(d, "title", at), _text(d, "prompt", at), tool, d["expect"], _int(d, "max_tokens", at, 1, 4096),
                 _text(d, "why", at))


def _soak(doc: Any, at: _At) -> Soak:
    d = _obj(doc, at, ("title", "prompts", "concurrency", "requests", "warmup_requests", "max_seconds", "max_tokens",
                       "max_memory_growth_mib", "max_memory_growth_fraction", "why"))
    return Soak(_text(d, "title", at), _texts(d, "prompts", at), _int(d, "concurrency", at, 1, 64),
                _int(d, "requests", at, 1, 10000), _int(d, "warmup_requests", at, 0, 1000),
                _num(d, "max_seconds", at, 1, 3600), _int(d, "max_tokens", at, 1, 4096),
                _num(d, "max_memory_growth_mib", at, 0, 1 << 20), _num(d, "max_memory_growth_fraction", at, 0, 10),
                _text(d, "why", at))


def _log_rule(doc: Any, at: _At) -> LogRule:
    d = _obj(doc, at, ("kind", "pattern"), ("name", "note"))
    kind = _text(d, "kind", at)
    if kind not in LOG_KINDS:
        raise (at / "kind").error(f"{kind!r} is not one of {', '.join(LOG_KINDS)}")
    try:
        pattern = re.compile(_text(d, "pattern", at))
    except re.error as exc:
        raise (at / "pattern").error(f"not a regular expression: {exc}") from None
    name = d.get("name", "")
    if not isinstance(name, str) or (not name and "name" not in pattern.groupindex):
        raise at.error("needs a fixed `name` or a pattern with a (?P<name>...) group")
    return LogRule(kind, pattern, name, str(d.get("note", "")))


def _providers(doc: Any, at: _At) -> Providers:
    d = _obj(doc, at, ("title", "log_rules", "compared", "why"))
    rules = d["log_rules"]
    if not isinstance(rules, list) or not rules:
        raise (at / "log_rules").error("expected a non-empty list")
    compared = _texts(d, "compared", at)
    if any(k not in ("attention", "moe", "linear") for k in compared):
        raise (at / "compared").error("compares only attention, moe and linear")
    return Providers(_text(d, "title", at), tuple(_log_rule(r, _At(at.file, f"{at.where}.log_rules[{i}]"))
                                                  for i, r in enumerate(rules)), compared, _text(d, "why", at))


def _accuracy(doc: Any, at: _At) -> Accuracy:
    d = _obj(doc, at, ("title", "prompts", "tokens", "top_logprobs", "repeats", "min_top1_agreement", "max_mean_kl",
                       "why"))
    return Accuracy(_text(d, "title", at), _texts(d, "prompts", at), _int(d, "tokens", at, 1, 1024),
                    _int(d, "top_logprobs", at, 1, 20), _int(d, "repeats", at, 1, 20),
                    _num(d, "min_top1_agreement", at, 0, 1), _num(d, "max_mean_kl", at, 0, 100), _text(d, "why", at))


def parse(data: bytes, where: str) -> Matrix:
    doc = strict_json(data, where, MatrixError)  # a key written twice is refused, not the last one kept
    at = _At(where)
    top = _obj(doc, at, ("schema_version", "matrix_version", "about", "checks"))
    if top["schema_version"] != SCHEMA_VERSION:
        raise (at / "schema_version").error(f"this toolkit reads version {SCHEMA_VERSION}")
    checks = _obj(top["checks"], at / "checks", CHECK_IDS)
    c = at / "checks"
    return Matrix(_int(top, "matrix_version", at, 1, 10 ** 6), hashlib.sha256(data).hexdigest(), where,
                  _determinism(checks["serve.determinism"], c / "serve.determinism"),
                  _niah(checks["serve.niah"], c / "serve.niah"), _tools(checks["serve.tools"], c / "serve.tools"),
                  _soak(checks["serve.soak"], c / "serve.soak"),
                  _providers(checks["serve.providers"], c / "serve.providers"),
                  _accuracy(checks["serve.accuracy"], c / "serve.accuracy"))


def load(path: Optional[str] = None) -> Matrix:
    path = path or DEFAULT_FILE
    return parse(read_small(path, MAX_BYTES, "serve matrix", MatrixError), path)


# --- the needle-in-a-haystack prompts --------------------------------------------------------


@dataclass(frozen=True)
class NiahCase:
    """One haystack: the user message, the word hidden in it, where, and the size it was made for."""

    fraction: float
    depth: float
    word: str
    sentences: int
    target_tokens: int
    message: str


def haystack(n: Niah, sentences: int, depth: float, word: str, rng: random.Random) -> str:
    """`sentences` hay sentences drawn by `rng`, the needle after round(depth x sentences) of them, the question."""
    hay = [rng.choice(n.hay) for _ in range(sentences)]
    hay.insert(int(round(depth * sentences)), n.needle.format(word=word))
    return " ".join(hay) + "\n\n" + n.question


def niah_cases(n: Niah, max_model_len: int, count_tokens: Callable[[str], int]) -> List[NiahCase]:
    """The matrix's haystacks for a server of `max_model_len` tokens. `count_tokens(message)` is the prompt's
    length as the server counts it (its chat template applied); the tiny model's training passes its own
    tokenizer, so both build the same prompts. Each case's sentence count is the largest that stays within
    `fraction x max_model_len - max_tokens`, found from two counts and a few checks (a server round trip each)."""
    empty = count_tokens(haystack(n, 0, 0.0, n.words[0], random.Random(0)))
    probe = 64
    per = max(1e-3, (count_tokens(haystack(n, probe, 0.5, n.words[0], random.Random(0))) - empty) / probe)
    out = []
    index = 0
    for fraction in n.context_fractions:
        target = int(fraction * max_model_len) - n.max_tokens
        for depth in n.depths:
            word = n.words[(index * 7 + 3) % len(n.words)]
            sentences = max(1, int((target - empty) / per))
            while True:
                message = haystack(n, sentences, depth, word, random.Random(n.seed * 1000 + index))
                if sentences == 1 or count_tokens(message) <= target:
                    break
                sentences = max(1, int(sentences * 0.97))
            out.append(NiahCase(fraction, depth, word, sentences, target, message))
            index += 1
    return out


def answer_words(n: Niah, text: str) -> Tuple[str, ...]:
    """The needle words an answer names, in the order of the matrix's list."""
    return tuple(w for w in n.words if re.search(rf"\b{w}\b", text, re.IGNORECASE))
