"""Publishing to a second, real registry (TLS from a CA made here, htpasswd
basic auth) and verifying from it. Needs the Docker engine, skopeo and
Debian's docker-registry; fails instead of skipping when CI=true."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tls_registry
from conftest import require

import images
from qualify import skopeo
from qualify.core import manifest as mf
from qualify.core.errors import RegistryError, VerificationError
from qualify.core.fsutil import canonical_json
from qualify.publish import attestation_verify, dsse, oci, publish
from qualify.signing import keys as cosign_keys

pytestmark = [pytest.mark.engine, pytest.mark.slow]
PASSWORD = b"release-key-password"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    require(os.path.exists(tls_registry.REGISTRY_BINARY) and shutil.which("skopeo") and shutil.which("openssl"),
            "docker-registry, skopeo and openssl are needed")
    gen = tls_registry.start(tmp_path_factory.mktemp("tls-registry"))
    reg = next(gen)
    yield reg
    gen.close()  # runs the teardown: process stopped, certs.d entries removed


@pytest.fixture
def creds(registry, monkeypatch):
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(registry.auth_file))
    return registry


def _key_pair(folder: Path, password: bytes = PASSWORD):
    pair = cosign_keys.generate_key_pair(password)
    (folder / "cosign.key").write_bytes(pair.private_pem)
    (folder / "cosign.pub").write_bytes(pair.public_pem)
    return folder / "cosign.key", folder / "cosign.pub"


def _release(root: Path, tag: str, record, verdict: str = "pass") -> Path:
    """A release folder as `nox -s release` leaves it: manifests/<tag>/<target>.json."""
    name, digest = record.image_reference.split("@")
    predicate = {"schema_version": 1, "verdict": verdict, "support_level": "unverified", "checks": [],
                 "target": {"name": record.target, "platform": record.platform, "capability": "12.0",
                            "profile": record.profile},
                 "base": {"kind": record.base_kind, "image": record.base_image}}
    folder = root / tag
    folder.mkdir(parents=True)
    (folder / f"{record.target}.json").write_bytes(canonical_json(mf.statement(name, digest, predicate)))
    return folder


@pytest.fixture(scope="module")
def smoke(docker_engine):
    return images.smoke("sm120")


@pytest.fixture(scope="module")
def published(smoke, registry, tmp_path_factory):
    """The sm120 smoke image published once (with SLSA + SBOM), for the verification tests."""
    root = tmp_path_factory.mktemp("release")
    key, pub = _key_pair(root)
    _release(root / "manifests", "v-test", smoke)
    os.environ["REGISTRY_AUTH_FILE"] = str(registry.auth_file)
    try:
        dest = publish.Destination.parse(f"{registry.address}/qualify")
        opts = publish.PublishOptions(tag="v-test", destination=dest, release_root=root / "manifests", key=key,
                                      password=PASSWORD)
        start = time.monotonic()
        lines = []
        record = publish.publish(opts, progress=lines.append)
        seconds = time.monotonic() - start
    finally:
        del os.environ["REGISTRY_AUTH_FILE"]
    return {"record": record, "root": root, "key": key, "pub": pub, "dest": dest, "seconds": seconds,
            "lines": lines}


def test_publish_keeps_the_digest_and_records_it(published, smoke, creds):
    rec = published["record"]
    image = rec.images[0]
    assert image.digest == smoke.digest
    assert image.reference == f"{creds.address}/qualify/sm120@{smoke.digest}"
    served = skopeo.inspect_raw(f"docker://{image.tag}")
    assert oci.digest_of(served) == smoke.digest
    saved = json.loads((published["root"] / "manifests" / "v-test" / "published.json").read_text())
    assert saved["images"][0]["reference"] == image.reference
    assert (published["root"] / "manifests" / "v-test" / "published.json.sig").exists()
    assert set(image.predicate_types) == {mf.PREDICATE_TYPE, "https://slsa.dev/provenance/v1",
                                          "https://cyclonedx.org/bom"}
    assert "no OCI 1.1 referrers API" in image.referrers  # Debian's distribution 2.8
    print(f"\npublish of the sm120 smoke image: {published['seconds']:.1f} s; {image.blobs_sent} blobs sent")


def test_attestation_layout_is_cosigns(published, smoke, creds):
    att = published["record"].images[0].attestations
    assert att.endswith(f":sha256-{smoke.digest.split(':')[1]}.att")
    doc = json.loads(skopeo.inspect_raw(f"docker://{att}"))
    assert doc["mediaType"] == oci.OCI_MANIFEST and doc["config"]["mediaType"] == oci.OCI_CONFIG
    for layer in doc["layers"]:
        assert layer["mediaType"] == "application/vnd.dsse.envelope.v1+json"
        assert layer["annotations"]["dev.cosignproject.cosign/signature"] == ""
        assert layer["annotations"]["predicateType"]


def test_slsa_and_sbom_contents(published, smoke, creds):
    ref = f"{creds.address}/qualify/sm120"
    layers = dict((layer.predicate_type, data) for layer, data in attestation_verify.fetch_layers(ref, smoke.digest))
    key = cosign_keys.load_public_key(published["pub"].read_bytes())
    prov = json.loads(dsse.verify(dsse.parse(layers["https://slsa.dev/provenance/v1"]), key))
    bd = prov["predicate"]["buildDefinition"]
    assert bd["externalParameters"]["target"] == "sm120" and bd["externalParameters"]["base"] == "hermetic"
    uris = [d["uri"] for d in bd["resolvedDependencies"]]
    assert any(u.startswith("oci://") for u in uris) and any(u.startswith("pkg:pypi/triton@") for u in uris)
    assert any("gitCommit" in d["digest"] for d in bd["resolvedDependencies"])
    bom = json.loads(dsse.verify(dsse.parse(layers["https://cyclonedx.org/bom"]), key))["predicate"]
    purls = [c.get("purl", "") for c in bom["components"]]
    assert any(p.startswith("pkg:deb/debian/libc6@") for p in purls), "Debian packages from /var/lib/dpkg/status"
    assert any(p.startswith("pkg:pypi/triton@") for p in purls)


def test_verify_image_from_the_registry_passes(published, smoke, creds):
    ref = f"{creds.address}/qualify/sm120@{smoke.digest}"
    out = subprocess.run([sys.executable, "-m", "qualify", "verify", "--image", ref, "--key",
                          str(published["pub"]), "--require-pass"], capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent, env={**os.environ, **creds.env()})
    assert out.returncode == 0, out.stderr
    assert "verified from the registry" in out.stdout and "verdict:       pass" in out.stdout
    by_tag = attestation_verify.verify_image(f"{creds.address}/qualify/sm120:v-test", published["pub"])
    assert by_tag.digest == smoke.digest


def test_another_key_fails_saying_so(published, smoke, creds, tmp_path):
    _, other = _key_pair(tmp_path, b"other")
    with pytest.raises(VerificationError, match="signed by another key"):
        attestation_verify.verify_image(f"{creds.address}/qualify/sm120@{smoke.digest}", other)


def _push_att(creds, repo: str, digest: str, layers):
    publish.push_document(oci.attestation_image(layers), f"{creds.address}/{repo}:{oci.att_tag(digest)}",
                          "test", lambda _m: None)


def _copy_image(creds, smoke, repo: str) -> None:
    skopeo.copy(f"docker://{smoke.image_reference}", f"docker://{creds.address}/{repo}:t", label="t",
                progress=lambda _m: None, insecure_hosts=("127.0.0.1:5555",))


def test_tampered_payload_fails_saying_so(published, smoke, creds):
    ref = f"{creds.address}/qualify/sm120"
    qual = [d for layer, d in attestation_verify.fetch_layers(ref, smoke.digest)
            if layer.predicate_type == mf.PREDICATE_TYPE][0]
    env = dsse.parse(qual)
    forged = json.loads(env.payload)
    forged["predicate"]["verdict"] = "pass"
    forged["predicate"]["support_level"] = "optimized"
    tampered = dsse.Envelope(env.payload_type, canonical_json(forged), env.signatures)
    _copy_image(creds, smoke, "tamper/sm120")
    _push_att(creds, "tamper/sm120", smoke.digest, [(tampered.to_json(), mf.PREDICATE_TYPE)])
    with pytest.raises(VerificationError, match="payload or signature was changed"):
        attestation_verify.verify_image(f"{creds.address}/tamper/sm120@{smoke.digest}", published["pub"])


def test_attestation_copied_from_another_image_fails(published, smoke, creds, docker_engine, tmp_path):
    other = images.derived(docker_engine, smoke.image_reference, "127.0.0.1:5555/qualify-test/publish-other:1",
                           "LABEL qualify.test=other", {}, tmp_path, smoke.platform)
    try:
        subprocess.run([docker_engine, "push", other], check=True, capture_output=True, timeout=300)
        raw = skopeo.inspect_raw(f"docker://{other}", ("127.0.0.1:5555",))
        other_digest = oci.digest_of(raw)
        skopeo.copy(f"docker://{other}", f"docker://{creds.address}/copied/sm120:t", label="t",
                    progress=lambda _m: None, insecure_hosts=("127.0.0.1:5555",))
        layers = [(d, layer.predicate_type) for layer, d in
                  attestation_verify.fetch_layers(f"{creds.address}/qualify/sm120", smoke.digest)]
        _push_att(creds, "copied/sm120", other_digest, layers)
        with pytest.raises(VerificationError, match="copied from another image"):
            attestation_verify.verify_image(f"{creds.address}/copied/sm120@{other_digest}", published["pub"])
    finally:
        subprocess.run([docker_engine, "rmi", other], capture_output=True)


def test_image_without_attestation_fails(published, smoke, creds):
    _copy_image(creds, smoke, "bare/sm120")
    with pytest.raises(VerificationError, match="no attestation"):
        attestation_verify.verify_image(f"{creds.address}/bare/sm120@{smoke.digest}", published["pub"])


def test_push_without_credentials_is_refused_clearly(smoke, registry, monkeypatch, tmp_path):
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(registry.empty_auth_file))
    key, _ = _key_pair(tmp_path)
    _release(tmp_path / "manifests", "v-nocreds", smoke)
    opts = publish.PublishOptions(tag="v-nocreds", destination=publish.Destination.parse(f"{registry.address}/x"),
                                  release_root=tmp_path / "manifests", key=key, password=PASSWORD,
                                  attest_build=False)
    with pytest.raises(RegistryError, match="without valid credentials") as info:
        publish.publish(opts, progress=lambda _m: None)
    assert "docker login" in info.value.hint
    assert not (tmp_path / "manifests" / "v-nocreds" / "published.json").exists()


def test_credentials_never_in_arguments_or_logs(published, smoke, creds, monkeypatch, capsys):
    secret = creds.password
    assert all(secret not in line for line in published["lines"])
    assert secret not in creds.log_text()
    seen = []
    real = skopeo.subprocess.Popen

    def recording(args, *a, **kw):  # the real Popen runs; we only keep its argument list
        seen.append(list(args))
        return real(args, *a, **kw)

    monkeypatch.setattr(skopeo.subprocess, "Popen", recording)
    attestation_verify.verify_image(f"{creds.address}/qualify/sm120@{smoke.digest}", published["pub"])
    assert seen and all(secret not in " ".join(a) and tls_registry.USER not in " ".join(a) for a in seen)
    assert all(not x.startswith(("--creds", "--authfile", "--src-creds", "--dest-creds")) for a in seen for x in a)
    out = capsys.readouterr()
    assert secret not in out.out + out.err


def _uploads(log: str, repo: str) -> int:
    return len(re.findall(rf'"(?:POST|PUT|PATCH) /v2/{re.escape(repo)}/blobs/uploads/', log))


def test_interrupted_publish_resumes_without_resending_blobs(smoke, creds, tmp_path):
    key, _ = _key_pair(tmp_path)
    _release(tmp_path / "manifests", "v-resume", smoke)
    opts = publish.PublishOptions(tag="v-resume", destination=publish.Destination.parse(f"{creds.address}/resume"),
                                  release_root=tmp_path / "manifests", key=key, password=PASSWORD,
                                  attest_build=False)
    # Interrupt: the python process publishing is killed once the first blob upload has finished.
    script = ("import os,sys; from pathlib import Path; from qualify.publish import publish as p; "
              f"o=p.PublishOptions(tag='v-resume', destination=p.Destination.parse('{creds.address}/resume'), "
              f"release_root=Path('{tmp_path}/manifests'), key=Path('{key}'), password={PASSWORD!r}, "
              "attest_build=False); p.publish(o)")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parent.parent,
                            env={**os.environ, **creds.env()}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if re.search(r'"PUT /v2/resume/sm120/blobs/uploads/[^"]*" 201', creds.log_text()):
            break
        time.sleep(0.05)
    os.killpg(proc.pid, 9)
    proc.wait()
    assert not (tmp_path / "manifests" / "v-resume" / "published.json").exists()
    before = creds.log_text()
    done_before = len(re.findall(r'"PUT /v2/resume/sm120/blobs/uploads/[^"]*" 201', before))
    assert done_before >= 1, "the interruption came after at least one whole blob"
    record = publish.publish(opts, progress=lambda _m: None)
    assert oci.digest_of(skopeo.inspect_raw(f"docker://{record.images[0].tag}")) == smoke.digest
    after = creds.log_text()[len(before):]
    completed_before = set(re.findall(r'digest=(sha256:[0-9a-f]{64})[^"]*" 201', before))
    resent = [d for d in re.findall(r'"PUT /v2/resume/sm120/blobs/uploads/[^"?]*\?digest=(sha256%3A[0-9a-f]{64}|sha256:'
                                    r'[0-9a-f]{64})', after)
              if d.replace("%3A", ":") in completed_before]
    assert resent == [], f"blobs sent again after the interruption: {resent}"
    assert record.images[0].blobs_skipped >= done_before, "skopeo itself reports the blobs as already there"
    print(f"\nresume: {done_before} blob(s) completed before the kill; re-run sent {record.images[0].blobs_sent}, "
          f"{_uploads(after, 'resume/sm120')} upload requests after; none re-sent")
