"""The search for container prefixes in mapped files (qualify/core/search.py):
libc's memmem on the mapping's own pages, CPython's search where that is
missing; both must find exactly what bytes.find finds."""

from __future__ import annotations

import mmap
import random

import pytest

from qualify.core import search

NEEDLE = bytes.fromhex("50ED55BA01001000")  # a fatbin container's first 8 bytes


@pytest.fixture()
def mapped(tmp_path):
    """A 1 MB file of seeded random bytes with zero runs, the needle planted
    at both ends, near-misses (the needle's first 7 bytes) and a few places
    between; mapped read-only as the census maps libraries."""
    rng = random.Random(15)
    data = bytearray(rng.randbytes(1 << 20))
    for at in range(0, len(data), 4096):
        data[at : at + 512] = bytes(512)  # zero padding, as in data sections
    for at in (0, 4093, 65536 - 3, 300_001, len(data) - len(NEEDLE)):
        data[at : at + len(NEEDLE)] = NEEDLE
    for at in (70_000, 500_000):
        data[at : at + 7] = NEEDLE[:7]
    path = tmp_path / "haystack.bin"
    path.write_bytes(bytes(data))
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        yield mm, bytes(data)


def ranges(size: int):
    rng = random.Random(7)
    yield from [(0, size), (1, size), (0, 0), (size, size), (4090, 4101), (4093, 4101), (4094, size), (65533, 65541)]
    for _ in range(300):
        a = rng.randrange(size + 1)
        yield a, rng.randrange(a, size + 1)


@pytest.mark.parametrize("libc", [True, False])
def test_first_match_is_bytes_find(mapped, monkeypatch, libc):
    mm, data = mapped
    if not libc:
        monkeypatch.setattr(search, "_memmem", lambda: None)
    finder = search.Finder(mm, libc_from=0)  # every range through memmem (by default only long ones)
    assert (finder.base is not None) == libc
    for start, end in ranges(len(data)):
        assert finder.first(NEEDLE, start, end) == data.find(NEEDLE, start, end), (start, end)


def test_memmem_is_used_on_this_host(mapped):
    """Linux with glibc: the fast path is in use (a silent fallback would lose ~10%)."""
    mm, _data = mapped
    assert search.Finder(mm).base is not None


@pytest.mark.parametrize("libc", [True, False])
def test_outside_the_mapping_or_after_close_is_refused(tmp_path, monkeypatch, libc):
    if not libc:
        monkeypatch.setattr(search, "_memmem", lambda: None)
    path = tmp_path / "small.bin"
    path.write_bytes(NEEDLE * 100)
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        finder = search.Finder(mm, libc_from=0)
        for start, end in ((-1, 10), (0, 801), (10, 5)):
            with pytest.raises(ValueError, match="outside the mapping"):
                finder.first(NEEDLE, start, end)
        mm.close()
        with pytest.raises(ValueError):  # never a read of unmapped memory
            finder.first(NEEDLE, 0, 800)
