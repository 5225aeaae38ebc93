"""The probe's runtime facts (issue 32): which libcuda.so.1 an image's loader finds first, its user and CUDA.

Real files and symlinks in a temporary tree stand in for an image's directories; the loader order is glibc's
(LD_LIBRARY_PATH, then ld.so.conf with its includes, then the default directories)."""

from __future__ import annotations

import os
from pathlib import Path

from qualify.probe import runtime_env


def _libcuda(folder: Path, version: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    real = folder / f"libcuda.so.{version}"
    real.write_bytes(b"\x7fELF")
    (folder / "libcuda.so.1").symlink_to(real.name)
    return real


def test_a_compat_libcuda_on_ld_library_path_is_found_first_and_warned_about(tmp_path):
    compat = tmp_path / "usr/local/cuda-13.0/compat"
    _libcuda(compat, "580.65.06")
    facts = runtime_env.libcuda({"LD_LIBRARY_PATH": f"{tmp_path}/empty:{compat}"}, conf=str(tmp_path / "none.conf"))
    first = facts["first"]
    assert first["compat"] is True and first["version"] == "580.65.06" and first["named_by"] == "LD_LIBRARY_PATH"
    check = runtime_env.compat_check(facts)
    assert check.status == "warn" and check.required is False
    assert "error 803" in check.reason and "error 804" in check.reason and "LD_LIBRARY_PATH" in check.reason


def test_ld_so_conf_includes_are_followed(tmp_path):
    compat = tmp_path / "cuda/compat"
    _libcuda(compat, "590.44.01")
    (tmp_path / "ld.so.conf.d").mkdir()
    (tmp_path / "ld.so.conf.d" / "000_cuda.conf").write_text(f"# the forward-compatibility package\n{compat}\n")
    conf = tmp_path / "ld.so.conf"
    conf.write_text("include ld.so.conf.d/*.conf\n")
    facts = runtime_env.libcuda({}, conf=str(conf))
    assert facts["first"]["named_by"] == str(conf) and facts["first"]["version"] == "590.44.01"
    assert str(compat) in facts["loader_path"]


def test_a_stub_named_libcuda_so_1_is_a_warning_and_none_is_a_pass(tmp_path):
    stubs = tmp_path / "cuda/lib64/stubs"
    stubs.mkdir(parents=True)
    (stubs / "libcuda.so").write_bytes(b"\x7fELF")
    (stubs / "libcuda.so.1").symlink_to("libcuda.so")
    facts = runtime_env.libcuda({"LD_LIBRARY_PATH": str(stubs)}, conf=str(tmp_path / "none.conf"))
    assert facts["first"]["stub"] is True
    assert "error 34" in runtime_env.compat_check(facts).reason
    clean = {"compat": [], "first": None, "loader_path": []}
    assert runtime_env.compat_check(clean).status == "pass"


def test_root_fails_only_where_we_enforce_it():
    root = {"uid": 0, "gid": 0, "name": "root"}
    assert runtime_env.user_check(root, enforce=True).status == "fail"
    told = runtime_env.user_check(root, enforce=False)
    assert told.status == "warn" and told.required is False and "Fix: add a user and set USER" in told.reason
    assert runtime_env.user_check({"uid": 1000, "name": "vllm"}, enforce=True).status == "pass"
    assert runtime_env.user()["uid"] == os.getuid()


def test_the_image_cuda_comes_from_torch_first():
    tk = {"ptxas": {"version": "13.0.88"}}
    assert runtime_env.image_cuda({}, tk, {"cuda": "12.8"}) == {"version": "12.8", "from": "torch.version.cuda"}
    assert runtime_env.image_cuda({}, tk, {}) == {"version": "13.0", "from": "the toolkit's ptxas"}
    assert runtime_env.image_cuda({}, {}, {})["version"] is None
