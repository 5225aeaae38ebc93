"""`qualify verify`: signature, image digest and verdict, each failure named."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from signing_helpers import (
    DIGEST_A,
    DIGEST_B,
    PASSWORD,
    REGISTRY,
    install_cosign_double,
    make_key_pair,
    path_with,
    push_real_image,
    read_log,
    run_qualify,
    write_manifest,
)

from qualify.core.errors import ConfigError, VerificationError
from qualify.release import verify
from qualify.signing import formats, signer


@pytest.fixture
def signed(tmp_path):
    """A manifest for sm120 (image DIGEST_A) signed by the built-in signer, and its keys."""
    key_file, pub = make_key_pair(tmp_path)
    manifest = write_manifest(tmp_path / "sm120.json", "sm120", DIGEST_A)
    signer.BuiltinSigner.from_key_file(key_file, PASSWORD.encode()).sign_file(
        manifest, formats.signature_path(manifest), formats.bundle_path(manifest))
    return manifest, pub


def never_resolve(ref: str) -> str:
    raise AssertionError(f"a name@sha256 reference must compare directly, not resolve {ref}")


def test_verify_passes_and_reports_verdict_and_level(signed):
    manifest, pub = signed
    result = verify.verify(verify.VerifyOptions(manifest, key=pub, image=f"{REGISTRY}/qualify/sm120@{DIGEST_A}",
                                                require_pass=True), resolve=never_resolve)
    assert (result.verdict, result.support_level, result.target) == ("pass", "experimental", "sm120")
    assert result.image_digest == DIGEST_A and result.signature.startswith("key sha256:")


def test_one_changed_byte_fails_the_signature_check(signed):
    manifest, pub = signed
    data = bytearray(manifest.read_bytes())
    data[data.index(b"experimental")] = ord("E")
    manifest.write_bytes(bytes(data))
    with pytest.raises(VerificationError, match=r"^signature check failed"):
        verify.verify(verify.VerifyOptions(manifest, key=pub))


def test_another_key_fails_the_signature_check(signed, tmp_path):
    manifest, _ = signed
    _, other_pub = make_key_pair(tmp_path, prefix="other")
    with pytest.raises(VerificationError, match=r"^signature check failed"):
        verify.verify(verify.VerifyOptions(manifest, key=other_pub))


def test_missing_signature_fails_the_signature_check(signed):
    manifest, pub = signed
    formats.signature_path(manifest).unlink()
    assert verify.verify(verify.VerifyOptions(manifest, key=pub)).verdict == "pass"  # the bundle carries it
    formats.bundle_path(manifest).unlink()
    with pytest.raises(VerificationError, match=r"^signature check failed: no signature"):
        verify.verify(verify.VerifyOptions(manifest, key=pub))


def test_other_image_digest_fails_the_image_check(signed):
    manifest, pub = signed
    with pytest.raises(VerificationError, match=r"^image digest check failed") as err:
        verify.verify(verify.VerifyOptions(manifest, key=pub, image=f"{REGISTRY}/qualify/sm120@{DIGEST_B}"),
                      resolve=never_resolve)
    assert DIGEST_A in str(err.value) and DIGEST_B in str(err.value)


def test_tagged_image_is_resolved(signed):
    manifest, pub = signed
    seen = []

    def resolve(ref):
        seen.append(ref)
        return {"qualify/sm120:dev": DIGEST_A, "qualify/sm120:old": DIGEST_B}[ref]

    assert verify.verify(verify.VerifyOptions(manifest, key=pub, image="qualify/sm120:dev"), resolve).image_digest
    with pytest.raises(VerificationError, match=r"^image digest check failed"):
        verify.verify(verify.VerifyOptions(manifest, key=pub, image="qualify/sm120:old"), resolve)
    assert seen == ["qualify/sm120:dev", "qualify/sm120:old"]


def test_require_pass_refuses_failing_checks(tmp_path):
    key_file, pub = make_key_pair(tmp_path)
    manifest = write_manifest(tmp_path / "sm121.json", "sm121", DIGEST_A, level="unsupported",
                              statuses={"fatbin-arch": "pass", "triton-compile": "fail"})
    signer.BuiltinSigner.from_key_file(key_file, PASSWORD.encode()).sign_file(
        manifest, formats.signature_path(manifest), formats.bundle_path(manifest))
    result = verify.verify(verify.VerifyOptions(manifest, key=pub))  # reported, not refused
    assert result.verdict == "fail" and result.failing_checks == ["triton-compile"]
    with pytest.raises(VerificationError, match=r"^verdict check failed: verdict is fail; failing checks: "
                                                r"triton-compile"):
        verify.verify(verify.VerifyOptions(manifest, key=pub, require_pass=True))


def test_an_unverified_incomplete_manifest_passes_require_pass(tmp_path):
    key_file, pub = make_key_pair(tmp_path)
    manifest = write_manifest(tmp_path / "sm121.json", "sm121", DIGEST_A, level="unverified",
                              statuses={"fatbin-arch": "pass", "gpu-smoke": "not-run"})
    signer.BuiltinSigner.from_key_file(key_file, PASSWORD.encode()).sign_file(
        manifest, formats.signature_path(manifest), formats.bundle_path(manifest))
    result = verify.verify(verify.VerifyOptions(manifest, key=pub, require_pass=True))
    assert (result.verdict, result.support_level) == ("incomplete", "unverified")


def test_a_trust_anchor_is_required(signed):
    manifest, _ = signed
    with pytest.raises(ConfigError, match="--key PUB, or --identity"):
        verify.verify(verify.VerifyOptions(manifest))


def test_cli_exit_codes_and_messages(signed, tmp_path):
    manifest, pub = signed
    ok = run_qualify(["verify", str(manifest), "--key", str(pub), "--require-pass",
                      "--image", f"{REGISTRY}/qualify/sm120@{DIGEST_A}"], tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "verdict:       pass" in ok.stdout and "support level: experimental" in ok.stdout
    bad = run_qualify(["verify", str(manifest), "--key", str(pub), "--json",
                       "--image", f"{REGISTRY}/qualify/sm120@{DIGEST_B}"], tmp_path)
    assert bad.returncode == VerificationError.exit_code
    assert "error: image digest check failed" in bad.stderr
    assert json.loads(bad.stdout)["failed"] == "image digest"
    good = run_qualify(["verify", str(manifest), "--key", str(pub), "--json"], tmp_path)
    assert json.loads(good.stdout)["ok"] is True and json.loads(good.stdout)["support_level"] == "experimental"


@pytest.mark.engine
def test_image_digest_through_the_engine(docker_engine, debian_python_image, loopback_registry, tmp_path):
    """Real images in the real loopback registry."""
    repository, digest = push_real_image(docker_engine, debian_python_image, loopback_registry.address,
                                         "verify-digest", tmp_path)
    assert verify.image_digest(f"{repository}@{digest}") == digest
    assert verify.image_digest(f"{repository}:test") == digest  # its own repository's digest
    local = "qualify-test/never-pushed:test"
    subprocess.run([docker_engine, "tag", f"{repository}:test", local], check=True)
    image_id = subprocess.run([docker_engine, "image", "inspect", "--format", "{{.Id}}", local], check=True,
                              capture_output=True, text=True).stdout.strip()
    assert verify.image_digest(local) == image_id  # never pushed under that name: the image id
    from qualify.core.errors import EngineError

    with pytest.raises(EngineError, match="No such image"):
        verify.image_digest("qualify-test/missing:tag")


def test_keyless_verification_goes_through_cosign(signed, tmp_path, monkeypatch):
    manifest, _ = signed
    install_cosign_double(tmp_path / "bin")
    monkeypatch.setenv("PATH", path_with(tmp_path / "bin"))
    monkeypatch.setenv("COSIGN_DOUBLE_LOG", str(tmp_path / "log.jsonl"))
    monkeypatch.setenv("COSIGN_DOUBLE_VERSION", "v3.1.2")
    result = verify.verify(verify.VerifyOptions(manifest, identity="rel@example.com",
                                                issuer="https://accounts.example.com"))
    assert result.signature.startswith("cosign v3.1.2, identity rel@example.com")
    argv = read_log(tmp_path / "log.jsonl")[-1]["argv"]
    assert argv[:-2] == [
        "verify-blob", "--certificate-identity", "rel@example.com", "--certificate-oidc-issuer",
        "https://accounts.example.com", "--bundle"]
    # Private copies of the bytes verify read once: the bundle and the blob it then parses.
    assert argv[-2] != str(formats.bundle_path(manifest)) and argv[-2].endswith("bundle.json")
    assert Path(argv[-1]).name == manifest.name
    monkeypatch.setenv("COSIGN_DOUBLE_FAIL", "none of the expected identities matched")
    with pytest.raises(VerificationError, match=r"^signature check failed: command failed .*cosign verify-blob"):
        verify.verify(verify.VerifyOptions(manifest, identity="x@example.com", issuer="https://a.example.com"))
