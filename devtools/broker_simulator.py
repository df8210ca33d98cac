"""A loopback stand-in for a broker's webhook receiver, for tests and the demo.

It listens on 127.0.0.1 (a free port), checks each dispatch's signature with the secret it
was given, records what arrived, and answers as scripted::

    with BrokerSimulator(secret=secret, replies=[500, Reply.slow(2.0), 200]) as broker:
        deliver("POST", broker.url, body=body, headers=headers, allow_private=True)
        broker.received[0].signature_ok, broker.received[0].json

    body, headers = sign_callback(secret, {"status": "completed", ...})  # PUT back to us

Unscripted calls get ``default_reply`` (200). Standard library plus our signing module only.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any

from devtools.loopback import LoopbackServer, serve_in_thread
from integrations.dispatch import signing

_TRICKLE_CHUNK = 64


@dataclass(frozen=True)
class Reply:
    """One scripted answer.

    ``delay`` holds back the whole response (the headers included); ``trickle`` sends the
    body in small pieces with that many seconds between them.
    """

    status: int = 200
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    trickle: float = 0.0

    @classmethod
    def slow(cls, delay: float, status: int = 200) -> Reply:
        return cls(status=status, delay=delay)

    @classmethod
    def rate_limited(cls, retry_after: str = "120", status: int = 429) -> Reply:
        return cls(status=status, headers={"Retry-After": retry_after})

    @classmethod
    def redirect(cls, location: str = "https://example.invalid/moved", status: int = 301) -> Reply:
        return cls(status=status, headers={"Location": location})

    @classmethod
    def gone(cls) -> Reply:
        return cls(status=410)


@dataclass(frozen=True)
class ReceivedRequest:
    """One request as the broker saw it. ``signature_ok`` is None when no secret was given."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    signature_ok: bool | None
    signature_error: str | None
    received_at: float


def sign_callback(
    secret: str, body: Mapping[str, Any], *, now: float | None = None
) -> tuple[bytes, dict[str, str]]:
    """A broker's outcome callback: the exact JSON bytes and the headers that sign them."""
    payload = json.dumps(body, separators=(",", ":")).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    headers.update(signing.signed_headers(secret, payload, now=now))
    return payload, headers


class _Server(LoopbackServer):
    simulator: BrokerSimulator


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real receivers do
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.simulator._opened(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.simulator._closed(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        simulator = self.server.simulator
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        reply = simulator._record(
            self.command,
            self.path,
            dict(self.headers.items()),
            body,
            timestamp=self.headers.get(signing.TIMESTAMP_HEADER),
            signature=self.headers.get(signing.SIGNATURE_HEADER),
        )
        if reply.delay and simulator._closing.wait(reply.delay):
            self.close_connection = True
            return
        try:
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            if not reply.trickle:
                self.wfile.write(reply.body)
                return
            for start in range(0, len(reply.body), _TRICKLE_CHUNK):
                self.wfile.write(reply.body[start : start + _TRICKLE_CHUNK])
                self.wfile.flush()
                if simulator._closing.wait(reply.trickle):
                    self.close_connection = True
                    return
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_POST = do_PUT = do_GET = do_PATCH = do_DELETE = _handle


class BrokerSimulator:
    """A threaded HTTP server on 127.0.0.1 acting as a broker's webhook endpoint."""

    sign_callback = staticmethod(sign_callback)

    def __init__(
        self,
        secret: str | None = None,
        *,
        previous_secret: str | None = None,
        replies: Iterable[int | Reply] = (),
        default_reply: int | Reply = 200,
        path: str = "/webhook",
    ) -> None:
        self.secrets = [s for s in (secret, previous_secret) if s]
        self.path = path
        self.default_reply = _as_reply(default_reply)
        self.connections_accepted = 0
        self._replies: deque[Reply] = deque(_as_reply(r) for r in replies)
        self._received: list[ReceivedRequest] = []
        self._lock = threading.Condition()
        self._open_sockets: set[socket.socket] = set()
        self._closing = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> BrokerSimulator:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.simulator = self
        self._server = server
        self._thread = serve_in_thread(server, name="broker-simulator")
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        # Kept-alive connections would otherwise outlive the server, and a client's pooled
        # connection could later be answered by this stale instance.
        with self._lock:
            sockets = list(self._open_sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):  # already closed by the client
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> BrokerSimulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- addresses ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the broker simulator is not running")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """Where dispatches go: the integration's configured URL."""
        return self.base_url + self.path

    # -- scripting and inspection -------------------------------------------------------------

    def script(self, *replies: int | Reply) -> None:
        """Queue answers for the next calls, in order."""
        with self._lock:
            self._replies.extend(_as_reply(r) for r in replies)

    def clear_script(self) -> None:
        """Forget the answers not given yet: unscripted calls get ``default_reply``."""
        with self._lock:
            self._replies.clear()

    def reset(self) -> None:
        """Forget what arrived and what was scripted, as if just started."""
        with self._lock:
            self._replies.clear()
            self._received.clear()

    @property
    def received(self) -> list[ReceivedRequest]:
        with self._lock:
            return list(self._received)

    def wait_for(self, count: int, timeout: float = 5.0) -> list[ReceivedRequest]:
        """The received requests once there are at least ``count`` (TimeoutError otherwise)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self._received) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{len(self._received)} of {count} requests arrived")
                self._lock.wait(remaining)
            return list(self._received)

    # -- called from the handler threads ------------------------------------------------------

    def _record(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        *,
        timestamp: str | None,
        signature: str | None,
    ) -> Reply:
        signature_ok: bool | None = None
        signature_error: str | None = None
        if self.secrets:
            try:
                signing.verify(self.secrets, timestamp, signature, body)
                signature_ok = True
            except signing.SignatureError as exc:
                signature_ok, signature_error = False, exc.code
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        request = ReceivedRequest(
            method=method,
            path=path,
            headers=headers,
            body=body,
            json=parsed,
            signature_ok=signature_ok,
            signature_error=signature_error,
            received_at=time.time(),
        )
        with self._lock:
            self._received.append(request)
            self._lock.notify_all()
            return self._replies.popleft() if self._replies else self.default_reply

    def _opened(self, sock: socket.socket) -> None:
        with self._lock:
            self.connections_accepted += 1
            self._open_sockets.add(sock)

    def _closed(self, sock: socket.socket) -> None:
        with self._lock:
            self._open_sockets.discard(sock)


def _as_reply(reply: int | Reply) -> Reply:
    return reply if isinstance(reply, Reply) else Reply(status=reply)
