"""Bounded reads of small input files, and strict JSON. Standard library only (image side).

This is the toolkit's one JSON reader (a house rule, issue 52): every JSON
document, from a file, a child process, a registry or a server, is decoded by
`strict_json` (`read_json` for a file). Every key, signature, bundle,
manifest, release index and targets file is read through `read_small`: only
a regular file (not a directory, FIFO, socket or device such as /dev/zero),
up to a size limit, so hostile input can neither
hang a read nor grow memory without bound. `read_in` does the same for a
name inside a folder opened once (`open_folder`), never following a symlink,
so a folder that is swapped or relinked while it is read cannot hand over a
second set of files. `strict_json` refuses duplicate object keys (in signed
JSON the last value would silently win), nesting deep enough to exhaust the
interpreter's stack, integers too long to be a count or a size (Python
refuses more than 4,300 digits with a ValueError of its own), and NaN and
infinities, which are not JSON and have no single meaning.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Type, Union

from qualify.core.errors import QualifyError

# Limits per kind of file; each is far above any real file of its kind.
KEY_LIMIT = 64 * 1024
SIGNATURE_LIMIT = 64 * 1024
BUNDLE_LIMIT = 1024 * 1024
MANIFEST_LIMIT = 64 * 1024 * 1024  # a vLLM manifest with every library is a few MB
TARGETS_LIMIT = 1024 * 1024
SCHEMA_LIMIT = 1024 * 1024  # the toolkit's own JSON Schemas (manifests/*.schema.json): tens of kB
MAX_JSON_DEPTH = 200
MAX_INT_DIGITS = 40  # a byte count or a time in nanoseconds has at most 20
MAX_FOLDER_ENTRIES = 10000
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def read_small(path: Union[str, os.PathLike[str]], limit: int, what: str,
               error: Type[QualifyError], missing_hint: str = "") -> bytes:
    """The bytes of `path` when it is a regular file of at most `limit` bytes; else `error`."""
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        raise error(f"{what} not found: {path}", hint=missing_hint) from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a directory, not a file", hint="give the path of the file itself") from None
    except OSError as exc:
        raise error(f"{what} {path} cannot be opened: {exc.strerror}") from None
    return _read_fd(fd, path, limit, what, error)


def _read_fd(fd: int, path: Union[str, os.PathLike[str]], limit: int, what: str, error: Type[QualifyError]) -> bytes:
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise error(f"{what} {path} is a directory, not a file", hint="give the path of the file itself")
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{what} {path} is not a regular file (a device, FIFO or socket); refused",
                        hint="give the path of a regular file")
        if info.st_size > limit:
            raise error(f"{what} {path} is {info.st_size} bytes, more than the {limit} bytes such a file can be")
        chunks, total = [], 0
        while True:
            block = os.read(fd, min(1 << 20, limit + 1 - total))
            if not block:
                break
            chunks.append(block)
            total += len(block)
            if total > limit:  # grew while we read it
                raise error(f"{what} {path} is more than the {limit} bytes such a file can be")
        return b"".join(chunks)
    except OSError as exc:
        raise error(f"{what} {path} cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)


class Folder:
    """A folder opened once (no symlink followed at its last component); files are read relative to it.

    Every later read goes through this descriptor, so renaming another folder into the path, or
    replacing a file by a symlink, changes nothing that was already decided from these bytes.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self.fd, self.path = fd, path

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def names(self, error: Type[QualifyError]) -> list:
        """The folder's entry names (bounded in number)."""
        try:
            with os.scandir(self.fd) as it:
                out = []
                for entry in it:
                    out.append(entry.name)
                    if len(out) > MAX_FOLDER_ENTRIES:
                        raise error(f"{self.path} holds more than {MAX_FOLDER_ENTRIES} entries; refused")
                return sorted(out)
        except OSError as exc:
            raise error(f"{self.path} cannot be listed: {exc.strerror}") from None

    def exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        except OSError:
            return True  # present but odd: reading it gives the error
        return True

    def read(self, name: str, limit: int, what: str, error: Type[QualifyError], missing_hint: str = "") -> bytes:
        """The bytes of NAME in this folder: a regular file, not a symlink, at most `limit` bytes."""
        if not name or "/" in name or name in (".", ".."):
            raise error(f"{what}: {name!r} is not a file name")
        shown = self.path / name
        try:
            fd = os.open(name, _FLAGS | getattr(os, "O_NOFOLLOW", 0), dir_fd=self.fd)
        except FileNotFoundError:
            raise error(f"{what} not found: {shown}", hint=missing_hint) from None
        except OSError as exc:
            if os.path.islink(shown):
                raise error(f"{what} {shown} is a symbolic link; refused",
                            hint="a release folder holds regular files only: restore it from its tag") from None
            raise error(f"{what} {shown} cannot be opened: {exc.strerror}") from None
        return _read_fd(fd, shown, limit, what, error)


def open_folder(path: Union[str, os.PathLike[str]], what: str, error: Type[QualifyError],
                missing_hint: str = "") -> Folder:
    """`path` opened as a folder, refusing a symlink in its last component, a file or a missing folder."""
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise error(f"{what} not found: {path}", hint=missing_hint) from None
    except OSError as exc:
        if os.path.islink(path):  # O_NOFOLLOW with O_DIRECTORY: ELOOP or ENOTDIR, by kernel
            raise error(f"{what} {path} is a symbolic link; refused",
                        hint="point at the folder itself, not at a link to it") from None
        if isinstance(exc, NotADirectoryError):
            raise error(f"{what} {path} is not a folder") from None
        raise error(f"{what} {path} cannot be opened: {exc.strerror}") from None
    return Folder(fd, path)


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


# A JSON string (escapes skipped; an unterminated one runs to the end) or one bracket: the scan below steps
# over strings in C, so a large document (an SBOM, an index page) costs a fraction of the decode itself.
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.S)


def _depth_exceeds(text: str, limit: int) -> bool:
    """Whether brackets nest deeper than `limit` (strings skipped), in one pass."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for m in _STRING_OR_BRACKET.finditer(text):
        ch = m.group()
        if ch == "[" or ch == "{":
            depth += 1
            if depth > limit:
                return True
        elif ch == "]" or ch == "}":
            depth -= 1
    return False


class _BadNumber(ValueError):
    pass


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _BadNumber(f"an integer of {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _BadNumber(f"{text[:40]} does not fit a number (it would read as infinity)")
    return value


def _constant(name: str) -> Any:
    raise _BadNumber(f"{name} is not JSON")


def read_json(path: Union[str, os.PathLike[str]], limit: int, what: str, error: Type[QualifyError],
              missing_hint: str = "") -> Any:
    """The strict JSON of the file at `path` (`read_small`, then `strict_json`); `error` names the file."""
    return strict_json(read_small(path, limit, what, error, missing_hint), f"{what} {path}", error)


def strict_json(data: Union[bytes, str], what: str, error: Type[QualifyError], nonfinite: bool = False) -> Any:
    """JSON with no duplicate keys, bounded nesting and ordinary numbers; `error` naming `what` otherwise.
    `nonfinite` lets NaN and infinities through, for a child process's report of a measurement that was not
    finite (Python's json writes them), where refusing the report would hide the very result."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise error(f"{what}: not JSON (not UTF-8: {exc})") from None
    if _depth_exceeds(text, MAX_JSON_DEPTH):
        raise error(f"{what}: JSON nested deeper than {MAX_JSON_DEPTH} levels; refused")
    try:
        if nonfinite:
            return json.loads(text, object_pairs_hook=_no_duplicates, parse_int=_int)
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_int=_int, parse_float=_float,
                          parse_constant=_constant)
    except _DuplicateKey as exc:
        raise error(f"{what}: duplicate JSON key {exc.args[0]!r}; refused (which value counts would be ambiguous)",
                    hint="a file this toolkit writes never has one: re-make it (or, in a file "
                    "written by hand, keep one of the two)") from None
    except _BadNumber as exc:
        raise error(f"{what}: {exc}; refused", hint="a file this toolkit wrote never holds one: re-make it") from None
    except json.JSONDecodeError as exc:
        raise error(f"{what}: not JSON: {exc}") from None
    except (RecursionError, ValueError) as exc:
        raise error(f"{what}: not usable JSON ({type(exc).__name__}); refused") from None
