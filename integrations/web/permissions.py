"""Permissions: an active API key, and the scope a view declares in ``required_scope``; and
the key an ``Authorization`` header carries (``bearer_key``)."""

from __future__ import annotations

from typing import Any

from rest_framework import permissions
from rest_framework.request import Request

from integrations.models import ApiKey
from integrations.web.errors import Problem


def bearer_key(header: str) -> str | None:
    """The API key of an ``Authorization: Bearer <key>`` header; None when it is not one
    (another scheme, no key, words)."""
    scheme, _, key = header.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key or " " in key:
        return None
    return key


class HasActiveApiKey(permissions.BasePermission):
    message = "An API key is required: send 'Authorization: Bearer <API key>'."

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, ApiKey) and request.auth.revoked_at is None


class HasScope(HasActiveApiKey):
    """Requires ``view.required_scope`` among the key's scopes (403 ``scope_missing``)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if not super().has_permission(request, view):
            return False
        scope: str = view.required_scope
        assert isinstance(request.auth, ApiKey)  # checked by HasActiveApiKey
        if scope not in request.auth.scopes:
            raise Problem(
                status=403,
                code="scope_missing",
                detail=f"This API key lacks the '{scope}' scope.",
            )
        return True
