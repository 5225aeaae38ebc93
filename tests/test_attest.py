"""DSSE envelopes, cosign's attestation layout and the SBOM parser, checked
against independent implementations (openssl, sigstore-js) where one exists."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import require

from qualify.core.errors import VerificationError
from qualify.devtools import attest_interop
from qualify.publish import dsse, oci, sbom
from qualify.signing import keys as cosign_keys


@pytest.fixture(scope="module")
def key():
    pair = cosign_keys.generate_key_pair(b"pw")
    return cosign_keys.load_private_key(pair.private_pem, b"pw"), pair.public_pem


def test_pae_is_the_dsse_spec_example():
    # DSSE spec (protocol.md) test vector
    assert dsse.pae("http://example.com/HelloWorld", b"hello world") == \
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


def test_round_trip_and_failures_say_which(key):
    private, _ = key
    env = dsse.sign(private, b'{"_type":"x"}')
    assert dsse.verify(dsse.parse(env.to_json()), private.public_key()) == b'{"_type":"x"}'
    changed = dsse.Envelope(env.payload_type, b'{"_type":"y"}', env.signatures)
    with pytest.raises(VerificationError, match="payload or signature was changed"):
        dsse.verify(changed, private.public_key())
    other = cosign_keys.load_private_key(cosign_keys.generate_key_pair(b"o").private_pem, b"o")
    with pytest.raises(VerificationError, match="signed by another key"):
        dsse.verify(env, other.public_key())
    with pytest.raises(VerificationError, match="payloadType"):
        dsse.verify(dsse.Envelope("text/plain", env.payload, env.signatures), private.public_key())
    with pytest.raises(VerificationError, match="not JSON"):
        dsse.parse(b"\xff")


def test_openssl_verifies_our_pae_signature(key, tmp_path):
    require(shutil.which("openssl") is not None, "openssl is needed")
    private, public_pem = key
    (tmp_path / "k.pub").write_bytes(public_pem)
    assert attest_interop.openssl_check(tmp_path, dsse.sign(private, b'{"a":1}'), tmp_path / "k.pub").startswith("openssl")


def test_attest_interop_session_runs_sigstore_js(tmp_path):
    """And leaves nothing behind (issue 41: /tmp/qualify-sigstore-js-* on every run): its work folders are in
    the state folder and removed on exit."""
    require(shutil.which("node") is not None and shutil.which("npm") is not None, "node and npm are needed")
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "QUALIFY_STATE_DIR": str(tmp_path / "state")}
    env.pop("QUALIFY_SIGSTORE_JS_DIR", None)
    out = subprocess.run([sys.executable, "-m", "qualify.devtools.attest_interop"], capture_output=True, text=True,
                         timeout=900, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sigstore-js: DSSE bundle v0.3 verified" in out.stdout and "openssl: PAE signature verified" in out.stdout
    assert list((tmp_path / "tmp").iterdir()) == [] and list((tmp_path / "state" / "work").iterdir()) == []


def test_attestation_image_layout():
    doc = oci.attestation_image([(b'{"e":1}', "https://example/p")])
    manifest = json.loads(doc.manifest)
    layer = manifest["layers"][0]
    assert layer["mediaType"] == "application/vnd.dsse.envelope.v1+json"
    assert layer["annotations"] == {"predicateType": "https://example/p", "dev.cosignproject.cosign/signature": ""}
    config = dict(doc.blobs)[manifest["config"]["digest"]]
    assert json.loads(config)["rootfs"]["diff_ids"] == [layer["digest"]]
    assert oci.att_tag("sha256:" + "0" * 64) == "sha256-" + "0" * 64 + ".att"
    with pytest.raises(ValueError):
        oci.att_tag("sha512:00")


def test_dpkg_status_parser_keeps_installed_only():
    text = ("Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.36-9\n"
            "Description: x\n more\n\nPackage: gone\nStatus: deinstall ok config-files\nVersion: 1\n")
    assert sbom.parse_dpkg_status(text) == [sbom.DebPackage("libc6", "2.36-9", "amd64")]


def test_labels_fit_for_publishing():
    from qualify.config import targets
    from qualify.host import provenance
    from qualify.imagebuild import image

    assert provenance.public_url("/work/main") == "" and provenance.public_url("file:///srv/x.git") == ""
    assert provenance.public_url("git@github.com:acme/bq.git") == "https://github.com/acme/bq"
    assert provenance.public_url("https://u:secret@gitlab.com/a/b.git") == "https://gitlab.com/a/b"
    plan = image.plan(targets.load(), image.BuildOptions(target="sm120", base="pinned", profile="smoke"))
    assert plan.labels["org.opencontainers.image.base.name"].startswith("docker.io/nvidia/cuda:")
    source = plan.labels.get("org.opencontainers.image.source")
    assert source is None or source.startswith("https://")
