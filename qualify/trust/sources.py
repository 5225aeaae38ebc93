"""Where a release's bytes come from. Reading is split from verifying (python-tuf's rule: the verifier takes
bytes, the caller does the I/O): a source hands over the bytes of a named file, bounded, and nothing else;
`verify.verify_release` decides what they are worth.

- `FolderSource`: a folder opened once (`manifests/<tag>/`); every file is read relative to its descriptor,
  never through a symbolic link, only as a regular file within its limit (core/readlimit.Folder).
- `LayeredSource`: a folder with a journal's files laid over it and the files the journal removes hidden:
  what the folder will hold once the journal is finished (journal.py's recovery check; a staging folder).
- `GitTagSource`: `manifests/<tag>/` as the tag `<tag>` holds it, read from git's object store through one
  `git cat-file --batch` process (`GitObjects`) shared by every tag a command reads (history, the tag a
  re-run resumes); only regular files (mode 100644/100755) count, a symbolic link in the tree is refused.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Protocol, Tuple

from qualify.core.errors import VerificationError
from qualify.core.readlimit import MAX_FOLDER_ENTRIES, Folder, open_folder
from qualify.host import cmd

GIT_TIMEOUT_S = 300.0


class Source(Protocol):
    """A release folder's files, by name. `name` is the folder's own name (a release is valid only under its
    own tag); `where` says where the bytes come from, for messages."""

    name: str
    where: str

    def names(self) -> List[str]: ...

    def exists(self, name: str) -> bool: ...

    def read(self, name: str, limit: int, what: str, missing_hint: str = "") -> bytes: ...

    def sub(self, name: str, what: str) -> Optional[Source]:
        """The source of a subfolder (`evidence/<target>`); None when it is not there."""


def join(source: Source, name: str) -> str:
    return f"{source.where}/{name}"


class FolderSource:
    """A folder opened once; `close()` (or `with`) gives the descriptor back."""

    def __init__(self, folder: Folder, name: Optional[str] = None) -> None:
        self.folder, self.name, self.where = folder, name if name is not None else folder.path.name, str(folder.path)

    @classmethod
    def open(cls, path: Path, what: str = "release folder", missing_hint: str = "") -> FolderSource:
        return cls(open_folder(Path(path), what, VerificationError, missing_hint=missing_hint))

    def names(self) -> List[str]:
        return self.folder.names(VerificationError)

    def exists(self, name: str) -> bool:
        return self.folder.exists(name)

    def read(self, name: str, limit: int, what: str, missing_hint: str = "") -> bytes:
        return self.folder.read(name, limit, what, VerificationError, missing_hint=missing_hint)

    def sub(self, name: str, what: str) -> Optional[FolderSource]:
        """A subfolder opened relative to this one's descriptor; a symbolic link or a file there is refused."""
        try:
            info = os.stat(name, dir_fd=self.folder.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise VerificationError(f"{join(self, name)} cannot be read: {exc.strerror}") from None
        if not stat.S_ISDIR(info.st_mode):
            raise VerificationError(f"{join(self, name)} is a symbolic link or not a folder; refused",
                                    hint=f"remove {join(self, name)} and restore it from where the release was promoted")
        flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(name, flags, dir_fd=self.folder.fd)
        except OSError as exc:
            raise VerificationError(f"{what} {join(self, name)} cannot be opened: {exc.strerror}") from None
        return FolderSource(Folder(fd, self.folder.path / name))

    def close(self) -> None:
        self.folder.close()

    def __enter__(self) -> FolderSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LayeredSource:
    """`top` (a journal) laid over `base` (the folder it goes to), `hidden` names removed: the folder as the
    journal will leave it. Messages name the folder, since that is where the files will be."""

    def __init__(self, base: Source, top: Source, hidden: Iterable[str] = ()) -> None:
        self.base, self.top, self.hidden = base, top, frozenset(hidden)
        self.name, self.where = base.name, base.where

    def names(self) -> List[str]:
        return sorted((set(self.base.names()) - self.hidden) | set(self.top.names()))

    def exists(self, name: str) -> bool:
        return self.top.exists(name) or (name not in self.hidden and self.base.exists(name))

    def read(self, name: str, limit: int, what: str, missing_hint: str = "") -> bytes:
        if self.top.exists(name):
            return self.top.read(name, limit, what, missing_hint)
        if name in self.hidden:
            raise VerificationError(f"{what} not found: {join(self, name)} (the journal removes it)", hint=missing_hint)
        return self.base.read(name, limit, what, missing_hint)

    def sub(self, name: str, what: str) -> Optional[Source]:
        return self.base.sub(name, what)  # a journal never holds subfolders (journal._shape)


# --- git ------------------------------------------------------------------------------------------------


class GitObjects:
    """One `git cat-file --batch` for a repository: trees and blobs by revision expression, each bounded."""

    def __init__(self, repo: Path) -> None:
        self.repo = Path(repo)
        self.pipe: Optional[cmd.Pipe] = None
        self.width = 20  # bytes of an object id in a tree; set from the first id git prints

    def _pipe(self) -> cmd.Pipe:
        if self.pipe is None:
            self.pipe = cmd.Pipe(["git", "cat-file", "--batch"], cwd=str(self.repo), timeout=GIT_TIMEOUT_S)
        return self.pipe

    def get(self, rev: str, limit: int, what: str) -> Optional[Tuple[str, bytes]]:
        """(type, content) of the object `rev` names; None when there is none. More than `limit` bytes, or
        a git that stops answering, is a VerificationError."""
        if "\n" in rev:
            raise VerificationError(f"{what}: {rev!r} is not a revision")
        pipe = self._pipe()
        try:
            pipe.send(rev.encode("utf-8") + b"\n")
            header = pipe.readline(4096)
            if not header.endswith(b"\n"):
                raise VerificationError(f"{what}: git cat-file stopped answering ({pipe.failure() or 'no output'})")
            parts = header.split()
            if len(parts) == 2 and parts[1] in (b"missing", b"ambiguous"):
                return None
            if len(parts) != 3 or not parts[2].isdigit():
                raise VerificationError(f"{what}: git cat-file said {header[:200]!r}")
            kind, size = parts[1].decode("ascii", "replace"), int(parts[2])
            self.width = len(parts[0]) // 2
            if size > limit:  # skipped, never held: the stream stays in step for the next object
                left = size + 1
                while left > 0:
                    left -= len(pipe.read(min(left, 1 << 20))) or left
                raise VerificationError(f"{what} {rev} is {size} bytes, more than the {limit} bytes such a file can be")
            content = pipe.read(size)
            pipe.read(1)  # the newline after the content
        except OSError as exc:
            raise VerificationError(f"{what}: git cat-file failed: {exc}") from None
        if len(content) != size:
            raise VerificationError(f"{what}: git cat-file gave {len(content)} of {size} bytes")
        return kind, content

    def close(self) -> None:
        if self.pipe is not None:
            self.pipe.close()
            self.pipe = None

    def __enter__(self) -> GitObjects:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tree_entries(data: bytes, width: int, where: str) -> Dict[str, Tuple[str, str]]:
    """name -> (mode, object id) of a raw tree object (`<mode> <name>\\0<binary id>`; the id is `width` bytes:
    20 for SHA-1 repositories, 32 for SHA-256 ones)."""
    out: Dict[str, Tuple[str, str]] = {}
    i = 0
    while i < len(data):
        space, nul = data.find(b" ", i), data.find(b"\0", i)
        if space < 0 or nul < space or nul + 1 + width > len(data):
            raise VerificationError(f"{where}: not a git tree object")
        mode, name = data[i:space].decode("ascii", "replace"), data[space + 1:nul].decode("utf-8", "surrogateescape")
        oid = data[nul + 1:nul + 1 + width].hex()
        out[name] = (mode, oid)
        i = nul + 1 + width
        if len(out) > MAX_FOLDER_ENTRIES:
            raise VerificationError(f"{where} holds more than {MAX_FOLDER_ENTRIES} entries; refused")
    return out


class GitTagSource:
    """`<root>/<tag>/` in the tree of tag `tag`. Only regular files are files; anything else is refused."""

    REGULAR = ("100644", "100755")

    def __init__(self, objects: GitObjects, root: str, tag: str, tree: Optional[Dict[str, Tuple[str, str]]] = None,
                 where: str = "") -> None:
        self.objects, self.root, self.name = objects, root, tag
        self.where = where or f"tag {tag}:{root}/{tag}"
        self._tree = tree

    @classmethod
    def of(cls, objects: GitObjects, root: str, tag: str) -> Optional[GitTagSource]:
        """The source, or None when the tag has no `<root>/<tag>/` folder (or no such tag)."""
        got = objects.get(f"refs/tags/{tag}^{{commit}}:{root}/{tag}", 16 * 1024 * 1024, f"tag {tag}")
        if got is None or got[0] != "tree":
            return None
        return cls(objects, root, tag, _tree_entries(got[1], objects.width, f"tag {tag}:{root}/{tag}"))

    def names(self) -> List[str]:
        return sorted(self._tree)

    def exists(self, name: str) -> bool:
        return name in self._tree

    def read(self, name: str, limit: int, what: str, missing_hint: str = "") -> bytes:
        entry = self._tree.get(name)
        if entry is None:
            raise VerificationError(f"{what} not found: {join(self, name)}", hint=missing_hint)
        mode, oid = entry
        if mode not in self.REGULAR:
            raise VerificationError(f"{what} {join(self, name)} is not a regular file in the tag (mode {mode}); refused")
        got = self.objects.get(oid, limit, f"{what} {join(self, name)}")
        if got is None or got[0] != "blob":
            raise VerificationError(f"{what} {join(self, name)}: git has no such blob")
        return got[1]

    def sub(self, name: str, what: str) -> Optional[GitTagSource]:
        entry = self._tree.get(name)
        if entry is None:
            return None
        if entry[0] != "40000":
            raise VerificationError(f"{join(self, name)} is not a folder in the tag; refused")
        got = self.objects.get(entry[1], 16 * 1024 * 1024, f"{what} {join(self, name)}")
        if got is None or got[0] != "tree":
            raise VerificationError(f"{what} {join(self, name)}: git has no such tree")
        return GitTagSource(self.objects, self.root, self.name, _tree_entries(got[1], self.objects.width, join(self, name)),
                            where=join(self, name))


def tags(repo: Path, limit: int) -> List[str]:
    """The repository's tag names (at most `limit`), oldest name order; [] when git cannot say."""
    done = cmd.output(["git", "for-each-ref", "--format=%(refname:strip=2)", "refs/tags/"], cwd=str(repo), timeout=60)
    if done.returncode != 0:
        return []
    return done.stdout.decode("utf-8", "replace").split()[:limit]
