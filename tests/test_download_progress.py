"""The wheelhouse download says how it goes (qualify/imagebuild/download_progress.py): a real `pip download`
from an index on loopback (PEP 691 JSON with sizes, the wheel sent slowly), through wheelhouse.prepare_into
as a build calls it: lines with bytes, rate and time left while pip runs, the wheel verified afterwards,
and nothing left of pip's temporary folder."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import re
import threading
import time
import zipfile

import pytest

from qualify.imagebuild import download_progress, wheelhouse

WHEEL = "tinypkg-1.0-py3-none-any.whl"


def _wheel(size: int) -> bytes:
    """A small valid wheel whose payload is `size` bytes of stored (incompressible) data."""
    body = hashlib.shake_256(b"payload").digest(size)
    files = {"tinypkg/__init__.py": b"", "tinypkg/blob.bin": body,
             "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
             "tinypkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},,\n" for n in files) + "tinypkg-1.0.dist-info/RECORD,,\n"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("tinypkg-1.0.dist-info/RECORD", record)
    return out.getvalue()


@pytest.fixture()
def index():
    """A PEP 691 index on loopback serving one wheel at ~10 MB/s; yields (url, wheel bytes, requests seen)."""
    data = _wheel(24 << 20)
    digest = hashlib.sha256(data).hexdigest()
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append((self.path, self.headers.get("Accept", "")))
            if self.path.rstrip("/") == "/simple/tinypkg":
                doc = {"meta": {"api-version": "1.1"}, "name": "tinypkg",
                       "files": [{"filename": WHEEL, "url": f"/files/{WHEEL}", "hashes": {"sha256": digest},
                                  "size": len(data)}]}
                self._send(json.dumps(doc).encode(), "application/vnd.pypi.simple.v1+json")
            elif self.path == f"/files/{WHEEL}":
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                for at in range(0, len(data), 1 << 20):
                    self.wfile.write(data[at:at + (1 << 20)])
                    time.sleep(0.1)
            else:
                self.send_error(404)

        def _send(self, body, kind):
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", data, seen
    finally:
        server.shutdown()


def test_a_download_says_bytes_rate_and_time_left(index, tmp_path, monkeypatch, capsys):
    url, data, _seen = index
    lock = tmp_path / "lock.txt"
    lock.write_text(f"tinypkg==1.0 --hash=sha256:{hashlib.sha256(data).hexdigest()}\n")
    monkeypatch.setattr(wheelhouse, "PYPI", url)
    monkeypatch.setattr(download_progress, "EVERY_S", 0.3)
    dest = tmp_path / "house"
    wheelhouse.prepare_into(lock, "linux/amd64", None, dest)
    err = capsys.readouterr().err
    assert (dest / WHEEL).read_bytes() == data
    lines = [x for x in err.splitlines() if "downloaded" in x]
    timed = [x for x in lines if re.search(r"downloaded \d+\.\d\d of 0\.03 GB \(\d+%\), 1 of 1 wheels started, \d+ MB/s, "
                                          r"about \d+ s left", x)]
    assert timed, err  # the total came from the index's sizes while pip was downloading
    assert not list(tmp_path.glob(".house.downloading*")), "pip's temporary folder was left behind"


def test_sizes_come_from_the_lock_s_hashes_for_the_platform():
    doc = {"files": [
        {"filename": "p-1-cp311-cp311-manylinux_2_28_x86_64.whl", "hashes": {"sha256": "a"}, "size": 10},
        {"filename": "p-1-cp311-cp311-manylinux_2_28_aarch64.whl", "hashes": {"sha256": "b"}, "size": 20},
        {"filename": "p-1-cp312-cp312-manylinux_2_28_x86_64.whl", "hashes": {"sha256": "c"}, "size": 30},
        {"filename": "p-1-py3-none-any.whl", "hashes": {"sha256": "d"}, "size": 5},
        {"filename": "p-1.tar.gz", "hashes": {"sha256": "e"}, "size": 99},
        {"filename": "p-1-cp311-cp311-manylinux_2_28_x86_64.whl", "hashes": {"sha256": "f"}},  # no size (PEP 700)
    ]}
    everything = frozenset("abcdef")
    assert download_progress.wheel_sizes(doc, everything, "linux/amd64") == 30
    assert download_progress.wheel_sizes(doc, everything, "linux/amd64", "3.11") == 10
    assert download_progress.wheel_sizes(doc, everything, "linux/arm64", "3.11") == 20
    assert download_progress.wheel_sizes(doc, frozenset("d"), "linux/arm64") == 5
    assert download_progress.wheel_sizes(doc, frozenset("ef"), "linux/amd64") is None
    assert download_progress.wheel_sizes({"files": "nonsense"}, everything, "linux/amd64") is None


def test_without_sizes_the_lines_say_the_total_is_unknown(tmp_path):
    lines = []
    watch = download_progress.Watch(tmp_path, 199, lines.append, total=lambda: None)
    watch.total_known = True
    assert watch.line(2_000_000_000, 9, 20.0) == ("downloaded 2.00 GB, 9 of 199 wheels started, 100 MB/s "
                                                 "(time left unknown: the index gave no sizes)")
    watch.total = 4_750_000_000
    assert watch.line(2_000_000_000, 9, 20.0) == ("downloaded 2.00 of 4.75 GB (42%), 9 of 199 wheels started, "
                                                 "100 MB/s, about 28 s left")


def test_an_index_without_the_json_form_gives_no_total(index):
    url, _data, seen = index
    pin = wheelhouse.Pin("nothere", "1.0", frozenset({"x"}))
    assert download_progress.fetch_total(url, [pin], "linux/amd64", None, None, timeout=5) is None
    assert any("vnd.pypi.simple.v1+json" in accept for _path, accept in seen)


def test_bytes_pip_moves_into_dest_still_count_and_a_line_never_goes_back(tmp_path):
    """Seen on the vLLM lock: 0.87 GB, then 0.70 GB, as pip moved finished wheels out of its temporary folder."""
    temp, dest = tmp_path / "temp", tmp_path / "dest"
    temp.mkdir()
    dest.mkdir()
    (dest / "old-1.0-py3-none-any.whl").write_bytes(b"x" * 50)  # there before: not this download's
    watch = download_progress.Watch(temp, 3, lambda _line: None, dest=dest)
    (temp / "a-1.0-py3-none-any.whl").write_bytes(b"a" * 100)
    (temp / "b-1.0-py3-none-any.whl").write_bytes(b"b" * 200)
    assert watch.arrived() == (300, 2)
    (temp / "a-1.0-py3-none-any.whl").rename(dest / "a-1.0-py3-none-any.whl")  # moved: still arrived
    assert watch.arrived() == (300, 2)
    (temp / "b-1.0-py3-none-any.whl").unlink()  # removed (pip's own scratch copy): the reading keeps its high
    assert watch.arrived() == (300, 2)
    (temp / "c-1.0-py3-none-any.whl").write_bytes(b"c" * 400)
    assert watch.arrived() == (500, 2)


def test_a_wheel_in_the_temporary_folder_and_in_dest_counts_once(tmp_path):
    """Issue 48: after a killed download, the re-run printed "downloaded 1.60 GB" for an 898 MB wheelhouse. pip
    copies each finished wheel from its temporary folder into --dest, so for a while it is in both; and the
    wheels the killed run left in --dest were downloaded before this run."""
    temp, dest = tmp_path / "temp", tmp_path / "dest"
    (temp / "pip-unpack-1").mkdir(parents=True)
    dest.mkdir()
    (dest / "kept-1.0-py3-none-any.whl").write_bytes(b"k" * 700)  # the killed run's: not this download's bytes
    watch = download_progress.Watch(temp, 3, lambda _line: None, dest=dest)
    (temp / "pip-unpack-1" / "torch-2.13.0-cp311-cp311-linux_x86_64.whl").write_bytes(b"t" * 300)
    assert watch.arrived() == (300, 1)
    (dest / "torch-2.13.0-cp311-cp311-linux_x86_64.whl").write_bytes(b"t" * 300)  # copied, the original still there
    assert watch.arrived() == (300, 1)
    (temp / "pip-unpack-2").mkdir()
    (temp / "pip-unpack-2" / "six-1.16.0-py2.py3-none-any.whl").write_bytes(b"s" * 20)
    assert watch.arrived() == (320, 2)
    assert watch.line(*watch.arrived(), 1.0).startswith("downloaded 0.00 GB, 2 of 3 wheels started")
