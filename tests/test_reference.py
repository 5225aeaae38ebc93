"""docs/reference/ is generated from the code (qualify/devtools/reference.py): a page that drifted fails here,
and every check id the code writes is in the catalogue the checks page is made from (core/checkids.py)."""

from __future__ import annotations

import re
from pathlib import Path

from qualify.core import checkids
from qualify.core.servingpaths import PATHS
from qualify.devtools import reference
from qualify.probe.providers import TABLES

REPO = Path(__file__).resolve().parent.parent
EMITTED = re.compile(r'"((?:versions|census|triton|providers|runtime|env|gpu|cpu|arch|serve)(?:\.[a-z0-9-]+)*)"')


def test_the_reference_pages_are_what_the_code_gives():
    pages = reference.generate()
    for name, text in pages.items():
        path = REPO / "docs" / "reference" / name
        assert path.is_file() and path.read_text() == text, f"docs/reference/{name} drifted: run `nox -s reference`"


def test_every_check_id_in_the_code_is_in_the_catalogue():
    found = set()
    for path in (REPO / "qualify").rglob("*.py"):
        for cid in EMITTED.findall(path.read_text()):
            if "." in cid and not cid.endswith((".json", ".py", ".so", ".txt")):
                found.add(cid)
    found |= {f"providers.{t.key}" for t in TABLES}
    unknown = sorted(c for c in found if not checkids.known(c, PATHS))
    assert not unknown, f"check ids written by the code but not in core/checkids.py: {unknown}"


def test_every_path_of_the_rules_has_a_title():
    assert {t.key for t in TABLES} == set(PATHS)
