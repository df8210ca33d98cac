"""The one outbound HTTP path for webhooks, ISI and SaaS calls: SSRF-safe, bounded, never raising.

Broker-configured URLs are untrusted input, so every call goes through ``deliver``::

    result = deliver("POST", integration.url, body=body, headers=headers,
                     allow_private=settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS)
    result.status, result.error, result.duration_ms, result.response_body  # kept per attempt

What it guarantees (product.md section 3):

- Target addresses are filtered by ``requests-hardened``: the host name is resolved once, the
  address is checked, and the connection is pinned to that address (no DNS rebinding between
  check and connect). On top of its private/loopback/multicast check we refuse reserved,
  link-local, site-local and otherwise non-global addresses, and plain ``http``. All of this
  happens before any connection is opened. ``allow_private=True`` (development and tests) turns
  the filtering off.
- Redirects are never followed: a 3xx is a failed attempt.
- 5 s to connect, 15 s in all, reading the response body included; the body is read as a
  stream and only its first 4 KiB are kept (``read_limit`` reads more into ``content`` for a
  caller that needs the whole answer, such as ISI's synchronous identifiers).
- TLS 1.2 or later, certificates verified.
- Network failures come back as ``DeliveryResult.error``, a short message for staff.

Sessions are cached per ``allow_private`` value so connections are kept alive between calls.
"""

from __future__ import annotations

import functools
import http.cookiejar
import ipaddress
import socket
import ssl
import time
from collections.abc import Iterator, Mapping
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
from urllib3.util.ssl_match_hostname import CertificateError as HostnameMismatch

if TYPE_CHECKING:
    from requests.adapters import _HostParams, _PoolKwargs

RESPONSE_BODY_LIMIT = 4096
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


class _TLSAdapter(HTTPAdapter):
    """An adapter whose HTTPS connections use ``tls_context()``."""

    def __init__(self, **kwargs: Any) -> None:
        # Also reached from IPFilterAdapter.__init__, which passes no pool arguments.
        kwargs.setdefault("pool_maxsize", POOL_MAXSIZE)
        super().__init__(**kwargs)

    def init_poolmanager(self, *args: Any, **pool_kwargs: Any) -> None:
        pool_kwargs["ssl_context"] = tls_context()
        super().init_poolmanager(*args, **pool_kwargs)


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
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(
            request, verify, cert
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
        return DeliveryResult(url=url, status=None, duration_ms=elapsed_ms(), error=message)

    error: str | None = None
    received = b""
    try:
        received = _read_capped(response, deadline, max(read_limit, RESPONSE_BODY_LIMIT))
    except (urllib3.exceptions.ReadTimeoutError, TimeoutError):
        error = f"timed out after {_seconds(timeout_total)}"
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        error = f"response interrupted: {type(exc).__name__}"
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
