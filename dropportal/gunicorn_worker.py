"""The web worker class of ``dropportal/gunicorn_conf.py``: gunicorn's threaded worker with a
bounded queue, answering 503 with ``Retry-After`` at once to what it cannot serve in time.

With gunicorn's sync workers a burst of callbacks waited in the kernel's accept queue, with
no answer, and beyond its room the kernel dropped the callers' connection attempts: callers
with a 15 s timeout gave up, and the work later done for their abandoned connections
delayed the next ones in turn (docs/benchmarks.md, "Callback bursts"). Here each worker:

- takes every connection off the listening socket as it comes (its main thread), and hands
  it to its threads, unless ``MAX_WAITING`` requests already wait for one: then it answers
  503 itself as soon as the request's first bytes are in, without parsing it or starting
  anything else (tens of microseconds), so a burst's surplus is refused as fast as it comes;
- answers 503 as well, before the application sees it, a request that waited more than
  ``QUEUE_SECONDS`` for a thread (requests slower than usual, a slow database): a queued
  request is served within about that, plus its own time, or refused.

For that the main thread must never wait. gunicorn's threaded worker (27.0.1, pinned) closes
each finished connection on it, waiting up to 2 s for the client to close its side (so that
unread request bytes never turn the close into a reset that would cut the answer off); the
callers of a burst, slow to close, stalled the accepting. Here the same close waits in the
worker's poller instead.
"""

from __future__ import annotations

import errno
import json
import random
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from gunicorn.workers.gthread import TConn, ThreadWorker

# Requests a worker lets wait for one of its threads; beyond, 503 at once. At a worker's
# rate on two busy cores (30 to 100 callbacks a second, docs/benchmarks.md), half a second
# to two seconds of work.
MAX_WAITING = 50
# How long a request may have waited for a thread and still be served.
QUEUE_SECONDS = 2.0
# Retry-After of a refused request, drawn in this range: the callers refused by one burst
# come back spread over seconds, not as the same burst again.
RETRY_AFTER_SECONDS = (2, 8)
OVERLOADED_DETAIL = "The service is busy; retry after the time in Retry-After."
# How long a refused connection may take to send its request: gunicorn's own wait.
REQUEST_SECONDS = 5.0
# How long a closed connection waits for the client to close its side: gunicorn's own.
LINGER_SECONDS = 2.0
# The most a worker's refusals are logged: one WARNING line a minute, with their count.
LOG_EVERY_SECONDS = 60.0

_waited = threading.local()  # how long the request this thread runs waited for it


class QueueTimedPool(ThreadPoolExecutor):
    """A thread pool counting the tasks waiting for a thread (``waiting``), and telling each
    task how long it waited (``waited()``)."""

    def __init__(self, max_workers: int) -> None:
        super().__init__(max_workers=max_workers)
        self.waiting = 0
        self._count = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        queued = time.monotonic()

        def timed() -> Any:
            with self._count:
                self.waiting -= 1
            _waited.seconds = time.monotonic() - queued
            return fn(*args, **kwargs)

        with self._count:
            self.waiting += 1
        return super().submit(timed)


def waited() -> float:
    """Seconds the request this thread runs waited for it (0 outside ``QueueTimedPool``)."""
    return float(getattr(_waited, "seconds", 0.0))


def overloaded(path: str, problem: bytes) -> tuple[list[tuple[str, str]], bytes]:
    """The 503's headers and body: ``problem`` (problem+json) under /api/ and /metrics, as
    the API's other refusals, a line of text elsewhere."""
    if path.startswith(("/api/", "/metrics")):
        body, content_type = problem, "application/problem+json"
    else:
        body, content_type = OVERLOADED_DETAIL.encode() + b"\n", "text/plain; charset=utf-8"
    headers = [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Retry-After", str(random.randint(*RETRY_AFTER_SECONDS))),  # noqa: S311
        ("Cache-Control", "no-store"),
    ]
    return headers, body


def shedding(app: Callable[..., Iterable[bytes]], *, problem: bytes) -> Callable[..., Any]:
    """``app``, except that a request which waited more than ``QUEUE_SECONDS`` for its
    thread is answered 503 without reaching it."""

    def shed_or_serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if waited() <= QUEUE_SECONDS:
            return app(environ, start_response)
        headers, body = overloaded(environ.get("PATH_INFO", ""), problem)
        start_response("503 Service Unavailable", headers)
        return [body]

    return shed_or_serve


class _Conn(TConn):
    """gunicorn's connection, handing its graceful close to the worker's poller."""

    def __init__(self, worker: ShedWorker, *args: Any) -> None:
        super().__init__(*args)
        self.worker = worker

    def close(self, graceful: bool = False) -> None:
        if graceful:
            self.worker.linger(self.sock)
        else:
            super().close()


class ShedWorker(ThreadWorker):
    """gunicorn's threaded worker, refusing at once what it cannot serve in time, and
    closing connections without blocking its main thread."""

    tpool: QueueTimedPool
    wsgi: Callable[..., Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lingering: deque[tuple[float, socket.socket]] = deque()
        # Refused connections count in ``nr_conns`` until closed: past ``worker_connections``
        # the worker stops taking more (they wait in the kernel's queue), as gunicorn's does.
        self.refusing: set[socket.socket] = set()
        self.problem = b""
        self.refused = 0
        self.refusals_logged_at = 0.0

    def get_thread_pool(self) -> QueueTimedPool:
        return QueueTimedPool(max_workers=self.cfg.threads)

    def load_wsgi(self) -> None:
        super().load_wsgi()
        # The app is loaded and Django set up: the API's problem format can be imported.
        from integrations.web.errors import problem_body

        problem = problem_body(status=503, code="overloaded", detail=OVERLOADED_DETAIL)
        self.problem = json.dumps(problem).encode()
        self.wsgi = shedding(self.wsgi, problem=self.problem)

    def accept(self, listener: socket.socket) -> None:
        """gunicorn's, with this module's connection, and a refusal when too many wait."""
        try:
            client, address = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        if self.tpool.waiting >= MAX_WAITING:
            self.refuse(client)
            return
        self.nr_conns += 1
        client.setblocking(True)
        self.enqueue_req(_Conn(self, self.cfg, client, address, listener.getsockname()))

    def refuse(self, client: socket.socket) -> None:
        """Answer 503 on a new connection from this thread, without waiting: once its
        request's first bytes are in (the poller says so), its path is peeked at for the
        body's format, the answer sent, and the rest drained while the connection closes.
        A client that sends nothing within ``REQUEST_SECONDS`` is closed, as gunicorn's."""
        self.nr_conns += 1
        self.refusing.add(client)
        self._when_readable(client, self._answer_refused, within=REQUEST_SECONDS)

    def _answer_refused(self, client: socket.socket) -> None:
        self.poller.unregister(client)
        try:
            head = client.recv(256, socket.MSG_PEEK)
        except OSError:
            head = b""
        parts = head.split(b" ", 2)
        path = parts[1].decode("latin-1") if len(parts) == 3 else ""
        headers, body = overloaded(path, self.problem)
        answer = "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
        answer += "".join(f"{name}: {value}\r\n" for name, value in headers)
        try:
            client.send(answer.encode("latin-1") + b"\r\n" + body)  # fits a new socket's buffer
        except OSError:
            self._close(client)
            return
        self.linger(client)
        self.refused += 1
        now = time.monotonic()
        if now - self.refusals_logged_at >= LOG_EVERY_SECONDS:
            self.log.warning(
                "overloaded: %d requests answered 503 at once (%d were waiting for a thread)",
                self.refused,
                MAX_WAITING,
            )
            self.refused, self.refusals_logged_at = 0, now

    def linger(self, sock: socket.socket) -> None:
        """Close ``sock`` as gunicorn's ``close_graceful`` does (end our side, read what the
        client still sends until it closes its side, at most ``LINGER_SECONDS``), waiting in
        the poller rather than on this thread."""
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(sock)
            return
        self._when_readable(sock, self._drain, within=LINGER_SECONDS)

    def _when_readable(
        self, sock: socket.socket, then: Callable[[socket.socket], None], *, within: float
    ) -> None:
        """``then(sock)`` from the poller once ``sock`` has something to read; closed when
        nothing came ``within`` seconds (``murder_pending``)."""
        try:
            sock.setblocking(False)
            self.poller.register(sock, selectors.EVENT_READ, then)
        except (OSError, ValueError, KeyError):
            self._close(sock)
            return
        self.lingering.append((time.monotonic() + within, sock))

    def _drain(self, sock: socket.socket) -> None:
        try:
            if sock.recv(65536):
                return  # more to read: the poller calls again
        except BlockingIOError:
            return
        except OSError:
            pass
        self.poller.unregister(sock)
        self._close(sock)  # the client closed its side (its entries in ``lingering`` go when due)

    def murder_pending(self) -> None:
        """gunicorn's (connections that sent nothing in time), and the refused connections
        and lingering closes that are due or done."""
        super().murder_pending()
        now = time.monotonic()
        while self.lingering and (self.lingering[0][0] <= now or self.lingering[0][1].fileno() < 0):
            _, sock = self.lingering.popleft()
            if sock.fileno() >= 0:
                self.poller.unregister(sock)
                self._close(sock)

    def _close(self, sock: socket.socket) -> None:
        if sock in self.refusing:
            self.refusing.discard(sock)
            self.nr_conns -= 1
        sock.close()
