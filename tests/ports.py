"""A free TCP port on loopback, for the servers tests start (the kernel picks it; a race
with another process taking it before the server binds is possible, and harmless here)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
