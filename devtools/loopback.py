"""What the loopback stand-ins share: an HTTP server on 127.0.0.1 served from a daemon thread."""

from __future__ import annotations

import socket
import threading
from http.server import ThreadingHTTPServer
from typing import Any


class LoopbackServer(ThreadingHTTPServer):
    """Each connection on a daemon thread; quiet about a client that went away mid-answer
    (the timeout tests leave one behind on purpose)."""

    daemon_threads = True

    def get_request(self) -> tuple[socket.socket, Any]:
        # An answer's headers and body are two writes: with Nagle's algorithm the second
        # waits for the client's delayed ACK of the first, 40 ms on every answer.
        connection, address = super().get_request()
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


def serve_in_thread(
    server: ThreadingHTTPServer, *, name: str, poll_interval: float = 0.01
) -> threading.Thread:
    """``server.serve_forever`` on a started daemon thread (``server.shutdown`` ends it within
    ``poll_interval``: short, as each test using a stand-in waits that long to stop it)."""
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": poll_interval},
        name=name,
        daemon=True,
    )
    thread.start()
    return thread
