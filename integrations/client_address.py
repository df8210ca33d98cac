"""The client's address, as the staff login lockout and the callbacks' throttle count it::

client_address(request)  # "203.0.113.7"; None when the server gave none
is_loopback_host("::1")  # True: this machine only
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest
from rest_framework.request import Request


def client_address(request: HttpRequest | Request) -> str | None:
    """The peer, or behind the opt-in TLS proxy (``DROPPORTAL_BEHIND_TLS_PROXY``), the address
    that proxy appended last to X-Forwarded-For (earlier entries are the client's own claim)."""
    if settings.DROPPORTAL_BEHIND_TLS_PROXY:
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        last = forwarded.split(",")[-1].strip()
        if last:
            return last
    address = request.META.get("REMOTE_ADDR")
    return str(address) if address else None


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
