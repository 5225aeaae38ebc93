"""Bounded reads of small input files, and strict JSON. Standard library only (image side).

Every key, signature, bundle, manifest, release index and targets file is read
through `read_small`: only a regular file (not a directory, FIFO, socket or
device such as /dev/zero), up to a size limit, so hostile input can neither
hang a read nor grow memory without bound. `strict_json` refuses duplicate
object keys (in signed JSON the last value would silently win) and nesting
deep enough to exhaust the interpreter's stack.
"""

from __future__ import annotations

import json
import os
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
MAX_JSON_DEPTH = 200


def read_small(path: Union[str, os.PathLike[str]], limit: int, what: str,
               error: Type[QualifyError], missing_hint: str = "") -> bytes:
    """The bytes of `path` when it is a regular file of at most `limit` bytes; else `error`."""
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{what} not found: {path}", hint=missing_hint) from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a directory, not a file", hint="give the path of the file itself") from None
    except OSError as exc:
        raise error(f"{what} {path} cannot be opened: {exc.strerror}") from None
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


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


def _depth_exceeds(text: str, limit: int) -> bool:
    """Whether brackets nest deeper than `limit` (strings skipped), in one pass."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def strict_json(data: Union[bytes, str], what: str, error: Type[QualifyError]) -> Any:
    """JSON with no duplicate keys and bounded nesting; `error` naming `what` otherwise."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise error(f"{what}: not UTF-8 JSON: {exc}") from None
    if _depth_exceeds(text, MAX_JSON_DEPTH):
        raise error(f"{what}: JSON nested deeper than {MAX_JSON_DEPTH} levels; refused")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise error(f"{what}: duplicate JSON key {exc.args[0]!r}; refused (which value counts would be ambiguous)",
                    hint="a signed file is never edited by hand; re-make it") from None
    except json.JSONDecodeError as exc:
        raise error(f"{what}: not JSON: {exc}") from None
    except RecursionError:
        raise error(f"{what}: JSON nested too deeply; refused") from None
