"""The level `show` and `compare` print for a manifest: in a release folder, its verified target's current
level (from release/v3 the manifest keeps the released level: a promotion is in the signed record only).

Light on purpose: `show` runs on a bare Python (the GPU host's, scripts/gpu-evidence.sh), so the verifier (and
cryptography) is imported late, and where it cannot be the manifest's own level is shown, saying why."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

from qualify.core import manifest as mf


@dataclass(frozen=True)
class Standing:
    """The current level of the manifest's verified release folder (`VerifiedTarget.current`) and the promotion
    record behind it, else the manifest's own, with why."""

    level: str
    promotion: Optional[Dict[str, Any]] = None  # the current promotion record's JSON (level, passes, evidence)
    note: str = ""  # why the manifest's own level is shown (a folder that does not verify)


def standing_of(path: Path, m: mf.Manifest) -> Standing:
    """The folder is verified with its own key (trust on first use): this is shown, never decided on;
    `verify --key` decides."""
    name = Path(path).name
    if not name.endswith(".json") or not mf.TARGET_NAME.fullmatch(name[:-len(".json")]):
        return Standing(m.support_level)
    try:
        from qualify.trust import folder as release_folder  # the verifier (and cryptography): only here
    except ModuleNotFoundError as exc:  # a bare Python (the GPU host's): it cannot verify, so vouches for nothing
        if (exc.name or "").startswith("qualify"):
            raise
        return Standing(m.support_level, note=f"the manifest's own level: this Python lacks {exc.name}, so no "
                        "release folder around it is verified")

    if not release_folder.in_release_folder(Path(path)):
        return Standing(m.support_level)
    from qualify.core.errors import QualifyError

    try:
        target = release_folder.read_release(Path(path).parent).target(name[:-len(".json")])
    except QualifyError as exc:
        return Standing(m.support_level, note=f"the manifest's own level: its release folder does not verify "
                        f"({exc.message})")
    promotion = target.promotion.as_json() if target.promotion else None
    return Standing(target.current.level, promotion)
