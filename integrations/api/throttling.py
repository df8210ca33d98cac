"""The throttles of the signed endpoints: DRF rate throttles counted in this process's memory.

Both count in the ``CALLBACK_THROTTLE_CACHE`` cache, a local-memory cache: no query and no
shared store on the hot path. With N web processes a client gets at most N times the rate,
which is what the limits are for: stopping a runaway client or a flood, not metering. A rate
``r`` a second allows bursts of ``2r``: at most ``2r`` in any window of ``2r / r`` seconds.

- ``CallbackKeyThrottle``: ``DROPPORTAL_CALLBACK_RATE_LIMIT`` callbacks a second per API key
  (DRF runs it after authentication and permissions: 429 ``rate_limited``).
- ``UnauthenticatedAddressThrottle``: ``DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT`` refusals a
  second per client address (an IPv6 address by its /64). Only a refusal without a valid
  key costs a token (``take``); an address without one is refused before anything else is
  read, key or no key::

    throttle = UnauthenticatedAddressThrottle()
    if not throttle.allow_request(request, view):
        raise AddressThrottled(wait=throttle.wait())    # 429 with Retry-After
    ...
    UnauthenticatedAddressThrottle().take(request, view)    # after refusing it

A rate of 0 turns a throttle off.
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.http import HttpRequest
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from integrations.api.errors import Problem
from integrations.client_address import client_network
from integrations.models import ApiKey


def throttle_address(request: HttpRequest | Request) -> str:
    """The address a throttle counts: the client's, an IPv6 address by its /64 (the same
    grouping as the staff login's lockout)."""
    return client_network(request) or "unknown"


class _PerSecondThrottle(SimpleRateThrottle):
    """A ``SimpleRateThrottle`` whose rate is a number a second read from ``rate_setting``."""

    rate_setting = ""
    num_requests: int | None  # set by SimpleRateThrottle from parse_rate
    duration: int | None

    def __init__(self) -> None:
        super().__init__()
        self.cache = caches[settings.CALLBACK_THROTTLE_CACHE]

    def get_rate(self) -> str | None:
        rate = float(getattr(settings, self.rate_setting, 0))
        return str(rate) if rate > 0 else None

    def parse_rate(self, rate: str | None) -> tuple[int | None, int | None]:
        if rate is None:
            return None, None
        per_second = float(rate)
        burst = max(1, math.ceil(2 * per_second))
        return burst, max(1, round(burst / per_second))


class CallbackKeyThrottle(_PerSecondThrottle):
    """Callbacks a second per API key (``DROPPORTAL_CALLBACK_RATE_LIMIT``)."""

    scope = "callback-key"
    rate_setting = "DROPPORTAL_CALLBACK_RATE_LIMIT"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        api_key = request.auth
        if not isinstance(api_key, ApiKey):
            return None
        return self.cache_format % {"scope": self.scope, "ident": api_key.prefix}

    def wait(self) -> float:
        return max(1.0, super().wait() or 0.0)  # DRF's Retry-After: at least a second


class UnauthenticatedAddressThrottle(_PerSecondThrottle):
    """Refused callbacks without a valid key a second per client address
    (``DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT``). Asking costs nothing; ``take`` spends."""

    scope = "callback-address"
    rate_setting = "DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        return self.cache_format % {"scope": self.scope, "ident": throttle_address(request)}

    def throttle_success(self) -> bool:
        return True  # a request let through costs its address nothing

    def take(self, request: Request, view: Any) -> None:
        """A token of ``request``'s address, for a refusal without a valid key."""
        if self.rate is None:
            return
        self.allow_request(request, view)  # reads the address's recent refusals
        assert self.key is not None and self.duration is not None
        self.history.insert(0, self.now)
        self.cache.set(self.key, self.history, self.duration)


class AddressThrottled(Problem):
    """429 for an address out of tokens; ``Retry-After`` says when it has one again."""

    def __init__(self, *, wait: float, detail: str) -> None:
        super().__init__(
            status=429,
            code="rate_limited",
            detail=detail,
            headers={"Retry-After": str(max(1, round(wait + 0.5)))},
        )
