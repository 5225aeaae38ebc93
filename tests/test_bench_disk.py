"""`nox -s bench-build` works out the free disk it needs before it builds (qualify/devtools/bench_disk.py):
what each phase holds, on which file system, and a refusal that says the number and what is short."""

from __future__ import annotations

import shutil
import zipfile

import pytest

from qualify.core.errors import QualifyError
from qualify.devtools import bench_disk

GB = 10**9


def _phases(tmp_path, engine, layers=(4 * GB, 3 * GB), wheels=3 * GB, download=True):
    return bench_disk.profile_phases("vllm", engine, tmp_path / "storage", tmp_path / "registry", tmp_path / "state",
                                     list(layers), wheels, base_missing=False, download=download)


def test_podman_s_push_holds_the_layers_twice_and_the_registry_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "big-tmp"))
    push = _phases(tmp_path, "podman")[-1]
    held = {n.what: (n.bytes, n.folder) for n in push.needs}
    assert held[bench_disk.PUSH_COPIES] == (7 * GB, tmp_path / "big-tmp")  # TMPDIR, where containers/image writes
    assert held["the vllm image in podman's storage"] == (7 * GB, tmp_path / "storage")
    assert held["the registry's copy of the vllm image"][0] == int(3 * GB * bench_disk.COMPRESSED_PER_WHEEL)
    assert bench_disk.peak(_phases(tmp_path, "podman")) == sum(n.bytes for n in push.needs)


def test_docker_pushes_without_copies_but_keeps_the_context(tmp_path):
    phases = _phases(tmp_path, "docker")
    names = {n.what for p in phases for n in p.needs}
    assert bench_disk.PUSH_COPIES not in names and "the build context in BuildKit's cache" in names
    build = next(p for p in phases if p.name.endswith("the build"))
    assert {n.what: n.bytes for n in build.needs}["the layer being committed"] == 4 * GB  # the largest layer
    assert phases[0].name.startswith("vllm: the timed wheel download")


def test_what_lasts_into_the_next_profile_leaves_out_the_transients(tmp_path):
    kept = {n.what for n in bench_disk.lasting(_phases(tmp_path, "podman")[-1])}
    assert kept == {"the vllm image in podman's storage", "the registry's copy of the vllm image"}


def test_a_run_that_does_not_fit_is_refused_with_the_number_and_what_is_short(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    phase = bench_disk.Phase("vllm: the push", (bench_disk.Need("the image", free, tmp_path / "not-yet" / "made"),
                                                bench_disk.Need("the registry's copy", 2 * GB, tmp_path)))
    with pytest.raises(QualifyError) as caught:
        bench_disk.refuse_if_short("bench-build --engine podman --profile vllm", [phase])
    text = str(caught.value)
    assert "at its peak (vllm: the push) it needs" in text and "GB short" in text
    assert f"the image {free / GB:.1f} GB ({tmp_path / 'not-yet' / 'made'})" in text
    bench_disk.refuse_if_short("fits", [bench_disk.Phase("small", (bench_disk.Need("a file", 1, tmp_path),))])


def test_the_installed_size_is_read_from_the_wheels_zip_directories(tmp_path):
    wheel = tmp_path / "p-1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("p/data.bin", bytes(1 << 20))  # 1 MB that deflates to almost nothing
    assert wheel.stat().st_size < 1 << 16
    assert bench_disk.installed_bytes([wheel]) == int((1 << 20) * bench_disk.INSTALLED_PER_ZIP)


def test_bench_build_refuses_before_it_builds(docker_engine, monkeypatch):
    """On a host with 1 GB free (the free space is the stand-in here: the real disk is what it is), the bench
    stops before its first build and names the number."""
    from qualify.devtools import bench_build
    from qualify.imagebuild import image

    real = shutil.disk_usage
    monkeypatch.setattr(bench_disk.shutil, "disk_usage", lambda p: real(p)._replace(free=GB))
    monkeypatch.setattr(image, "build", lambda *a, **k: pytest.fail("built before checking the disk"))
    with pytest.raises(QualifyError, match=r"bench-build --engine docker --profile smoke does not fit .* which has "
                                           r"1\.0 GB: \d+\.\d GB short"):
        bench_build.main(["--engine", "docker", "--profile", "smoke"])
