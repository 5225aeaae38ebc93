"""The tag message's changelog: targets, digests, levels and verdicts since the previous release,
with `qualify diff` (report.changes) underneath for each changed target."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from qualify import cmd
from qualify.core import manifest as mf
from qualify.core.errors import ReleaseError, VerificationError
from qualify.core.readlimit import strict_json
from qualify.release import report

INDEX_FILE = "release.json"


def _git(opts, *args: str) -> cmd.Result:
    return cmd.call(["git", *args], cwd=str(opts.repo), check=False, timeout=120)


def previous_release(opts) -> Optional[Tuple[str, Dict[str, Any]]]:
    """The newest other tag whose commit holds a release index: (tag, index)."""
    refs = _git(opts, "for-each-ref", "--sort=-creatordate", "--format=%(refname:strip=2)", "refs/tags").stdout
    root = opts.out_root.relative_to(opts.repo).as_posix()
    for tag in refs.split():
        if tag == opts.tag:
            continue
        shown = _git(opts, "show", f"refs/tags/{tag}:{root}/{tag}/{INDEX_FILE}")
        if shown.returncode != 0:
            continue
        try:
            index = strict_json(shown.stdout, f"{tag}:{root}/{tag}/{INDEX_FILE}", ReleaseError)
        except ReleaseError:
            continue
        if isinstance(index, dict):
            return tag, index
    return None


def _old_manifest(opts, tag: str, target: str) -> Optional[Dict[str, Any]]:
    root = opts.out_root.relative_to(opts.repo).as_posix()
    shown = _git(opts, "show", f"refs/tags/{tag}:{root}/{tag}/{target}.json")
    if shown.returncode != 0:
        return None
    try:
        return mf.parse(shown.stdout.encode("utf-8"), f"{tag}:{target}.json")
    except VerificationError:
        return None


def changelog(opts, entries: Sequence[Any], manifests: Mapping[str, bytes],
              max_lines: int = 4) -> List[str]:
    """Targets, digests, levels and verdicts since the previous release (`qualify diff` underneath)."""
    previous = previous_release(opts)
    if previous is None:
        return ["Changes: first release"]
    tag, index = previous
    old = {t.get("target"): t for t in index.get("targets") or [] if isinstance(t, dict)}
    lines = [f"Changes since {tag}:"]
    for e in entries:
        before = old.pop(e.target, None)
        if before is None:
            lines.append(f"  + {e.target}: new ({e.image_digest}, {e.support_level}, {e.verdict})")
            continue
        was = ((before.get("image") or {}).get("digest"), before.get("support_level"), before.get("verdict"))
        if was == (e.image_digest, e.support_level, e.verdict) and before.get("manifest_sha256") == e.manifest_sha256:
            lines.append(f"  = {e.target}: unchanged")
            continue
        parts = [f"{what} {a} -> {b}" for what, a, b in zip(("digest", "level", "verdict"), was,
                                                           (e.image_digest, e.support_level, e.verdict)) if a != b]
        lines.append(f"  ~ {e.target}: " + ("; ".join(parts) or "manifest changed"))
        old_stmt = _old_manifest(opts, tag, e.target)
        if old_stmt is not None:
            changes = [c for c in report.diff(old_stmt, mf.parse(manifests[e.target], e.target))
                       if not c.startswith(("verdict:", "support_level:", "image:"))]  # in the line above
            lines += [f"      {c}" for c in changes[:max_lines]]
            if len(changes) > max_lines:
                lines.append(f"      ... {len(changes) - max_lines} more (qualify diff)")
    lines += [f"  - {name}: no longer released" for name in old]
    return lines
