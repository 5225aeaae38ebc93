"""Issue 52: a README a newcomer reads in ten minutes, guides under docs/ for the rest, and sources named by what
they are. The README stays short, every relative link of the README and the guides leads to a file that exists,
and nothing a user reads cites a source by an internal name ("seed 000") they cannot look up: the Blackwell
support RFC, the community SM120/121 deploy, the GB10 compatibility report, the sm_121a field report
(docs/README.md, "Sources cited")."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path
from typing import Iterator, List, Tuple

import docpages
import pytest

REPO = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250
INTERNAL_NAME = re.compile(r"seed[ _-]?00\d", re.IGNORECASE)

def user_facing_files() -> List[Path]:
    """What users read: the README, docs/ (the generated reference too), ARCHITECTURE.md, the evidence README,
    the schemas, the targets file; and the toolkit's sources, whose strings are its help and its messages."""
    found = [REPO / "README.md", REPO / "ARCHITECTURE.md", REPO / "VERIFYING.md", REPO / "manifests" / "evidence" / "README.md",
             REPO / "images" / "targets.toml", *sorted((REPO / "docs").rglob("*.md")),
             *sorted((REPO / "manifests").glob("*.json")), *sorted((REPO / "qualify").rglob("*.py"))]
    return found


def python_strings(text: str) -> Iterator[Tuple[int, str]]:
    """The string literals of a Python source (docstrings, help, messages), with their line numbers."""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            yield tok.start[0], tok.string


def test_the_readme_is_short():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to a docs/ guide"


def test_the_readme_keeps_the_commands_ci_runs():
    """.ci/run runs the README's lint and test commands as written."""
    text = (REPO / "README.md").read_text()
    assert "bash scripts/setup-host.sh && python3 -m nox -s lint && python3 -m nox -s tests\n" in text
    assert 'python3 -m nox -s tests -- -m "not engine and not slow"\n' in text


def test_no_user_facing_file_cites_a_source_by_an_internal_name():
    found = []
    for path in user_facing_files():
        rel = str(path.relative_to(REPO))
        text = path.read_text()
        if path.suffix == ".py":
            found += [f"{rel}:{line}" for line, s in python_strings(text) if INTERNAL_NAME.search(s)]
        else:
            found += [f"{rel}:{n}" for n, ln in enumerate(text.splitlines(), 1) if INTERNAL_NAME.search(ln)]
    assert not found, f"cite the source by what it is (docs/README.md, Sources cited): {found}"


def test_the_internal_name_check_sees_python_strings_not_comments():
    source = 'x = "the rule (seed 000)"  # seed 001 in a comment\ny = f"{x} seed 002"\n'
    hits = [s for _, s in python_strings(source) if INTERNAL_NAME.search(s)]
    assert len(hits) == 2 and all("#" not in h for h in hits)


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(name: str) -> Iterator[str]:
    text = re.sub(r"```.*?```", "", docpages.page(name), flags=re.DOTALL)  # code blocks hold no links
    for target in LINK.findall(text):
        if not re.match(r"[a-z][a-z0-9+.-]*:", target):
            yield target


def anchors(path: Path) -> set:
    """The anchors GitHub gives a markdown page's headings (lower case, punctuation dropped, spaces to hyphens)."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("name", docpages.guides())
def test_every_relative_link_leads_to_a_file_that_exists(name):
    base = (REPO / name).parent
    broken = []
    for target in relative_links(name):
        file, _, anchor = target.partition("#")
        path = (base / file).resolve() if file else REPO / name
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            broken.append(target)
    assert not broken, f"{name}: {broken}"


def test_the_index_links_every_guide():
    index = docpages.page("docs/README.md")
    missing = [g for g in docpages.guides() if g.startswith("docs/") and g != "docs/README.md"
               and f"({Path(g).name})" not in index]
    assert not missing, missing


def test_a_section_runs_to_the_next_heading_of_its_level():
    text = docpages.section("docs/deploy.md", "## The cpu target")
    assert text.startswith("## The cpu target") and "```sh\n" in text and "\n## " not in text
    with pytest.raises(AssertionError, match="has 0 sections"):
        docpages.section("docs/deploy.md", "## No such section")
