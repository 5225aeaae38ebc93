"""Verify a signed manifest: signature, image digest, verdict, in that order.

Each failure raises VerificationError whose message starts with the check that
failed ("signature check failed", "image digest check failed", "verdict check
failed"), so start.sh and people can tell which. The manifest's bytes are read
once: the bytes whose signature is checked are the bytes that are parsed. A
manifest in a release folder (a folder named as a version tag, or holding any
file a release writes: folder.in_release_folder) is always verified as part of
its release, through the one reader (folder.read_release), whatever
--signature or --bundle say, and also when its release.json is gone (which is
then the refusal); a manifest on its own against its `.sig` and, when there
is one, its bundle (both are checked).

Key-pair signatures are checked in-process (works without cosign); keyless
ones need cosign, because they need Sigstore's trust root and transparency log.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from qualify.config.imageref import ImageRef, ImageRefError
from qualify.core import manifest as mf
from qualify.core.errors import ConfigError, ExternalCommandError, VerificationError
from qualify.core.readlimit import BUNDLE_LIMIT, SIGNATURE_LIMIT, read_small
from qualify.signing import formats
from qualify.trust import folder as release_folder
from qualify.trust.folder import read_release
from qualify.trust.records import HOSTS_FILE
from qualify.trust.verify import EVIDENCE, KeyAnchor, TrustedKey, check_bundle, verify_blob

ImageResolver = Callable[[str], str]


def image_digest(ref: str) -> str:
    """`sha256:...` of the local image that `ref` names (the engine's repo digest, else its id)."""
    from qualify.host.engine import Engine  # python-on-whales: host side only

    try:
        return Engine("docker").repo_digest(ref)
    except ImageRefError as exc:
        raise ConfigError(str(exc)) from None


def registry_digest(ref: str) -> Optional[str]:
    """The digest the registry serves for `name@sha256:...`, asked by that digest (a tag can move,
    a digest cannot); None when the registry no longer has it. Loopback registries only."""
    from qualify.host.registry import Registry  # host side only

    parsed = _parse_ref(ref)
    host, _, repository = parsed.name.partition("/")
    if not parsed.digest or not repository or not (":" in host or "." in host or host == "localhost"):
        raise ConfigError(f"{ref}: not a registry/repository@sha256:... reference")
    if not host.startswith(("127.0.0.1:", "localhost:", "[::1]:")):
        raise ConfigError(f"{ref}: only a loopback registry can be checked here (HTTP on 127.0.0.1)",
                          hint="release from the host whose registry holds the images")
    return Registry(host).manifest_digest(repository, parsed.digest)


def _parse_ref(ref: str) -> ImageRef:
    try:
        return ImageRef.parse(ref)
    except ImageRefError as exc:
        raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class VerifyOptions:
    manifest: Path
    key: Optional[Path] = None
    identity: Optional[str] = None
    issuer: Optional[str] = None
    signature: Optional[Path] = None
    bundle: Optional[Path] = None
    image: Optional[str] = None
    require_pass: bool = False
    hosts: Optional[Path] = None  # a release folder's enrolled hosts (default: its parent's hosts.json)
    hosts_history: Optional[Path] = None  # earlier versions of it, where git and hosts.<n>.json do not have them

    def validate(self) -> None:
        if self.key is None and not (self.identity and self.issuer):
            raise ConfigError("say whose signature to trust: --key PUB, or --identity ID with --issuer URL")
        if self.key is not None and (self.identity or self.issuer):
            raise ConfigError("--key and --identity/--issuer are exclusive")


@dataclass(frozen=True)
class VerifyResult:
    manifest: str
    target: Optional[str]
    subject_digest: str
    signature: str  # how it was verified
    image: Optional[str]  # the --image checked, if any
    image_digest: Optional[str]
    verdict: Optional[str]
    support_level: Optional[str]
    failing_checks: List[str] = field(default_factory=list)
    release: str = ""  # the release it was verified as part of ("" for a manifest on its own)
    release_sequence: int = 0
    promotion_sequence: int = 0

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def _signature_and_bundle(opts: VerifyOptions) -> tuple:
    """(the `.sig` bytes or None, the bundle bytes or None): both are read when both are there."""
    sig_file = opts.signature or formats.signature_path(opts.manifest)
    bundle_file = opts.bundle or formats.bundle_path(opts.manifest)
    sig = read_small(sig_file, SIGNATURE_LIMIT, "signature", VerificationError) if sig_file.exists() else None
    bundle = read_small(bundle_file, BUNDLE_LIMIT, "bundle", VerificationError) if bundle_file.exists() else None
    if sig is None and bundle is None:
        raise VerificationError(f"signature check failed: no signature for {opts.manifest}: "
                                f"neither {sig_file} nor {bundle_file} exists")
    return sig, bundle


def check_signature(opts: VerifyOptions, data: bytes, key: Optional[TrustedKey] = None) -> str:
    if opts.key is None:
        return _check_keyless(opts, data)
    key = key or TrustedKey.read(opts.key)
    try:
        sig, bundle = _signature_and_bundle(opts)
        if sig is not None:
            verify_blob(key, data, sig, bundle, str(opts.manifest))
        else:
            check_bundle(key, data, bundle, str(opts.bundle or formats.bundle_path(opts.manifest)))
    except VerificationError as exc:
        if exc.message.startswith("signature check failed"):
            raise
        raise VerificationError(f"signature check failed: {exc.message}", hint=exc.hint) from None
    return f"key {key.fingerprint}"


def _check_keyless(opts: VerifyOptions, data: bytes) -> str:
    from qualify.signing import cosign

    bundle_file = opts.bundle or formats.bundle_path(opts.manifest)
    if not bundle_file.exists():
        raise VerificationError(f"signature check failed: keyless verification needs the bundle {bundle_file}")
    sig_file = opts.signature or formats.signature_path(opts.manifest)
    with tempfile.TemporaryDirectory(prefix="qualify-verify-") as tmp:
        # cosign checks a private copy of the bytes we parse afterwards, not a path that could change.
        blob = Path(tmp) / opts.manifest.name
        blob.write_bytes(data)
        raw = read_small(bundle_file, BUNDLE_LIMIT, "bundle", VerificationError)
        private_bundle = Path(tmp) / "bundle.json"
        private_bundle.write_bytes(raw)
        req = cosign.VerifyBlobRequest(
            blob=blob,
            signature=sig_file if sig_file.exists() else None,
            bundle=private_bundle,
            bundle_is_sigstore=formats.is_sigstore_bundle(raw),
            identity=opts.identity,
            issuer=opts.issuer,
        )
        how = cosign.verify_blob(req)
    return f"{how}, identity {opts.identity} from {opts.issuer}"


def match_digest(manifest: mf.Manifest, image: str, actual: str) -> str:
    """`actual` (the digest `image` has), when it is the manifest's subject."""
    if actual != manifest.digest:
        raise VerificationError(f"image digest check failed: the manifest is for {manifest.digest}, but {image} is "
                                f"{actual}", hint="deploy the image the manifest was qualified for, or qualify this one")
    return actual


def check_image(manifest: mf.Manifest, image: Optional[str], resolve: ImageResolver) -> Optional[str]:
    """The digest `image` has (a `name@sha256:` reference is taken as written), checked against the subject."""
    if image is None:
        return None
    actual = _parse_ref(image).digest
    if actual is None:
        try:
            actual = resolve(image)
        except ExternalCommandError as exc:
            raise VerificationError(f"image digest check failed: cannot resolve {image}: {exc.message}",
                                    hint="pull or build the image first, or pass it as name@sha256:...") from None
    return match_digest(manifest, image, actual)


def check_verdict(manifest: mf.Manifest, require_pass: bool) -> List[str]:
    """Failing checks; with require_pass, a refusal unless every value is a known one and none fails
    (an allow-list: an unknown verdict or status is damage, never a pass)."""
    if require_pass and manifest.problems:
        raise VerificationError(f"verdict check failed: {'; '.join(manifest.problems)}",
                                hint="the manifest is damaged or not made by this toolkit; re-qualify the image")
    if require_pass and not manifest.passes:
        raise VerificationError(f"verdict check failed: {manifest.verdict_refusal()}")
    return list(manifest.failing)


def in_release_folder(manifest: Path) -> bool:
    """A file in a release folder is verified as part of its release (index, tag, binding, ledger)."""
    return release_folder.in_release_folder(manifest)


def _own_signatures_only(opts: VerifyOptions) -> None:
    folder = opts.manifest.parent
    for flag, given, own in (("--signature", opts.signature, formats.signature_path(opts.manifest)),
                             ("--bundle", opts.bundle, formats.bundle_path(opts.manifest))):
        if given is not None and Path(given).absolute() != own.absolute():
            raise VerificationError(f"signature check failed: {opts.manifest} is in the release folder {folder}, "
                                    f"so it is verified as part of that release with the folder's own signatures, "
                                    f"not {flag} {given}", hint="copy the manifest out of the release folder to "
                                    "verify it on its own")
    if opts.key is None:
        raise VerificationError(f"signature check failed: {opts.manifest} is in the release folder {folder}, whose "
                                "files are signed with the release key: pass --key with the release's cosign.pub")


def _from_release(opts: VerifyOptions) -> tuple:
    _own_signatures_only(opts)
    key = TrustedKey.read(opts.key, VerificationError)
    name = opts.manifest.name
    if not name.endswith(".json") or not mf.TARGET_NAME.fullmatch(name[:-len(".json")]):
        raise VerificationError(f"{opts.manifest} is in the release folder {opts.manifest.parent} but is no target's "
                                "manifest (<target>.json): a release's other files are verified through it")
    release = read_release(opts.manifest.parent, KeyAnchor(trusted=key), through=EVIDENCE)
    target = release.target(name[:-len(".json")])
    # as the recipe does (VERIFYING.md steps 4, 7, 8): the hosts chain, and who signed each accepted run
    unchecked = release_folder.check_release_hosts(
        release, opts.hosts or opts.manifest.parent.parent / HOSTS_FILE, opts.hosts_history)
    from qualify.core.errors import QualifyError
    from qualify.release import promote

    for t in release.targets:  # each accepted run parsed and bound as promote reads it (serving: one run, once)
        if t.promotion:
            try:
                promote.accepted(release, t, release.rule(t.target))
            except QualifyError as exc:
                raise VerificationError(f"signature check failed: {exc.message}", hint=exc.hint) from None
    if unchecked:
        raise VerificationError(f"signature check failed: not everything could be checked here: {unchecked[0]}"
                                + (f" (and {len(unchecked) - 1} more)" if len(unchecked) > 1 else ""),
                                hint="verify keyless evidence with cosign verify-blob")
    how = f"key {key.fingerprint}; release {release.tag} (sequence {release.index.sequence}" + (
        f", promotion {target.promotion_sequence}" if target.promotion else "") + ")"
    return target.manifest, how, release, target


def verify(opts: VerifyOptions, resolve: ImageResolver = image_digest) -> VerifyResult:
    opts.validate()
    release = target = None
    if in_release_folder(opts.manifest):
        manifest, how, release, target = _from_release(opts)
    else:
        data = mf.read(opts.manifest)
        how = check_signature(opts, data)
        manifest = mf.Manifest.parse(data, str(opts.manifest))
    actual = check_image(manifest, opts.image, resolve)
    failing = check_verdict(manifest, opts.require_pass)
    return VerifyResult(
        manifest=str(opts.manifest), target=manifest.target, subject_digest=manifest.digest, signature=how,
        image=opts.image, image_digest=actual, verdict=manifest.verdict or None,
        # the verified target's current level (its promotion record's, else release.json's), never a release/v3
        # manifest's own, which stays the released level
        support_level=(target.current.level if target else manifest.support_level) or None, failing_checks=failing,
        release=release.tag if release else "", release_sequence=release.index.sequence if release else 0,
        promotion_sequence=target.promotion_sequence if target else 0)
