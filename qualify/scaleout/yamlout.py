"""A small YAML writer for the data we generate (dicts, lists, str, int, float, bool, None).

Why our own: PyYAML is not a dependency of the toolkit, and its output quotes
and wraps strings in ways that change between versions; a generated file that
is compared byte for byte with a fresh generation needs one fixed spelling.
Keys keep the order they were inserted in (the generators insert in a fixed
order). Strings are plain only when no YAML 1.1 or 1.2 reader could read them
as anything else; otherwise JSON-quoted (a JSON string is a YAML string).
Multi-line strings are literal blocks.
"""

from __future__ import annotations

import json
import re
from typing import Any, List

_PLAIN = re.compile(r"^[A-Za-z_/.$][A-Za-z0-9 _./:=@${}()|&*,+<>'-]*$")
_RESERVED = {"y", "n", "yes", "no", "true", "false", "on", "off", "null", "~"}


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if not isinstance(value, str):
        raise TypeError(f"cannot write {type(value).__name__} {value!r} as YAML")
    plain = (_PLAIN.match(value) and value.lower() not in _RESERVED and not value.endswith((" ", ":"))
             and ": " not in value and " #" not in value and not value.startswith(("${", "*", "&")))
    return value if plain else json.dumps(value, ensure_ascii=False)


def _block(value: str, indent: int) -> List[str]:
    chomp = "" if value.endswith("\n") else "-"
    pad = " " * indent
    return [f"|{chomp}"] + [(pad + line) if line else "" for line in value.rstrip("\n").split("\n")]


def _lines(value: Any, indent: int) -> List[str]:
    pad = " " * indent
    out: List[str] = []
    if isinstance(value, dict):
        if not value:
            return [pad + "{}"]
        for key, item in value.items():
            k = _scalar(str(key))
            out.extend(_entry(f"{pad}{k}:", item, indent))
        return out
    if isinstance(value, (list, tuple)):
        if not value:
            return [pad + "[]"]
        for item in value:
            out.extend(_entry(f"{pad}-", item, indent, in_list=True))
        return out
    return [pad + _scalar(value)]


def _entry(head: str, item: Any, indent: int, in_list: bool = False) -> List[str]:
    if isinstance(item, str) and "\n" in item:
        block = _block(item, indent + 2)
        return [f"{head} {block[0]}"] + block[1:]
    if isinstance(item, (dict, list, tuple)) and item:
        if in_list and isinstance(item, dict):
            # "- key: value" with the rest of the mapping aligned under the first key
            inner = _lines(item, indent + 2)
            return [f"{head} {inner[0].lstrip()}"] + inner[1:]
        return [head] + _lines(item, indent + 2)
    return [f"{head} {_lines(item, 0)[0]}"]


def dumps(doc: Any, header: str = "") -> str:
    """The YAML text of `doc`; `header` lines become `# ` comments at the top."""
    comments = [f"# {line}".rstrip() for line in header.splitlines()]
    return "\n".join(comments + _lines(doc, 0)) + "\n"


def dumps_all(docs: List[Any], header: str = "") -> str:
    """Several documents, separated by `---`."""
    comments = [f"# {line}".rstrip() for line in header.splitlines()]
    parts = ["\n".join(_lines(d, 0)) for d in docs]
    return "\n".join(comments) + ("\n" if comments else "") + "---\n" + "\n---\n".join(parts) + "\n"
