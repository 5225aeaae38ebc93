"""What users read: README.md and the guides under docs/ (issue 52 moved most of the README's sections there).

Not a test module. Tests that check what a page says, or run its commands as written, find the text here, so
they keep testing the page a user reads after a section moves:

    section("docs/deploy.md", "## The cpu target")   # from that heading to the next of its level or higher
    user_text()                                       # README.md and every docs/*.md guide, in that order
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parent.parent
README = "README.md"


def guides() -> List[str]:
    """README.md, then the guides of docs/ (docs/reference/ is generated from the code: not a guide)."""
    return [README] + sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))


def page(name: str) -> str:
    path = REPO / name
    assert path.is_file(), f"{name} is gone: the tests read what users read there"
    return path.read_text()


def section(name: str, heading: str) -> str:
    """The section of page `name` whose heading line starts with `heading` (e.g. "## Exit codes"), up to the
    next heading of the same level or higher; refused when the page has none, or more than one."""
    level = len(heading) - len(heading.lstrip("#"))
    assert level and heading[level:level + 1] == " ", f"not a markdown heading: {heading!r}"
    lines = page(name).splitlines(keepends=True)
    fenced = False
    starts, out = [], []
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith(heading):
            starts.append(i)
    assert len(starts) == 1, f"{name} has {len(starts)} sections {heading!r}, wanted one"
    fenced = False
    for line in lines[starts[0] + 1:]:
        if line.startswith("```"):
            fenced = not fenced
        m = re.match(r"(#+) ", line)
        if not fenced and m and len(m.group(1)) <= level:
            break
        out.append(line)
    return lines[starts[0]] + "".join(out)


def user_text() -> str:
    """README.md and the guides, joined: where a test looks for a command or a fact users are shown."""
    return "\n".join(page(name) for name in guides())


def user_lines(needle: str) -> List[str]:
    """Every line of README.md and the guides holding `needle`, README first."""
    return [ln for name in guides() for ln in page(name).splitlines() if needle in ln]
