"""qualify.core.census: compatibility classes of real nvcc output, the walker, the JSON."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from conftest import REPO
from cuda_fixtures import COMPRESSION_FLAGS, deadline

from qualify.core import census, fatbin
from qualify.core.arch import Capability
from qualify.core.fsutil import canonical_json

SCHEMA = json.loads((REPO / "manifests" / "inspect.schema.json").read_text())
TARGETS = ["10.0", "10.3", "12.0", "12.1"]

# Library class per target, from the rules in ARCHITECTURE.md (not from arch.compatibility):
# plain SASS runs on the same major with an equal or higher minor; `a` only on
# its exact capability; `f` on its family from its minor up; PTX JITs upward.
EXPECTED = {
    "plain": ["native", "compatible", "native", "native"],  # sm_100 sm_120 sm_121 compute_121
    "arch": ["native", "native", "native", "none"],  # sm_100a sm_103a sm_120a
    "family": ["native", "compatible", "native", "compatible"],  # sm_100f sm_120f
    "ptx100": ["ptx-jit", "ptx-jit", "ptx-jit", "ptx-jit"],  # compute_100 only
    "rdc": ["none", "none", "native", "compatible"],  # sm_120 (+ relocatable, not judged)
    "cubin_100": ["native", "compatible", "none", "none"],
    "cubin_120a": ["none", "none", "native", "none"],
    "cubin_120f": ["none", "none", "native", "compatible"],
    "fatbin": ["none", "none", "native", "compatible"],  # sm_120f compute_121
    "embedded": ["none", "none", "native", "compatible"],  # the same fatbin, in .rodata
    "two": ["none", "none", "none", "none"],  # registered: each container must run
    "pool": ["native", "compatible", "native", "compatible"],  # database: the best container serves
}


def path_of(fx, key: str, compression: str = "default") -> Path:
    if key in fx.files:
        return fx.files[key]
    return fx.lib(key, compression)


def verdict(path: Path, target: str, decompress: bool = True) -> census.TargetVerdict:
    report = census.scan([str(path)], Capability.parse(target), decompress=decompress)
    (lib,) = report.libraries
    assert lib.summary.ok, lib.summary.errors
    return lib.verdict


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_classes(fx, key):
    compressions = sorted(COMPRESSION_FLAGS) if key in ("plain", "arch", "family") else ["default"]
    for compression in compressions:
        got = [verdict(path_of(fx, key, compression), t).klass.value for t in TARGETS]
        assert got == EXPECTED[key], f"{key} ({compression})"


def test_cross_generation_ptx(fx):
    path = path_of(fx, "ptx100")
    assert [verdict(path, t).cross_generation_jit for t in TARGETS] == [False, False, True, True]
    assert not verdict(path_of(fx, "plain"), "12.1").cross_generation_jit


def test_link_stubs_are_not_judged(fx):
    plain = verdict(path_of(fx, "plain"), "12.1")
    assert plain.units == 1 and plain.excluded["link_stub"] == 1
    # Without decompressing (an image without decoders) a compressed stub cannot
    # be recognised: it is judged like code.
    zstd = verdict(path_of(fx, "plain", "zstd"), "12.1", decompress=False)
    assert zstd.units == 2 and zstd.excluded["link_stub"] == 0
    # Decompressed, it is seen to hold no kernel.
    zstd = verdict(path_of(fx, "plain", "zstd"), "12.1")
    assert zstd.units == 1 and zstd.excluded["link_stub"] == 0 and zstd.excluded["no_kernel"] == 1
    # The empty container nvcc emits for a PTX-only library holds no code.
    assert verdict(path_of(fx, "ptx100"), "12.1").excluded["no_driver_code"] == 1


def test_relocatable_and_lto_are_not_judged(fx):
    rdc = verdict(path_of(fx, "rdc"), "12.0")
    assert rdc.units == 1 and rdc.excluded["relocatable"] == 1
    lto = verdict(path_of(fx, "lto"), "12.0")
    assert lto.klass is None and lto.units == 0 and lto.excluded["no_driver_code"] == 1


def test_containers_without_code_are_listed(fx):
    path = path_of(fx, "arch")
    v = verdict(path, "12.1")
    code = fatbin.read_file(str(path)).containers[1]
    assert [u.to_json() for u in v.no_code] == [
        {"section": ".nv_fatbin", "offset": code.offset, "containers": 1, "sass": ["sm_100a", "sm_103a", "sm_120a"], "ptx": []}
    ]
    assert v.counts == {census.Compat.NONE: 1}
    two = verdict(path_of(fx, "two"), "12.1")
    assert [u.to_json()["sass"] for u in two.no_code] == [["sm_100"]]
    assert two.best.value == "compatible"


def test_embedded_section_is_one_unit(fx):
    v = verdict(path_of(fx, "pool"), "10.0")
    assert v.units == 1 and v.klass.value == "native"
    none = verdict(path_of(fx, "pool"), "9.0")
    assert [u.to_json() for u in none.no_code] == [
        {"section": ".rodata", "offset": None, "containers": 2, "sass": ["sm_100", "sm_120f"], "ptx": ["compute_121"]}
    ]


def test_library_summary(fx):
    data = census.scan([str(path_of(fx, "plain", "lz4"))]).to_json()
    (lib,) = data["libraries"]
    assert lib["sass"] == ["sm_100", "sm_120", "sm_121"] and lib["ptx"] == ["compute_121"]
    assert lib["compression"] == {"none": 0, "lz4": 7, "zstd": 0, "unknown": 0}
    assert lib["link_stubs"] == {"yes": 0, "no": 1, "unknown": 1}
    assert lib["sections"] == {
        ".nv_fatbin": {"containers": 2, "role": "registered", "sass": ["sm_100", "sm_120", "sm_121"], "ptx": ["compute_121"]}
    }
    assert lib["verdict"] is None and data["target"] is None
    lto = census.scan([str(path_of(fx, "lto"))]).to_json()["libraries"][0]
    assert lto["lto_ir"] == ["lto_100"] and lto["sass"] == [] and lto["ptx"] == []


def test_json_is_stable_and_valid(fx):
    paths = [str(p) for p in reversed(fx.all_paths())]
    first = census.scan(paths, Capability.parse("12.1"), detail=True)
    second = census.scan(paths, Capability.parse("12.1"), detail=True)
    assert canonical_json(first.to_json()) == canonical_json(second.to_json())
    data = first.to_json()
    jsonschema.validate(data, SCHEMA)
    jsonschema.validate(census.scan(paths).to_json(), SCHEMA)
    assert data["schema_version"] == census.SCHEMA_VERSION == 1
    listed = [lib["path"] for lib in data["libraries"]]
    assert listed == sorted(listed)
    for lib in data["libraries"]:
        offsets = [c["offset"] for c in lib["details"]]
        assert offsets == sorted(offsets)


def test_for_target_does_not_read_again(fx, monkeypatch):
    report = census.scan([str(path_of(fx, "family"))])

    def refuse(path):
        raise AssertionError("read again")

    monkeypatch.setattr(fatbin, "read_file", refuse)
    assert [report.for_target(Capability.parse(t)).libraries[0].verdict.klass.value for t in TARGETS] == (EXPECTED["family"])


# --- walking directories ------------------------------------------------------------


def test_directory_walk(fx, tmp_path):
    tree = tmp_path / "tree"
    (tree / "lib" / "deep").mkdir(parents=True)
    shutil.copy(path_of(fx, "plain"), tree / "lib" / "libplain.so.1")
    shutil.copy(path_of(fx, "cubin_120a"), tree / "lib" / "deep" / "k.cubin")
    shutil.copy(path_of(fx, "fatbin"), tree / "lib" / "deep" / "k.fatbin")
    os.symlink("libplain.so.1", tree / "lib" / "libplain.so")  # a soname link: read once
    os.symlink("..", tree / "lib" / "deep" / "loop")  # a directory loop: not followed
    os.symlink("missing", tree / "lib" / "dangling.so")
    shutil.copy("/bin/true", tree / "lib" / "true")  # ELF without device code
    (tree / "lib" / "README.txt").write_text("not a binary")
    bad = tree / "lib" / "libbad.so"
    bad.write_bytes(path_of(fx, "plain").read_bytes()[:4096])
    os.mkfifo(tree / "lib" / "pipe")  # must not be opened (it would block)
    with deadline(20):
        report = census.scan([str(tree)], Capability.parse("12.1"))
    paths = [Path(lib.path).relative_to(tree).as_posix() for lib in report.libraries]
    assert paths == ["lib/deep/k.cubin", "lib/deep/k.fatbin", "lib/libbad.so", "lib/libplain.so.1"]
    assert report.without_device_code == [str(tree / "lib" / "true")]
    assert report.files_scanned == 5
    assert [Path(lib.path).name for lib in report.with_errors] == ["libbad.so"]


def test_explicit_paths(fx, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    plain = str(path_of(fx, "plain"))
    report = census.scan([plain, plain, str(text), str(tmp_path / "missing.so")])
    by_path = {lib.path: lib for lib in report.libraries}
    assert len(report.libraries) == 3  # the duplicate is read once
    assert by_path[plain].summary.ok
    assert "unknown magic" in by_path[str(text)].summary.errors[0]
    assert "cannot read" in by_path[str(tmp_path / "missing.so")].summary.errors[0]


# --- runs in images: Python 3.9, standard library only -----------------------------


def _python39():
    candidates = [shutil.which("python3.9")] + sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9")))
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "--version"], capture_output=True).returncode == 0:
            return candidate
    return None


def test_runs_under_python39(fx):
    py39 = _python39()
    if py39 is None:
        pytest.skip("no python3.9 here: test_layout.py:test_image_side_sources_parse_as_python_3_9 is the check")
    paths = [str(p) for p in fx.all_paths()]
    code = (
        "import json, sys; from qualify.core import census; from qualify.core.arch import Capability; "
        "print(json.dumps(census.scan(sys.argv[1:], Capability.parse('12.1')).to_json(), sort_keys=True))"
    )
    proc = subprocess.run(
        [py39, "-c", code, *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    # python3.9 here has no zstandard or lz4, as an image has not: it must give
    # what this interpreter gives without decompressing.
    assert json.loads(proc.stdout) == census.scan(paths, Capability.parse("12.1"), decompress=False).to_json()


@pytest.mark.parametrize("module", ["qualify.core.census", "qualify.core.fatbin", "qualify.cli.inspect_cmd"])
def test_imports_only_stdlib(module):
    code = "import sys; before = set(sys.modules); import " + module + "; print('\\n'.join(sorted(set(sys.modules) - before)))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    foreign = [
        name
        for name in proc.stdout.split()
        if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] not in ("qualify", "elftools")
    ]
    assert foreign == []


def test_registered_only(fx):
    paths = [str(path_of(fx, "embedded")), str(path_of(fx, "rdc")), str(path_of(fx, "plain"))]
    full = census.scan(paths).to_json()
    fast = census.scan(paths, embedded=False).to_json()
    assert full["embedded_searched"] and not fast["embedded_searched"]
    sections = {Path(lib["path"]).name: sorted(lib["sections"]) for lib in fast["libraries"]}
    assert sections == {"libembedded.so": [], "librdc.so": [".nv_fatbin"], "libplain-default.so": [".nv_fatbin"]}
    # What cuobjdump sees is the same either way.
    for a, b in zip(full["libraries"], fast["libraries"]):
        assert a["sections"].get(".nv_fatbin") == b["sections"].get(".nv_fatbin")


def test_serving_path_check_never_passes_a_class_it_does_not_know():
    # A newer census reports damaged or undecodable libraries with a class of its own.
    from qualify.core.arch import Capability
    from qualify.probe import census_check

    row = {"short": "vllm/_C.abi3.so", "class": "unknown", "best": "unknown", "sass": [], "ptx": [], "serving_path": True}
    # Issue 29: the serving-path check is required, and the unknown part is on the serving path: fail.
    assert census_check.serving_path([row], Capability.parse("12.1")).status == "fail"
    assert census_check.serving_path([dict(row, best="native")], Capability.parse("12.1")).status == "pass"
