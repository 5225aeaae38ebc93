"""DSSE envelopes, cosign's attestation layout and the SBOM parser, checked
against independent implementations (openssl, sigstore-js) where one exists."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
from conftest import require

from qualify.core.errors import VerificationError
from qualify.devtools import attest_interop
from qualify.publish import dsse, imagefs, oci
from qualify.signing import keys as cosign_keys
from qualify.signing.signer import BuiltinSigner


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
    env = dsse.sign(BuiltinSigner(private), b'{"_type":"x"}')
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
    envelope = dsse.sign(BuiltinSigner(private), b'{"a":1}')
    assert attest_interop.openssl_check(tmp_path, envelope, tmp_path / "k.pub").startswith("openssl")


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
    assert imagefs.parse_dpkg_status(text) == [imagefs.DebPackage("libc6", "2.36-9", "amd64")]
    # distroless: one paragraph per package in status.d/, no Status field
    assert imagefs.parse_dpkg_status("Package: tzdata\nVersion: 2024a\nArchitecture: all\n",
                                     "/var/lib/dpkg/status.d/tzdata") == [
        imagefs.DebPackage("tzdata", "2024a", "all", "/var/lib/dpkg/status.d/tzdata")]


def _tar_stream(members: dict) -> io.BytesIO:
    """A filesystem as `docker export` streams it (names without a leading slash)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out.seek(0)
    return out


def test_the_filesystem_reader_finds_every_python_environment_and_reports_damage():
    """Python distributions anywhere (a venv, the system's dist-packages, a user's ~/.local, an egg-info file),
    wheel files with their sha256, os-release; a METADATA without Name or Version is a problem named by path,
    never a package quietly left out."""
    wheel = b"PK-not-really-a-zip"
    fs = _tar_stream({
        "etc/os-release": b'ID=debian\nVERSION_ID="12"\n',
        "var/lib/dpkg/status": b"Package: python3\nStatus: install ok installed\nVersion: 3.11.2-1\nArchitecture: amd64\n",
        "opt/venv/lib/python3.11/site-packages/Triton-3.8.0.dist-info/METADATA": b"Name: Triton\nVersion: 3.8.0\n\nbody",
        "usr/lib/python3/dist-packages/six-1.16.0.egg-info": b"Metadata-Version: 1.1\nName: six\nVersion: 1.16.0\n",
        "root/.local/lib/python3.11/site-packages/a_b-1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: A_b\nVersion: 1\n",
        "opt/other/site-packages/broken-1.dist-info/METADATA": b"Summary: no name\n",
        # an unpacked egg (setuptools' pkg_resources/tests/data in the vLLM image: syft lists it)
        "opt/venv/lib/python3.11/site-packages/pkg_resources/tests/data/my-test-package_unpacked-egg/"
        "my_test_package-1.0-py3.7.egg/EGG-INFO/PKG-INFO": b"Metadata-Version: 1.0\nName: my-test-package\nVersion: 1.0\n",
        "usr/share/python-wheels/pip-23.0.1-py3-none-any.whl": wheel,
    })
    c = imagefs.read_contents(fs, "test image")
    assert (c.os_id, c.os_version, c.members) == ("debian", "12", 8)
    egg = "/opt/venv/lib/python3.11/site-packages/pkg_resources/tests/data/my-test-package_unpacked-egg"
    assert [(d.name, d.version, d.environment) for d in c.python] == [
        ("triton", "3.8.0", "/opt/venv/lib/python3.11/site-packages"),
        ("my-test-package", "1.0", f"{egg}/my_test_package-1.0-py3.7.egg"),
        ("a-b", "1", "/root/.local/lib/python3.11/site-packages"),
        ("six", "1.16.0", "/usr/lib/python3/dist-packages")]
    assert c.wheel_files == (imagefs.WheelFile("/usr/share/python-wheels/pip-23.0.1-py3-none-any.whl", "pip", "23.0.1",
                                               hashlib.sha256(wheel).hexdigest()),)
    assert c.problems == ("/opt/other/site-packages/broken-1.dist-info: no Name or Version header (not a Python "
                          "distribution's metadata)",)
    assert [d.name for d in c.debs] == ["python3"]


def test_a_damaged_cuda_wheel_record_is_reported():
    fs = _tar_stream({"usr/local/cuda-13.0/wheels/wheels.json": b'{"schema": "https://blackwell-qualify.dev/cuda-wheels/v1",'
                                                               b' "wheels": [{"file": "x.whl"}]}'})
    assert "wheels[0] is not a wheel's file, name, version, sha256 and files" in imagefs.read_contents(fs, "t").problems[0]


def test_a_published_statement_renamed_back_is_the_released_bytes():
    from qualify.core import manifest as mf
    from qualify.core.fsutil import canonical_json

    released = canonical_json(mf.statement("127.0.0.1:5555/blackwell/sm120", "sha256:" + "a" * 64, {"verdict": "pass"}))
    published = mf.with_subject_name(released, "ghcr.io/acme/sm120", "m")
    assert json.loads(published)["subject"] == [{"name": "ghcr.io/acme/sm120", "digest": {"sha256": "a" * 64}}]
    assert mf.with_subject_name(published, "127.0.0.1:5555/blackwell/sm120", "m") == released
    two = json.loads(released) | {"subject": [{"name": "a", "digest": {}}, {"name": "b", "digest": {}}]}
    with pytest.raises(VerificationError, match="not a Statement about one subject"):
        mf.with_subject_name(canonical_json(two), "x", "m")


def test_slsa_digests_are_digest_sets_of_the_installed_wheel(tmp_path):
    """Issue 42's reproducer: the lock's hashes left as {"<hex>": ""}. Each wheel is now {"sha256": hex}: the one
    the build installed where its record says, else every file the lock allows; a record naming a file the lock
    does not allow is refused."""
    from qualify.core.errors import ConfigError
    from qualify.imagebuild import locks
    from qualify.publish import slsa

    h1, h2, h3 = "1" * 64, "2" * 64, "3" * 64
    lock = tmp_path / "smoke.txt"
    lock.write_text(f"triton==3.8.0 \\\n    --hash=sha256:{h1} \\\n    --hash=sha256:{h2}\nfilelock==3.0 --hash=sha256:{h3}\n")
    facts = slsa.BuildFacts("sm120", "smoke", "hermetic", "linux/amd64", "r/base@sha256:" + "b" * 64, lock, "c" * 40, "",
                            "docker", "buildkit", "0.1.0", 1.0, wheels={"triton-3.8.0-cp311-cp311-x.whl": h2})
    deps = slsa.predicate(facts)["buildDefinition"]["resolvedDependencies"]
    assert [d["digest"] for d in deps] == [{"sha256": "b" * 64}, {"sha256": hashlib.sha256(lock.read_bytes()).hexdigest()},
                                           {"gitCommit": "c" * 40}, {"sha256": h2}, {"sha256": h3}]
    assert deps[3]["name"] == "triton-3.8.0-cp311-cp311-x.whl"
    unknown = slsa.predicate(facts.__class__(**{**facts.__dict__, "revision": "unknown"}))
    assert "digest" not in unknown["buildDefinition"]["resolvedDependencies"][2]  # no commit, no digest
    with pytest.raises(ConfigError, match="a file the lock does not allow"):
        slsa.predicate(facts.__class__(**{**facts.__dict__, "wheels": {"triton-3.8.0-x.whl": h3}}))
    with pytest.raises(ValueError):
        locks.digest_set("sha256:" + h1)


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
