"""A loopback HTTP server that trickles its response headers, one byte every ``interval``.

What a slow or hostile target does to hold a client: every byte arrives well within any
per-read timeout, so only a wall-clock bound stops the client. Used by the tests and the
outbound bench::

    with TrickleServer(interval=1.0, header_bytes=40) as server:
        deliver("POST", server.url, ...)        # must end at its total timeout
        server.cut_off.wait(5)                  # set once the client has hung up
        server.bytes_sent                       # header bytes it got before that

A complete, valid response takes ``header_bytes * interval`` seconds: a client without a
wall-clock bound waits for all of it and gets a 200.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class TrickleServer:
    def __init__(self, *, interval: float = 1.0, header_bytes: int = 40) -> None:
        self.interval = interval
        self.header_bytes = header_bytes
        self.cut_off = threading.Event()  # the client closed or shut down its end
        self.finished = threading.Event()  # the whole response went out
        self.bytes_sent = 0
        self.connections = 0
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        # How often the accepting thread looks at ``_stop``: at most this long to leave.
        self._listener.settimeout(0.02)
        self.port = int(self._listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}/"
        self._thread = threading.Thread(target=self._serve, name="trickle-server", daemon=True)

    def __enter__(self) -> TrickleServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        padding = b"X-Slow: " + b"a" * max(0, self.header_bytes - 8)
        response = b"HTTP/1.1 200 OK\r\n" + padding + b"\r\nContent-Length: 2\r\n\r\nok"
        with conn:
            conn.settimeout(1.0)
            with contextlib.suppress(OSError):
                conn.recv(65536)  # the request (small: one read is enough here)
            status_line_end = len(b"HTTP/1.1 200 OK\r\n")
            try:
                conn.sendall(response[:status_line_end])
                for index in range(status_line_end, len(response)):
                    if self._stop.wait(self.interval):
                        return
                    conn.sendall(response[index : index + 1])
                    self.bytes_sent += 1
                    if _peer_gone(conn):
                        self.cut_off.set()
                        return
            except OSError:
                self.cut_off.set()
                return
            self.finished.set()


def _peer_gone(conn: socket.socket) -> bool:
    """Whether the client closed its end (a read that would not block returns nothing)."""
    try:
        conn.setblocking(False)
        try:
            return conn.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        finally:
            conn.setblocking(True)
            conn.settimeout(1.0)
    except OSError:
        return True
