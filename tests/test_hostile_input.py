"""Issue 15 items 5-8: hostile input to the targets file, keys, signatures, bundles and manifests.

Each test keeps the reproducer of the review; each refusal is an error with its exit code
(never a traceback, never exit 1 = "failing verdict") that names the file or value.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from signing_helpers import (
    DIGEST_A,
    PASSWORD,
    make_key_pair,
    run_qualify,
    write_manifest,
)

from qualify.config import targets
from qualify.core import manifest as mf
from qualify.core.errors import ConfigError, VerificationError
from qualify.core.fsutil import canonical_json
from qualify.release import verify
from qualify.signing import formats, signer

REPO = Path(__file__).resolve().parent.parent
FILE = REPO / "images" / "targets.toml"


def edited(tmp_path: Path, old: str, new: str) -> Path:
    text = FILE.read_text()
    assert old in text, old
    path = tmp_path / "targets.toml"
    path.write_text(text.replace(old, new, 1))
    return path


def no_traceback(proc) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr


# --- item 5: values that reach paths and tools --------------------------------------------


@pytest.mark.parametrize("old,new,words", [
    ("[targets.sm120]", '[targets."../../../../tmp/victim/"]', ["../../../../tmp/victim/", "not allowed"]),
    ("[targets.sm120]", "[targets.SM120]", ["'SM120'", "not allowed"]),
    ('suite = "bookworm"', 'suite = "--foreign"', ["suite", "--foreign"]),
    ('mirror = "http://deb.debian.org/debian"', 'mirror = "http://deb.debian.org/debian\\nevil"', ["mirror"]),
    ('torch_cuda_arch_list = "12.0;12.0a"', 'torch_cuda_arch_list = ";;12.0;;12.0a;;"',
     ["sm120", "torch_cuda_arch_list", "empty"]),
    ('python = "3.11"', 'python = "3.11/../../x"', ["python", "3.11/../../x"]),
])
def test_values_reaching_paths_and_tools_are_refused(tmp_path, old, new, words):
    bad = edited(tmp_path, old, new)
    if "[targets." in new:  # the target's subtables must follow its rename
        name = new[len("[targets."):-1]
        bad.write_text(bad.read_text().replace("[targets.sm120.", f"[targets.{name}."))
    with pytest.raises(ConfigError) as err:
        targets.load(bad)
    for word in words:
        assert word in str(err.value), (word, str(err.value))
    out = run_qualify(["targets", "check", str(bad)], tmp_path)
    assert out.returncode == ConfigError.exit_code
    no_traceback(out)


@pytest.mark.parametrize("value", ["-12", "0", "99999999"])
def test_absurd_memory_sizes_are_refused(tmp_path, value):
    text = FILE.read_text()
    assert "[targets.sm120.runtime]" not in text
    bad = tmp_path / "targets.toml"
    bad.write_text(text.replace("[targets.sm120.base]", f"[targets.sm120.runtime]\nmin_gpu_memory_gib = {value}\n\n"
                                "[targets.sm120.base]", 1))
    with pytest.raises(ConfigError, match=f"min_gpu_memory_gib': {value} is outside"):
        targets.load(bad)


def test_targets_check_reports_every_error_not_only_the_first(tmp_path):
    text = FILE.read_text()
    text = text.replace('support_level = "baseline"', 'support_level = "supported"', 1)  # sm100, and ...
    text = text.replace('platform = "linux/amd64"', 'platform = "linux/s390x"', 1)  # ... sm100 again
    text = text.replace('suite = "bookworm"', 'suite = "-x"', 1)
    text = text.replace('torch_cuda_arch_list = "12.0;12.0a"', 'torch_cuda_arch_list = "12.0f"', 1)
    text = text.replace('torch_cuda_arch_list = "12.1;12.1a"', 'torch_cuda_arch_list = ";;"', 1)
    bad = tmp_path / "targets.toml"
    bad.write_text(text)
    out = run_qualify(["targets", "check", str(bad)], tmp_path)
    assert out.returncode == ConfigError.exit_code
    assert "5 problems" in out.stderr and out.stderr.count("target 'sm100'") == 2  # sm100 has two
    for word in ("suite", "'sm120'", "'sm121'", "'supported'", "linux/s390x"):
        assert word in out.stderr, (word, out.stderr)


# --- item 6: bounded reads ---------------------------------------------------------------


def test_verify_key_dev_zero_fails_fast_with_a_clear_error(tmp_path):
    manifest = write_manifest(tmp_path / "sm120.json", "sm120", DIGEST_A)
    start = time.monotonic()
    out = run_qualify(["verify", str(manifest), "--key", "/dev/zero"], tmp_path)
    assert time.monotonic() - start < 30
    assert out.returncode == ConfigError.exit_code
    assert "/dev/zero is not a regular file" in out.stderr
    no_traceback(out)


@pytest.mark.parametrize("what", ["manifest", "signature", "bundle", "targets"])
def test_fifo_and_oversized_inputs_are_refused(tmp_path, what):
    key, pub = make_key_pair(tmp_path)
    manifest = write_manifest(tmp_path / "sm120.json", "sm120", DIGEST_A)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    with open(big, "wb") as fh:
        fh.truncate(70 * 1024 * 1024)  # sparse: larger than any limit, costs no disk
    for path in (fifo, big):
        if what == "manifest":
            args = ["verify", str(path), "--key", str(pub)]
        elif what == "signature":
            args = ["verify", str(manifest), "--key", str(pub), "--signature", str(path)]
        elif what == "bundle":
            args = ["verify", str(manifest), "--key", str(pub), "--bundle", str(path)]
        else:
            args = ["targets", "check", str(path)]
        start = time.monotonic()
        out = run_qualify(args, tmp_path)
        assert time.monotonic() - start < 30
        assert out.returncode in (ConfigError.exit_code, VerificationError.exit_code), out.stderr
        assert str(path) in out.stderr and ("not a regular file" in out.stderr or "bytes" in out.stderr), out.stderr
        no_traceback(out)


# --- item 7: --require-pass is an allow-list; duplicate keys in signed JSON ---------------


def sign(manifest: Path, key: Path) -> None:
    signer.write_signature(signer.BuiltinSigner.from_key_file(key, PASSWORD.encode()), manifest)


def signed_with(tmp_path: Path, mutate) -> tuple:
    key, pub = make_key_pair(tmp_path)
    stmt = mf.statement("127.0.0.1:5000/qualify/sm120", DIGEST_A,
                        json.loads((write_manifest(tmp_path / "base.json", "sm120", DIGEST_A)).read_text())["predicate"])
    mutate(stmt["predicate"])
    path = tmp_path / "sm120.json"
    path.write_bytes(canonical_json(stmt))
    sign(path, key)
    return path, pub


@pytest.mark.parametrize("verdict", ["bogus", "", "PASS"])
def test_require_pass_refuses_an_unknown_verdict(tmp_path, verdict):
    path, pub = signed_with(tmp_path, lambda p: p.update(verdict=verdict))
    with pytest.raises(VerificationError, match=r"^verdict check failed: unknown verdict"):
        verify.verify(verify.VerifyOptions(path, key=pub, require_pass=True))
    out = run_qualify(["verify", str(path), "--key", str(pub), "--require-pass"], tmp_path)
    assert out.returncode == VerificationError.exit_code and "unknown verdict" in out.stderr


def test_require_pass_refuses_an_unknown_check_status(tmp_path):
    path, pub = signed_with(tmp_path, lambda p: p["checks"][0].update(status="FAIL"))
    with pytest.raises(VerificationError, match="unknown status 'FAIL'"):
        verify.verify(verify.VerifyOptions(path, key=pub, require_pass=True))


def test_require_pass_refuses_a_verdict_its_checks_do_not_give(tmp_path):
    def mutate(p):
        p["checks"][0]["status"] = "not-run"  # verdict stays "pass": the checks say incomplete
    path, pub = signed_with(tmp_path, mutate)
    with pytest.raises(VerificationError, match="is not what its checks give"):
        verify.verify(verify.VerifyOptions(path, key=pub, require_pass=True))


def test_duplicate_keys_in_a_signed_manifest_are_refused(tmp_path):
    key, pub = make_key_pair(tmp_path)
    good = write_manifest(tmp_path / "good.json", "sm120", DIGEST_A, level="unsupported",
                          statuses={"triton-compile": "fail"})
    text = good.read_text()
    # The later "verdict" would win in a plain json.loads: a failing manifest reads as passing.
    dup = text.replace('"verdict": "fail"', '"verdict": "fail",\n    "verdict": "pass"', 1)
    assert dup != text
    path = tmp_path / "sm120.json"
    path.write_text(dup)
    sign(path, key)
    with pytest.raises(VerificationError, match="duplicate JSON key 'verdict'"):
        verify.verify(verify.VerifyOptions(path, key=pub))
    bundle = formats.bundle_path(path)
    doc = bundle.read_text()
    bundle.write_text(doc.replace('"mediaType"', '"mediaType":"x","mediaType"', 1))
    with pytest.raises(VerificationError, match="duplicate JSON key 'mediaType'"):
        formats.load_bundle(bundle.read_bytes(), str(bundle))


# --- item 8: tracebacks become errors with the right exit code ----------------------------


def test_a_directory_as_key_or_manifest(tmp_path):
    manifest = write_manifest(tmp_path / "sm120.json", "sm120", DIGEST_A)
    _, pub = make_key_pair(tmp_path)
    (tmp_path / "dir").mkdir()
    as_key = run_qualify(["verify", str(manifest), "--key", str(tmp_path / "dir")], tmp_path)
    assert as_key.returncode == ConfigError.exit_code and "is a directory" in as_key.stderr
    no_traceback(as_key)
    as_manifest = run_qualify(["verify", str(tmp_path / "dir"), "--key", str(pub)], tmp_path)
    assert as_manifest.returncode == VerificationError.exit_code and "is a directory" in as_manifest.stderr
    no_traceback(as_manifest)
    for command in (["show", str(tmp_path / "dir")], ["diff", str(tmp_path / "dir"), str(manifest)]):
        out = run_qualify(command, tmp_path)
        assert out.returncode == VerificationError.exit_code and "is a directory" in out.stderr, out.stderr
        no_traceback(out)


@pytest.mark.parametrize("message_signature,words", [
    ('"MEUCIQ=="', "messageSignature.signature object"),
    ('{"signature": "MEUC\u00e9IQ=="}', "non-ASCII"),
    ('{"signature": 5}', "messageSignature.signature object"),
    ('[1, 2]', "messageSignature.signature object"),
])
def test_malformed_bundles_are_verification_errors(tmp_path, message_signature, words):
    key, pub = make_key_pair(tmp_path)
    manifest = write_manifest(tmp_path / "sm120.json", "sm120", DIGEST_A)
    bundle = formats.bundle_path(manifest)
    doc = '{"mediaType": "' + formats.BUNDLE_MEDIA_TYPE + '", "messageSignature": ' + message_signature + "}"
    bundle.write_text(doc, encoding="utf-8")
    out = run_qualify(["verify", str(manifest), "--key", str(pub)], tmp_path)
    assert out.returncode == VerificationError.exit_code, out.stderr
    assert "signature check failed" in out.stderr and words in out.stderr
    no_traceback(out)


def test_deeply_nested_toml_and_json(tmp_path):
    deep = tmp_path / "targets.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    out = run_qualify(["targets", "check", str(deep)], tmp_path)
    assert out.returncode == ConfigError.exit_code and "nested too deeply" in out.stderr
    no_traceback(out)
    manifest = tmp_path / "sm120.json"
    manifest.write_text('{"_type": ' + "[" * 100000 + "]" * 100000 + "}")
    shown = run_qualify(["show", str(manifest)], tmp_path)
    assert shown.returncode == VerificationError.exit_code and "nested deeper" in shown.stderr
    no_traceback(shown)


def test_a_non_ascii_signature_file(tmp_path):
    key, pub = make_key_pair(tmp_path)
    manifest = write_manifest(tmp_path / "sm120.json", "sm120", DIGEST_A)
    formats.signature_path(manifest).write_bytes("MEUCIQ\u00e9==".encode())
    out = run_qualify(["verify", str(manifest), "--key", str(pub)], tmp_path)
    assert out.returncode == VerificationError.exit_code and "not a base64 signature" in out.stderr
    no_traceback(out)


@pytest.fixture
def full_disk(tmp_path):
    """A real file system with no room: an 8 KiB tmpfs (the tests run as root, as CI does)."""
    import subprocess

    from conftest import require

    where = tmp_path / "full"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(where)], capture_output=True)
    require(mounted.returncode == 0, f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield where
    subprocess.run(["umount", str(where)], capture_output=True)


def test_a_full_disk_is_a_message_with_what_to_do_not_a_traceback(tmp_path, full_disk):
    """Issue 30, item 13: a full disk gave raw OSError tracebacks."""
    out = run_qualify(["bake", "--out", str(full_disk / "docker-bake.json")], tmp_path)
    assert out.returncode == 12, out.stderr
    assert "No space left on device" in out.stderr and "free disk space" in out.stderr
    no_traceback(out)
    assert not [p for p in full_disk.iterdir() if p.name.endswith(".tmp")]  # nothing half-written stays


def test_an_atomic_write_never_replaces_a_device_or_a_link(tmp_path):
    """`--out /dev/full` once replaced the device node with a plain file (rename over it)."""
    from qualify.core.fsutil import write_atomic

    target = tmp_path / "real.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    for path in (Path("/dev/null"), link, tmp_path):
        with pytest.raises(OSError):
            write_atomic(path, b"x")
    assert Path("/dev/null").is_char_device() and link.is_symlink() and target.read_text() == "{}"


def test_registry_failures_say_what_happened_and_what_to_do():
    from qualify.host import skopeo

    said = {
        "connection refused": skopeo.explain("dial tcp 127.0.0.1:5999: connect: connection refused", "push"),
        "500": skopeo.explain("writing blob: received unexpected HTTP status: 500 Internal Server Error", "push"),
        "disk": skopeo.explain("write /var/lib/x: no space left on device", "copy"),
    }
    assert "does not answer" in said["connection refused"].message and "QUALIFY_REGISTRY" in said["connection refused"].hint
    assert "HTTP 500" in said["500"].message and "full disk" in said["500"].hint
    assert "the disk is full" in said["disk"].message and "nox -s clean" in said["disk"].hint


def test_empty_link_files_a_full_registry_disk_left_are_removed(tmp_path, capsys):
    """Issue 30, item 13: a full registry left 0-byte `_layers/*/link` files that failed every later push."""
    from qualify.host.registry import repair_storage

    layers = tmp_path / "docker" / "registry" / "v2" / "repositories" / "blackwell" / "sm120" / "_layers" / "sha256"
    (layers / ("a" * 64)).mkdir(parents=True)
    (layers / ("a" * 64) / "link").write_bytes(b"")
    (layers / ("b" * 64)).mkdir()
    (layers / ("b" * 64) / "link").write_text("sha256:" + "b" * 64)
    removed = repair_storage(tmp_path)
    assert len(removed) == 1 and not (layers / ("a" * 64) / "link").exists()
    assert (layers / ("b" * 64) / "link").exists() and "removed 1 empty link file" in capsys.readouterr().err
