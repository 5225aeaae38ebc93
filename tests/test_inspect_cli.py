"""`python -m qualify inspect`: table, JSON, exit codes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import jsonschema
import pytest
from conftest import REPO

SCHEMA = json.loads((REPO / "manifests" / "inspect.schema.json").read_text())


def inspect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "qualify", "inspect", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture()
def tree(fx, tmp_path):
    root = tmp_path / "libs"
    root.mkdir()
    for name in ("plain", "arch"):
        shutil.copy(fx.lib(name), root / f"lib{name}.so")
    shutil.copy(fx.files["cubin_120f"], root / "k.cubin")
    (root / "libtrunc.so").write_bytes(fx.lib("plain").read_bytes()[:2000])
    return root


def test_table(tree):
    proc = inspect(tree, "--target", "sm_121")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == [
        "LIBRARY",
        "CONTAINERS",
        "SASS",
        "(sm_)",
        "PTX",
        "(compute_)",
        "LINK-ONLY",
        "(never",
        "loaded)",
        "CLASS",
        "FOR",
        "12.1",
        "BEST",
        "NO",
        "CODE",
        "ERRORS",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:5]}
    # Columns: containers, SASS, PTX, link-only (none here), class, best, no code.
    assert rows[str(tree / "libplain.so")] == ["2", "100", "120", "121", "121", "-", "native", "native", "0/1"]
    assert rows[str(tree / "libarch.so")] == ["2", "100a", "103a", "120a", "-", "-", "none", "none", "1/1"]
    assert rows[str(tree / "k.cubin")] == ["1", "120f", "-", "-", "compatible", "compatible", "0/1"]
    assert rows[str(tree / "libtrunc.so")] == ["0", "-", "-", "-", "-", "-", "0/0", "1"]
    out = proc.stdout
    assert f"{tree / 'libarch.so'}: no code for 12.1 in:\n  .nv_fatbin at 0x" in out
    assert "sm_100a sm_103a sm_120a" in out
    assert f"{tree / 'libtrunc.so'}: could not be fully parsed:\n  bad ELF section table" in out
    assert "4 file(s) reported, 4 examined" in out


def test_no_target(tree):
    proc = inspect(tree / "libplain.so")
    assert proc.returncode == 0
    assert "CLASS" not in proc.stdout and "100 120 121" in proc.stdout


@pytest.mark.parametrize("spelling", ["12.1", "sm_121", "sm121", "121"])
def test_target_spellings(tree, spelling):
    data = json.loads(inspect(tree / "libplain.so", "--target", spelling, "--json").stdout)
    assert data["target"] == "12.1"


def test_json(tree):
    proc = inspect(tree, "--target", "12.0", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    jsonschema.validate(data, SCHEMA)
    assert [lib["verdict"]["class"] for lib in data["libraries"]] == ["native", "native", "native", None]
    assert proc.stdout == inspect(tree, "--target", "12.0", "--json").stdout  # stable
    detail = json.loads(inspect(tree, "--json", "--detail").stdout)
    jsonschema.validate(detail, SCHEMA)
    assert detail["libraries"][0]["details"][0]["entries"][0]["arch"] == "sm_120f"


def test_registered_only(fx, tmp_path):
    data = json.loads(inspect(fx.files["embedded"], "--registered-only", "--json").stdout)
    assert data["embedded_searched"] is False and data["libraries"][0]["containers"] == 0
    data = json.loads(inspect(fx.files["embedded"], "--json").stdout)
    assert data["embedded_searched"] is True and data["libraries"][0]["containers"] == 1


def test_usage_errors(tree):
    bad = inspect(tree, "--target", "blackwell")
    assert bad.returncode == 2 and "not a compute capability" in bad.stderr
    missing = inspect(tree / "nope.so")
    assert missing.returncode == 2 and "no such file or directory" in missing.stderr
    assert inspect().returncode == 2  # argparse: PATH is required


def test_empty_directory(tmp_path):
    proc = inspect(tmp_path)
    assert proc.returncode == 0
    assert "no ELF, cubin or fatbin files with device code found" in proc.stdout
