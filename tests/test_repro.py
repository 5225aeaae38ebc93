"""Reproducibility: the tar comparison on small synthetic image tarballs, and real double builds
(podman: the sm120 smoke image reproduces; docker's classic builder: a tiny image does not,
and the report names the files)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import REPO, require

from qualify.core.errors import EngineError, ParseError
from qualify.host.engine import BuildRequest, Engine
from qualify.repro import archive
from qualify.repro import compare as explain
from qualify.repro import double as repro

EPOCH = 1764374400


# --- synthetic images ----------------------------------------------------------------


def member(name, data=b"", *, mtime=EPOCH, mode=0o644, uid=0, gid=0, kind=tarfile.REGTYPE, link="", pax=None):
    return dict(name=name, data=data, mtime=mtime, mode=mode, uid=uid, gid=gid, kind=kind, link=link, pax=pax or {})


def layer_bytes(members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            info = tarfile.TarInfo(m["name"])
            info.type, info.mode, info.mtime = m["kind"], m["mode"], m["mtime"]
            info.uid, info.gid, info.linkname = m["uid"], m["gid"], m["link"]
            info.pax_headers = dict(m["pax"])
            info.size = len(m["data"]) if m["kind"] == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(m["data"]) if m["kind"] == tarfile.REGTYPE else None)
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def image_tar(path: Path, layers, *, layout="docker", created="2026-01-01T00:00:00Z", gz=False) -> Path:
    """A saved-image tarball: docker-archive (manifest.json + <n>/layer.tar) or OCI layout (index.json + blobs)."""
    raw = [layer_bytes(members) for members in layers]
    config = {"architecture": "amd64", "os": "linux", "created": created,
              "rootfs": {"type": "layers", "diff_ids": [_sha(b) for b in raw]},
              "history": [{"created_by": f"RUN step {i}"} for i in range(len(raw))]}
    config_raw = json.dumps(config, sort_keys=True).encode()
    with tarfile.open(path, "w") as tar:
        if layout == "docker":
            names = []
            for i, data in enumerate(raw):
                names.append(f"{i}/layer.tar")
                _add(tar, names[-1], data)
            _add(tar, "config.json", config_raw)
            _add(tar, "manifest.json", json.dumps([{"Config": "config.json", "RepoTags": None, "Layers": names}]).encode())
        else:
            blobs = [gzip.compress(b, mtime=0) if gz else b for b in raw]
            for data in blobs + [config_raw]:
                _add(tar, f"blobs/sha256/{_sha(data)[7:]}", data)
            media = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if gz else "")
            manifest = json.dumps({"schemaVersion": 2, "config": {"digest": _sha(config_raw)},
                                   "layers": [{"mediaType": media, "digest": _sha(b)} for b in blobs]}).encode()
            _add(tar, f"blobs/sha256/{_sha(manifest)[7:]}", manifest)
            _add(tar, "index.json", json.dumps({"schemaVersion": 2, "manifests": [{"digest": _sha(manifest)}]}).encode())
            _add(tar, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
    return path


BASE = [member("etc", kind=tarfile.DIRTYPE, mode=0o755), member("etc/os-release", b"debian\n")]
APP = [member("app", kind=tarfile.DIRTYPE, mode=0o755), member("app/a.py", b"print(1)\n"),
       member("app/b.bin", b"\x00" * 64), member("app/link", kind=tarfile.SYMTYPE, link="a.py", mode=0o777)]


def edited(members, name, **changes):
    return [dict(m, **changes) if m["name"] == name else m for m in members]


def compare(tmp_path, layers_a, layers_b, **kw):
    a = image_tar(tmp_path / "a.tar", layers_a, **kw)
    b = image_tar(tmp_path / "b.tar", layers_b, **kw)
    return explain.compare_archives(a, b)


def only_layer(result):
    assert len(result.layers) == 1, result.layers
    return result.layers[0]


# --- the comparison ----------------------------------------------------------------------


def test_identical_archives_are_identical(tmp_path):
    result = compare(tmp_path, [BASE, APP], [BASE, APP])
    assert result.identical and result.a_config == result.b_config and not result.config


@pytest.mark.parametrize("changes,kind,a,b", [
    ({"data": b"print(2)\n"}, "content", "sha256:", "sha256:"),  # same size: hashed
    ({"data": b"print(22)\n"}, "content", "file, 9 B", "file, 10 B"),  # size alone says it
    ({"mtime": EPOCH + 60}, "mtime", "2025-11-29T00:00:00Z", "2025-11-29T00:01:00Z"),
    ({"uid": 1000, "gid": 1000}, "owner", "0:0", "1000:1000"),
    ({"mode": 0o755}, "mode", "0644", "0755"),
    ({"pax": {"SCHILY.xattr.user.note": "x"}}, "xattr", "-", "user.note"),
    ({"pax": {"atime": "1.5"}}, "header", "atime=-", "atime=1.5"),
])
def test_each_kind_of_file_difference(tmp_path, changes, kind, a, b):
    layer = only_layer(compare(tmp_path, [BASE, APP], [BASE, edited(APP, "app/a.py", **changes)]))
    assert layer.index == 1 and layer.created_by == "RUN step 1"
    assert [(f.path, f.kind) for f in layer.files] == [("app/a.py", kind)]
    assert layer.files[0].a.startswith(a) and layer.files[0].b.startswith(b)


def test_symlink_target_is_content(tmp_path):
    layer = only_layer(compare(tmp_path, [APP], [edited(APP, "app/link", link="b.bin")]))
    assert [(f.path, f.kind, f.a, f.b) for f in layer.files] == [
        ("app/link", "content", "symlink -> a.py", "symlink -> b.bin")]


def test_added_removed_and_order(tmp_path):
    layer = only_layer(compare(tmp_path, [APP], [APP[1:] + [member("app/new.txt", b"n")]]))
    kinds = {(f.path, f.kind) for f in layer.files}
    assert ("app/new.txt", "added") in kinds and ("app", "removed") in kinds
    moved = only_layer(compare(tmp_path, [APP], [[APP[0], APP[2], APP[1], APP[3]]]))
    assert [(f.kind, f.path) for f in moved.files] == [("order", "app/a.py")]
    assert moved.files[0].a == "entry 1 of 4" and moved.files[0].b.startswith("entry 2")


def test_extra_layer_lists_its_files_as_added(tmp_path):
    result = compare(tmp_path, [BASE], [BASE, APP])
    layer = only_layer(result)
    assert layer.a is None and layer.b and {f.kind for f in layer.files} == {"added"}
    assert "(only in build 2)" in "\n".join(explain.render(result))


def test_contents_are_hashed_only_where_sizes_match(tmp_path, monkeypatch):
    wanted = []
    real = archive.hash_members
    monkeypatch.setattr(explain, "hash_members", lambda stream, names: wanted.append(set(names)) or real(stream, names))
    changed = edited(edited(APP, "app/a.py", data=b"print(3)\n"), "app/b.bin", data=b"\x00" * 65)
    layer = only_layer(compare(tmp_path, [APP], [changed]))
    assert wanted == [{"app/a.py"}, {"app/a.py"}]  # b.bin differs in size: no hashing
    assert {(f.path, f.kind) for f in layer.files} == {("app/a.py", "content"), ("app/b.bin", "content")}


def test_nvcc_temporary_names_are_named_as_the_cause(tmp_path):
    # the name straddles the reader's 1 MiB chunks
    so = b"\x7fELF" + b"\0" * ((1 << 20) - 14) + b"tmpxft_0000776d_00000000-6_smoke_ext.cudafe1.cpp\0"
    other = so.replace(b"0000776d", b"0000776e")
    result = compare(tmp_path, [[member("lib.so", so)]], [[member("lib.so", other)]])
    (diff,) = only_layer(result).files
    assert diff.kind == "content" and "tmpxft_0000776d_00000000" in diff.a and "tmpxft_0000776e_00000000" in diff.b
    assert "-Xlinker --discard-all" in "\n".join(explain.render(result))


@pytest.mark.parametrize("gz", [False, True])
def test_oci_layout_gives_the_same_report(tmp_path, gz):
    changed = edited(APP, "app/a.py", mtime=EPOCH + 1)
    docker = compare(tmp_path, [BASE, APP], [BASE, changed])
    oci = compare(tmp_path, [BASE, APP], [BASE, changed], layout="oci", gz=gz)
    assert [(f.path, f.kind) for f in only_layer(oci).files] == [(f.path, f.kind) for f in only_layer(docker).files]


def test_config_differences_and_the_rendered_report(tmp_path):
    a = image_tar(tmp_path / "a.tar", [BASE, APP])
    b = image_tar(tmp_path / "b.tar", [BASE, edited(APP, "app/a.py", mtime=EPOCH + 5)], created="2026-01-02T00:00:00Z")
    result = explain.compare_archives(a, b)
    assert [d.path for d in result.config] == [".created"]
    text = "\n".join(explain.render(result))
    assert "layers: 1 of 2 differ" in text and "layer 1: RUN step 1" in text
    assert "mtime    app/a.py: 2025-11-29T00:00:00Z | 2025-11-29T00:00:05Z" in text
    assert "why: file time from the build clock" in text and "image creation time" in text
    data = explain.comparison_json(result)
    assert data["layers"][0]["counts"] == {"mtime": 1} and not data["identical"]


def test_one_field_across_history_entries_is_one_line():
    diffs = [explain.ConfigDiff(f".history[{i}].created", f"t{i}", f"u{i}") for i in range(5)]
    result = explain.Comparison("sha256:a", "sha256:b", 1, 1, config=diffs + [explain.ConfigDiff(".container", "x", "y")])
    text = explain.render(result)
    assert text[:3] == ["config: 6 field(s) differ",
                        "  .history[*].created: 5 entries differ, e.g. .history[0].created: t0 | u0   [build step time]",
                        "  .container: x | y   [random id of the build container (docker-format config): "
                        "podman build --format oci has none]"]


def test_not_an_image_tarball_is_a_clear_error(tmp_path):
    path = tmp_path / "x.tar"
    with tarfile.open(path, "w") as tar:
        _add(tar, "hello", b"hi")
    with pytest.raises(ParseError, match="neither manifest.json"):
        archive.open_archive(path)


# --- the driver's bookkeeping, with a fake engine -------------------------------------------


class FakeEngine(Engine):
    """image id -> (parent, tags, layers); what `images -a` and `inspect` would say. The engine's own
    clean-up logic runs over these three low-level calls."""

    def __init__(self, images):
        self.images = dict(images)
        self.removed = []

    def image_ids(self):
        return set(self.images)

    def inspect_raw(self, refs):
        missing = [r for r in refs if r not in self.images]
        if missing:
            raise EngineError(f"no such image {missing}")
        return [{"Id": r, "Parent": self.images[r][0], "RepoTags": self.images[r][1],
                 "RootFS": {"Layers": self.images[r][2]}} for r in refs]

    def remove_images(self, ids):
        # exactly these (--no-prune); like the engines, an image with children refuses to go
        refused = []
        for i in ids:  # in the order given, as docker does
            if any(p == i for p, _, _ in self.images.values()):
                refused.append(i)
                continue
            self.removed.append(i)
            del self.images[i]
        return f"conflict: {refused} have children" if refused else ""


def sid(name):
    return "sha256:" + name * 8


def test_only_this_builds_images_are_chosen_and_removed():
    base, other_base = sid("b"), sid("o")
    before = {base, other_base, sid("p"), sid("l")}
    engine = FakeEngine({
        base: ("", ["reg/base:1"], ["L0"]), other_base: ("", [], ["O0"]), sid("p"): (base, [], ["L0", "P"]),
        sid("l"): ("", [], ["L0"]),  # an older look-alike of the base (same layers, another config)
        # the build: podman names the look-alike as the first step's parent
        sid("1"): (sid("l"), [], ["L0", "A"]), sid("2"): (sid("1"), [], ["L0", "A", "B"]),
        sid("f"): (sid("2"), ["reg/x:smoke-repro"], ["L0", "A", "B"]),
        sid("s"): (base, [], ["L0", "S"]),  # another stage of the build
        sid("n"): (other_base, [], ["O0", "N"]),  # someone else's concurrent build
        sid("t"): (base, ["someone/else:1"], ["L0", "T"]),  # new, but someone else's name
    })
    created = engine.created_images(before, sid("f"), "reg/x:smoke-repro", base)
    assert sorted(created) == sorted([sid("1"), sid("2"), sid("f"), sid("s")])
    assert engine.remove_created(created) == ""
    assert engine.image_ids() == {base, other_base, sid("p"), sid("l"), sid("n"), sid("t")}
    assert set(engine.removed) <= set(created)


def test_from_scratch_steps_are_found_by_their_layers():
    engine = FakeEngine({sid("a"): ("", [], ["R"]), sid("c"): (sid("x"), [], ["R", "C"]),
                         sid("f"): (sid("c"), ["reg/base:t"], ["R", "C"]), sid("x"): ("", [], ["R"])})
    created = engine.created_images({sid("x")}, sid("f"), "reg/base:t", "")
    assert sorted(created) == sorted([sid("a"), sid("c"), sid("f")])


def test_exit_status_is_zero_only_when_reproducible():
    def outcome(a, b, ma="", mb=""):
        return repro.ReproResult("x", "b", "0", [repro.BuildRun(1, a, ma, "", 0, None), repro.BuildRun(2, b, mb, "", 0, None)])

    assert repro.exit_status([outcome("sha256:1", "sha256:1", "m", "m")]) == 0
    assert repro.exit_status([outcome("sha256:1", "sha256:2")]) == 1
    assert repro.exit_status([outcome("sha256:1", "sha256:1", "m1", "m2")]) == 1  # same image, pushed differently
    assert repro.exit_status([]) == 1


def test_builder_override_and_podman_build_line(tmp_path):
    require_binary("docker")
    assert Engine("docker", builder="classic").builder == "classic"
    with pytest.raises(EngineError, match="no 'classic' builder"):
        Engine("podman", builder="classic")
    require_binary("podman")
    req = BuildRequest(context=tmp_path, dockerfile=tmp_path / "Dockerfile", tags=["t"], platform="linux/amd64",
                       source_date_epoch="123")
    argv, _ = Engine("podman").build_command(req, tmp_path / "iid")
    assert argv[argv.index("--format") + 1] == "oci" and argv[argv.index("--timestamp") + 1] == "123"


def test_check_base_needs_the_hermetic_base():
    out = subprocess.run([sys.executable, "-m", "qualify", "repro", "sm120", "--check-base"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 2 and "--base hermetic" in out.stderr


def require_binary(name):
    require(shutil.which(name) is not None, f"{name} is not installed")


# --- real engines -----------------------------------------------------------------------


@pytest.mark.engine
def test_podman_double_build_of_sm120_smoke_is_reproducible(podman_engine, loopback_registry):
    out = subprocess.run([sys.executable, "-m", "qualify", "repro", "sm120", "--base", "hermetic", "--profile", "smoke",
                          "--engine", "podman", "--json"], capture_output=True, text=True, cwd=REPO, timeout=1500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (result,) = json.loads(out.stdout)
    one, two = result["builds"]
    assert result["reproducible"] and one["image_id"] == two["image_id"] and one["image_id"].startswith("sha256:")
    assert one["manifest_digest"] == two["manifest_digest"]
    assert "[repro] build 2/2" in out.stderr and "done in" in out.stderr
    ids = subprocess.run(["podman", "images", "-a", "-q", "--no-trunc"], capture_output=True, text=True).stdout
    assert one["image_id"].split(":")[1] not in ids  # what the builds made is gone


@pytest.mark.engine
def test_classic_docker_double_build_reports_the_differing_files(docker_engine, debian_python_image, tmp_path):
    (tmp_path / "Dockerfile").write_text(f"FROM {debian_python_image}\nRUN echo built > /built.txt\n")
    engine = Engine("docker", builder="classic").check()
    work = tmp_path / "work"
    work.mkdir()
    outcome = repro.double_build_dockerfile(engine, tmp_path, "qualify-test/repro-classic:x", "linux/amd64",
                                            str(EPOCH), debian_python_image, work)
    assert not outcome.reproducible and repro.exit_status([outcome]) == 1
    assert outcome.comparison is not None and outcome.comparison.layers
    for layer in outcome.comparison.layers:
        assert layer.files, f"layer {layer.index} differs but no file is named"
    names = {f.path for layer in outcome.comparison.layers for f in layer.files}
    assert "built.txt" in names
    text = "\n".join(repro.outcome_lines(outcome))
    assert "NOT reproducible" in text and "built.txt" in text and "diffoci" in text
    assert not list(work.iterdir())  # tarballs removed
    have = subprocess.run([docker_engine, "images", "-a", "-q", "--no-trunc"], capture_output=True, text=True).stdout
    assert all(run.image_id not in have for run in outcome.runs)  # the builds' images are gone
