"""Signing: cosign's key format, the built-in signer, and cosign's v2/v3 argument lists.

Signatures are checked independently with `openssl dgst -sha256 -verify`.
cosign itself cannot be installed on this platform; its argument lists are
tested against a recording test double (signing_helpers.COSIGN_DOUBLE), and
the tests that need a real cosign run only where one exists.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from signing_helpers import (
    DIGEST_A,
    PASSWORD,
    assert_no_secrets,
    install_cosign_double,
    make_key_pair,
    path_with,
    read_log,
    run_qualify,
    secrets_of,
    write_manifest,
)

from qualify.core.errors import ConfigError
from qualify.probe import cosignkey
from qualify.signing import cosign, formats, signer
from qualify.signing import keys as cosign_keys

# Known-answer vectors: keys made by cosign itself, password "hello", from
# sigstore/cosign pkg/cosign/keys_test.go (commit b36644f, Apache-2.0), where
# TestReadingPrivatePemTypes expects the first two to load and the third (a
# SEC1 "EC PRIVATE KEY" inside the box, N=2^16) to be refused as not PKCS#8.
COSIGN_PEM_SIGSTORE = """-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----
eyJrZGYiOnsibmFtZSI6InNjcnlwdCIsInBhcmFtcyI6eyJOIjozMjc2OCwiciI6
OCwicCI6MX0sInNhbHQiOiI3T3VGd2VsbWZZNXVId2NoaURSc210anNwZ2ZlZjFG
Mk5lOGFDTjVLYVpZPSJ9LCJjaXBoZXIiOnsibmFtZSI6Im5hY2wvc2VjcmV0Ym94
Iiwibm9uY2UiOiJQNHk4OGhCb3ZTa09MbXN0bFVBaGJwdDJ0K2xTNUxQSCJ9LCJj
aXBoZXJ0ZXh0IjoiMnB1QzdyZldJOWh3bnJlQ2s4aUZDRlVwQlRrSzRJNlIvbFBF
cnBDekpXUGpJWXl4eGVIL1A2VW52cFJHdVhla1NNb3JMdGhLamdoQ1JlNy82NDVH
QWtoVm1LRC92eEF0S2EvbE1abENSQ3FlekJGUFd1dzNpeFRtZ2xhb2J1ZFVSbUVs
bmNGOGlZbzBTMVl6Y1ZOMVFwY2J2c0dNcUlYRzVlbmdteGp5dCtBcXlyZTF0Q0Y0
V01tU1BlaEljNlBqd2h1Q2xHaVpJUWRvTGc9PSJ9
-----END ENCRYPTED SIGSTORE PRIVATE KEY-----
"""
COSIGN_PEM_COSIGN = """-----BEGIN ENCRYPTED COSIGN PRIVATE KEY-----
eyJrZGYiOnsibmFtZSI6InNjcnlwdCIsInBhcmFtcyI6eyJOIjozMjc2OCwiciI6
OCwicCI6MX0sInNhbHQiOiJ4WWdoc09JTUxUWGNOT0RsclNIOUNKc1FlOVFnZmN1
cmUrMXlLdHh1TlkwPSJ9LCJjaXBoZXIiOnsibmFtZSI6Im5hY2wvc2VjcmV0Ym94
Iiwibm9uY2UiOiI0cS9PSlVmaXJkSUkrUjZ0ajZBMmcyQ0JqL25xdFNicCJ9LCJj
aXBoZXJ0ZXh0IjoiKzB4Q3NzcFN0WStBczdKanJpOWtsbHBWd2JhcUI4ZWJNdWto
eS9aVE1MSXRsL3B1YS9jWVJvbytLRGxMWWdmOW1kSjk4K1FnQW9oTktoYnJPMTcw
MHdBY1JTMjFDOE4zQUNJRUVZaWpOMllBNnMraGJSbkhjUnd4eGhDMDFtb2FvL0dO
Y1pmbEJheXZMV3pXblo4d2NDZ2ZpT1o1VXlRTEFJMHh0dnR6dEh3cTdDV1Vhd3V4
RlhlNDZzck9TUE9SNHN6bytabWErUGovSFE9PSJ9
-----END ENCRYPTED COSIGN PRIVATE KEY-----
"""
COSIGN_PEM_SEC1_INSIDE = """-----BEGIN ENCRYPTED COSIGN PRIVATE KEY-----
eyJrZGYiOnsibmFtZSI6InNjcnlwdCIsInBhcmFtcyI6eyJOIjo2NTUzNiwiciI6
OCwicCI6MX0sInNhbHQiOiJHK3F5WTYrNzhNS0JzMXNGTGs1ajYwcS9kS3Z1czBW
VkhlSHZybC9POTF3PSJ9LCJjaXBoZXIiOnsibmFtZSI6Im5hY2wvc2VjcmV0Ym94
Iiwibm9uY2UiOiJRc2JGdG13WDRDK2ttV3ZCcVRaMEFGOUFYdk1jRmg1SCJ9LCJj
aXBoZXJ0ZXh0IjoiREM5T28zeldiYVQzSXYwdFVnWEdycjUxYW1samwwNlQ5MTNP
VkxPbWpuMWhnK2o2WXRUbWg3SGhZSlY1N2J5eGE0Q281bE9YYmRqbTJ3aklubEd1
Um5aZCt5OExnekpSNzFSeEhKVzgrWmRlcFJmYWJMTjdHbDgrSFZEcERVQ3NxQnRh
VngyblpGbFEwWUl1anZwbFphblNGaUVvdERLVGkxZ3VhUXIwUHNzYU01NXZxbTRY
WS9rPSJ9
-----END ENCRYPTED COSIGN PRIVATE KEY-----
"""


def openssl_verify(pub: Path, sig_file: Path, blob: Path, tmp: Path) -> subprocess.CompletedProcess:
    """Independent check: base64-decode the .sig and let openssl verify it."""
    der = tmp / "sig.der"
    der.write_bytes(base64.b64decode(sig_file.read_bytes()))
    return subprocess.run(["openssl", "dgst", "-sha256", "-verify", str(pub), "-signature", str(der), str(blob)],
                          capture_output=True, text=True)


def body_json(pem: bytes) -> dict:
    return json.loads(cosignkey.pem_decode(pem, "key")[1])


# --- the encrypted key format ----------------------------------------------------


@pytest.mark.parametrize("pem", [COSIGN_PEM_SIGSTORE, COSIGN_PEM_COSIGN], ids=["sigstore-label", "cosign-label"])
def test_known_answer_cosign_generated_keys_decrypt_and_sign(pem, tmp_path):
    key = cosign_keys.load_private_key(pem.encode(), "hello")
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    blob = tmp_path / "blob"
    blob.write_bytes(b"signed with a key cosign made\n")
    sig = tmp_path / "blob.sig"
    sig.write_bytes(formats.encode_signature(formats.sign_bytes(key, blob.read_bytes())))
    pub = tmp_path / "pub.pem"
    pub.write_bytes(cosign_keys.public_key_pem(key.public_key()))
    assert openssl_verify(pub, sig, blob, tmp_path).stdout.strip() == "Verified OK"


def test_known_answer_wrong_password_and_non_pkcs8_are_refused_like_cosign():
    with pytest.raises(ConfigError, match="wrong password"):
        cosign_keys.load_private_key(COSIGN_PEM_SIGSTORE.encode(), "hellO")
    # The N=2^16 box opens (so the Standard parameters are read right), but
    # holds a SEC1 key, which cosign refuses as not PKCS#8.
    with pytest.raises(ConfigError, match="not PKCS#8"):
        cosign_keys.load_private_key(COSIGN_PEM_SEC1_INSIDE.encode(), "hello")


def test_written_key_has_cosigns_layout():
    pair = cosign_keys.generate_key_pair(PASSWORD)
    text = pair.private_pem.decode()
    assert text.startswith("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
    assert text.endswith("-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
    assert all(len(line) <= 64 for line in text.splitlines())
    ours, theirs = body_json(pair.private_pem), body_json(COSIGN_PEM_SIGSTORE.encode())
    assert list(ours) == list(theirs) == ["kdf", "cipher", "ciphertext"]
    assert list(ours["kdf"]) == list(theirs["kdf"]) == ["name", "params", "salt"]
    assert list(ours["kdf"]["params"]) == list(theirs["kdf"]["params"]) == ["N", "r", "p"]
    assert ours["kdf"]["params"] == {"N": 65536, "r": 8, "p": 1}  # cosign >= 2.2's default
    assert ours["cipher"]["name"] == "nacl/secretbox" and len(base64.b64decode(ours["cipher"]["nonce"])) == 24
    assert len(base64.b64decode(ours["kdf"]["salt"])) == 32
    assert pair.public_pem.startswith(b"-----BEGIN PUBLIC KEY-----\n")


@pytest.mark.parametrize("params", [cosignkey.LEGACY, cosignkey.STANDARD], ids=["N=2^15", "N=2^16"])
def test_encrypt_decrypt_round_trip(params):
    key = ec.generate_private_key(ec.SECP256R1())
    pem = cosign_keys.private_key_pem(key, PASSWORD, params)
    back = cosign_keys.load_private_key(pem, PASSWORD)
    assert back.private_numbers() == key.private_numbers()
    assert body_json(pem)["kdf"]["params"]["N"] == params.n


def test_wrong_password_is_a_clear_error():
    pem = cosign_keys.generate_key_pair(PASSWORD).private_pem
    with pytest.raises(ConfigError) as err:
        cosign_keys.load_private_key(pem, PASSWORD + "x", what="cosign.key")
    assert "cosign.key: wrong password" in str(err.value) and "COSIGN_PASSWORD" in str(err.value)


def test_tampered_scrypt_parameters_are_refused_before_any_work():
    pem = cosign_keys.generate_key_pair(PASSWORD).private_pem
    doc = body_json(pem)
    doc["kdf"]["params"]["N"] = 1 << 24  # 16 GiB of scrypt memory if honoured
    bad = cosign_keys.pem_encode(cosignkey.SIGSTORE_PEM_TYPE, json.dumps(doc).encode())
    with pytest.raises(ConfigError, match="unsupported scrypt parameters"):
        cosign_keys.load_private_key(bad, PASSWORD)


def test_other_pem_types_are_refused():
    with pytest.raises(ConfigError, match="not a cosign key"):
        cosign_keys.load_private_key(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "x")


# --- the built-in signer ---------------------------------------------------------


def test_builtin_signature_verifies_with_openssl_and_bundle_layout(tmp_path):
    key_file, pub = make_key_pair(tmp_path)
    manifest = write_manifest(tmp_path / "sm120.json", "sm120", DIGEST_A)
    done = signer.write_signature(signer.BuiltinSigner.from_key_file(key_file, PASSWORD.encode()), manifest)
    assert done.signature.name == "sm120.json.sig" and done.bundle.name == "sm120.json.sigstore.json"
    assert not done.signature.read_bytes().endswith(b"\n")  # cosign writes no newline either
    assert openssl_verify(pub, done.signature, manifest, tmp_path).stdout.strip() == "Verified OK"

    bundle = json.loads(done.bundle.read_text())
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    digest = bundle["messageSignature"]["messageDigest"]
    assert digest["algorithm"] == "SHA2_256"
    assert base64.b64decode(digest["digest"]).hex() == hashlib.sha256(manifest.read_bytes()).hexdigest()
    assert bundle["messageSignature"]["signature"] == done.signature.read_text()
    # The hint is base64(SHA-256(PKIX DER)), computed here by openssl.
    der = subprocess.run(["openssl", "pkey", "-pubin", "-in", str(pub), "-outform", "DER"], capture_output=True,
                         check=True).stdout
    assert bundle["verificationMaterial"] == {"publicKey": {"hint": base64.b64encode(hashlib.sha256(der).digest())
                                                                    .decode()}}
    assert set(bundle) == {"mediaType", "verificationMaterial", "messageSignature"}


def test_builtin_signatures_are_deterministic(tmp_path):
    key_file, _ = make_key_pair(tmp_path)
    s = signer.BuiltinSigner.from_key_file(key_file, PASSWORD.encode())
    assert formats.sign_bytes(s.private_key, b"x") == formats.sign_bytes(s.private_key, b"x")


def test_builtin_refuses_non_p256_keys(tmp_path):
    key = ec.generate_private_key(ec.SECP384R1())
    (tmp_path / "p384.key").write_bytes(cosign_keys.private_key_pem(key, PASSWORD))
    with pytest.raises(ConfigError, match="P-256"):
        signer.BuiltinSigner.from_key_file(tmp_path / "p384.key", PASSWORD.encode())


def test_cli_generate_key_sign_and_openssl_verify_leaks_nothing(tmp_path):
    env = {"COSIGN_PASSWORD": PASSWORD, "PATH": "/usr/bin:/bin"}  # no cosign: auto means builtin
    gen = run_qualify(["sign", "generate-key", "--output-key-prefix", str(tmp_path / "release")], tmp_path, env)
    assert gen.returncode == 0, gen.stderr
    assert (tmp_path / "release.key").stat().st_mode & 0o777 == 0o600
    again = run_qualify(["sign", "generate-key", "--output-key-prefix", str(tmp_path / "release")], tmp_path, env)
    assert again.returncode == 2 and "already exist" in again.stderr
    manifest = write_manifest(tmp_path / "sm100.json", "sm100", DIGEST_A)
    signed = run_qualify(["sign", str(manifest), "--key", str(tmp_path / "release.key")], tmp_path, env)
    assert signed.returncode == 0, signed.stderr
    assert "with builtin" in signed.stdout
    result = openssl_verify(tmp_path / "release.pub", formats.signature_path(manifest), manifest, tmp_path)
    assert result.stdout.strip() == "Verified OK"
    secrets = secrets_of(tmp_path / "release.key")
    written = [p.read_text() for p in tmp_path.iterdir() if p.name != "release.key" and p.suffix != ".der"]
    assert_no_secrets([gen.stdout, gen.stderr, signed.stdout, signed.stderr, *written], secrets)


def test_cli_sign_without_password_or_terminal_says_what_to_do(tmp_path):
    key_file, _ = make_key_pair(tmp_path)
    manifest = write_manifest(tmp_path / "m.json", "sm120", DIGEST_A)
    args = ["sign", str(manifest), "--key", str(key_file)]
    empty = run_qualify(args, tmp_path, {"PATH": "/usr/bin:/bin", "COSIGN_PASSWORD": ""})
    assert empty.returncode == 2 and "wrong password" in empty.stderr  # set but empty is used, as cosign does
    unset = run_qualify(args, tmp_path, {"PATH": "/usr/bin:/bin"}, unset=["COSIGN_PASSWORD"])
    assert unset.returncode == 2 and "COSIGN_PASSWORD is not set" in unset.stderr


# --- cosign: version detection and argument lists ----------------------------


def test_version_parse_real_formats():
    text = "  ______\ncosign: A tool...\n\nGitVersion:    v2.2.4\nGitCommit:     abc\n"
    assert cosign.CosignVersion.parse(text) == cosign.CosignVersion(2, 2, 4)
    assert cosign.CosignVersion.parse('{\n  "GitVersion": "v3.1.2",\n  "GitCommit": "x"\n}') == (
        cosign.CosignVersion(3, 1, 2))
    with pytest.raises(ConfigError, match="GitVersion"):
        cosign.CosignVersion.parse("GitVersion:    \nGitCommit:     \n")  # built outside git (cosign#4999)
    with pytest.raises(ConfigError, match="not supported"):
        cosign.CosignVersion(4, 0, 0).require_supported()


SIGN_KEY = cosign.SignBlobRequest(Path("m.json"), Path("m.json.sig"), Path("m.json.bundle"), key=Path("cosign.key"))


def test_sign_blob_args_v3_key_pair_offline():
    assert cosign.sign_blob_args(cosign.CosignVersion(3, 1, 2), SIGN_KEY) == [
        "cosign", "sign-blob", "--yes", "--key", "cosign.key",
        "--use-signing-config=false", "--tlog-upload=false", "--bundle", "m.json.bundle", "m.json"]


def test_sign_blob_args_v2_key_pair_offline():
    assert cosign.sign_blob_args(cosign.CosignVersion(2, 2, 4), SIGN_KEY) == [
        "cosign", "sign-blob", "--yes", "--key", "cosign.key",
        "--tlog-upload=false", "--output-signature", "m.json.sig", "m.json"]
    assert cosign.sign_blob_args(cosign.CosignVersion(2, 4, 1), SIGN_KEY) == [
        "cosign", "sign-blob", "--yes", "--key", "cosign.key",
        "--tlog-upload=false", "--output-signature", "m.json.sig",
        "--new-bundle-format", "--bundle", "m.json.bundle", "m.json"]


def test_sign_blob_args_keyless():
    req = cosign.SignBlobRequest(Path("m.json"), Path("m.sig"), Path("m.bundle"), identity_token_file=Path("tok"))
    assert cosign.sign_blob_args(cosign.CosignVersion(3, 0, 2), req) == [
        "cosign", "sign-blob", "--yes", "--identity-token", "tok", "--bundle", "m.bundle", "m.json"]
    assert cosign.sign_blob_args(cosign.CosignVersion(2, 6, 1), req) == [
        "cosign", "sign-blob", "--yes", "--identity-token", "tok", "--output-signature", "m.sig",
        "--bundle", "m.bundle", "--new-bundle-format", "m.json"]
    no_token = cosign.SignBlobRequest(Path("m.json"), Path("m.sig"), Path("m.bundle"))
    assert "--identity-token" not in cosign.sign_blob_args(cosign.CosignVersion(3, 0, 2), no_token)


def test_verify_blob_args():
    key_req = cosign.VerifyBlobRequest(Path("m.json"), signature=Path("m.sig"), bundle=Path("m.bundle"),
                                       key=Path("cosign.pub"))
    assert cosign.verify_blob_args(cosign.CosignVersion(3, 1, 2), key_req) == [
        "cosign", "verify-blob", "--key", "cosign.pub", "--bundle", "m.bundle", "--insecure-ignore-tlog=true",
        "m.json"]
    assert cosign.verify_blob_args(cosign.CosignVersion(2, 2, 4), key_req) == [
        "cosign", "verify-blob", "--key", "cosign.pub", "--signature", "m.sig", "--insecure-ignore-tlog=true",
        "m.json"]
    keyless = cosign.VerifyBlobRequest(Path("m.json"), bundle=Path("m.bundle"), identity="rel@example.com",
                                       issuer="https://accounts.example.com")
    assert cosign.verify_blob_args(cosign.CosignVersion(3, 1, 2), keyless) == [
        "cosign", "verify-blob", "--certificate-identity", "rel@example.com",
        "--certificate-oidc-issuer", "https://accounts.example.com", "--bundle", "m.bundle", "m.json"]
    assert cosign.verify_blob_args(cosign.CosignVersion(2, 5, 0), keyless)[-2:] == ["--new-bundle-format", "m.json"]
    with pytest.raises(ConfigError, match="v2.4.0 or newer"):
        cosign.verify_blob_args(cosign.CosignVersion(2, 2, 4), keyless)


# --- cosign through the recording test double --------------------------------


@pytest.fixture
def cosign_double(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    install_cosign_double(bin_dir)
    log = tmp_path / "cosign-argv.jsonl"
    monkeypatch.setenv("PATH", path_with(bin_dir))
    monkeypatch.setenv("COSIGN_DOUBLE_LOG", str(log))
    monkeypatch.delenv("COSIGN_PASSWORD", raising=False)
    monkeypatch.delenv("SIGSTORE_ID_TOKEN", raising=False)
    return log


@pytest.mark.parametrize("version", ["v2.2.4", "v2.4.1", "v3.1.2"])
def test_cosign_key_signing_through_double(version, tmp_path, cosign_double, monkeypatch, capsys):
    monkeypatch.setenv("COSIGN_DOUBLE_VERSION", version)
    key_file, pub = make_key_pair(tmp_path)
    manifest = write_manifest(tmp_path / "sm121.json", "sm121", DIGEST_A)
    sign = signer.key_signer("auto", key_file, PASSWORD.encode())
    assert sign.name == "cosign"
    done = signer.write_signature(sign, manifest)
    assert done.signer == f"cosign {version}"
    calls = read_log(cosign_double)
    assert [c["argv"][0] for c in calls] == ["version", "sign-blob"]
    sign_call = calls[1]
    assert sign_call["password_in_env"] and PASSWORD not in json.dumps(calls)
    assert "--key" in sign_call["argv"] and "--tlog-upload=false" in sign_call["argv"]
    assert ("--use-signing-config=false" in sign_call["argv"]) == version.startswith("v3")
    # Whatever the version wrote, both files end up in place and verify.
    assert openssl_verify(pub, done.signature, manifest, tmp_path).stdout.strip() == "Verified OK"
    assert formats.load_bundle(done.bundle.read_bytes())["messageSignature"]["signature"] == done.signature.read_text()
    out = capsys.readouterr()
    assert "sign-blob" in out.err and PASSWORD not in out.err + out.out  # echoed command, no secret


def test_cosign_errors_name_the_command(tmp_path, cosign_double, monkeypatch):
    monkeypatch.setenv("COSIGN_DOUBLE_VERSION", "v3.1.2")
    monkeypatch.setenv("COSIGN_DOUBLE_FAIL", "signing m.json: getting signer: reading key: decrypt: bad")
    key_file, _ = make_key_pair(tmp_path)
    manifest = write_manifest(tmp_path / "m.json", "sm120", DIGEST_A)
    sign = signer.key_signer("cosign", key_file, PASSWORD.encode())
    from qualify.core.errors import ExternalCommandError

    with pytest.raises(ExternalCommandError) as err:
        signer.write_signature(sign, manifest, tmp_path / "m.sig", tmp_path / "m.bundle")
    assert "cosign sign-blob --yes --key" in str(err.value) and "decrypt: bad" in str(err.value)
    assert PASSWORD not in str(err.value)


def test_cosign_keyless_token_stays_out_of_argv(tmp_path, cosign_double, monkeypatch):
    monkeypatch.setenv("COSIGN_DOUBLE_VERSION", "v3.1.2")
    token = "eyJhbGciOiJSUzI1NiJ9.secret-identity-token.sig"
    monkeypatch.setenv("SIGSTORE_ID_TOKEN", token)
    manifest = write_manifest(tmp_path / "m.json", "sm120", DIGEST_A)
    result = run_qualify(["sign", str(manifest), "--keyless"], tmp_path)
    assert result.returncode == 0, result.stderr
    calls = read_log(cosign_double)
    assert calls[-1]["argv"][:2] == ["sign-blob", "--yes"] and calls[-1]["token_in_env"]
    assert token not in json.dumps(calls) + result.stdout + result.stderr
    token_file = tmp_path / "token"
    token_file.write_text(token)
    result = run_qualify(["sign", str(manifest), "--keyless", "--identity-token", str(token_file)], tmp_path)
    assert result.returncode == 0, result.stderr
    argv = read_log(cosign_double)[-1]["argv"]
    assert argv[argv.index("--identity-token") + 1] == str(token_file)
    assert token not in json.dumps(read_log(cosign_double)) + result.stdout + result.stderr


def test_auto_signer_is_builtin_without_cosign(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    key_file, _ = make_key_pair(tmp_path)
    sign = signer.key_signer("auto", key_file, PASSWORD.encode())
    assert sign.name == "builtin"
    with pytest.raises(ConfigError, match="keyless signing needs cosign"):
        signer.choose_backend("builtin", keyless=True)


# --- a real cosign, where one exists (never on this platform, not a CI requirement) ---


def test_cosign_interop_session_refuses_clearly_without_cosign(monkeypatch):
    """The real-cosign checks live in `nox -s cosign-interop` (cosign cannot be installed here);
    without cosign it must say so and fail, not pretend."""
    from qualify.devtools import cosign_interop

    monkeypatch.setenv("PATH", "/nonexistent")
    assert cosign_interop.main() == 7
