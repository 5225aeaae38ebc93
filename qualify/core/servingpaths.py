"""The manifest's serving paths (issue 50): for each quantized or special path a model can take (NVFP4 MoE,
FP8 block-scaled linear, FP8 KV cache, ...), the provider vLLM would pick on the target, whether that
provider's kernel families carry code that runs there, and what vLLM falls back to.

The probe writes `predicate.serving_paths` (probe/providers/paths.py); the deploy reads it through
`ServingPaths.of(manifest)` from the verified manifest, maps the model's config.json to the paths it will
run (deploy/modelpaths.py) and refuses a model whose path has no kernels for this GPU. `show` and `compare`
print it. Values are kept as written: an unknown verdict is `problems`, never read as a better one.

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from qualify.core.enums import ValueEnum
from qualify.core.record import record

# Every path the provider rules describe, in the order the manifest lists them; the titles are for people.
TITLES: Dict[str, str] = {
    "attention.bf16": "bf16 attention",
    "attention.mla": "MLA attention (DeepSeek-style)",
    "attention.fp8-kv": "attention over an FP8 KV cache",
    "moe.bf16": "bf16 MoE",
    "moe.fp8": "FP8 MoE (per-tensor scales)",
    "moe.fp8-block": "FP8 MoE (128x128 block scales, DeepSeek-style)",
    "moe.nvfp4": "NVFP4 MoE",
    "moe.mxfp4": "MXFP4 MoE (gpt-oss)",
    "linear.fp8": "FP8 linear (per-tensor weights, per-token activations)",
    "linear.fp8-block": "FP8 linear (128x128 block scales, DeepSeek-style)",
    "linear.nvfp4": "NVFP4 linear",
    "linear.w4a16": "int4 weight-only linear (GPTQ/AWQ)",
}
PATHS: Tuple[str, ...] = tuple(TITLES)


class PathVerdict(ValueEnum):
    PRESENT = "present"  # vLLM's pick has kernels that run on the target
    FALLBACK = "fallback"  # vLLM's pick runs, and is itself a slower fallback (weight-only, emulation)
    MISSING = "missing"  # vLLM's pick has no kernels for the target: it fails at the first launch
    NONE = "none"  # no provider of the path can run on the target
    UNKNOWN = "unknown"  # the families could not be read (a library the census cannot read)

    @property
    def serves(self) -> bool:
        """A model on this path starts and runs (maybe slower)."""
        return self in (PathVerdict.PRESENT, PathVerdict.FALLBACK)


@record(frozen=True)
class Family:
    """One kernel family of a provider: a set of kernels of one library, found by their mangled names."""

    name: str
    library: str  # the library's path under site-packages
    present: Optional[bool]  # None: unknown (entries that could not be read)
    code: Tuple[str, ...]  # the entries that carry it and run on the target (sm_120f, compute_90 (PTX JIT))
    what: str = ""


@record(frozen=True)
class Fallback:
    provider: str
    cli: str  # the override that selects it
    note: str  # why it is slower ("" when not known to be)


@record(frozen=True)
class ServingPath:
    path: str
    provider: Optional[str]  # vLLM's own pick on the target (None: vLLM has none)
    runs: Optional[str]  # the first provider whose kernels run (None: none)
    families: Tuple[Family, ...]  # vLLM's pick's families
    fallback: Optional[Fallback]  # what runs where vLLM's pick does not, or is slow
    verdict: str  # a PathVerdict value, as written
    reason: str
    engine: str = "vllm"  # whose rules judged it: vllm, or sglang (then `provider` is SGLang's pick)

    @property
    def title(self) -> str:
        return TITLES.get(self.path, self.path)

    @property
    def known(self) -> bool:
        return self.verdict in PathVerdict.values()

    @property
    def serves(self) -> bool:
        return self.known and PathVerdict(self.verdict).serves

    def line(self) -> str:
        """For people: "moe.nvfp4  NVFP4 MoE: FLASHINFER_CUTLASS, kernels present"."""
        head = f"{self.title}: {self.provider or 'no provider'}"
        if self.verdict == PathVerdict.PRESENT:
            return f"{head}, kernels present"
        if self.verdict == PathVerdict.FALLBACK:
            return f"{head} (a slower fallback{': ' + self.fallback.note if self.fallback and self.fallback.note else ''})"
        if self.verdict == PathVerdict.MISSING:
            then = f"falls back to {self.fallback.provider} ({self.fallback.cli})" if self.fallback else "nothing else runs"
            return f"{head}, kernels missing: {then}"
        if self.verdict == PathVerdict.NONE:
            return f"{head}: no provider can run"
        return f"{head}: kernels unknown ({self.reason})"

    def to_json(self) -> Dict[str, Any]:
        return {"path": self.path, "provider": self.provider, "runs": self.runs,
                "families": [{"name": f.name, "library": f.library, "present": f.present, "code": list(f.code),
                              **({"what": f.what} if f.what else {})} for f in self.families],
                "fallback": None if self.fallback is None else
                {"provider": self.fallback.provider, "cli": self.fallback.cli, "note": self.fallback.note},
                "verdict": self.verdict, "reason": self.reason,
                **({"engine": self.engine} if self.engine != "vllm" else {})}


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _optional(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def from_json(item: Mapping[str, Any]) -> ServingPath:
    families = tuple(Family(_text(f.get("name")), _text(f.get("library")),
                            f.get("present") if isinstance(f.get("present"), bool) else None,
                            tuple(_text(c) for c in (f.get("code") or []) if isinstance(c, str)), _text(f.get("what")))
                     for f in (item.get("families") or []) if isinstance(f, dict))
    fb = item.get("fallback")
    fallback = Fallback(_text(fb.get("provider")), _text(fb.get("cli")), _text(fb.get("note"))) \
        if isinstance(fb, dict) else None
    return ServingPath(_text(item.get("path")), _optional(item.get("provider")), _optional(item.get("runs")),
                       families, fallback, _text(item.get("verdict")), _text(item.get("reason")),
                       _text(item.get("engine")) or "vllm")


@record(frozen=True)
class ServingPaths:
    """predicate.serving_paths, typed. `recorded` is False for a manifest from before issue 50."""

    recorded: bool
    paths: Tuple[ServingPath, ...]
    problems: Tuple[str, ...]

    @classmethod
    def of_predicate(cls, predicate: Mapping[str, Any]) -> ServingPaths:
        raw = predicate.get("serving_paths")
        if raw is None:
            return cls(False, (), ())
        if not isinstance(raw, list):
            return cls(True, (), ("predicate.serving_paths is not a list",))
        paths = tuple(from_json(x) for x in raw if isinstance(x, dict))
        problems = [f"serving path {p.path!r}: verdict {p.verdict!r} is not one of {', '.join(PathVerdict.values())}"
                    for p in paths if not p.known]
        if len(paths) != len(raw):
            problems.append("predicate.serving_paths holds an item that is not an object")
        return cls(True, paths, tuple(problems))

    @classmethod
    def of(cls, manifest) -> ServingPaths:
        """From a core.manifest.Manifest."""
        return cls.of_predicate(manifest.predicate)

    def get(self, path: str, engine: str = "vllm") -> Optional[ServingPath]:
        """The path as `engine`'s rules judged it (vLLM's by default: the deploy serves vLLM)."""
        return next((p for p in self.paths if p.path == path and p.engine == engine), None)
