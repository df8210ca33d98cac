"""The one outbound HTTP module: every call this process makes (webhooks, ISI, OAuth, SaaS,
DROP, staff alerts) goes through its sessions. SSRF-safe, bounded, and ``deliver`` never raises.

Broker-configured URLs are untrusted input, so every call to a broker goes through ``deliver``::

    result = deliver("POST", integration.url, body=body, headers=headers,
                     allow_private=settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS)
    result.status, result.error, result.duration_ms, result.response_body  # kept per attempt

What it guarantees (docs/contracts.md §6):

- Only the URLs ``target_urls`` allows are called: absolute https, no user:password part.
- Target addresses are filtered by ``requests-hardened``: the host name is resolved once, the
  address is checked, and the connection is pinned to that address (no DNS rebinding between
  check and connect). On top of its private/loopback/multicast check we refuse reserved,
  link-local, site-local and otherwise non-global addresses, and IPv6 addresses that lead to
  such an IPv4 address (IPv4-mapped or -compatible, 6to4, Teredo, NAT64). All of this
  happens before any connection is opened. ``allow_private=True`` (development and tests:
  ``DROPPORTAL_ALLOW_PRIVATE_TARGETS``) turns the filtering off, for every call alike.
- Redirects are never followed: a 3xx is a failed attempt.
- ``CONNECT_TIMEOUT`` (5 s) to connect, ``TOTAL_TIMEOUT`` (15 s) in all by the wall clock,
  whatever the peer does: name resolution, connecting, the TLS handshake, the response
  headers and the body all fit in the total (``outbound_deadline``). The body is read as a
  stream and only its first 4 KiB are kept, as text PostgreSQL can store (``storable_text``:
  a NUL byte becomes U+FFFD, as undecodable bytes do); ``read_limit`` reads more into
  ``content`` for a caller that needs the whole answer, such as ISI's synchronous identifiers.
- TLS 1.2 or later, certificates verified against one CA store (requests' bundle).
- Network failures come back as ``DeliveryResult.error``, a short message for staff
  (``describe_failure``); ``retry_after_seconds`` reads a peer's ``Retry-After``.

Sessions are cached per ``allow_private`` value so connections are kept alive between calls.
The DROP client sends through the same sessions, each attempt inside
``outbound_deadline.bounded`` (a package's body bounded by a stall instead: ``postpone``).
"""

from __future__ import annotations

import datetime
import email.utils
import functools
import http.cookiejar
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import requests
import urllib3
from requests.utils import DEFAULT_CA_BUNDLE_PATH
from requests_hardened import Config, HTTPSession
from requests_hardened.ip_filter import InvalidIPAddress
from requests_hardened.ip_filter_adapter import IPFilterAdapter
from urllib3.util.ssl_match_hostname import CertificateError as HostnameMismatch

from integrations.ascii_integers import ascii_integer
from integrations.outbound_deadline import DeadlineAdapter, bounded
from integrations.storable_text import storable
from integrations.target_urls import TargetUrlProblem, target_url_problem

if TYPE_CHECKING:
    from requests.adapters import _HostParams, _PoolKwargs

# The time bounds of every call but DROP's (whose are ``drop.transport.DropLimits``): to
# connect, and in all by the wall clock. Read at each call, so tests can shorten them.
CONNECT_TIMEOUT = 5.0
TOTAL_TIMEOUT = 15.0
RESPONSE_BODY_LIMIT = 4096
# The longest wait a Retry-After is read as (a year); callers bound it further.
RETRY_AFTER_LONGEST = 365 * 24 * 3600
USER_AGENT = "dropportal"
# Kept-alive connections per host. requests' default (10) is below the calls a worker has in
# flight to one broker (jobs x dispatch threads): beyond it every call opened a new connection.
POOL_MAXSIZE = 32

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
    # What was taken out of ``response_body`` (``dispatch.transport.answer_redacted``): it is
    # redacted again from ``content``, so each later redaction takes these out too.
    redacted: tuple[str, ...] = field(default=(), repr=False)


def tls_context() -> ssl.SSLContext:
    """A client TLS context: TLS 1.2 or later, certificates and host names verified."""
    context = ssl.create_default_context(cafile=DEFAULT_CA_BUNDLE_PATH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


# IPv6 prefixes that carry an IPv4 address in their last 32 bits and reach it through a
# translator: NAT64's well-known and local-use prefixes (RFC 6052, RFC 8215).
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one leads to, if any: IPv4-mapped (``::ffff:a.b.c.d``),
    IPv4-compatible (``::a.b.c.d``), 6to4 (``2002::/16``), Teredo's client (``2001::/32``)
    or NAT64 (``64:ff9b::/96``, ``64:ff9b:1::/48``)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if any(ip in network for network in _NAT64) or (
        ip in _IPV4_COMPATIBLE and int(ip) > 1  # not :: nor ::1, judged as IPv6 below
    ):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def ip_refusal_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` is not a public target, or None if it is one. An IPv6 address that leads
    to an IPv4 one (mapped, compatible, 6to4, Teredo, NAT64) is refused for what that IPv4
    address is, then judged as IPv6 too."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            reason = _own_refusal_reason(embedded)
            if ip.ipv4_mapped is not None:
                return reason
            if reason is not None:
                return f"{reason} (it leads to {embedded})"
    return _own_refusal_reason(ip)


def _own_refusal_reason(ip: IPAddress) -> str | None:
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


class _Adapter(DeadlineAdapter):
    """Our TLS context and pool size on the deadline's connections."""

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        pool_kwargs["ssl_context"] = tls_context()
        super().init_poolmanager(connections, POOL_MAXSIZE, block, **pool_kwargs)


class _PublicOnlyAdapter(_Adapter, IPFilterAdapter):
    """requests-hardened's filtering adapter (resolve, check, pin), its name resolution within
    the deadline (``DeadlineAdapter`` comes first in the method order), and a stricter check.

    The library refuses private, loopback, multicast and a list of special ranges; Python's
    ``is_private`` misses some reserved and site-local IPv6 space (e.g. ``fec0::/10``) and
    the IPv4 address a 6to4 one leads to (``2002:7f00:1::``: 127.0.0.1), so the pinned
    address is checked again here (``ip_refusal_reason``), still before connecting.
    """

    def __init__(self, *, is_https_proto: bool, allow_loopback: bool) -> None:
        IPFilterAdapter.__init__(self, is_https_proto=is_https_proto, allow_loopback=allow_loopback)

    def build_connection_pool_key_attributes(
        self,
        request: requests.PreparedRequest,
        verify: bool | str,
        cert: str | tuple[str, str] | None = None,
    ) -> tuple[_HostParams, _PoolKwargs]:
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(
            request, verify, cert
        )
        pinned = ipaddress.ip_address(str(host_params["host"]).strip("[]"))
        if ip_refusal_reason(pinned) is not None:
            raise InvalidIPAddress(pinned)
        return host_params, pool_kwargs


# The first callers of ``build_session`` are often a worker's dispatch threads, started
# together: without the lock each of them missed the cache and built a session of its own,
# its TLS contexts loading the CA bundle (tens of milliseconds of CPU each).
_session_building = threading.Lock()


def build_session(allow_private: bool) -> requests.Session:
    """The shared session for ``allow_private``; reused so connections are kept alive.

    It keeps no per-call state (no cookies, no auth), so worker threads can share it; the
    connection pools underneath are thread-safe.
    """
    with _session_building:
        return _session(allow_private)


@functools.cache
def _session(allow_private: bool) -> requests.Session:
    config = Config(
        ip_filter_enable=not allow_private,  # DROPPORTAL_ALLOW_PRIVATE_TARGETS turns it off
        ip_filter_allow_loopback_ips=False,
        never_redirect=True,
        default_timeout=(CONNECT_TIMEOUT, TOTAL_TIMEOUT),
    )
    session = HTTPSession(config)
    # Ours take the place of the adapters requests-hardened mounted: its same filter, with
    # the same settings, under the deadline and our TLS context.
    for scheme, is_https in (("https://", True), ("http://", False)):
        if config.ip_filter_enable:
            allow_loopback = config.ip_filter_allow_loopback_ips
            adapter: _Adapter = _PublicOnlyAdapter(
                is_https_proto=is_https, allow_loopback=allow_loopback
            )
        else:
            adapter = _Adapter()
        session.mount(scheme, adapter)
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
    seconds = ascii_integer(value)
    if seconds is not None:
        # Read on the sending threads: float() of 400 digits raises (OverflowError).
        return float(min(seconds, RETRY_AFTER_LONGEST))
    if value.isascii() and value.isdigit():  # more digits than int() reads
        return float(RETRY_AFTER_LONGEST)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):  # Overflow: a huge field
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
                reason = ip_refusal_reason(address) or reason
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


# What a call refused by ``target_urls`` reports, as an attempt's error.
_URL_REFUSALS = {
    TargetUrlProblem.UNREADABLE: "invalid URL",
    TargetUrlProblem.NOT_ABSOLUTE: "invalid URL: an absolute https:// URL is required",
    TargetUrlProblem.PLAIN_HTTP: "plain http not allowed: use https",
    TargetUrlProblem.CREDENTIALS: "invalid URL: a user name or password in the URL is not allowed",
}


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


def _unsendable_header(headers: Mapping[str, str]) -> str | None:
    """The name of a header whose value http.client cannot encode (it sends Latin-1)."""
    for name, value in headers.items():
        try:
            value.encode("latin-1")
        except UnicodeEncodeError:
            return name
    return None


def deliver(
    method: str,
    url: str,
    *,
    body: bytes,
    headers: Mapping[str, str],
    allow_private: bool,
    timeout_connect: float | None = None,
    timeout_total: float | None = None,
    session: requests.Session | None = None,
    read_limit: int = RESPONSE_BODY_LIMIT,
) -> DeliveryResult:
    """Send one request and report what happened; network failures never raise. The time
    bounds are ``CONNECT_TIMEOUT`` and ``TOTAL_TIMEOUT`` unless given."""
    timeout_connect = CONNECT_TIMEOUT if timeout_connect is None else timeout_connect
    timeout_total = TOTAL_TIMEOUT if timeout_total is None else timeout_total
    started = time.monotonic()
    deadline = started + timeout_total

    def elapsed_ms() -> int:
        return round((time.monotonic() - started) * 1000)

    problem = target_url_problem(url, allow_private=allow_private)
    if problem is not None:
        refusal = _URL_REFUSALS[problem]
        return DeliveryResult(url=url, status=None, duration_ms=elapsed_ms(), error=refusal)

    unsendable = _unsendable_header(headers)
    if unsendable is not None:
        # http.client raises on it (UnicodeEncodeError), out of every caller's batch. The
        # value is not named: it is often a credential.
        refusal = f"the {unsendable} header holds a character HTTP cannot carry"
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
            # Storable: a certificate's names (a mismatched host) are the peer's text.
            message = storable(
                describe_failure(exc, timeout_connect=timeout_connect, timeout_total=timeout_total)
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
        # Kept with the attempt: an answer holding a NUL byte is no reason to lose the batch.
        response_body=storable(received[:RESPONSE_BODY_LIMIT].decode("utf-8", errors="replace")),
        response_headers=dict(response.headers),
        error=error,
        content=received,
    )
