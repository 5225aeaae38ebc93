"""What a release signs besides the manifests: the list of its files and release.json (the index), with
the promotion rule and the deploy facts of its policy taken from the targets file at release time."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from qualify.config import targets
from qualify.core.errors import ReleaseError
from qualify.release.model import ReleasedTarget, ReleaseOptions, Withheld
from qualify.signing import formats
from qualify.signing import keys as cosign_keys
from qualify.trust import deployfacts, policy
from qualify.trust import records as rec
from qualify.trust.folder import released_files
from qualify.trust.policy import ReleasePolicy
from qualify.trust.verify import TrustedKey

INDEX_FILE = rec.INDEX_FILE
PUBLIC_KEY_FILE = rec.PUBLIC_KEY_FILE


def release_files(entries: Sequence[ReleasedTarget]) -> List[str]:
    """Every file the release writes into its folder (release.json lists them all but its own three)."""
    return sorted([PUBLIC_KEY_FILE, INDEX_FILE, INDEX_FILE + formats.SIGNATURE_SUFFIX,
                   INDEX_FILE + formats.BUNDLE_SUFFIX] + [f for e in entries for f in e.files])


def release_policy(opts: ReleaseOptions, entries: Sequence[ReleasedTarget]) -> ReleasePolicy:
    """The promotion rule this release signs: the targets file's pass count, all-reduce floors ([allreduce],
    as policy.AllReduceFloor entries: promote and the deploy apply only these) and PTX JIT table ([ptx_jit],
    issue 51: the deploy's PTX gate reads only this copy), and per target the intended
    level its manifest recorded (else the targets file's, else experimental). And the target facts the deploy
    uses (issue 52, trust/deployfacts.py): each released target's and every cpu target's, with [drivers]; the
    deploy reads them only from here, never a deploy host's targets file."""
    tf = targets.load(opts.targets_file) if opts.targets_file else targets.load()
    unknown = sorted(e.target for e in entries if e.target not in tf.targets)
    if unknown:
        raise ReleaseError(f"{tf.path} has no target {', '.join(unknown)}, so the release cannot sign what the "
                           "deploy needs of it (its capability, driver floor, memory, user)",
                           hint="release from the checkout whose targets file built these manifests")
    chosen = [tf.get(e.target) for e in entries] + [t for t in tf.cpu_targets() if t.name not in {e.target for e in entries}]
    return policy.for_release({e.target: e.intended_level or tf.get(e.target).support_level for e in entries},
                              tf.promotion_passes, tf.allreduce_floors, tf.promotion_level_checks, tf.ptx_jit,
                              deployfacts.of_targets(chosen, tf.drivers))


def release_index(opts: ReleaseOptions, revision: str, entries: List[ReleasedTarget], withheld: List[Withheld],
                  key: TrustedKey, files: Dict[str, bytes], dirty: Sequence[str], sequence: int,
                  predecessor: Optional[rec.Predecessor], time_: str) -> rec.ReleaseIndex:
    return rec.ReleaseIndex(policy=release_policy(opts, entries),
        tag=opts.tag, sequence=sequence, time=time_, source_revision=revision, min_level=opts.min_level,
        key_fingerprint=key.fingerprint, key_hint=cosign_keys.key_hint(key.key),
        targets=tuple(e.entry() for e in entries), files=released_files(files), predecessor=predecessor,
        withheld=tuple((w.target, w.reason) for w in withheld), dirty_paths=tuple(dirty),
        dirty_allowed=opts.allow_dirty)
