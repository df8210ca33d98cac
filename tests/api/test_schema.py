"""The OpenAPI schema documents the errors as they are sent: RFC 9457 problem details."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def test_every_error_answer_is_documented_as_problem_details(api_client: APIClient) -> None:
    schema = api_client.get("/api/v1/schema", {"format": "json"}).json()

    errors = {
        (path, method, status): frozenset(response.get("content", {}))
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
        for status, response in operation["responses"].items()
        if int(status) >= 400
    }

    assert errors  # the API documents its errors at all
    assert {types for types in errors.values() if types} == {
        frozenset({"application/problem+json"})
    }
    assert ("/api/v1/ping", "get", "401") in errors
    assert "Problem" in schema["components"]["schemas"]
