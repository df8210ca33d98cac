"""A wall-clock deadline for outbound HTTP calls: whatever the peer does (a name server that
never answers, a handshake or headers trickled a byte at a time), a call made inside
``bounded`` through a ``DeadlineAdapter`` ends by its deadline::

    with bounded(15.0) as bound:
        response = session.get(url, timeout=(5, 15), stream=True)  # adapters: DeadlineAdapter
    bound.expired  # whether the deadline cut the call

Per-read socket timeouts cannot do this: each byte of a trickle arrives within them. So one
watchdog thread shuts down, at its deadline, the sockets a call uses, which ends any read or
handshake waiting on them; and name resolution runs on a resolver thread, waited for only
until the deadline. A body read as a stream may ``postpone`` the deadline at each read,
bounding it by a silence instead of a total.

urllib3 has no public hook on a new socket before its TLS handshake, nor on the name it
resolves, so the connections here override two private parts of ``urllib3.connection.
HTTPConnection``: the method ``_new_conn()`` (opens the socket, called by ``connect()``
before any handshake) and the attribute ``_dns_host`` (the name ``_new_conn`` resolves). They
also set the public ``PoolManager.pool_classes_by_scheme`` and ``ConnectionCls``, and override
``HTTPAdapter.build_connection_pool_key_attributes``, where requests-hardened resolves the
name it filters. ``VERIFIED_WITH`` names the versions this was checked against; the test
``tests/test_outbound_deadline.py`` fails on any other version, and on any change to these
parts, so that an upgrade is checked here first.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import ipaddress
import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.util.connection import allowed_gai_family

if TYPE_CHECKING:
    from requests.adapters import _HostParams, _PoolKwargs

# The versions whose private parts (see the module docstring) this module was checked against.
VERIFIED_WITH = {"requests": "2.34.2", "urllib3": "2.8.0", "requests-hardened": "1.3.0"}
# Name lookups waited for at once, across all calls; one that outlives its call's deadline
# is abandoned to finish here (the system resolver gives up by itself).
RESOLVER_THREADS = 16

_T = TypeVar("_T")


class Bound:
    """One call's deadline. The sockets the call uses are registered (as duplicates of their
    descriptors, so a number reused after close is never touched); when the deadline passes
    first, the watchdog shuts them down, which ends any read or handshake waiting on them."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.expired = False
        self._done = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def postpone(self, seconds: float) -> None:
        """Move the deadline to ``seconds`` from now, earlier or later: a body read as a
        stream calls it for each read, so the bound becomes "no byte for ``seconds``"
        rather than a total (the watchdog looks at the deadline again before it cuts)."""
        self.deadline = time.monotonic() + seconds

    def adopt(self, sock: socket.socket) -> None:
        try:
            duplicate = socket.fromfd(sock.fileno(), sock.family, sock.type, sock.proto)
        except OSError:
            return
        with self._lock:
            kept = not self._done
            if kept:
                self._sockets.append(duplicate)
            expired = self.expired
        if not kept:
            duplicate.close()
        elif expired:  # the deadline passed while it was connecting
            _shut(duplicate)

    def expire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)

    def finish(self) -> None:
        with self._lock:
            self._done = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            sock.close()


def _shut(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _Watchdog:
    """One thread for every call in the process: it expires each ``Bound`` at its deadline."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._heap: list[tuple[float, int, Bound]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, bound: Bound) -> None:
        with self._condition:
            heapq.heappush(self._heap, (bound.deadline, next(self._order), bound))
            # Started on first use, and again in a forked child (threads do not survive fork).
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="outbound-watchdog", daemon=True
                )
                self._thread.start()
            if self._heap[0][2] is bound:  # the earliest now: the thread must wake sooner
                self._condition.notify()

    def _run(self) -> None:
        while True:
            with self._condition:
                while True:
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        _, _, bound = heapq.heappop(self._heap)
                        if bound.deadline <= now:
                            break
                        # Postponed since it was queued: wait for its new deadline.
                        heapq.heappush(self._heap, (bound.deadline, next(self._order), bound))
                        continue
                    self._condition.wait(self._heap[0][0] - now if self._heap else None)
            bound.expire()


_watchdog = _Watchdog()
_current = threading.local()
_resolver = concurrent.futures.ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="resolve")


@contextmanager
def bounded(timeout_total: float) -> Iterator[Bound]:
    """Every request made on this thread inside the block, through a ``DeadlineAdapter``,
    ends by ``timeout_total`` seconds from now; ``bound.expired`` says whether it was cut."""
    bound = Bound(time.monotonic() + timeout_total)
    previous = getattr(_current, "bound", None)
    _current.bound = bound
    _watchdog.watch(bound)
    try:
        yield bound
    finally:
        _current.bound = previous
        bound.finish()


def current_bound() -> Bound | None:
    """The deadline of the ``bounded`` block this thread is in, if any."""
    return cast(Bound | None, getattr(_current, "bound", None))


def within(bound: Bound, what: str, function: Callable[..., _T], *args: Any) -> _T:
    """``function(*args)`` on a resolver thread, waited for until the deadline only."""
    future = _resolver.submit(function, *args)
    try:
        return future.result(timeout=bound.remaining())
    except concurrent.futures.TimeoutError:
        bound.expired = True
        raise requests.exceptions.ConnectTimeout(f"{what}: no answer in time") from None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


class _BoundedConnectionMixin:
    """A urllib3 connection that registers its socket with the thread's ``Bound`` (new or
    reused) and resolves its host name within the deadline."""

    _dns_host: str
    port: int
    sock: socket.socket | None

    def _new_conn(self) -> socket.socket:
        bound = current_bound()
        host = self._dns_host
        if bound is not None and not _is_ip(host):
            infos = within(
                bound,
                f"resolving {host}",
                socket.getaddrinfo,
                host,
                self.port,
                allowed_gai_family(),
                socket.SOCK_STREAM,
            )
            self._dns_host = str(infos[0][4][0])  # urllib3 connects to the address found here
        try:
            sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        finally:
            self._dns_host = host
        if bound is not None:
            bound.adopt(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        bound = current_bound()
        if bound is not None and self.sock is not None:  # a kept-alive connection
            bound.adopt(self.sock)
        super().request(*args, **kwargs)  # type: ignore[misc]


class _BoundedHTTPConnection(_BoundedConnectionMixin, HTTPConnection):
    pass


class _BoundedHTTPSConnection(_BoundedConnectionMixin, HTTPSConnection):
    pass


class _BoundedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _BoundedHTTPConnection


class _BoundedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _BoundedHTTPSConnection


class DeadlineAdapter(HTTPAdapter):
    """A requests adapter whose calls keep the deadline of the ``bounded`` block they are
    made in. Whatever a subclass placed after this one in the method order does while the
    pool key is built (requests-hardened resolves and filters the name there) is waited for
    until the deadline only."""

    def init_poolmanager(self, *args: Any, **pool_kwargs: Any) -> None:
        super().init_poolmanager(*args, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": _BoundedHTTPPool,
            "https": _BoundedHTTPSPool,
        }

    def build_connection_pool_key_attributes(
        self,
        request: requests.PreparedRequest,
        verify: bool | str,
        cert: str | tuple[str, str] | None = None,
    ) -> tuple[_HostParams, _PoolKwargs]:
        bound = current_bound()
        build = super().build_connection_pool_key_attributes
        if bound is None:
            return build(request, verify, cert)
        host = urlsplit(request.url or "").hostname or "?"
        return within(bound, f"resolving {host}", build, request, verify, cert)
