"""Release qualified manifests to a git tag: check, sign, write, tag, upload.

Steps, each a function below:

1. preflight: a valid tag name; an existing tag is refused unless --force
   (nothing is read, signed or written before this).
2. collect + assess: every `build/manifests/<target>.json`; a target is
   withheld, with the reason, when its image is not the one the manifest is
   about, a check failed, or its support level is below --min-level.
3. stage: the exact manifest bytes, `.sig`, Sigstore bundle, `cosign.pub`
   and `release.json` are written to a staging folder beside the release.
4. install: staged files move into `manifests/<tag>/`; files already there
   must be identical (a re-run after an interruption continues), anything
   else is refused unless --force. `release.json` moves last.
5. tag: an annotated tag whose message lists each target's image digest and
   manifest sha256. Last, so a tag exists only for a complete release.
6. upload: `gh release upload` when gh is logged in, else the command is printed.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from qualify import cmd
from qualify.core import manifest as mf
from qualify.core.errors import EngineError, ExternalCommandError, ReleaseError, VerificationError
from qualify.core.fsutil import canonical_json, write_atomic
from qualify.release.verify import ImageResolver, image_digest, match_digest, parse_manifest, target_name
from qualify.signing import formats
from qualify.signing import keys as cosign_keys

INDEX_FILE = "release.json"
PUBLIC_KEY_FILE = "cosign.pub"
DEFAULT_MIN_LEVEL = "unverified"
_TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")

Progress = Callable[[str], None]
SignerFactory = Callable[[], Tuple[Any, Any]]  # -> (signer with sign_file, public key)


def stderr_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def step(progress: Progress, what: str) -> Iterator[None]:
    start = time.monotonic()
    progress(f"- {what} ...")
    yield
    progress(f"  done: {what} ({time.monotonic() - start:.1f} s)")


@dataclass(frozen=True)
class ReleaseOptions:
    tag: str
    repo: Path
    source: Path
    out_root: Path
    min_level: str = DEFAULT_MIN_LEVEL
    force: bool = False
    upload: bool = True

    @property
    def directory(self) -> Path:
        return self.out_root / self.tag


@dataclass(frozen=True)
class Candidate:
    target: str
    path: Path
    data: bytes


@dataclass(frozen=True)
class Withheld:
    target: str
    reason: str


@dataclass(frozen=True)
class Entry:
    target: str
    reference: str
    image_digest: str
    manifest_sha256: str
    support_level: str
    verdict: str

    @property
    def manifest_file(self) -> str:
        return f"{self.target}.json"


@dataclass
class Outcome:
    tag: str
    directory: str
    released: List[Entry] = field(default_factory=list)
    withheld: List[Withheld] = field(default_factory=list)
    written: List[str] = field(default_factory=list)
    unchanged: List[str] = field(default_factory=list)
    tag_object: str = ""
    upload: str = "skipped"
    upload_command: List[str] = field(default_factory=list)

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


# --- 1. preflight -------------------------------------------------------------


def git(repo: Path, *args: str, check: bool = True, input_text: Optional[str] = None) -> cmd.Result:
    return cmd.call(["git", *args], cwd=str(repo), check=check, input_text=input_text, timeout=60)


def git_root(start: Path) -> Path:
    if not Path(start).is_dir():
        raise ReleaseError(f"{start} is not a folder")
    result = git(start, "rev-parse", "--show-toplevel", check=False)
    if result.returncode != 0:
        raise ReleaseError(f"{start} is not in a git work tree", hint="run the release from the repository")
    return Path(result.stdout.strip())


def existing_tag(repo: Path, tag: str) -> Optional[str]:
    result = git(repo, "rev-parse", "-q", "--verify", f"refs/tags/{tag}", check=False)
    return result.stdout.strip() or None


def preflight(opts: ReleaseOptions) -> None:
    if not _TAG_RE.fullmatch(opts.tag) or ".." in opts.tag or opts.tag.endswith((".lock", ".")):
        raise ReleaseError(f"{opts.tag!r} is not a usable tag name (letters, digits, . _ + -)")
    if opts.min_level not in mf.LEVEL_RANK:
        raise ReleaseError(f"--min-level {opts.min_level!r} is not one of {', '.join(mf.LEVEL_RANK)}")
    if git(opts.repo, "rev-parse", "-q", "--verify", "HEAD^{commit}", check=False).returncode != 0:
        raise ReleaseError(f"{opts.repo} has no commit to tag")
    found = existing_tag(opts.repo, opts.tag)
    if found and not opts.force:
        raise ReleaseError(
            f"tag {opts.tag} already exists ({found[:12]}); a release never moves a tag",
            hint="choose a new tag, or pass --force to re-sign, overwrite the assets and move the tag",
        )


# --- 2. collect and assess ----------------------------------------------------


def collect(source: Path) -> List[Candidate]:
    paths = sorted(Path(source).glob("*.json"))
    if not paths:
        raise ReleaseError(f"no manifests in {source}", hint="qualify the targets first: nox -s qualify-<target>")
    return [Candidate(p.stem, p, p.read_bytes()) for p in paths]


def _policy_reason(stmt: Dict[str, Any], target: str, min_level: str) -> Optional[str]:
    pred = mf.predicate(stmt)
    named = target_name(stmt)
    if named and named != target:
        return f"the manifest is for target {named!r}, not {target!r}"
    failing = [str(c.get("id")) for c in mf.failing_checks(stmt)]
    if failing:
        return f"failing checks: {', '.join(failing)}"
    if pred.get("verdict") == "fail":
        return "verdict is fail"
    level = pred.get("support_level")
    if level not in mf.LEVEL_RANK:
        return f"unknown support level {level!r}"
    if mf.LEVEL_RANK[level] < mf.LEVEL_RANK[min_level]:
        return f"support level {level} is below --min-level {min_level}"
    return None


def assess(c: Candidate, min_level: str, resolve: ImageResolver) -> Union[Entry, Withheld]:
    try:
        stmt = parse_manifest(c.data, str(c.path))
    except VerificationError as exc:
        return Withheld(c.target, exc.message)
    reason = _policy_reason(stmt, c.target, min_level)
    if reason:
        return Withheld(c.target, reason)
    pred = mf.predicate(stmt)
    reference = (pred.get("image") or {}).get("reference")
    if not reference:
        return Withheld(c.target, "the manifest records no image reference")
    # The build's tag says what was built last; a manifest of an older build of it is stale.
    built = (pred.get("image") or {}).get("tag") or reference
    try:
        actual = resolve(built)
    except (ExternalCommandError, EngineError) as exc:
        raise ReleaseError(f"cannot resolve image {built} of target {c.target}: {exc.message}",
                           hint="build the image first, or release from the host that built it") from None
    try:
        match_digest(stmt, built, actual)
    except VerificationError as exc:
        return Withheld(c.target, f"{exc.message} (built image {built} resolves to {actual})")
    return Entry(c.target, reference, actual, hashlib.sha256(c.data).hexdigest(), pred["support_level"],
                 pred.get("verdict", ""))


# --- 3. stage -----------------------------------------------------------------


def _reuse_signature(dest: Path, c: Candidate, public_key, staging: Path) -> bool:
    """Keep a signature from an interrupted run when it still verifies.

    cosign's ECDSA signatures are randomised, so re-signing would make a
    re-run's files differ from the first run's for no reason.
    """
    old_manifest = dest / f"{c.target}.json"
    old_sig = formats.signature_path(old_manifest)
    old_bundle = formats.bundle_path(old_manifest)
    if not (old_manifest.is_file() and old_sig.is_file() and old_bundle.is_file()):
        return False
    if old_manifest.read_bytes() != c.data:
        return False
    try:
        sig = formats.decode_signature(old_sig.read_bytes())
    except VerificationError:
        return False
    if not formats.verify_bytes(public_key, c.data, sig):
        return False
    shutil.copyfile(old_sig, formats.signature_path(staging / old_manifest.name))
    shutil.copyfile(old_bundle, formats.bundle_path(staging / old_manifest.name))
    return True


def sign_staged(entry: Entry, c: Candidate, staging: Path, dest: Path, sign, public_key) -> str:
    blob = write_atomic(staging / entry.manifest_file, c.data)
    if _reuse_signature(dest, c, public_key, staging):
        return "kept the existing signature"
    done = sign.sign_file(blob, formats.signature_path(blob), formats.bundle_path(blob))
    sig = formats.decode_signature(done.signature.read_bytes())
    # Whatever signed it, the release only ships what our own verifier accepts.
    if not formats.verify_bytes(public_key, c.data, sig):
        raise ReleaseError(f"{done.signer} made a signature for {entry.target} that does not verify with the key")
    return f"signed with {done.signer}"


def release_index(opts: ReleaseOptions, revision: str, entries: List[Entry], withheld: List[Withheld],
                  public_key) -> Dict[str, Any]:
    def files(e: Entry) -> Dict[str, str]:
        return {"manifest": e.manifest_file, "signature": e.manifest_file + formats.SIGNATURE_SUFFIX,
                "bundle": e.manifest_file + formats.BUNDLE_SUFFIX}

    return {
        "schema_version": 1,
        "tag": opts.tag,
        "source_revision": revision,
        "min_level": opts.min_level,
        "public_key": {"file": PUBLIC_KEY_FILE, "fingerprint": cosign_keys.fingerprint(public_key),
                       "hint": cosign_keys.key_hint(public_key)},
        "targets": [
            {"target": e.target, "image": {"reference": e.reference, "digest": e.image_digest},
             "manifest_sha256": e.manifest_sha256, "support_level": e.support_level, "verdict": e.verdict,
             "files": files(e)}
            for e in entries
        ],
        "withheld": [{"target": w.target, "reason": w.reason} for w in withheld],
    }


# --- 4. install ---------------------------------------------------------------


@dataclass(frozen=True)
class InstallPlan:
    new: List[str]
    same: List[str]
    differ: List[str]
    extra: List[str]  # in the release folder, not in this release


def plan_install(staging: Path, dest: Path) -> InstallPlan:
    staged = sorted(p.name for p in staging.iterdir())
    present = sorted(p.name for p in dest.iterdir()) if dest.is_dir() else []
    new = [n for n in staged if n not in present]
    same = [n for n in staged if n in present and (dest / n).read_bytes() == (staging / n).read_bytes()]
    differ = [n for n in staged if n in present and n not in same]
    extra = [n for n in present if n not in staged]
    return InstallPlan(new, same, differ, extra)


def install(staging: Path, dest: Path, plan: InstallPlan, force: bool) -> List[str]:
    if (plan.differ or plan.extra) and not force:
        raise ReleaseError(
            f"{dest} already holds other files: "
            + "; ".join(filter(None, [plan.differ and f"differ: {', '.join(plan.differ)}",
                                      plan.extra and f"not in this release: {', '.join(plan.extra)}"])),
            hint="pass --force to overwrite them (and move the tag if it exists)",
        )
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, dest)  # one atomic step: the folder appears whole
        return plan.new
    for name in plan.extra:
        (dest / name).unlink()
    moving = [n for n in plan.new + plan.differ if n != INDEX_FILE]
    if INDEX_FILE in plan.new + plan.differ:
        moving.append(INDEX_FILE)  # the index last: present means complete
    for name in moving:
        os.replace(staging / name, dest / name)
    return moving


# --- 5. tag -------------------------------------------------------------------


def tag_message(opts: ReleaseOptions, entries: List[Entry], withheld: List[Withheld], public_key,
                index_sha256: str) -> str:
    rel = opts.directory.relative_to(opts.repo) if opts.directory.is_relative_to(opts.repo) else opts.directory
    lines = [f"Qualification release {opts.tag}", "", "Released targets (image digest, manifest sha256, level):"]
    lines += [f"  {e.target}  {e.image_digest}  manifest sha256:{e.manifest_sha256}  {e.support_level}"
              for e in entries]
    if withheld:
        lines += ["", "Withheld:"] + [f"  {w.target}: {w.reason}" for w in withheld]
    lines += ["", f"Signing key: {cosign_keys.fingerprint(public_key)} ({rel}/{PUBLIC_KEY_FILE})",
              f"Index: {rel}/{INDEX_FILE} sha256:{index_sha256}"]
    return "\n".join(lines) + "\n"


def create_tag(repo: Path, tag: str, message: str, force: bool) -> str:
    git(repo, "tag", "-a", *(["-f"] if force else []), tag, "-F", "-", input_text=message)
    return existing_tag(repo, tag) or ""


# --- 6. upload ----------------------------------------------------------------


def upload_command(opts: ReleaseOptions, files: List[str]) -> List[str]:
    return ["gh", "release", "upload", opts.tag, *files, *(["--clobber"] if opts.force else [])]


def gh_ready(repo: Path) -> bool:
    """gh on PATH and logged in (`gh auth status` exits 0)."""
    if not cmd.which("gh"):
        return False
    return cmd.call(["gh", "auth", "status"], cwd=str(repo), check=False, timeout=60).returncode == 0


def upload(opts: ReleaseOptions, files: List[str], progress: Progress) -> Tuple[str, List[str]]:
    command = upload_command(opts, files)
    if not opts.upload:
        return "skipped (--no-upload)", command
    if not gh_ready(opts.repo):
        progress("gh is not installed or not logged in: the assets are not uploaded")
        return "not uploaded: gh unavailable", command
    try:
        cmd.call(command, cwd=str(opts.repo), echo=True, timeout=600)
    except ExternalCommandError as exc:
        raise ReleaseError(
            f"the release is tagged and written, but the upload failed: {exc.message}",
            hint=f"push the tag (git push origin {opts.tag}), create the GitHub release "
            f"(gh release create {opts.tag} --verify-tag), then run: {cmd.quote(command)}",
        ) from None
    return "uploaded", command


# --- orchestration ------------------------------------------------------------


def _staging_prefix(tag: str) -> str:
    return f".release-{tag}.staging-"


def _remove_stale_staging(parent: Path, tag: str) -> None:
    """Staging folders left by a killed run; they never hold anything released."""
    for stale in glob.glob(str(parent / (glob.escape(_staging_prefix(tag)) + "*"))):
        shutil.rmtree(stale, ignore_errors=True)


def _assess_all(candidates: List[Candidate], opts: ReleaseOptions, resolve: ImageResolver,
                progress: Progress) -> Tuple[List[Entry], List[Withheld]]:
    entries, withheld = [], []
    for c in candidates:
        result = assess(c, opts.min_level, resolve)
        if isinstance(result, Withheld):
            withheld.append(result)
            progress(f"  withheld {c.target}: {result.reason}")
        else:
            entries.append(result)
            progress(f"  {c.target}: {result.image_digest}, level {result.support_level}")
    if not entries:
        raise ReleaseError(f"nothing to release: every target is withheld "
                           f"({'; '.join(f'{w.target}: {w.reason}' for w in withheld)})")
    return entries, withheld


def _stage(opts: ReleaseOptions, staging: Path, entries: List[Entry], by_target: Dict[str, Candidate],
           withheld: List[Withheld], make_signer: SignerFactory, progress: Progress) -> Tuple[Any, str]:
    sign, public_key = make_signer()
    for e in entries:
        how = sign_staged(e, by_target[e.target], staging, opts.directory, sign, public_key)
        progress(f"  {e.target}: {how}")
    write_atomic(staging / PUBLIC_KEY_FILE, cosign_keys.public_key_pem(public_key))
    revision = git(opts.repo, "rev-parse", "HEAD").stdout.strip()
    index = canonical_json(release_index(opts, revision, entries, withheld, public_key))
    write_atomic(staging / INDEX_FILE, index)
    return public_key, hashlib.sha256(index).hexdigest()


def run_release(opts: ReleaseOptions, make_signer: SignerFactory, resolve: ImageResolver = image_digest,
                progress: Progress = stderr_progress) -> Outcome:
    preflight(opts)
    outcome = Outcome(opts.tag, str(opts.directory))
    with step(progress, f"check the manifests in {opts.source}"):
        candidates = collect(opts.source)
        outcome.released, outcome.withheld = _assess_all(candidates, opts, resolve, progress)
    by_target = {c.target: c for c in candidates}
    # Staged beside manifests/, not in it: deploy lists manifests/ for releases,
    # and a half-made folder there must never look like one.
    staging_parent = opts.out_root.parent
    _remove_stale_staging(staging_parent, opts.tag)
    staging = Path(tempfile.mkdtemp(prefix=_staging_prefix(opts.tag), dir=str(staging_parent)))
    try:
        with step(progress, f"sign {len(outcome.released)} manifest(s)"):
            public_key, index_sha = _stage(opts, staging, outcome.released, by_target, outcome.withheld,
                                           make_signer, progress)
        with step(progress, f"write {opts.directory}"):
            plan = plan_install(staging, opts.directory)
            outcome.written = install(staging, opts.directory, plan, opts.force)
            outcome.unchanged = plan.same
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    with step(progress, f"tag {opts.tag}"):
        message = tag_message(opts, outcome.released, outcome.withheld, public_key, index_sha)
        outcome.tag_object = create_tag(opts.repo, opts.tag, message, opts.force)
    files = sorted(str((opts.directory / n).relative_to(opts.repo)) if opts.directory.is_relative_to(opts.repo)
                   else str(opts.directory / n) for n in os.listdir(opts.directory))
    outcome.upload, outcome.upload_command = upload(opts, files, progress)
    return outcome
