"""How the signed records of a release folder are read: one JSON object key by key, types checked, unknown keys
refused, naming the file and the key; canonical bytes only (issue 49: both verifiers read one form)."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, List, Optional, Tuple, Type

from qualify.core.errors import QualifyError, VerificationError
from qualify.core.fsutil import canonical_problem
from qualify.core.readlimit import strict_json

HEX = re.compile(r"[0-9a-f]{64}")
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,200}")
TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")


def parse_time(text: Any, where: str, error: Type[QualifyError] = VerificationError) -> dt.datetime:
    """An RFC 3339 UTC time as this toolkit writes it (`2026-12-01T09:15:00Z`), parsed (never compared as text)."""
    if not isinstance(text, str) or not TIME.fullmatch(text):
        raise error(f"{where}: {str(text)[:60]!r} is not a UTC time written as YYYY-MM-DDTHH:MM:SSZ")
    try:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        raise error(f"{where}: {text!r} is not a real date and time") from None


def format_time(when: dt.datetime) -> str:
    return when.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Fields:
    """One JSON object of a signed record, read key by key with its type checked; unknown keys refused."""

    def __init__(self, doc: Any, where: str, error: Type[QualifyError] = VerificationError) -> None:
        if not isinstance(doc, dict):
            raise error(f"{where}: not a JSON object")
        self.doc, self.where, self.error = doc, where, error

    def _fail(self, key: str, wanted: str) -> QualifyError:
        return self.error(f"{self.where}: {key!r} is missing or not {wanted} (found {str(self.doc.get(key))[:60]!r})",
                          hint="a signed record is never edited by hand; restore it or re-make it")

    def text(self, key: str, pattern: Optional[re.Pattern] = None, empty: bool = False) -> str:
        value = self.doc.get(key)
        if not isinstance(value, str) or (not empty and not value) or (pattern and value and not pattern.fullmatch(value)):
            raise self._fail(key, "a string" if pattern is None else f"a string matching {pattern.pattern}")
        return value

    def optional_text(self, key: str) -> Optional[str]:
        return None if self.doc.get(key) is None else self.text(key)

    def integer(self, key: str, minimum: int = 0) -> int:
        value = self.doc.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self._fail(key, f"a whole number >= {minimum}")
        return value

    def flag(self, key: str) -> bool:
        value = self.doc.get(key)
        if not isinstance(value, bool):
            raise self._fail(key, "true or false")
        return value

    def obj(self, key: str) -> Fields:
        return Fields(self.doc.get(key), f"{self.where}: {key}", self.error)

    def optional_obj(self, key: str) -> Optional[Fields]:
        return None if self.doc.get(key) is None else self.obj(key)

    def items(self, key: str) -> List[Fields]:
        value = self.doc.get(key)
        if not isinstance(value, list):
            raise self._fail(key, "a list")
        return [Fields(v, f"{self.where}: {key}[{i}]", self.error) for i, v in enumerate(value)]

    def texts(self, key: str) -> Tuple[str, ...]:
        value = self.doc.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._fail(key, "a list of strings")
        return tuple(value)

    def only(self, *keys: str) -> Fields:
        extra = sorted(set(self.doc) - set(keys))
        if extra:
            raise self.error(f"{self.where}: keys this toolkit does not write: {', '.join(map(repr, extra[:5]))}",
                             hint="a signed record is never edited by hand; restore it or re-make it")
        return self


def load(data: bytes, where: str, schema: str, error: Type[QualifyError], legacy: str = "") -> Fields:
    """One signed record's object, canonical and of `schema` (or the `legacy` one it still reads)."""
    doc = Fields(strict_json(data, where, error), where, error)
    why = canonical_problem(data, doc.doc)
    if why:
        raise error(f"{where}: not in the canonical form signed records are written in (sorted keys, two-space "
                    f"indent, one key a line, a newline at the end): {why}", hint="restore the file the toolkit wrote")
    if doc.doc.get("schema") not in (schema, legacy or schema):
        raise error(f"{where}: not a {schema} record (schema {str(doc.doc.get('schema'))[:80]!r})",
                    hint="made by an older toolkit? re-make it with this one")
    return doc
