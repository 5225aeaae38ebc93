"""The bench's corpus of PyPI wheels unpacks only shared objects, only under its own folder, within its
bounds, and refuses a wheel whose bytes are not the pinned ones (qualify/devtools/bench_wheels.py; the
downloads themselves run in `nox -s bench-inventory`, not here)."""

from __future__ import annotations

import hashlib
import stat
import zipfile

import pytest

from qualify.core.errors import QualifyError
from qualify.devtools import bench_wheels


def _wheel(path, members):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def test_only_shared_objects_are_unpacked_under_their_names(tmp_path):
    wheel = _wheel(tmp_path / "pkg.whl", {"pkg/_C.abi3.so": b"\x7fELF one", "pkg/lib/libx.so.13": b"\x7fELF two",
                                          "pkg/__init__.py": b"", "pkg-1.0.dist-info/RECORD": b""})
    out = bench_wheels.unpack(wheel, tmp_path / "libs")
    assert sorted(p.relative_to(tmp_path / "libs").as_posix() for p in out) == ["pkg/_C.abi3.so", "pkg/lib/libx.so.13"]
    assert (tmp_path / "libs" / "pkg" / "lib" / "libx.so.13").read_bytes() == b"\x7fELF two"
    assert not (tmp_path / "libs" / "pkg" / "__init__.py").exists()


@pytest.mark.parametrize("name", ["../evil.so", "/abs/evil.so", "pkg/../../evil.so", "pkg\\..\\evil.so"])
def test_a_member_outside_the_folder_is_refused(tmp_path, name):
    wheel = _wheel(tmp_path / "bad.whl", {name: b"x"})
    with pytest.raises(QualifyError, match="outside"):
        bench_wheels.unpack(wheel, tmp_path / "libs")
    assert not (tmp_path / "evil.so").exists()


def test_a_symbolic_link_member_is_refused(tmp_path):
    path = tmp_path / "link.whl"
    with zipfile.ZipFile(path, "w") as zf:
        info = zipfile.ZipInfo("pkg/libl.so")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(QualifyError, match="symbolic link"):
        bench_wheels.unpack(path, tmp_path / "libs")


def test_a_member_over_the_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_wheels, "MAX_MEMBER", 10)
    wheel = _wheel(tmp_path / "big.whl", {"pkg/libbig.so": b"x" * 11})
    with pytest.raises(QualifyError, match="over the bench's bounds"):
        bench_wheels.unpack(wheel, tmp_path / "libs")


def test_the_pins_are_sha256_and_the_check_reads_the_file(tmp_path):
    assert all(len(w.sha256) == 64 and int(w.sha256, 16) >= 0 for w in bench_wheels.WHEELS)
    assert len({w.name for w in bench_wheels.WHEELS}) == 5
    path = tmp_path / "f.whl"
    path.write_bytes(b"wheel bytes")
    assert bench_wheels.sha256_of(path) == hashlib.sha256(b"wheel bytes").hexdigest()
