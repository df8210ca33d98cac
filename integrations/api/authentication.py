"""``Authorization: Bearer <key>`` authentication against the API keys table."""

from __future__ import annotations

from collections.abc import Callable

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from integrations.models import ApiKey
from integrations.services.keys import api_key_authenticate


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """``lookup`` finds the active key for the clear one (a callback view passes its own,
    which finds what the callback answers in the same query)."""

    keyword = "Bearer"

    def __init__(self, lookup: Callable[[str], ApiKey | None] = api_key_authenticate) -> None:
        self.lookup = lookup

    def authenticate(self, request: Request) -> tuple[ApiKey, ApiKey] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None  # the permission then answers 401 "authentication required"
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != self.keyword.lower() or not key or " " in key:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header: expected 'Bearer <API key>'."
            )
        api_key = self.lookup(key)
        if api_key is None:
            raise exceptions.AuthenticationFailed("The API key is unknown or revoked.")
        return api_key, api_key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
