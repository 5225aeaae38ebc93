"""Images side by side (`qualify compare M1.json M2.json ...`): which of these should I deploy on this GPU?

One column per manifest, one row per fact: the image, its verdict and level, key package versions, every
check's status, the provider vLLM would select per case, and per serving-path library its class for the
target. Rows whose values differ are marked. Manifests are read once each (bounded, strict JSON) into a
typed `Column`; the table, the markdown (for release notes) and the JSON are all made from those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from qualify.config.imageref import try_parse
from qualify.core import manifest
from qualify.core.errors import ConfigError
from qualify.host.tables import table

KEY_PACKAGES = ("torch", "triton", "vllm", "sglang", "sglang-kernel", "sgl-kernel", "flashinfer-python")
ABSENT = "—"
MARK = "*"


@dataclass(frozen=True)
class Column:
    """What one manifest says about its image, as the comparison needs it."""

    path: str
    target: str
    capability: str
    platform: str
    subject: str  # name@sha256:<hex>
    origin: str  # built | external (manifests from before issue 34 are ours: built)
    profile: str
    verdict: str
    support_level: str
    packages: Mapping[str, str] = field(default_factory=dict)
    checks: Mapping[str, str] = field(default_factory=dict)  # id -> status, in the manifest's order
    providers: Mapping[str, str] = field(default_factory=dict)  # "kind variant" -> selected
    libraries: Mapping[str, str] = field(default_factory=dict)  # serving-path library -> class for the target

    @classmethod
    def read(cls, path: Path) -> Column:
        from qualify.release.standing import standing_of

        m = manifest.Manifest.load(path)
        return cls(
            path=str(path), target=m.target, capability=m.capability, platform=m.platform,
            subject=m.subject, origin=m.origin, profile=m.profile or ABSENT, verdict=m.verdict,
            # in a release folder its verified current level (a promotion lives in the promotion record)
            support_level=standing_of(path, m).level, packages={k: m.packages[k] for k in KEY_PACKAGES if k in m.packages},
            checks={c.id: c.status for c in m.checks},
            # Providers and the census are shown, never decided on: read as written.
            providers=_providers(m.predicate.get("providers")), libraries=_libraries(m.predicate.get("census")))

    @property
    def label(self) -> str:
        ref = try_parse(self.subject)
        if ref is None:
            return self.subject[:40]
        return f"{ref.tagged.rsplit('/', 1)[-1]}@{(ref.digest or '').split(':', 1)[-1][:12]}"


def _providers(entries: Any) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, dict):
            # SGLang's entries beside vLLM's (an image with both): "sglang attention bf16"
            name = " ".join(str(x) for x in (e.get("engine"), e.get("kind"), e.get("variant")) if x)
            chosen = str(e.get("selected") or "none")
            out[name] = chosen + (" (observed)" if e.get("mode") == "observed" else "")
    return out


def _libraries(census: Any) -> Dict[str, str]:
    rows = census.get("libraries") if isinstance(census, dict) else None
    out: Dict[str, str] = {}
    for lib in rows if isinstance(rows, list) else []:
        if isinstance(lib, dict) and lib.get("serving_path"):
            best, worst = lib.get("best") or "none", lib.get("class") or "none"
            out[str(lib.get("short") or lib.get("path"))] = best if best == worst else f"{best} (some units {worst})"
    return out


@dataclass(frozen=True)
class Row:
    section: str  # image | result | package | check | provider | library
    name: str
    values: Tuple[Optional[str], ...]  # one per column; None where the manifest has no such fact

    @property
    def differs(self) -> bool:
        return len(set(self.values)) > 1

    @property
    def title(self) -> str:
        """The row's name for people: checks carry their family in their id, other facts get their section."""
        return f"{self.section} {self.name}" if self.section in ("package", "provider", "library") else self.name

    def to_json(self) -> Dict[str, Any]:
        return {"section": self.section, "name": self.name, "values": list(self.values), "differs": self.differs}


@dataclass(frozen=True)
class Comparison:
    target: str
    capability: str
    columns: Tuple[Column, ...]
    rows: Tuple[Row, ...]

    @property
    def verdicts_differ(self) -> bool:
        return len({c.verdict for c in self.columns}) > 1

    def to_json(self) -> Dict[str, Any]:
        return {"target": self.target, "capability": self.capability, "verdicts_differ": self.verdicts_differ,
                "images": [{"manifest": c.path, "label": c.label, "subject": c.subject, "origin": c.origin}
                           for c in self.columns],
                "rows": [r.to_json() for r in self.rows]}

    def _labels(self) -> List[str]:
        labels = [c.label for c in self.columns]
        return [f"{label} #{i + 1}" if labels.count(label) > 1 else label for i, label in enumerate(labels)]

    def text(self, width: Optional[int] = None) -> str:
        """For people: one column per image; `*` marks a row whose values differ."""
        # The header names each image (repository and digest prefix); the full references are in --json/--markdown.
        rows = [[MARK if r.differs else "", r.title, *(v or ABSENT for v in r.values)] for r in self.rows
                if r.section != "image" or r.name != "image"]
        head = f"{self.target} (capability {self.capability}): {len(self.columns)} images"
        foot = (f"{MARK} the images differ; the verdicts differ" if self.verdicts_differ
                else f"{MARK} the images differ; the verdicts agree")
        return "\n".join([head, table(rows, ["", "", *self._labels()], width), foot])

    def markdown(self) -> str:
        """For release notes: a GitHub table, differing rows in bold."""
        def cell(text: str) -> str:
            return text.replace("|", "\\|")

        lines = [f"**{self.target}** (capability {self.capability})", "",
                 "| | " + " | ".join(f"`{cell(label)}`" for label in self._labels()) + " |",
                 "|---|" + "---|" * len(self.columns)]
        for r in self.rows:
            values = [cell(v or ABSENT) for v in r.values]
            if r.differs:
                lines.append(f"| **{cell(r.title)}** | " + " | ".join(f"**{v}**" for v in values) + " |")
            else:
                lines.append(f"| {cell(r.title)} | " + " | ".join(values) + " |")
        lines += ["", "Rows in bold differ between the images."]
        return "\n".join(lines)


def _union(maps: Sequence[Mapping[str, str]]) -> List[str]:
    """Keys in first-seen order (a check's place in the manifest says which family it belongs to)."""
    seen: Dict[str, None] = {}
    for m in maps:
        for k in m:
            seen.setdefault(k, None)
    return list(seen)


def build_rows(columns: Sequence[Column]) -> Tuple[Row, ...]:
    def row(section: str, name: str, get) -> Row:
        return Row(section, name, tuple(get(c) for c in columns))

    rows = [row("image", "image", lambda c: c.subject), row("image", "origin", lambda c: c.origin),
            row("image", "profile", lambda c: c.profile), row("result", "verdict", lambda c: c.verdict),
            row("result", "support level", lambda c: c.support_level)]
    for section, attr in (("package", "packages"), ("check", "checks"), ("provider", "providers"),
                          ("library", "libraries")):
        maps = [getattr(c, attr) for c in columns]
        keys = [k for k in KEY_PACKAGES if any(k in m for m in maps)] if section == "package" else _union(maps)
        rows += [row(section, key, lambda c, key=key, attr=attr: getattr(c, attr).get(key)) for key in keys]
    return tuple(rows)


def compare(paths: Sequence[Path], target: Optional[str] = None) -> Comparison:
    """Read every manifest and line them up; `target` keeps only the manifests for it."""
    if len(paths) < 2:
        raise ConfigError("compare needs at least two manifests", hint="python -m qualify compare M1.json M2.json ...")
    columns = [Column.read(Path(p)) for p in paths]
    if target is not None:
        kept = [c for c in columns if c.target == target]
        if len(kept) < 2:
            found = ", ".join(f"{c.path}: {c.target}" for c in columns)
            raise ConfigError(f"fewer than two of the manifests are for target {target} ({found})",
                              hint="give at least two manifests qualified for that target")
        columns = kept
    targets = {(c.target, c.capability) for c in columns}
    if len(targets) > 1:
        found = ", ".join(f"{c.path}: {c.target} ({c.capability})" for c in columns)
        raise ConfigError(f"the manifests are for different targets ({found}): a comparison is for one GPU",
                          hint="pass --target TARGET to compare the manifests for one of them")
    (name, capability), = targets
    return Comparison(name, capability, tuple(columns), build_rows(columns))
