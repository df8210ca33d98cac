"""The one outbound HTTP module: every call this process makes (webhooks, ISI, OAuth, SaaS,
DROP, staff alerts) goes through its sessions. SSRF-safe, bounded, and ``deliver`` never raises.

Broker-configured URLs are untrusted input, so every call to a broker goes through ``deliver``::

    result = deliver("POST", integration.url, body=body, headers=headers,
                     allow_private=settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS)
    result.status, result.error, result.duration_ms, result.response_body  # kept per attempt

What it guarantees (docs/contracts.md §6):

- Target addresses are filtered by ``requests-hardened``: the host name is resolved once, the
  address is checked, and the connection is pinned to that address (no DNS rebinding between
  check and connect). On top of its private/loopback/multicast check we refuse reserved,
  link-local, site-local and otherwise non-global addresses, and plain ``http``. All of this
  happens before any connection is opened. ``allow_private=True`` (development and tests:
  ``DROPPORTAL_ALLOW_PRIVATE_TARGETS``) turns the filtering off, for every call alike.
- Redirects are never followed: a 3xx is a failed attempt.
- 5 s to connect, 15 s in all by the wall clock, whatever the peer does: name resolution,
  connecting, the TLS handshake, the response headers and the body all fit in the total
  (``bounded``: a watchdog shuts the call's sockets down when its deadline passes, and name
  resolution is waited for only until then). A caller streaming a large body may
  ``postpone`` the deadline at each read, bounding the body by a stall instead (DROP
  packages). The body is read as a stream and only its
  first 4 KiB are kept (``read_limit`` reads more into ``content`` for a
  caller that needs the whole answer, such as ISI's synchronous identifiers).
- TLS 1.2 or later, certificates verified against one CA store (requests' bundle).
- Network failures come back as ``DeliveryResult.error``, a short message for staff
  (``describe_failure``); ``retry_after_seconds`` reads a peer's ``Retry-After``.

Sessions are cached per ``allow_private`` value so connections are kept alive between calls.
The DROP client sends through the same sessions, each attempt inside ``bounded``.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import email.utils
import functools
import heapq
import http.cookiejar
import ipaddress
import itertools
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import requests
import urllib3
from requests.adapters import HTTPAdapter
from requests.utils import DEFAULT_CA_BUNDLE_PATH
from requests_hardened import Config, HTTPSession
from requests_hardened.ip_filter import InvalidIPAddress
from requests_hardened.ip_filter_adapter import IPFilterAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.util.connection import allowed_gai_family
from urllib3.util.ssl_match_hostname import CertificateError as HostnameMismatch

if TYPE_CHECKING:
    from requests.adapters import _HostParams, _PoolKwargs

RESPONSE_BODY_LIMIT = 4096
USER_AGENT = "dropportal"
# Kept-alive connections per host. requests' default (10) is below the calls a worker has in
# flight to one broker (jobs x dispatch threads): beyond it every call opened a new connection.
POOL_MAXSIZE = 32
# Name lookups waited for at once, across all calls; one that outlives its call's deadline
# is abandoned to finish here (the system resolver gives up by itself).
RESOLVER_THREADS = 16

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class DeliveryResult:
    """What one attempt produced; ``status`` is None when no response came back."""

    url: str
    status: int | None
    duration_ms: int
    response_body: str = ""
    response_headers: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    # The body as read: at most ``read_limit`` + 1 bytes, so a longer body shows as longer.
    content: bytes = b""


def tls_context() -> ssl.SSLContext:
    """A client TLS context: TLS 1.2 or later, certificates and host names verified."""
    context = ssl.create_default_context(cafile=DEFAULT_CA_BUNDLE_PATH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _refusal_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` is not a public target, or None if it is one."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_unspecified or ip.is_reserved:
        return "reserved"
    if ip.is_private or not ip.is_global:
        return "private"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "private"
    return None


# -- the wall-clock bound -------------------------------------------------------------------


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
    """Every request made on this thread inside the block ends by ``timeout_total`` seconds
    from now (sessions of ``build_session``); ``bound.expired`` says whether it was cut."""
    bound = Bound(time.monotonic() + timeout_total)
    previous = getattr(_current, "bound", None)
    _current.bound = bound
    _watchdog.watch(bound)
    try:
        yield bound
    finally:
        _current.bound = previous
        bound.finish()


def _bound() -> Bound | None:
    return cast(Bound | None, getattr(_current, "bound", None))


def _within(bound: Bound, what: str, function: Any, *args: Any) -> Any:
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
        bound = _bound()
        host = self._dns_host
        if bound is not None and not _is_ip(host):
            infos = _within(
                bound,
                f"resolving {host}",
                socket.getaddrinfo,
                host,
                self.port,
                allowed_gai_family(),
                socket.SOCK_STREAM,
            )
            self._dns_host = infos[0][4][0]
        try:
            sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        finally:
            self._dns_host = host
        if bound is not None:
            bound.adopt(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        bound = _bound()
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


class _TLSAdapter(HTTPAdapter):
    """An adapter whose HTTPS connections use ``tls_context()``."""

    def __init__(self, **kwargs: Any) -> None:
        # Also reached from IPFilterAdapter.__init__, which passes no pool arguments.
        kwargs.setdefault("pool_maxsize", POOL_MAXSIZE)
        super().__init__(**kwargs)

    def init_poolmanager(self, *args: Any, **pool_kwargs: Any) -> None:
        pool_kwargs["ssl_context"] = tls_context()
        super().init_poolmanager(*args, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": _BoundedHTTPPool,
            "https": _BoundedHTTPSPool,
        }


class _PublicOnlyAdapter(IPFilterAdapter, _TLSAdapter):
    """requests-hardened's filtering adapter (resolve, check, pin) with a stricter address check.

    The library refuses private, loopback, multicast and a list of special ranges; Python's
    ``is_private`` misses some reserved and site-local IPv6 space (e.g. ``::7f00:1``,
    ``fec0::/10``), so the pinned address is checked again here, still before connecting.
    """

    def __init__(self, *, is_https_proto: bool) -> None:
        IPFilterAdapter.__init__(self, is_https_proto=is_https_proto, allow_loopback=False)

    def build_connection_pool_key_attributes(
        self,
        request: requests.PreparedRequest,
        verify: bool | str,
        cert: str | tuple[str, str] | None = None,
    ) -> tuple[_HostParams, _PoolKwargs]:
        # requests-hardened resolves the name here: waited for within the deadline only.
        bound = _bound()
        attributes = super().build_connection_pool_key_attributes
        if bound is None:
            host_params, pool_kwargs = attributes(request, verify, cert)
        else:
            host = urlsplit(request.url or "").hostname or "?"
            host_params, pool_kwargs = _within(
                bound, f"resolving {host}", attributes, request, verify, cert
            )
        pinned = ipaddress.ip_address(str(host_params["host"]).strip("[]"))
        if _refusal_reason(pinned) is not None:
            raise InvalidIPAddress(pinned)
        return host_params, pool_kwargs


@functools.cache
def build_session(allow_private: bool) -> requests.Session:
    """The shared session for ``allow_private``; reused so connections are kept alive.

    It keeps no per-call state (no cookies, no auth), so worker threads can share it; the
    connection pools underneath are thread-safe.
    """
    session = HTTPSession(
        Config(
            # Filtering is done by the adapters mounted below (requests-hardened's own,
            # subclassed); the flag here would only mount the unsubclassed ones.
            ip_filter_enable=False,
            ip_filter_allow_loopback_ips=False,
            never_redirect=True,
            default_timeout=(5.0, 15.0),
        )
    )
    if allow_private:
        session.mount("https://", _TLSAdapter())
        session.mount("http://", _TLSAdapter())
    else:
        session.mount("https://", _PublicOnlyAdapter(is_https_proto=True))
        session.mount("http://", _PublicOnlyAdapter(is_https_proto=False))
    # No proxies, .netrc or CA bundle from the environment: a proxy would connect on our
    # behalf and defeat the address filter. And no cookies carried between calls.
    session.trust_env = False
    session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    session.headers["User-Agent"] = USER_AGENT
    # The body is recorded as text; asking for no compression keeps it readable.
    session.headers["Accept-Encoding"] = "identity"
    return cast(requests.Session, session)


def retry_after_seconds(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds asked for by a ``Retry-After`` header (delta-seconds or HTTP-date), or None.

    A date in the past means "now" (0); an unreadable value is None. A date without a zone
    (the obsolete asctime form, or "-0000") is GMT, as every HTTP-date is.
    """
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(int(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and everything it wraps (requests and urllib3 nest their errors several deep)."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        wrapped = [current.__cause__, current.__context__, getattr(current, "reason", None)]
        wrapped.extend(current.args)
        pending.extend(item for item in wrapped if isinstance(item, BaseException))


def describe_failure(exc: BaseException, *, timeout_connect: float, timeout_total: float) -> str:
    """A short message for staff about a request that got no response (also used by the
    DROP client): what went wrong, found under the layers requests and urllib3 wrap it in."""
    causes = list(_causes(exc))
    for cause in causes:
        if isinstance(cause, InvalidIPAddress):
            address = cause.args[0] if cause.args else "?"
            reason = "not public"
            if isinstance(address, ipaddress.IPv4Address | ipaddress.IPv6Address):
                reason = _refusal_reason(address) or reason
            return f"target address not allowed: {address} is {reason}"
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return f"connect timed out after {_seconds(timeout_connect)}"
    if isinstance(exc, requests.exceptions.Timeout):
        return f"timed out after {_seconds(timeout_total)}"
    if isinstance(exc, requests.exceptions.InvalidURL | requests.exceptions.MissingSchema):
        return "invalid URL"
    for cause in causes:
        if isinstance(cause, socket.gaierror):
            return "could not resolve host"
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, ConnectionResetError):
            return "connection reset"
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"TLS certificate rejected: {cause.verify_message}"
        if isinstance(cause, HostnameMismatch):  # urllib3 checks the name itself (pinned IP)
            return f"TLS certificate rejected: {cause}"
        if isinstance(cause, ssl.SSLError):
            return f"TLS handshake failed: {cause.reason or cause}"
        if isinstance(cause, socket.timeout):
            return f"timed out after {_seconds(timeout_total)}"
    if isinstance(exc, requests.exceptions.SSLError):
        return "TLS handshake failed"
    if isinstance(exc, requests.exceptions.ConnectionError):
        if any(isinstance(cause, urllib3.exceptions.ProtocolError) for cause in causes):
            return "connection closed without a response"
        return "connection failed"
    return f"request failed: {type(exc).__name__}"


def _scheme_refusal(url: str, *, allow_private: bool) -> str | None:
    try:
        parts = urlsplit(url)
        has_host = bool(parts.hostname)
    except ValueError:
        return "invalid URL"
    if parts.scheme not in ("https", "http") or not has_host:
        return "invalid URL: an absolute https:// URL is required"
    if parts.scheme == "http" and not allow_private:
        return "plain http not allowed: use https"
    if "@" in parts.netloc:
        return "invalid URL: a user name or password in the URL is not allowed"
    return None


def _read_capped(
    response: requests.Response, deadline: float, limit: int = RESPONSE_BODY_LIMIT
) -> bytes:
    """The body, or its first ``limit + 1`` bytes when it is longer.

    Each read waits at most until ``deadline``: ``read1`` issues at most one ``recv`` and the
    socket timeout is set to the time left, so a server trickling bytes cannot stretch the
    overall timeout. Raises ``TimeoutError`` (or urllib3's ``ReadTimeoutError``) when the
    deadline passes first.
    """
    raw = response.raw
    connection = getattr(raw, "connection", None)
    sock: socket.socket | None = getattr(connection, "sock", None)
    received = bytearray()
    while len(received) <= limit:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline passed while reading the response body")
        if sock is not None:
            sock.settimeout(remaining)
        chunk = raw.read1(limit + 1 - len(received))
        if not chunk:
            break
        received += chunk
    return bytes(received)


def deliver(
    method: str,
    url: str,
    *,
    body: bytes,
    headers: Mapping[str, str],
    allow_private: bool,
    timeout_connect: float = 5.0,
    timeout_total: float = 15.0,
    session: requests.Session | None = None,
    read_limit: int = RESPONSE_BODY_LIMIT,
) -> DeliveryResult:
    """Send one request and report what happened; network failures never raise."""
    started = time.monotonic()
    deadline = started + timeout_total

    def elapsed_ms() -> int:
        return round((time.monotonic() - started) * 1000)

    refusal = _scheme_refusal(url, allow_private=allow_private)
    if refusal is not None:
        return DeliveryResult(url=url, status=None, duration_ms=elapsed_ms(), error=refusal)

    session = session or build_session(allow_private)
    # `total` makes the wait for the response headers what is left after connecting.
    timeout = urllib3.Timeout(
        connect=min(timeout_connect, timeout_total), read=timeout_total, total=timeout_total
    )
    timed_out = f"timed out after {_seconds(timeout_total)}"
    with bounded(timeout_total) as bound:
        try:
            response = session.request(
                method,
                url,
                data=body,
                headers=dict(headers),
                timeout=cast(Any, timeout),
                allow_redirects=False,
                stream=True,
            )
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            message = describe_failure(
                exc, timeout_connect=timeout_connect, timeout_total=timeout_total
            )
            if bound.expired and not message.startswith("target address not allowed"):
                message = timed_out
            return DeliveryResult(url=url, status=None, duration_ms=elapsed_ms(), error=message)
        if bound.expired:
            # Cut while the headers were coming: what was parsed of them is not an answer.
            response.close()
            return DeliveryResult(url=url, status=None, duration_ms=elapsed_ms(), error=timed_out)

        error: str | None = None
        received = b""
        try:
            received = _read_capped(response, deadline, max(read_limit, RESPONSE_BODY_LIMIT))
        except (urllib3.exceptions.ReadTimeoutError, TimeoutError):
            error = timed_out
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            error = timed_out if bound.expired else f"response interrupted: {type(exc).__name__}"
        finally:
            # A body read to its end has already gone back to the pool (kept alive); anything
            # else (too long, timed out, broken) closes the connection instead of draining it.
            response.close()

    status = response.status_code
    if error is None and 300 <= status < 400:
        error = f"redirect not followed ({status})"
    return DeliveryResult(
        url=url,
        status=status,
        duration_ms=elapsed_ms(),
        response_body=received[:RESPONSE_BODY_LIMIT].decode("utf-8", errors="replace"),
        response_headers=dict(response.headers),
        error=error,
        content=received,
    )
