"""`qualify show` fits the terminal; `qualify diff` exits as diff(1) does and gives structured changes."""

from __future__ import annotations

import json

from signing_helpers import DIGEST_A, DIGEST_B, run_qualify, statement

from qualify.core import manifest as mf
from qualify.release import report


def write(path, stmt):
    mf.write(path, stmt)
    return path


def long_manifest():
    stmt = statement("sm120", DIGEST_A)
    stmt["predicate"]["checks"][0]["reason"] = "a very long reason " * 20
    stmt["predicate"]["census"] = {"libraries": [
        {"path": "/usr/lib/libx.so", "short": "libx.so", "class": "native", "best": "native",
         "sass": [f"sm_{n}" for n in range(50, 130)], "ptx": ["compute_120"]}]}
    return stmt


def test_show_fits_the_width_and_marks_cut_text(tmp_path):
    path = write(tmp_path / "sm120.json", long_manifest())
    for env, width in (({}, 60), ({"COLUMNS": "50"}, 50)):
        args = ["show", str(path)] + (["--width", str(width)] if not env else [])
        out = run_qualify(args, tmp_path, env)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert max(len(line) for line in lines) <= width, max(lines, key=len)
        assert any(line.endswith(report.ELLIPSIS) or f"{report.ELLIPSIS} " in line for line in lines)
        assert "a very long" in out.stdout and "libx.so" in out.stdout


def test_diff_exit_status_and_structured_changes(tmp_path):
    old = write(tmp_path / "old.json", statement("sm120", DIGEST_A))
    same = run_qualify(["diff", str(old), str(old)], tmp_path)
    assert same.returncode == 0 and same.stdout.strip() == "no differences"
    changed = statement("sm121", DIGEST_B, statuses={"fatbin-arch": "pass", "triton-compile": "fail"},
                        level="unsupported")
    changed["predicate"]["target"].update(platform="linux/arm64", capability="12.1")
    new = write(tmp_path / "new.json", changed)
    text = run_qualify(["diff", str(old), str(new)], tmp_path)
    assert text.returncode == 1, text.stderr
    for line in ("target: sm120 -> sm121", "platform: linux/amd64 -> linux/arm64", "capability: 12.0 -> 12.1",
                 "verdict: pass -> fail", f"image: {DIGEST_A} -> {DIGEST_B}", "check allocator: pass -> absent",
                 "check triton-compile: pass -> fail"):
        assert line in text.stdout, (line, text.stdout)
    as_json = run_qualify(["diff", str(old), str(new), "--json"], tmp_path)
    assert as_json.returncode == 1
    doc = json.loads(as_json.stdout)
    assert doc["differ"] is True
    by_kind = {(c["kind"], c["name"]): c for c in doc["changes"]}
    assert by_kind[("platform", "platform")] == {"kind": "platform", "name": "platform", "before": "linux/amd64",
                                                 "after": "linux/arm64", "detail": ""}
    assert by_kind[("check", "allocator")]["after"] is None
    assert by_kind[("support_level", "support_level")]["after"] == "unsupported"
    missing = run_qualify(["diff", str(old), str(tmp_path / "nope.json")], tmp_path)
    assert missing.returncode == 9 and "not found" in missing.stderr  # an error is never "differ" (1)
