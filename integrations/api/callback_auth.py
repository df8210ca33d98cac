"""What every signed callback from a broker goes through (deletion, resolution, ISI).

A callback view subclasses ``SignedCallbackView``; correlating the body with the request it
answers is the view's job, because only then is the secret known (the Webhook Secret of the
integration that sent the dispatch). A view answering a deletion request names the kind of
integration that dispatched it and where its body refers to it; the request is then found
in the same query as the API key (``services.keys.api_key_lookup``)::

    class DeletionCallbackView(SignedCallbackView):
        callback = "deletion"
        integration_kind = IntegrationKind.WEBHOOK

        def correlation(self, payload):
            return ...payload's request_uuid if it is a UUID, else None...

        def put(self, request):
            payload = self.json_object(request)                   # 400 unless a JSON object
            ...400 without a correlation...
            found = self.deletion_request                         # 404 when None
            self.subject = str(found.request_uuid)
            self.verify_signature(request, found.integration)     # 401
            ...validate, call the service, render...

The order of checks, each with its status and ``code`` (docs/contracts.md §5.1):

0. the client address refused too many unauthenticated callbacks lately: 429
   ``rate_limited`` with ``Retry-After``, at once, key or no key: before any key is looked
   up or any byte of the body read, so a flood with made-up keys costs no query;
1. body over 64 KiB: 413 ``payload_too_large`` (refused before anything else, unread);
2. API key missing, unknown or revoked: 401 ``authentication_failed``;
3. key without ``webhook_callback``: 403 ``scope_missing``;
4. more than the key's rate: 429 ``rate_limited`` with ``Retry-After``;
5. signature headers missing: 401 ``signature_invalid``;
6. body not a JSON object: 400 ``validation_failed``; no such request of this broker: 404;
7. signature wrong (current secret, or the previous one within 24 h of a rotation):
   401 ``signature_invalid``; timestamp more than 5 minutes off: 401 ``timestamp_out_of_range``.

A rejection of a request with a valid API key is a ledger event (``callback.rejected``:
which callback, status, code, the key's prefix, the request if known; never the body, a
secret or an identifier). A rejection without one (no key, an unknown or revoked key, a
body refused before the key was read, an address throttled) writes nothing: anyone can send
those, and the ledger is append-only. They are counted (``UNAUTHENTICATED``), logged at
most once a minute per process with the count, and each costs its client address a token
of ``DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT`` (per address, or per /64 for IPv6); a
request with a valid key never costs one. The address is the peer's, or the one the opt-in
TLS proxy forwards: behind a reverse proxy without ``DROPPORTAL_BEHIND_TLS_PROXY`` every
client shares the proxy's, and a flood of bad keys then throttles the brokers' callbacks too
(they are answered 429 with ``Retry-After`` and retried).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from integrations.api.authentication import ApiKeyAuthentication
from integrations.api.errors import Problem
from integrations.api.json_body import json_body
from integrations.api.permissions import HasScope
from integrations.client_address import client_network
from integrations.dispatch import signing
from integrations.ledger_kinds import LedgerKind
from integrations.models import ApiKey, ApiKeyScope, DeletionRequest, Integration, IntegrationKind
from integrations.services.integrations import integration_callback_secrets
from integrations.services.keys import api_key_authenticate, api_key_lookup
from integrations.services.ledger import ledger_event_append

log = logging.getLogger(__name__)

CALLBACK_BODY_LIMIT = 64 * 1024
# A flood from many addresses must not grow the table of buckets without bound: past this,
# the buckets that are full again (their address quiet) are dropped.
ADDRESS_BUCKETS_MAX = 100_000
LOG_EVERY_SECONDS = 60.0


class CallbackRateThrottle(BaseThrottle):
    """A token bucket per API key, per web process: ``DROPPORTAL_CALLBACK_RATE_LIMIT``
    callbacks a second sustained, bursts of twice that. 0 turns it off.

    In memory on purpose: it costs no query on the hot path. With N web processes a key
    gets at most N times the rate, which is what the limit is for: stopping a runaway
    client, not metering.
    """

    _buckets: dict[str, tuple[float, float]] = {}  # key prefix -> (tokens, at)
    _lock = threading.Lock()

    def __init__(self) -> None:
        self._wait = 0.0

    def allow_request(self, request: Request, view: Any) -> bool:
        rate = float(getattr(settings, "DROPPORTAL_CALLBACK_RATE_LIMIT", 0))
        api_key = request.auth
        if rate <= 0 or not isinstance(api_key, ApiKey):
            return True
        capacity = 2 * rate
        now = time.monotonic()
        with self._lock:
            tokens, at = self._buckets.get(api_key.prefix, (capacity, now))
            tokens = min(capacity, tokens + (now - at) * rate)
            if tokens >= 1:
                self._buckets[api_key.prefix] = (tokens - 1, now)
                return True
            self._buckets[api_key.prefix] = (tokens, now)
        self._wait = (1 - tokens) / rate
        return False

    def wait(self) -> float:
        return max(1.0, self._wait)


class _AddressBuckets:
    """Token buckets per client address for rejected unauthenticated callbacks: each such
    rejection takes a token; an address without one is refused at once (429). Requests with
    a valid key never take one, so a broker is throttled only by its key's own rate."""

    def __init__(self) -> None:
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, at)
        self._lock = threading.Lock()

    @staticmethod
    def rate() -> float:
        return float(getattr(settings, "DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT", 0))

    def wait(self, address: str) -> float:
        """Seconds until ``address`` may try again; 0 when it may now."""
        rate = self.rate()
        if rate <= 0:
            return 0.0
        with self._lock:
            tokens = self._tokens(address, rate, time.monotonic())
        return 0.0 if tokens >= 1 else (1 - tokens) / rate

    def take(self, address: str) -> None:
        rate = self.rate()
        if rate <= 0:
            return
        now = time.monotonic()
        with self._lock:
            tokens = self._tokens(address, rate, now)
            if len(self._buckets) >= ADDRESS_BUCKETS_MAX and address not in self._buckets:
                self._prune(rate, now)
            self._buckets[address] = (max(0.0, tokens - 1), now)

    def _tokens(self, address: str, rate: float, now: float) -> float:
        capacity = 2 * rate
        tokens, at = self._buckets.get(address, (capacity, now))
        return min(capacity, tokens + (now - at) * rate)

    def _prune(self, rate: float, now: float) -> None:
        capacity = 2 * rate
        self._buckets = {
            address: (tokens, at)
            for address, (tokens, at) in self._buckets.items()
            if tokens + (now - at) * rate < capacity
        }

    def clear(self) -> None:
        with self._lock:
            self._buckets.clear()


class _Rejections:
    """How many unauthenticated callbacks this process refused; logged once a minute."""

    def __init__(self) -> None:
        self.count = 0
        self._unlogged = 0
        self._logged_at = float("-inf")
        self._lock = threading.Lock()

    def add(self, *, address: str, status: int, code: str) -> None:
        now = time.monotonic()
        with self._lock:
            self.count += 1
            self._unlogged += 1
            if now - self._logged_at < LOG_EVERY_SECONDS:
                return
            unlogged, self._unlogged, self._logged_at = self._unlogged, 0, now
        log.warning(
            "refused %d unauthenticated callback(s) since the last such line "
            "(%d in all); the latest from %s: %s %s",
            unlogged,
            self.count,
            address,
            status,
            code,
        )


ADDRESS_BUCKETS = _AddressBuckets()
UNAUTHENTICATED = _Rejections()


def throttle_address(request: HttpRequest | Request) -> str:
    """The address a throttle counts: the client's, an IPv6 address by its /64 (the same
    grouping as the staff login's lockout)."""
    return client_network(request) or "unknown"


class SignedCallbackView(APIView):
    """The shared checks of a broker callback; subclasses set ``callback`` and ``subject``."""

    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [HasScope]
    throttle_classes = [CallbackRateThrottle]
    required_scope = ApiKeyScope.WEBHOOK_CALLBACK
    callback = ""  # "deletion", "resolution", "isi": names it in ledger events
    # Set by a view that answers a deletion request dispatched by this kind of integration.
    integration_kind: IntegrationKind | None = None
    deletion_request: DeletionRequest | None = None  # the one answered, found with the key

    def correlation(self, payload: dict[str, Any]) -> str | None:
        """How the body names the deletion request it answers, when it does so validly
        (views with an ``integration_kind``)."""
        return None

    def get_authenticators(self) -> list[BaseAuthentication]:
        return [ApiKeyAuthentication(lookup=self._api_key_lookup)]

    def _api_key_lookup(self, key: str) -> ApiKey | None:
        # The deletion request answered comes with the key, in one query: finding it through
        # the ORM instead costs the callbacks bench about half its rate (docs/benchmarks.md).
        # None when the broker has no such request (404 once the key, scope, rate and body
        # have been checked, in that order).
        if self.integration_kind is None:
            return api_key_authenticate(key)
        payload = self._parsed_body(self.request)
        correlation = self.correlation(payload) if isinstance(payload, dict) else None
        found = api_key_lookup(key, kind=self.integration_kind, correlation=correlation)
        if found is None:
            return None
        api_key, self.deletion_request = found
        return api_key

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        self.subject = ""  # the request the callback answers, once known
        self.deletion_request = None
        self._body: dict[str, Any] | Problem | None = None
        self._throttled_address = False
        # First of all, key or no key: a made-up key must not buy its sender a key lookup
        # and a parsed body (the costly part of a refusal) from a throttled address.
        self._refuse_if_throttled(request)
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > CALLBACK_BODY_LIMIT:
            raise Problem(
                status=413,
                code="payload_too_large",
                detail=f"The body is {length} bytes; callbacks are limited to 64 KiB.",
            )
        super().initial(request, *args, **kwargs)
        headers = request.headers
        if not headers.get(signing.TIMESTAMP_HEADER) or not headers.get(signing.SIGNATURE_HEADER):
            raise Problem(
                status=401,
                code="signature_invalid",
                detail=f"Sign the callback: {signing.TIMESTAMP_HEADER} and "
                f"{signing.SIGNATURE_HEADER} are required.",
            )

    def json_object(self, request: Request) -> dict[str, Any]:
        """The raw body parsed as a JSON object (the signature is checked on the raw bytes)."""
        payload = self._parsed_body(request)
        if isinstance(payload, Problem):
            raise payload
        return payload

    def _parsed_body(self, request: Request) -> dict[str, Any] | Problem:
        """The body as a JSON object, or the problem with it; parsed once."""
        if self._body is None:
            self._body = _json_object(request.body)
        return self._body

    def verify_signature(self, request: Request, integration: Integration) -> None:
        """401 unless signed by ``integration``'s secret (or the previous one within 24 h)."""
        try:
            signing.verify(
                integration_callback_secrets(integration),
                request.headers.get(signing.TIMESTAMP_HEADER),
                request.headers.get(signing.SIGNATURE_HEADER),
                request.body,
            )
        except signing.SignatureError as exc:
            raise Problem(status=401, code=exc.code, detail=str(exc)) from None

    @staticmethod
    def not_found(what: str) -> Problem:
        # The same answer for another broker's request: existence does not leak.
        return Problem(status=404, code="not_found", detail=f"No {what} for this API key.")

    def actor(self, request: Request) -> str:
        api_key = request.auth
        assert isinstance(api_key, ApiKey)
        return f"apikey:{api_key.prefix}"

    def _refuse_if_throttled(self, request: HttpRequest | Request) -> None:
        wait = ADDRESS_BUCKETS.wait(throttle_address(request))
        if wait > 0:
            self._throttled_address = True
            raise Problem(
                status=429,
                code="rate_limited",
                detail="Too many unauthenticated callbacks from this address; try again later.",
                headers={"Retry-After": str(max(1, round(wait + 0.5)))},
            )

    def handle_exception(self, exc: Exception) -> Response:
        response = super().handle_exception(exc)
        if isinstance(exc, exceptions.APIException):
            self._record_rejection(exc, response)
            if not isinstance(self.request.__dict__.get("_auth"), ApiKey):
                # Counted and logged once a minute instead: keeps Django's line per
                # response out of the log, which anyone could flood otherwise.
                response._has_been_logged = True  # type: ignore[attr-defined]
        return response

    def _record_rejection(self, exc: exceptions.APIException, response: Response) -> None:
        # Only what authentication established: reading request.auth here would
        # authenticate a request refused before authentication (413).
        api_key = self.request.__dict__.get("_auth")
        body = response.data if isinstance(response.data, dict) else {}
        data: dict[str, Any] = {
            "callback": self.callback,
            "status": response.status_code,
            "code": body.get("code", ""),
            "detail": str(body.get("detail", ""))[:500],
        }
        if isinstance(body.get("errors"), dict):
            data["fields"] = sorted(str(field) for field in body["errors"])  # names, not values
        data.update(getattr(exc, "ledger_data", {}))
        if not isinstance(api_key, ApiKey):
            address = throttle_address(self.request)
            if not getattr(self, "_throttled_address", False):
                ADDRESS_BUCKETS.take(address)
            UNAUTHENTICATED.add(address=address, status=response.status_code, code=data["code"])
            return
        ledger_event_append(
            kind=LedgerKind.CALLBACK_REJECTED,
            broker_id=api_key.broker.broker_id if api_key.broker else "",
            subject=getattr(self, "subject", ""),
            actor=f"apikey:{api_key.prefix}",
            data=data,
        )


def _json_object(body: bytes) -> dict[str, Any] | Problem:
    if len(body) > CALLBACK_BODY_LIMIT:
        return Problem(
            status=413, code="payload_too_large", detail="Callbacks are limited to 64 KiB."
        )
    try:
        payload = json_body(body)
    except Problem as problem:
        return problem
    if not isinstance(payload, dict):
        return Problem(
            status=400,
            code="validation_failed",
            detail="The body must be a JSON object.",
            errors={"non_field_errors": ["The body must be a JSON object."]},
        )
    return payload
