"""What a release tells people: the annotated tag's message and a dry run's account of what it would do."""

from __future__ import annotations

from typing import List, Sequence

from qualify.host import cmd
from qualify.release import records as rec
from qualify.release.gitops import existing_tag
from qualify.release.model import ReleasedTarget, ReleaseOptions, ReleaseResult, Withheld

INDEX_FILE = rec.INDEX_FILE
PUBLIC_KEY_FILE = rec.PUBLIC_KEY_FILE


def tag_message(opts: ReleaseOptions, entries: List[ReleasedTarget], withheld: List[Withheld], public_key,
                index_sha256: str, changes: Sequence[str] = ()) -> str:
    rel = opts.folder
    lines = [f"Qualification release {opts.tag}", "", "Released targets (image digest, manifest sha256, level):"]
    lines += [f"  {e.target}  {e.digest}  manifest sha256:{e.manifest_sha256}  {e.support_level}"
              for e in entries]
    if withheld:
        lines += ["", "Withheld (--allow-partial):"] + [f"  {w.target}: {w.reason}" for w in withheld]
    if changes:
        lines += ["", *changes]
    key = public_key.fingerprint if public_key is not None else "<the signing key's fingerprint>"
    lines += ["", f"Signing key: {key} ({rel}/{PUBLIC_KEY_FILE})",
              f"Index: {rel}/{INDEX_FILE} sha256:{index_sha256}"]
    return "\n".join(lines) + "\n"


def dry_run_lines(o: ReleaseResult, opts: ReleaseOptions) -> List[str]:
    """What a dry run would do, for people."""
    lines = [f"Dry run of release {o.tag} (the key and its password checked; nothing signed, written, tagged, pushed "
             "or uploaded)", f"It would be sequence {o.sequence}" + (f", after {o.predecessor}" if o.predecessor else
                                                                       ", the first release of this key"),
             "", "Would sign:"]
    lines += [f"  {opts.folder}/{e.manifest_file}  ({e.target}, {e.digest}, {e.support_level})"
              for e in o.released]
    lines += ["", f"Would write {opts.folder}/:"] + [f"  {n}" for n in o.files]
    lines += ["", f"Would commit them on top of {o.source_revision} and tag it {o.tag}"
              + (" (moving the existing tag: --force)" if existing_tag(opts.repo, o.tag) else "") + " with:"]
    lines += [f"  | {line}" for line in o.tag_message.rstrip("\n").splitlines()]
    lines += ["", "Would push:", f"  {cmd.quote(o.push_command)}", "Would upload (creating the GitHub release if missing):",
              f"  {cmd.quote(o.upload_command)}"]
    return lines

