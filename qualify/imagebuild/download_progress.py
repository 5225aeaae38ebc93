"""Progress of a wheelhouse download: bytes done, rate and time left, while `pip download` runs.

`pip download --dest DIR` fetches every wheel into a temporary folder and copies them into DIR only at
the end, and with `--quiet` says nothing: the vLLM lock's 199 wheels (4.75 GB) were 97 s of silence. So
pip runs with TMPDIR set to a folder of ours beside the wheelhouse (same disk; removed afterwards, also
after a killed run, so nothing half-downloaded is left anywhere), and a thread sums the bytes under it
every few seconds: how much has arrived, how fast, and how many wheels have started.

Time left needs the total, which a lock does not record: it is asked of the index pip downloads from, in
the background (the Simple API's JSON form, PEP 691, gives each file's size since PEP 700): for each pin,
the largest wheel whose sha256 the lock lists for this platform (so "time left" errs long). Where the
index does not answer, or names no size for a wheel (a find-links folder, an index without PEP 700), the
lines give bytes and rate and say that the total is unknown. The download never waits for this.
"""

from __future__ import annotations

import os
import shutil
import ssl
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence

from qualify.core.errors import ConfigError
from qualify.core.readlimit import strict_json
from qualify.core.report import Progress

_JSON = "application/vnd.pypi.simple.v1+json"
_LIMIT = 32 << 20  # bytes of one package's index document read at most
_ARCH = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}
EVERY_S = 5.0  # seconds between lines


def wheel_sizes(document: dict, hashes: frozenset, platform: str, python: Optional[str] = None) -> Optional[int]:
    """The largest size among the document's wheels for `platform` (and `python`, "3.11", when given) whose
    sha256 is one of `hashes` (None when none of them states a size)."""
    arch = _ARCH.get(platform, "")
    cpython = f"cp{python.replace('.', '')}" if python else None
    sizes = []
    for entry in document.get("files", []) if isinstance(document, dict) else []:
        if not isinstance(entry, dict):
            continue
        name, digest, size = entry.get("filename", ""), (entry.get("hashes") or {}).get("sha256"), entry.get("size")
        if not (isinstance(name, str) and name.endswith(".whl") and digest in hashes and isinstance(size, int)):
            continue
        py_tag, abi_tag, tags = name[:-4].split("-")[-3:]  # name-version(-build)-python-abi-platform
        fits_python = cpython is None or cpython in py_tag.split(".") or "py3" in py_tag or abi_tag == "abi3"
        if fits_python and (tags == "any" or (arch and arch in tags)):
            sizes.append(size)
    return max(sizes) if sizes else None


def fetch_total(index_url: str, pins: Sequence, platform: str, python: Optional[str], cafile: Optional[str],
                timeout: float = 30.0) -> Optional[int]:
    """The bytes the pins' wheels take, from the index's JSON pages; None unless every pin has a size."""
    context = ssl.create_default_context(cafile=cafile) if cafile and os.path.exists(cafile) else None

    def one(pin) -> Optional[int]:
        request = urllib.request.Request(f"{index_url.rstrip('/')}/{pin.name}/", headers={"Accept": _JSON})
        for _attempt in range(2):  # one retry: a page of thousands of files, 16 at once, may time out
            try:
                with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
                    if _JSON not in response.headers.get("Content-Type", ""):
                        return None  # an index without the JSON form
                    doc = strict_json(response.read(_LIMIT), f"{pin.name}'s index page", ConfigError)
                    return wheel_sizes(doc, pin.hashes, platform, python)
            except (OSError, ValueError, ConfigError):
                continue
        return None

    with ThreadPoolExecutor(max_workers=16) as pool:
        sizes = list(pool.map(one, pins))
    return None if any(s is None for s in sizes) else sum(sizes)  # type: ignore[misc]


def _sizes(folder: Path, skip: frozenset = frozenset()) -> Dict[str, int]:
    """File name -> size of the files under `folder` (the largest where a name is there twice)."""
    out: Dict[str, int] = {}
    for root, _dirs, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            if path in skip:
                continue
            try:
                size = os.stat(path).st_size
            except OSError:
                continue  # pip renamed or removed it between listing and looking
            out[name] = max(size, out.get(name, 0))
    return out


def _files(folder: Optional[Path]) -> frozenset:
    if folder is None or not folder.is_dir():
        return frozenset()
    return frozenset(os.path.join(root, n) for root, _dirs, names in os.walk(folder) for n in names)


class Watch:
    """A line every `every_s` seconds about the bytes under `folder`."""

    def __init__(self, folder: Path, wheels: int, say: Progress, every_s: float = 5.0,
                 total: Optional[Callable[[], Optional[int]]] = None, dest: Optional[Path] = None) -> None:
        self.folder, self.wheels, self.say, self.every_s = folder, wheels, say, every_s
        # pip moves finished files out of its temporary folder (0.87 GB then 0.70 GB was printed): what has
        # arrived is the temporary folder plus what is new in --dest, and a line never says less than one before
        self.dest, self.before = dest, _files(dest)
        self.high = (0, 0)
        self.total: Optional[int] = None
        self.total_known = False  # the question was answered (with a number or with None)
        self.start = time.monotonic()
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = [threading.Thread(target=self._loop, daemon=True)]
        if total is not None:
            self._threads.append(threading.Thread(target=self._ask, args=(total,), daemon=True))

    def __enter__(self) -> Watch:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._threads[0].join(timeout=5)

    def _ask(self, total: Callable[[], Optional[int]]) -> None:
        self.total = total()
        self.total_known = True

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            done, files = self.arrived()
            self.say(self.line(done, files, time.monotonic() - self.start))

    def arrived(self) -> tuple:
        """(bytes, wheels) downloaded so far, never fewer than an earlier reading. pip downloads a wheel into
        its temporary folder and copies it into --dest, so for a while it is in both: each file name counts
        once (counted in both, a re-run after a kill printed 1.60 GB for an 898 MB wheelhouse)."""
        sizes = _sizes(self.folder)
        if self.dest is not None and self.dest.is_dir():
            for name, size in _sizes(self.dest, self.before).items():
                sizes[name] = max(size, sizes.get(name, 0))
        done, files = sum(sizes.values()), sum(name.endswith(".whl") for name in sizes)
        self.high = (max(self.high[0], done), max(self.high[1], files))
        return self.high

    def line(self, done: int, files: int, elapsed: float) -> str:
        rate = done / elapsed if elapsed > 0 else 0.0
        started = f"{min(files, self.wheels)} of {self.wheels} wheels started"
        if self.total:
            part = min(done, self.total)
            left = (self.total - part) / rate if rate > 0 else None
            when = f", about {_duration(left)} left" if left is not None else ""
            return (f"downloaded {part / 1e9:.2f} of {self.total / 1e9:.2f} GB ({100 * part / self.total:.0f}%), "
                    f"{started}, {rate / 1e6:.0f} MB/s{when}")
        why = "the index gave no sizes" if self.total_known else "asking the index for sizes"
        return f"downloaded {done / 1e9:.2f} GB, {started}, {rate / 1e6:.0f} MB/s (time left unknown: {why})"


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def _option(argv: Sequence[str], name: str) -> Optional[str]:
    for k, arg in enumerate(argv):
        if arg == name and k + 1 < len(argv):
            return argv[k + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


@contextmanager
def watching(argv: Sequence[str], pins: Sequence, platform: str, dest: Path, say: Progress,
             every_s: Optional[float] = None) -> Iterator[Dict[str, str]]:
    """The environment to run `pip download` (argv) in, and progress lines while it runs. The sizes are
    asked of argv's own --index-url (none asked with --no-index)."""
    folder = dest.with_name(f".{dest.name}.downloading")
    shutil.rmtree(folder, ignore_errors=True)  # what a killed run left
    folder.mkdir(parents=True)
    index = None if "--no-index" in argv else _option(argv, "--index-url")
    cafile = _option(argv, "--cert")
    python = _option(argv, "--python-version")
    total = (lambda: fetch_total(index, pins, platform, python, cafile)) if index else None
    try:
        with Watch(folder, len(pins), say, EVERY_S if every_s is None else every_s, total, dest):
            yield {"TMPDIR": str(folder)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
