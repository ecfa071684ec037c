"""A TCP port to hand to a server that binds it a moment later.

Binding port 0 and closing the socket returns a port from the kernel's ephemeral range, and
the kernel hands the same range to every connect() and bind(0) on the host: between the
pick and the server's bind, a Ray worker or any client may take it ("Address already in
use"). So the port is drawn from below the ephemeral range, which only an explicit bind
can take, and above Ray's worker ports (10002-19999 by default).
"""

from __future__ import annotations

import random
import socket

_LOWEST_PORT = 20000  # above Ray's default worker port range
_EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_EPHEMERAL_LOW_DEFAULT = 32768  # Linux's default, below macOS's (49152)
_ATTEMPTS = 64


def _ephemeral_low() -> int:
    try:
        with open(_EPHEMERAL_RANGE_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_LOW_DEFAULT


def _binds(ip: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip, port))
        except OSError:
            return False
    return True


def free_port(ip: str = "127.0.0.1") -> int:
    """A TCP port nothing is bound to on `ip` now, outside the ephemeral range when the host
    leaves room below it (else the kernel's pick)."""
    high = _ephemeral_low()
    if high - _LOWEST_PORT >= _ATTEMPTS:
        for port in random.sample(range(_LOWEST_PORT, high), _ATTEMPTS):
            if _binds(ip, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return s.getsockname()[1]
