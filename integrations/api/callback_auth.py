"""What every signed callback from a broker goes through (deletion, resolution, ISI).

A callback view subclasses ``SignedCallbackView``; correlating the body with the request it
answers is the view's job, because only then is the secret known (the Webhook Secret of the
integration that sent the dispatch). A view answering a deletion request says how its body
names it (``integration_kind``: ``ISI`` by ``results_token``, ``WEBHOOK`` by
``request_uuid``; whatever kind of integration dispatched it) and where; the request is
then found in the same query as the API key (``authentication.CallbackAuthentication``)::

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

Who does what: this view asks ``throttling.UnauthenticatedAddressThrottle`` (0) and checks
the size (1) before DRF's own checks, which run ``authentication.CallbackAuthentication``
(2, and the request answered), ``permissions.HasScope`` (3) and
``throttling.CallbackKeyThrottle`` (4) in that order; the view does the rest.

A rejection of a request with a valid API key is a ledger event (``callback.rejected``,
``services.dispatch.callback_rejections``); one without (no key, an unknown or revoked key, a body
refused before the key was read, an address throttled) writes nothing: anyone can send
those. They are counted and logged at most once a minute per process, and each costs its
client address a token of ``DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT`` (per address, or per
/64 for IPv6); a request with a valid key never costs one. The address is the peer's, or the
one the opt-in TLS proxy forwards: behind a reverse proxy without
``DROPPORTAL_BEHIND_TLS_PROXY`` every client shares the proxy's, and a flood of bad keys
then throttles the brokers' callbacks too (they are answered 429 with ``Retry-After`` and
retried).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from integrations.api.authentication import CallbackAuthentication
from integrations.api.json_body import json_body
from integrations.dispatch import signing
from integrations.models import ApiKey, ApiKeyScope, DeletionRequest, Integration, IntegrationKind
from integrations.services.dispatch.callback_rejections import (
    callback_rejection_record,
    callback_unauthenticated_count,
)
from integrations.services.staff.integrations import integration_callback_secrets
from integrations.web.errors import Problem
from integrations.web.permissions import HasScope
from integrations.web.throttling import (
    AddressThrottled,
    CallbackKeyThrottle,
    UnauthenticatedAddressThrottle,
    throttle_address,
)

CALLBACK_BODY_LIMIT = 64 * 1024


# Both signature headers, required on every signed callback (missing: 401
# ``signature_invalid``), as ``signing.verify`` reads them.
_SIGNATURE_HEADERS = [
    OpenApiParameter(
        signing.TIMESTAMP_HEADER,
        str,
        OpenApiParameter.HEADER,
        required=True,
        pattern="^[0-9]{1,19}$",
        description="Unix seconds when the callback was signed; within "
        f"{signing.TOLERANCE_SECONDS // 60} minutes of the server's clock.",
    ),
    OpenApiParameter(
        signing.SIGNATURE_HEADER,
        str,
        OpenApiParameter.HEADER,
        required=True,
        pattern="^[A-Za-z0-9+/]{43}=$",
        description="Base64 HMAC-SHA256 of '<X-Webhook-Timestamp>:<raw body>', keyed by the "
        "Webhook Secret of the integration that sent the request.",
    ),
]


# In the schema the callbacks take the same bearer API key as every other endpoint (one
# "apiKey" scheme), though they look it up with their request. drf-spectacular puts ``auth``
# into the operation's security as given (security requirement objects), though typed as str.
@extend_schema(auth=[{"apiKey": []}], parameters=_SIGNATURE_HEADERS)  # type: ignore[list-item]
class SignedCallbackView(APIView):
    """The shared checks of a broker callback; subclasses set ``callback`` and ``subject``."""

    authentication_classes = [CallbackAuthentication]
    permission_classes = [HasScope]
    throttle_classes = [CallbackKeyThrottle]
    required_scope = ApiKeyScope.WEBHOOK_CALLBACK
    callback = ""  # "deletion", "resolution", "isi": names it in ledger events
    # Set by a view that answers a deletion request: the callback it is, which says how its
    # body names the request (sql/api_key_lookup.sql), not who dispatched it.
    integration_kind: IntegrationKind | None = None
    deletion_request: DeletionRequest | None = None  # the one answered, found with the key
    api_key: ApiKey | None = None  # once authentication found a valid one
    subject = ""  # the request the callback answers, once known
    _body: dict[str, Any] | Problem | None = None  # parsed once, by the first to ask

    def correlation(self, payload: dict[str, Any]) -> str | None:
        """How the body names the deletion request it answers, when it does so validly
        (views with an ``integration_kind``)."""
        return None

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # First of all, key or no key: a made-up key must not buy its sender a key lookup
        # and a parsed body (the costly part of a refusal) from a throttled address.
        throttle = UnauthenticatedAddressThrottle()
        if not throttle.allow_request(request, self):
            raise AddressThrottled(
                wait=throttle.wait() or 0.0,
                detail="Too many unauthenticated callbacks from this address; try again later.",
            )
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
        super().initial(request, *args, **kwargs)  # key, scope, the key's rate
        headers = request.headers
        if not headers.get(signing.TIMESTAMP_HEADER) or not headers.get(signing.SIGNATURE_HEADER):
            raise Problem(
                status=401,
                code="signature_invalid",
                detail=f"Sign the callback: {signing.TIMESTAMP_HEADER} and "
                f"{signing.SIGNATURE_HEADER} are required.",
            )

    def perform_authentication(self, request: Request) -> None:
        super().perform_authentication(request)
        # Kept for the refusal record: only what authentication established counts (a body
        # refused before it, 413, has no key).
        self.api_key = request.auth if isinstance(request.auth, ApiKey) else None

    def json_object(self, request: Request) -> dict[str, Any]:
        """The raw body parsed as a JSON object (the signature is checked on the raw bytes)."""
        payload = self.json_object_or_problem(request)
        if isinstance(payload, Problem):
            raise payload
        return payload

    def json_object_or_problem(self, request: Request) -> dict[str, Any] | Problem:
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

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, exceptions.APIException) and exc.status_code == 401:
            # RFC 9110 §11.6.1: every 401 carries a challenge (WWW-Authenticate). DRF sets
            # ``auth_header`` on its own authentication errors only; the signature's 401s
            # (signature_invalid, timestamp_out_of_range) get the same one.
            challenge = self.get_authenticate_header(self.request)
            exc.auth_header = challenge  # type: ignore[attr-defined]
        response = super().handle_exception(exc)
        if isinstance(exc, exceptions.APIException):
            self._rejection_record(exc, response)
            if self.api_key is None:
                # Counted and logged once a minute instead: keeps Django's line per
                # response out of the log, which anyone could flood otherwise.
                response._has_been_logged = True  # type: ignore[attr-defined]
        return response

    def _rejection_record(self, exc: exceptions.APIException, response: Response) -> None:
        body = response.data if isinstance(response.data, dict) else {}
        data: dict[str, Any] = {
            "status": response.status_code,
            "code": body.get("code", ""),
            "detail": str(body.get("detail", ""))[:500],
        }
        if isinstance(body.get("errors"), dict):
            data["fields"] = sorted(str(field) for field in body["errors"])  # names, not values
        data.update(getattr(exc, "ledger_data", {}))
        if self.api_key is None:
            if not isinstance(exc, AddressThrottled):
                UnauthenticatedAddressThrottle().take(self.request, self)
            callback_unauthenticated_count(
                address=throttle_address(self.request),
                status=response.status_code,
                code=data["code"],
            )
            return
        callback_rejection_record(
            api_key=self.api_key, callback=self.callback, subject=self.subject, data=data
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
