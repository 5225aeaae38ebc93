"""One exit-code table (qualify/core/errors.py) for the CLI and start.sh, documented once in docs/deploy.md
(the README's until issue 52) and in the generated docs/reference/exit-codes.md."""

from __future__ import annotations

import re
from pathlib import Path

from qualify.core import errors
from qualify.deploy import errors as deploy_errors
from qualify.deploy import ui

REPO = Path(__file__).resolve().parent.parent


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_error_class_exits_with_a_code_of_the_table():
    table = errors.exit_code_table()
    for cls in [errors.QualifyError, *_subclasses(errors.QualifyError)]:
        assert cls.exit_code in table, f"{cls.__name__} exits {cls.exit_code}, which the table does not list"
    for entry in errors.EXIT_CODES:
        if entry.error:
            assert getattr(errors, entry.error).exit_code == entry.code
    assert deploy_errors.NoReleaseError.exit_code in table and deploy_errors.DeployError.exit_code in table


def test_start_sh_codes_are_the_tables():
    text = (REPO / "scripts" / "lib.sh").read_text()
    shell = {name: int(code) for name, code in re.findall(r"\b(EX_[A-Z]+)=(\d+)", text)}
    named = {e.shell_name: e.code for e in errors.EXIT_CODES if e.shell_name}
    # The shell names what it exits with itself; the deploy it hands over to uses the whole table.
    assert shell and all(named[name] == code for name, code in shell.items())
    assert {n: getattr(ui, n) for n in named} == named


def test_the_deploy_guides_exit_code_section_is_generated_from_the_table():
    from docpages import section

    text = section("docs/deploy.md", "## Exit codes")  # exactly one such section, or it refuses
    begin, end = "<!-- exit-codes:begin -->\n", "\n<!-- exit-codes:end -->"
    assert text[text.index(begin) + len(begin):text.index(end)] == errors.exit_codes_markdown()


def test_start_sh_help_lists_every_code_the_deploy_exits_with():
    """Issue 41: 12 (a full DEPLOY_DIR) was missing from start.sh's exit codes."""
    text = (REPO / "start.sh").read_text()
    listed = text[text.index("Exit status:"):].split("\n\n", 1)[0].split("USAGE", 1)[0]
    codes = {int(c) for c in re.findall(r"\b(\d+) [a-z]", listed)}
    wanted = {e.code for e in errors.EXIT_CODES if e.start_sh and e.code not in (0, 1)}
    assert wanted <= codes | {0}, f"start.sh --help does not list {sorted(wanted - codes)}"
