"""The throttles of the signed endpoints and of the staff's sign-in through the identity
provider: DRF rate throttles counted in this process's memory.

They count in local-memory caches (``CALLBACK_THROTTLE_CACHE``; the sign-ins' in
``SIGN_IN_THROTTLE_CACHE``): no query and no shared store on the hot path. With N web
processes a client gets at most N times the rate, which is what the limits are for: stopping
a runaway client or a flood, not metering. A full bucket holds ``burst_seconds`` of the rate
(a token bucket: bursts of ``2r`` for a rate ``r`` a second).

- ``CallbackKeyThrottle``: ``DROPPORTAL_CALLBACK_RATE_LIMIT`` callbacks a second per API key
  (DRF runs it after authentication and permissions: 429 ``rate_limited``).
- ``UnauthenticatedAddressThrottle``: ``DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT`` refusals a
  second per client address (an IPv6 address by its /64). Only a refusal without a valid
  key costs a token (``take``); DROP's notifications, which carry no key, spend one each,
  accepted or refused. An address without one is refused before anything else is read, key
  or no key::

    throttle = UnauthenticatedAddressThrottle()
    if not throttle.allow_request(request, view):
        raise AddressThrottled(wait=throttle.wait(), detail="...")  # 429, Retry-After
    ...
    UnauthenticatedAddressThrottle().take(request, view)    # after refusing it

- ``OidcSignInThrottle``: ``DROPPORTAL_OIDC_SIGN_IN_RATE_LIMIT`` refused sign-ins through
  the identity provider a minute per client address, bursts of as many. The same rule: a
  refusal the ledger records spends a token (``take``), and an address without one may not
  start a sign-in (429). Starting one spends nothing, so a page that makes browsers start
  sign-ins (a plain GET) cannot shut staff out.

A rate of 0 turns a throttle off.
"""

from __future__ import annotations

import math
import time
from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.http import HttpRequest
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from integrations.client_address import client_network
from integrations.models import ApiKey
from integrations.web.errors import Problem


def throttle_address(request: HttpRequest | Request) -> str:
    """The address a throttle counts: the client's, an IPv6 address by its /64 (the same
    grouping as the staff login's lockout)."""
    return client_network(request) or "unknown"


class _PerSecondThrottle(SimpleRateThrottle):
    """A ``SimpleRateThrottle`` (its cache keys, its cache) counted as a token bucket: a
    rate ``r`` a second from ``rate_setting`` sustained, bursts of ``burst_seconds * r``.

    A key's bucket is one ``(tokens, at)`` pair whatever the rate: the timestamps
    ``SimpleRateThrottle`` keeps would be ``2r`` of them a key, read and written on every
    callback (the callbacks bench runs with a rate of a million).
    """

    rate_setting = ""
    burst_seconds = 2  # a full bucket holds this many seconds of the rate
    cache_setting = "CALLBACK_THROTTLE_CACHE"  # the name of the setting naming its cache
    timer = staticmethod(time.monotonic)  # per process: a clock that never jumps
    num_requests: int | None  # set by SimpleRateThrottle from parse_rate
    duration: int | None

    def __init__(self) -> None:
        super().__init__()
        self.cache = caches[getattr(settings, self.cache_setting)]
        self.per_second = float(self.rate) if self.rate is not None else 0.0
        self.tokens = 0.0

    def get_rate(self) -> str | None:
        rate = float(getattr(settings, self.rate_setting, 0))
        return str(rate) if rate > 0 else None

    def parse_rate(self, rate: str | None) -> tuple[int | None, int | None]:
        """The burst, and the seconds an empty bucket takes to fill (``burst_seconds``)."""
        if rate is None:
            return None, None
        return max(1, math.floor(self.burst_seconds * float(rate))), self.burst_seconds

    def allow_request(self, request: Request, view: Any) -> bool:
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        self.now = self.timer()
        # Rounded: 60 s of 123 a minute is 123 tokens, not 122.99999999999999.
        capacity = round(self.burst_seconds * self.per_second, 9)
        tokens, at = self.cache.get(self.key, (capacity, self.now))
        self.tokens = min(capacity, tokens + (self.now - at) * self.per_second)
        return self.throttle_success() if self.tokens >= 1 else self.throttle_failure()

    def throttle_success(self) -> bool:
        self._tokens_keep(self.tokens - 1)
        return True

    def wait(self) -> float:
        return max(0.0, 1 - self.tokens) / self.per_second if self.per_second else 0.0

    def _tokens_keep(self, tokens: float) -> None:
        # Gone after the time a bucket takes to fill: it is full by then anyway.
        self.cache.set(self.key, (tokens, self.now), self.duration)


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
        """A token of ``request``'s address, for a refusal without a valid key (or for any
        DROP notification)."""
        if self.rate is None:
            return
        self.allow_request(request, view)  # the address's tokens now
        self._tokens_keep(max(0.0, self.tokens - 1))


class OidcSignInThrottle(UnauthenticatedAddressThrottle):
    """Refused staff sign-ins through the identity provider a minute per client address
    (``DROPPORTAL_OIDC_SIGN_IN_RATE_LIMIT``), bursts of as many: asked before a sign-in
    starts, spent (``take``) by each refusal the ledger records."""

    scope = "oidc-sign-in-address"
    rate_setting = "DROPPORTAL_OIDC_SIGN_IN_RATE_LIMIT"
    burst_seconds = 60  # a minute's worth
    cache_setting = "SIGN_IN_THROTTLE_CACHE"

    def get_rate(self) -> str | None:
        a_minute = super().get_rate()
        return str(float(a_minute) / 60) if a_minute is not None else None


class AddressThrottled(Problem):
    """429 for an address out of tokens; ``Retry-After`` says when it has one again."""

    def __init__(self, *, wait: float, detail: str) -> None:
        super().__init__(
            status=429,
            code="rate_limited",
            detail=detail,
            headers={"Retry-After": str(max(1, round(wait + 0.5)))},
        )
