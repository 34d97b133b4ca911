"""Loopback ports for the tests' servers."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nothing listens on now: the kernel's pick, released at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
