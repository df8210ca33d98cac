"""``Authorization: Bearer <key>`` authentication against the API keys table.

``ApiKeyAuthentication`` serves every endpoint; the broker callbacks use
``CallbackAuthentication``, which finds the deletion request a callback answers in the same
query as its key (``services.staff.keys.api_key_lookup``) and hands it to the view::

    class DeletionCallbackView(SignedCallbackView):     # authentication_classes set there
        integration_kind = IntegrationKind.WEBHOOK
        def correlation(self, payload): return ...the body's request_uuid...
        def put(self, request):
            found = self.deletion_request                # None: no such request of the key's
"""

from __future__ import annotations

from typing import Any, Protocol

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from integrations.models import ApiKey, DeletionRequest, IntegrationKind
from integrations.services.staff.keys import api_key_authenticate, api_key_lookup
from integrations.web.permissions import bearer_key


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[ApiKey, ApiKey] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None  # the permission then answers 401 "authentication required"
        key = bearer_key(header)
        if key is None:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header: expected 'Bearer <API key>'."
            )
        api_key = self.lookup(request, key)
        if api_key is None:
            raise exceptions.AuthenticationFailed("The API key is unknown or revoked.")
        return api_key, api_key

    def lookup(self, request: Request, key: str) -> ApiKey | None:
        """The active key for the clear one."""
        return api_key_authenticate(key)

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class CallbackView(Protocol):
    """What ``CallbackAuthentication`` asks of a callback view."""

    integration_kind: IntegrationKind | None
    deletion_request: DeletionRequest | None

    def correlation(self, payload: dict[str, Any]) -> str | None: ...

    def json_object_or_problem(self, request: Request) -> dict[str, Any] | Exception: ...


class CallbackAuthentication(ApiKeyAuthentication):
    """A callback's API key. For a view answering a deletion request (``integration_kind``
    set), the request the body names (``view.correlation``) comes with the key, in one
    query: finding it through the ORM instead costs the callbacks bench about half its rate
    (docs/benchmarks.md). It is set on the view as ``deletion_request``; None when the
    key's broker has no such request (404 once the key, scope, rate and body are checked)."""

    def lookup(self, request: Request, key: str) -> ApiKey | None:
        view: CallbackView = request.parser_context["view"]
        if view.integration_kind is None:
            return api_key_authenticate(key)
        payload = view.json_object_or_problem(request)
        correlation = view.correlation(payload) if isinstance(payload, dict) else None
        found = api_key_lookup(key, kind=view.integration_kind, correlation=correlation)
        if found is None:
            return None
        api_key, view.deletion_request = found
        return api_key
