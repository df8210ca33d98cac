"""The client's address, as the staff login lockout and the callbacks' throttle count it::

client_address(request)  # "203.0.113.7"; None when the server gave none
client_network(request)  # the same, but an IPv6 client by its /64: "2001:db8:1:2::/64"
proxy_setting_missing(request)  # a proxy in front, DROPPORTAL_BEHIND_TLS_PROXY off
is_loopback_host("::1")  # True: this machine only

Without ``DROPPORTAL_BEHIND_TLS_PROXY`` behind a proxy, every client is the proxy's loopback
address: one lockout and one throttle for the whole internet. A request that arrives from
loopback with ``X-Forwarded-For`` says so; the first one logs a WARNING (once per process) and
the dashboard shows a notice while it lasts.
"""

from __future__ import annotations

import ipaddress
import logging
from functools import cache, lru_cache

from django.conf import settings
from django.http import HttpRequest
from rest_framework.request import Request

logger = logging.getLogger(__name__)


def client_address(request: HttpRequest | Request) -> str | None:
    """The peer, or behind the opt-in TLS proxy (``DROPPORTAL_BEHIND_TLS_PROXY``), the address
    that proxy appended last to X-Forwarded-For (earlier entries are the client's own claim)."""
    if settings.DROPPORTAL_BEHIND_TLS_PROXY:
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        last = forwarded.split(",")[-1].strip()
        if last:
            return last
    elif proxy_setting_missing(request):
        _warn_proxy_setting_missing()
    address = request.META.get("REMOTE_ADDR")
    return str(address) if address else None


def client_network(request: HttpRequest | Request) -> str | None:
    """``client_address``, an IPv6 address by its /64 (one client holds a whole /64 and may
    rotate through it) and an IPv4-mapped one as IPv4."""
    address = client_address(request)
    if address is None:
        return None
    # Longer than any address's text (an IPv4-mapped IPv6 one is 45): not worth remembering.
    return _network(address) if len(address) <= 45 else _parsed_network(address)


@lru_cache(maxsize=4096)
def _network(address: str) -> str:
    """``_parsed_network``, remembered (bounded): every callback's throttle asks it, and
    parsing an address costs more than looking it up."""
    return _parsed_network(address)


def _parsed_network(address: str) -> str:
    """``address``'s network as ``client_network`` counts it (itself when it is no address)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def proxy_setting_missing(request: HttpRequest | Request) -> bool:
    """A proxy on this machine forwards the request (``X-Forwarded-For`` from loopback) but
    ``DROPPORTAL_BEHIND_TLS_PROXY`` is off: every client would look like the proxy."""
    if settings.DROPPORTAL_BEHIND_TLS_PROXY or not request.META.get("HTTP_X_FORWARDED_FOR"):
        return False
    return is_loopback_host(str(request.META.get("REMOTE_ADDR") or ""))


@cache
def _warn_proxy_setting_missing() -> None:
    logger.warning(
        "requests arrive from a proxy on this machine (X-Forwarded-For from loopback) but "
        "DROPPORTAL_BEHIND_TLS_PROXY is off: every client counts as the proxy's address, so "
        "one client's wrong passwords lock staff out for everyone; set "
        "DROPPORTAL_BEHIND_TLS_PROXY=true"
    )


_LOOPBACK_NAMES = {"localhost", "localhost.localdomain"}


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an address) can only be this machine."""
    name = host.lower()
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
