"""Is the API port free on this host."""

from __future__ import annotations

import errno
import socket
from typing import Optional


def port_problem(address: str, port: int) -> Optional[str]:
    """None when `address:port` can be bound now, else what is wrong."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # As the server will bind (docker's proxy and uvicorn set it): connections of a server stopped a moment
        # ago linger in TIME-WAIT for a minute and do not keep the port from being bound; a listener still does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {address} is already in use"
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"{address} is not an address of this host"
            if exc.errno == errno.EACCES:
                return f"port {port} needs privileges to bind"
            return f"cannot bind {address}:{port}: {exc.strerror}"
    return None
