"""Does a registry offer the OCI 1.1 referrers API (GET /v2/<name>/referrers/<digest>)?

Hand-written because neither skopeo 1.9 nor oras-py asks this question. It is
one bounded GET: TLS trust from certs.d plus the system store, credentials
from the same auth file skopeo reads (basic auth, or a bearer token when the
registry asks for one). Credentials go only into the Authorization header.
"""

from __future__ import annotations

import os
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Dict, Optional

from qualify.core.errors import RegistryError
from qualify.core.readlimit import read_json, strict_json

MAX_BYTES = 1024 * 1024


def auth_file() -> Optional[Path]:
    for candidate in (os.environ.get("REGISTRY_AUTH_FILE"),
                      os.path.join(os.environ.get("XDG_RUNTIME_DIR", "/nonexistent"), "containers", "auth.json"),
                      os.path.join(os.environ.get("DOCKER_CONFIG", os.path.expanduser("~/.docker")), "config.json")):
        if candidate and os.path.isfile(candidate):
            return Path(candidate)
    return None


def _basic(host: str) -> Optional[str]:
    path = auth_file()
    if path is None:
        return None
    try:
        entry = (read_json(path, MAX_BYTES, "registry auth file", RegistryError).get("auths") or {}).get(host) or {}
    except (RegistryError, AttributeError):  # no credentials from it: the registry says what it needs
        return None
    return entry.get("auth") if isinstance(entry.get("auth"), str) else None


def _context(host: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    for root in ("/etc/containers/certs.d", "/etc/docker/certs.d"):
        ca = Path(root) / host / "ca.crt"
        if ca.is_file():
            ctx.load_verify_locations(cafile=str(ca))
    return ctx


def _get(url: str, host: str, headers: Dict[str, str]):
    req = urllib.request.Request(url, headers=headers)
    return urllib.request.urlopen(req, timeout=20, context=_context(host))


def supported(host: str, repository: str, digest: str) -> Optional[bool]:
    """True/False when the registry answered the question; None when it could not be asked."""
    url = f"https://{host}/v2/{repository}/referrers/{digest}"
    headers = {"Accept": "application/vnd.oci.image.index.v1+json"}
    basic = _basic(host)
    for _ in range(2):
        try:
            with _get(url, host, headers) as resp:
                kind = resp.headers.get("Content-Type", "")
                resp.read(MAX_BYTES)
                return resp.status == 200 and kind.startswith("application/vnd.oci.image.index.v1+json")
        except urllib.error.HTTPError as exc:
            challenge = exc.headers.get("WWW-Authenticate", "") if exc.headers else ""
            if exc.code == 401 and "Authorization" not in headers and basic:
                if challenge.lower().startswith("bearer"):
                    token = _token(challenge, basic, host)
                    if not token:
                        return None
                    headers["Authorization"] = f"Bearer {token}"
                else:
                    headers["Authorization"] = f"Basic {basic}"
                continue
            return False if exc.code == 404 else None
        except (urllib.error.URLError, OSError):
            return None
    return None


def _token(challenge: str, basic: str, host: str) -> Optional[str]:
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    if "realm" not in params:
        return None
    query = urllib.parse.urlencode({k: v for k, v in params.items() if k in ("service", "scope")})
    try:
        with _get(f"{params['realm']}?{query}", host, {"Authorization": f"Basic {basic}"}) as resp:
            body = strict_json(resp.read(MAX_BYTES), f"{host}'s token answer", RegistryError)
    except (urllib.error.URLError, OSError, ValueError, RegistryError):
        return None
    return body.get("token") or body.get("access_token")

