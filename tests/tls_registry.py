"""A second, real registry for the publish tests: Debian's docker-registry on a
free 127.0.0.1 port, serving TLS with a CA made here by openssl (trusted the
standard way, through certs.d) and htpasswd basic auth (bcrypt entries).

Credentials reach skopeo only through an auth file named by REGISTRY_AUTH_FILE
(docker's config.json format), never through arguments. Everything made here
(process, certs.d entries, files) is removed on teardown.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator

import bcrypt

REGISTRY_BINARY = "/usr/bin/docker-registry"
CERTS_D_ROOTS = (Path("/etc/docker/certs.d"), Path("/etc/containers/certs.d"))
USER = "publisher"
# Made per run: never a constant that could leak into a real deployment.
_PASSWORD_ENV = "QUALIFY_TEST_REGISTRY_PASSWORD"


@dataclass(frozen=True)
class TlsRegistry:
    address: str  # 127.0.0.1:PORT
    root: Path
    ca: Path
    log: Path
    auth_file: Path  # docker config.json with this registry's credentials
    empty_auth_file: Path  # the same format, no credentials
    password: str

    def env(self, with_credentials: bool = True) -> Dict[str, str]:
        """Environment for a process that should (or should not) hold the credentials."""
        return {"REGISTRY_AUTH_FILE": str(self.auth_file if with_credentials else self.empty_auth_file)}

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_ca_and_cert(d: Path) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=qualify test CA", cwd=d)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.crt", "-days", "2", "-extfile", "san.ext", cwd=d)


_CONFIG = """version: 0.1
log:
  level: info
  formatter: text
storage:
  filesystem:
    rootdirectory: {root}/data
  delete:
    enabled: true
http:
  addr: {address}
  tls:
    certificate: {root}/server.crt
    key: {root}/server.key
auth:
  htpasswd:
    realm: qualify-test
    path: {root}/htpasswd
"""


def _answers(address: str, ca: Path) -> bool:
    ctx = ssl.create_default_context(cafile=str(ca))
    try:
        urllib.request.urlopen(f"https://{address}/v2/", timeout=2, context=ctx).close()
        return True
    except urllib.error.HTTPError as exc:
        return exc.code == 401  # up, and asking for credentials
    except (urllib.error.URLError, OSError):
        return False


def start(root: Path) -> Iterator[TlsRegistry]:
    """Generator for a pytest fixture: yields a running registry, then tears it all down."""
    if not os.path.exists(REGISTRY_BINARY):
        raise RuntimeError(f"{REGISTRY_BINARY} is missing (apt-get install docker-registry)")
    root.mkdir(parents=True, exist_ok=True)
    _make_ca_and_cert(root)
    password = base64.urlsafe_b64encode(os.urandom(18)).decode()
    (root / "htpasswd").write_bytes(USER.encode() + b":" + bcrypt.hashpw(password.encode(), bcrypt.gensalt(10)) + b"\n")
    address = f"127.0.0.1:{_free_port()}"
    (root / "config.yml").write_text(_CONFIG.format(root=root, address=address))
    auth = {"auths": {address: {"auth": base64.b64encode(f"{USER}:{password}".encode()).decode()}}}
    auth_file, empty = root / "auth.json", root / "no-auth.json"
    auth_file.write_text(json.dumps(auth))
    auth_file.chmod(0o600)
    empty.write_text(json.dumps({"auths": {}}))
    certs = [r / address for r in CERTS_D_ROOTS]
    log = root / "registry.log"
    proc = None
    try:
        for d in certs:
            d.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / "ca.crt", d / "ca.crt")
        with open(log, "ab") as out:
            proc = subprocess.Popen([REGISTRY_BINARY, "serve", str(root / "config.yml")], stdout=out, stderr=out,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 20
        while not _answers(address, root / "ca.crt"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"test registry on {address} did not start; log:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield TlsRegistry(address, root, root / "ca.crt", log, auth_file, empty, password)
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: only what we started
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        for d in certs:
            shutil.rmtree(d, ignore_errors=True)
