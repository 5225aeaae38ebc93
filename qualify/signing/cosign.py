"""cosign through subprocess: version detection and the sign-blob / verify-blob argument lists.

The flag sets of cosign v2 and v3 differ (read in sigstore/cosign at v2.0.0,
v2.4.0, v2.6.1, v3.0.0 and v3.1.2: cmd/cosign/cli/options/signblob.go,
verify.go, cmd/cosign/cli/sign/sign_blob.go, signcommon/common.go):

- v2: `--new-bundle-format` (from v2.4.0) defaults to false and `--bundle`
  writes cosign's legacy JSON; `--output-signature` writes base64 of the DER
  signature; `--use-signing-config` (from v2.6.0) defaults to false.
- v3: `--new-bundle-format` and `--use-signing-config` default to true;
  `--bundle` is then required and is the only output (`--output-signature`
  is ignored with a warning); `--tlog-upload=false` is refused unless
  `--use-signing-config=false` is given too.
- verify-blob in v3 refuses `--signature` together with a Sigstore bundle;
  with a key and no log entry it needs `--insecure-ignore-tlog=true`.

The key password reaches cosign only through COSIGN_PASSWORD in its
environment, never its arguments; cmd.call closes cosign's stdin, so cosign
never waits on a prompt. A keyless identity token comes from SIGSTORE_ID_TOKEN
(which cosign reads itself) or a file whose path is passed to
`--identity-token` (cosign accepts a token or a path; we pass only paths).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from qualify.core.errors import ConfigError, ExternalCommandError, VerificationError
from qualify.core.fsutil import write_atomic
from qualify.host import cmd
from qualify.signing import formats

PROGRAM = "cosign"
SUPPORTED_MAJORS = (2, 3)
# v2.4.0 added --new-bundle-format to sign-blob and verify-blob.
NEW_BUNDLE_SINCE = (2, 4, 0)
SIGN_TIMEOUT_S = 300.0  # keyless signing talks to Fulcio and Rekor

_VERSION_RE = re.compile(r"""GitVersion["']?\s*[:=]\s*["']?v?(\d+)\.(\d+)\.(\d+)""")


@dataclass(frozen=True, order=True)
class CosignVersion:
    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, output: str) -> CosignVersion:
        """From `cosign version` text (`GitVersion:    v2.2.4`) or its --json form."""
        m = _VERSION_RE.search(output)
        if not m:
            raise ConfigError(
                "cannot tell which cosign this is: `cosign version` printed no GitVersion vX.Y.Z",
                hint="a cosign built outside git reports a blank version; install a release build, "
                "or use --signer builtin",
            )
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3)))

    @property
    def triple(self) -> tuple:
        return (self.major, self.minor, self.patch)

    def __str__(self) -> str:
        return f"v{self.major}.{self.minor}.{self.patch}"

    def require_supported(self) -> None:
        if self.major not in SUPPORTED_MAJORS:
            raise ConfigError(
                f"cosign {self} is not supported: its sign-blob/verify-blob flags are known for v2 and v3 only",
                hint="use --signer builtin for key-pair signing, or install cosign v2 or v3",
            )


def detect_version(program: str = PROGRAM) -> CosignVersion:
    result = cmd.call([program, "version"], timeout=30)
    version = CosignVersion.parse(result.stdout + "\n" + result.stderr)
    version.require_supported()
    return version


@dataclass(frozen=True)
class SignBlobRequest:
    blob: Path
    signature_out: Path
    bundle_out: Path
    key: Optional[Path] = None  # None means keyless
    identity_token_file: Optional[Path] = None


@dataclass(frozen=True)
class VerifyBlobRequest:
    blob: Path
    signature: Optional[Path] = None
    bundle: Optional[Path] = None
    bundle_is_sigstore: bool = True
    key: Optional[Path] = None
    identity: Optional[str] = None
    issuer: Optional[str] = None


def sign_blob_args(version: CosignVersion, req: SignBlobRequest, program: str = PROGRAM) -> List[str]:
    """The sign-blob argument list for this cosign version (no secrets in it)."""
    version.require_supported()
    args = [program, "sign-blob", "--yes"]
    if req.key is not None:
        args += ["--key", str(req.key)]
        if version.major >= 3:
            # Offline: no TUF signing config, no Rekor upload; the bundle is the output.
            args += ["--use-signing-config=false", "--tlog-upload=false", "--bundle", str(req.bundle_out)]
        else:
            args += ["--tlog-upload=false", "--output-signature", str(req.signature_out)]
            if version.triple >= NEW_BUNDLE_SINCE:
                args += ["--new-bundle-format", "--bundle", str(req.bundle_out)]
        return args + [str(req.blob)]
    if req.identity_token_file is not None:
        args += ["--identity-token", str(req.identity_token_file)]
    if version.major >= 3:
        args += ["--bundle", str(req.bundle_out)]
    else:
        args += ["--output-signature", str(req.signature_out), "--bundle", str(req.bundle_out)]
        if version.triple >= NEW_BUNDLE_SINCE:
            args += ["--new-bundle-format"]
    return args + [str(req.blob)]


def verify_blob_args(version: CosignVersion, req: VerifyBlobRequest, program: str = PROGRAM) -> List[str]:
    version.require_supported()
    args = [program, "verify-blob"]
    if req.key is not None:
        args += ["--key", str(req.key)]
        if version.major >= 3 and req.bundle is not None and req.bundle_is_sigstore:
            args += ["--bundle", str(req.bundle)]
        elif req.signature is not None:
            args += ["--signature", str(req.signature)]
        else:
            raise ConfigError("key-pair verification with cosign v2 needs the .sig file")
        return args + ["--insecure-ignore-tlog=true", str(req.blob)]
    if not (req.identity and req.issuer):
        raise ConfigError("keyless verification needs both --identity and --issuer")
    if req.bundle is None:
        raise ConfigError("keyless verification needs the bundle (it carries the certificate and log entry)")
    args += ["--certificate-identity", req.identity, "--certificate-oidc-issuer", req.issuer,
             "--bundle", str(req.bundle)]
    if version.major == 2 and req.bundle_is_sigstore:
        if version.triple < NEW_BUNDLE_SINCE:
            raise ConfigError(f"cosign {version} cannot read Sigstore bundles", hint="use cosign v2.4.0 or newer")
        args += ["--new-bundle-format"]
    return args + [str(req.blob)]


def _outputs(work: Path, data: bytes, public_key) -> formats.BlobSignature:
    """The signature and bundle from cosign's outputs, deriving whichever of the two it did not write.

    v3 writes only the bundle; v2 before 2.4 writes only the signature for a key.
    """
    sig_tmp, bundle_tmp = work / "blob.sig", work / "blob.bundle"
    if sig_tmp.exists():
        sig_der = formats.decode_signature(sig_tmp.read_bytes(), "cosign's signature")
    elif bundle_tmp.exists():
        sig_der = formats.bundle_signature(formats.load_bundle(bundle_tmp.read_bytes(), "cosign's bundle"))
    else:
        raise ExternalCommandError("cosign sign-blob succeeded but wrote neither a signature nor a bundle")
    if bundle_tmp.exists():
        bundle = bundle_tmp.read_bytes()
    elif public_key is not None:
        bundle = formats.bundle_bytes(formats.make_bundle(data, sig_der, public_key))
    else:
        raise ExternalCommandError("cosign sign-blob wrote no bundle; a keyless signature needs it to verify")
    return formats.BlobSignature(sig_der, bundle)


def _sign_blob(program: str, data: bytes, request: dict, env: Optional[dict], public_key,
               label: str) -> formats.BlobSignature:
    """One cosign sign-blob run over a private copy of `data` in a scratch folder, its outputs read back."""
    version = detect_version(program)
    with tempfile.TemporaryDirectory(prefix="qualify-cosign-") as tmp:
        work = Path(tmp)
        blob = write_atomic(work / "blob", data)
        req = SignBlobRequest(blob, work / "blob.sig", work / "blob.bundle", **request)
        cmd.call(sign_blob_args(version, req, program), env=env, echo=True, timeout=SIGN_TIMEOUT_S)
        done = _outputs(work, data, public_key)
    return formats.BlobSignature(done.der, done.bundle, f"cosign {version}{label}")


@dataclass(frozen=True)
class CosignKeySigner:
    """Key-pair signing with a real cosign (a Signer); the password goes in its environment."""

    key_file: Path
    password: bytes = field(repr=False)
    public: object = field(default=None, repr=False)
    program: str = PROGRAM
    name: str = "cosign"

    def public_key(self):
        return self.public

    def sign_blob(self, data: bytes) -> formats.BlobSignature:
        return _sign_blob(self.program, data, {"key": self.key_file},
                          {formats.PASSWORD_ENV: self.password.decode("utf-8")}, self.public, "")

    def sign_dsse(self, pae: bytes) -> bytes:
        """cosign sign-blob over the PAE bytes is DSSE's signature: ECDSA over SHA-256 of exactly those bytes."""
        return self.sign_blob(pae).der


@dataclass(frozen=True)
class CosignKeylessSigner:
    """Keyless (Fulcio certificate + Rekor entry) signing (a Signer); needs network and an identity token."""

    identity_token_file: Optional[Path] = None
    program: str = PROGRAM
    name: str = "cosign-keyless"

    def public_key(self):
        return None  # the certificate in each bundle names the identity; there is no key to pin

    def sign_blob(self, data: bytes) -> formats.BlobSignature:
        return _sign_blob(self.program, data, {"identity_token_file": self.identity_token_file}, None, None, " keyless")

    def sign_dsse(self, pae: bytes) -> bytes:
        raise ConfigError("a keyless signature of a DSSE envelope needs its certificate beside it, which cosign's "
                          "attestation layout does not carry here", hint="publish with the release key (--key)")


def verify_blob(req: VerifyBlobRequest, program: str = PROGRAM) -> str:
    """Run cosign verify-blob; VerificationError (naming the command) if it refuses."""
    version = detect_version(program)
    args = verify_blob_args(version, req, program)
    try:
        cmd.call(args, timeout=SIGN_TIMEOUT_S)
    except ExternalCommandError as exc:
        if "program not found" in exc.message:
            raise
        raise VerificationError(f"signature check failed: {exc.message}") from None
    return f"cosign {version}"
