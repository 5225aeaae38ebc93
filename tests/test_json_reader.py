"""Issue 52: one JSON reader (core/readlimit.py: strict_json, read_json). What used to be read with a plain
json.loads now refuses a key written twice (the last one silently won), names the document, and stays
bounded; a child's report may still say that a measurement was not finite."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest

from qualify.core.errors import ConfigError, VerificationError
from qualify.core.readlimit import read_json, strict_json
from qualify.deploy import api
from qualify.deploy.errors import DeployError
from qualify.deploy.servecheck import basic
from qualify.probe import servematrix as sm
from qualify.probe import subproc
from qualify.publish import dsse


def test_the_serve_matrix_refuses_a_key_written_twice_naming_the_file(tmp_path):
    text = Path(sm.DEFAULT_FILE).read_text()
    # Before issue 52 the second matrix_version silently won.
    doubled = text.replace('"matrix_version":', '"matrix_version": 999999, "matrix_version":', 1)
    assert doubled != text
    path = tmp_path / "serve-matrix.json"
    path.write_text(doubled)
    with pytest.raises(sm.MatrixError) as err:
        sm.load(str(path))
    assert "duplicate JSON key 'matrix_version'" in err.value.message and str(path) in err.value.message
    assert sm.load(sm.DEFAULT_FILE).version == 1  # the file as shipped still reads


def test_the_serve_matrix_is_read_bounded(tmp_path):
    big = tmp_path / "serve-matrix.json"
    big.write_bytes(b" " * (sm.MAX_BYTES + 1))
    with pytest.raises(sm.MatrixError, match="more than"):
        sm.load(str(big))
    with pytest.raises(sm.MatrixError, match="is a directory"):
        sm.load(str(tmp_path))


def test_read_json_names_the_file(tmp_path):
    path = tmp_path / "record.json"
    path.write_text('{"a": 1, "a": 2}')
    with pytest.raises(ConfigError) as err:
        read_json(path, 1024, "deployment record", ConfigError)
    assert err.value.message.startswith(f"deployment record {path}: duplicate JSON key 'a'")
    path.write_text('{"a": 1}')
    assert read_json(path, 1024, "deployment record", ConfigError) == {"a": 1}
    with pytest.raises(ConfigError, match="not found"):
        read_json(tmp_path / "absent.json", 1024, "deployment record", ConfigError)
    with pytest.raises(ConfigError, match="bytes such a file can be"):
        read_json(path, 4, "deployment record", ConfigError)


def test_nonfinite_lets_nan_through_and_nothing_else():
    with pytest.raises(ConfigError, match="NaN is not JSON"):
        strict_json('{"max_abs_error": NaN}', "report", ConfigError)
    assert math.isnan(strict_json('{"max_abs_error": NaN}', "report", ConfigError, nonfinite=True)["max_abs_error"])
    assert strict_json('{"x": -Infinity}', "report", ConfigError, nonfinite=True)["x"] == -math.inf
    with pytest.raises(ConfigError, match="duplicate JSON key 'ok'"):
        strict_json('{"ok": false, "ok": true}', "report", ConfigError, nonfinite=True)


def test_a_childs_report_keeps_a_nan_measurement_and_is_never_a_line_with_a_doubled_key(tmp_path):
    child = tmp_path / "child.py"
    child.write_text("import json\nprint(json.dumps({'ok': True, 'max_abs_error': float('nan')}))\n")
    done = subproc.run_python([str(child)], timeout=60, python=sys.executable)
    assert done.ok and math.isnan(done.data["max_abs_error"])
    child.write_text("print('{\"ok\": false}')\nprint('{\"ok\": false, \"ok\": true}')\n")
    done = subproc.run_python([str(child)], timeout=60, python=sys.executable)
    assert done.data == {"ok": False}  # the doubled line is not a report: the one before it is


def test_api_answers_and_tool_arguments_refuse_doubled_keys():
    with pytest.raises(DeployError, match="duplicate JSON key 'id'"):
        api.load_json_text('{"id": "a", "id": "b"}', "/v1/models")
    tools = sm.load().tools
    fn = {"name": tools.name, "arguments": '{"x": 1, "x": 2}'}
    assert basic._call_problem(tools, fn, "tool_calls", None).startswith("the arguments are not JSON")
    assert basic._call_problem(tools, {"name": tools.name, "arguments": {"x": 1}}, "tool_calls", None) \
        .startswith("the arguments are not JSON")  # an object where JSON text belongs


def test_a_dsse_envelope_with_a_doubled_key_is_refused():
    raw = b'{"payloadType": "a", "payloadType": "b", "payload": "", "signatures": []}'
    with pytest.raises(VerificationError, match="duplicate JSON key 'payloadType'"):
        dsse.parse(raw, "attestation layer")
    with pytest.raises(VerificationError, match="not JSON"):
        dsse.parse(b"\xff")


def _depth_by_hand(text: str, limit: int) -> bool:
    """The nesting test as it read before it stepped over strings with a regular expression: one character at
    a time, a backslash in a string skipping the next one."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def test_the_nesting_scan_agrees_with_a_character_by_character_one():
    from qualify.core import readlimit

    rng = random.Random(52)
    cases = ["[" * 201, "[" * 200, '"[[[', '"\\"[[', '["\\\\"[[', '{"a": "]]]]"}[[']
    cases += ["".join(rng.choice('[]{}"\\ a\n') for _ in range(rng.randint(0, 30))) for _ in range(5000)]
    for limit in (0, 1, 2, 3, 200):
        for text in cases:
            assert readlimit._depth_exceeds(text, limit) == _depth_by_hand(text, limit), (text, limit)
