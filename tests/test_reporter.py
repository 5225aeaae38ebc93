"""The one reporter (issue 28): '[stage] message' lines on stderr, control characters escaped, steps timed."""

from __future__ import annotations

import pytest

from qualify.core.report import Reporter


def test_a_line_names_its_stage_and_cannot_forge_another(capsys):
    report = Reporter("build")
    report("pushed \x1b[2Jimage")
    report.warn("cache over budget")
    out, err = capsys.readouterr()
    assert out == ""  # stdout is for what a command produces
    assert err.splitlines() == ["[build] pushed \\x1b[2Jimage", "[build] warning: cache over budget"]


def test_a_step_says_how_it_ended_and_how_long_it_took(capsys):
    report = Reporter("hermetic")
    with report.step("unpacking the CUDA wheels"):
        pass
    with pytest.raises(RuntimeError):
        with report.step("pushing"):
            raise RuntimeError("registry down")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "[hermetic] unpacking the CUDA wheels ..."
    assert lines[1].startswith("[hermetic] unpacking the CUDA wheels: done in ") and lines[1].endswith(" s")
    assert lines[2] == "[hermetic] pushing ..." and lines[3].startswith("[hermetic] pushing: failed after ")
