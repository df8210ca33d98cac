"""Scope permission: a view declares ``required_scope``; a key without it gets 403."""

from __future__ import annotations

import pytest
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from integrations.web.permissions import HasScope
from tests.conftest import bearer

pytestmark = pytest.mark.django_db


class AuditOnlyView(APIView):
    permission_classes = [HasScope]
    required_scope = "audit"

    def get(self, request: Request) -> Response:
        return Response({"ok": True})


def call(key: str | None):
    headers = bearer(key) if key else {}
    request = APIRequestFactory().get("/api/v1/audit-only", **headers)
    response = AuditOnlyView.as_view()(request)
    response.render()
    return response


def test_key_with_the_scope_passes(make_key) -> None:
    assert call(make_key("audit").key).status_code == 200


def test_key_without_the_scope_is_403_scope_missing(make_key) -> None:
    response = call(make_key("ingest", "webhook_callback").key)
    assert response.status_code == 403
    assert response["Content-Type"] == "application/problem+json"
    body = response.data
    assert body["code"] == "scope_missing"
    assert "audit" in body["detail"]


def test_no_key_is_401_not_403(make_key) -> None:
    make_key("audit")
    response = call(None)
    assert response.status_code == 401
    assert response.data["code"] == "authentication_failed"
