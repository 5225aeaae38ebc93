"""`pin` against a real registry on loopback: push, pin, push another image
under the same tag, pin again; only that digest and its date change."""

import difflib
import subprocess
import uuid
from pathlib import Path

import pytest

from qualify.config import targets
from qualify.config.imageref import ImageRef
from qualify.core.errors import RegistryError
from qualify.imagebuild import pin

REPO = Path(__file__).resolve().parent.parent


def _push(docker, image, ref):
    subprocess.run([docker, "tag", image, ref], check=True, capture_output=True)
    out = subprocess.run([docker, "push", ref], check=True, capture_output=True, text=True).stdout
    return next(line.split("digest: ", 1)[1].split()[0] for line in out.splitlines() if "digest: sha256:" in line)


def _variant(docker, base, label, tmp_path):
    ctx = tmp_path / label
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {base}\nLABEL variant={label}\n")
    tag = f"qualify-test/pin-variant:{label}"
    subprocess.run([docker, "build", "-q", "-t", tag, str(ctx)], check=True, capture_output=True,
                   env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/bin:/bin"})
    return tag


@pytest.mark.engine
def test_pin_follows_a_moved_tag_and_changes_nothing_else(docker_engine, debian_python_image, loopback_registry, tmp_path):
    repo = f"qualify-test/pin-{uuid.uuid4().hex[:8]}"
    ref = f"{loopback_registry.address}/{repo}:13.0-test"
    first = _push(docker_engine, _variant(docker_engine, debian_python_image, "one", tmp_path), ref)

    text = (REPO / "images" / "targets.toml").read_text()
    old_image = str(targets.load().get("sm120").base.image)
    start = text.index("[targets.sm120.base]")
    path = tmp_path / "targets.toml"
    path.write_text(text[:start] + text[start:].replace(old_image, f"{ref}@sha256:{'0' * 64}", 1))
    original = path.read_text()

    changes = pin.pin(path, ["sm120"], today="2030-01-02")
    assert [c.new for c in changes] == [first] and changes[0].changed
    after_first = path.read_text()
    assert targets.load(path).get("sm120").base.image.digest == first

    second = _push(docker_engine, _variant(docker_engine, debian_python_image, "two", tmp_path), ref)
    assert second != first
    changes = pin.pin(path, ["sm120"], today="2030-02-03")
    assert changes[0].old == first and changes[0].new == second
    after_second = path.read_text()

    diff = [line for line in difflib.unified_diff(after_first.splitlines(), after_second.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert sorted(diff) == sorted([f'-image = "{ref}@{first}"', f'+image = "{ref}@{second}"',
                                   '-pinned = "2030-01-02"', '+pinned = "2030-02-03"'])
    # comments and every other target untouched since the start
    assert [ln for ln in original.splitlines() if ln.startswith("#")] == [ln for ln in after_second.splitlines()
                                                                        if ln.startswith("#")]
    assert after_second.count("7d2f6a8c2071d911524f95061a0db363e24d27aa51ec831fcccf9e76eb72bc92") == 4

    # unchanged tag: nothing written
    before = path.stat().st_mtime_ns
    assert not pin.pin(path, ["sm120"])[0].changed
    assert path.stat().st_mtime_ns == before


def test_unreachable_registry_changes_nothing(tmp_path):
    path = tmp_path / "targets.toml"
    text = (REPO / "images" / "targets.toml").read_text()
    path.write_text(text)
    # 127.0.0.1:9 (discard) refuses connections: a registry that cannot be reached
    unreachable = lambda ref: pin.resolve(ImageRef.parse("127.0.0.1:9/nvidia/cuda:13.0"), timeout=3)  # noqa: E731
    with pytest.raises(RegistryError, match="cannot reach 127.0.0.1:9"):
        pin.pin(path, [], resolver=unreachable)
    assert path.read_text() == text


def test_registry_split():
    assert pin.split_registry("nvidia/cuda") == ("registry-1.docker.io", "nvidia/cuda")
    assert pin.split_registry("debian") == ("registry-1.docker.io", "library/debian")
    assert pin.split_registry("127.0.0.1:5555/a/b") == ("127.0.0.1:5555", "a/b")
    assert pin.split_registry("nvcr.io/nvidia/cuda") == ("nvcr.io", "nvidia/cuda")
