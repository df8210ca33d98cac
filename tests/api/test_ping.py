"""GET /api/v1/ping (docs/contracts.md §3.3, §5.2) and the problem-details shape of errors."""

from __future__ import annotations

import re

import pytest
from rest_framework.test import APIClient

from integrations.services.staff.keys import api_key_revoke
from tests.conftest import bearer

pytestmark = pytest.mark.django_db

PROBLEM_KEYS = {"type", "title", "status", "detail", "code"}


def assert_problem(response, status: int, code: str) -> dict:
    assert response.status_code == status
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body.keys() >= PROBLEM_KEYS
    assert body["status"] == status
    assert body["code"] == code
    assert body["type"] == f"urn:dropportal:problem:{code}"
    return body


def test_active_key_gets_200_and_an_empty_body(api_client: APIClient, make_key) -> None:
    created = make_key("webhook_callback")
    response = api_client.get("/api/v1/ping", **bearer(created.key))
    assert response.status_code == 200
    assert response.content == b""


@pytest.mark.parametrize("accept", ["text/plain", "text/html", "application/xml"])
def test_any_accept_header_is_answered_not_refused(
    api_client: APIClient, make_key, accept: str
) -> None:
    created = make_key("webhook_callback")
    response = api_client.get("/api/v1/ping", HTTP_ACCEPT=accept, **bearer(created.key))
    assert response.status_code == 200, response.content
    created.api_key.refresh_from_db()
    assert created.api_key.last_used_at is not None
    # Errors too: problem details, not a 406.
    refused = api_client.get("/api/v1/ping", HTTP_ACCEPT=accept)
    assert_problem(refused, 401, "authentication_failed")


def test_ping_records_last_use(api_client: APIClient, make_key) -> None:
    created = make_key("audit")
    api_client.get("/api/v1/ping", **bearer(created.key))
    created.api_key.refresh_from_db()
    assert created.api_key.last_used_at is not None


def test_missing_key_is_401_with_bearer_challenge(api_client: APIClient, make_key) -> None:
    make_key("ingest")
    response = api_client.get("/api/v1/ping")
    assert_problem(response, 401, "authentication_failed")
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "header",
    ["Basic dXNlcjpwYXNz", "Bearer", "Bearer ", "Token abc", "Bearer two words", "dpk_only"],
)
def test_malformed_header_is_401(api_client: APIClient, make_key, header: str) -> None:
    make_key("ingest")
    response = api_client.get("/api/v1/ping", HTTP_AUTHORIZATION=header)
    body = assert_problem(response, 401, "authentication_failed")
    assert "Authorization" in body["detail"]


def test_unknown_key_is_401(api_client: APIClient, make_key) -> None:
    created = make_key("ingest")
    response = api_client.get("/api/v1/ping", **bearer(created.key + "x"))
    assert_problem(response, 401, "authentication_failed")


def test_revoked_key_is_401(api_client: APIClient, make_key) -> None:
    created = make_key("ingest")
    assert api_client.get("/api/v1/ping", **bearer(created.key)).status_code == 200
    api_key_revoke(api_key=created.api_key, actor="test")
    response = api_client.get("/api/v1/ping", **bearer(created.key))
    assert_problem(response, 401, "authentication_failed")


def test_unknown_api_path_is_a_problem_not_html(api_client: APIClient) -> None:
    response = api_client.get("/api/v1/nothing-here")
    assert_problem(response, 404, "not_found")


def test_wrong_method_is_a_problem(api_client: APIClient, make_key) -> None:
    created = make_key("ingest")
    response = api_client.post("/api/v1/ping", **bearer(created.key))
    assert_problem(response, 405, "method_not_allowed")


def test_openapi_schema_and_docs_are_served_without_a_key(api_client: APIClient) -> None:
    schema = api_client.get("/api/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    assert "/api/v1/ping" in schema.json()["paths"]
    docs = api_client.get("/api/v1/docs")
    assert docs.status_code == 200
    assert b"swagger" in docs.content.lower()
    # Its scripts and styles are served from here, none from a CDN. (Not "no 'cdn' in the
    # page": its random CSRF token spells that now and then.)
    assets = re.findall(rb'(?:src|href)="([^"]*)"', docs.content)
    assert assets
    assert all(asset.startswith(b"/static/") for asset in assets), assets


@pytest.mark.parametrize(
    ("accept", "query", "content_type"),
    [
        ("application/vnd.oai.openapi+json", {}, "application/vnd.oai.openapi+json"),
        ("application/json", {}, "application/json"),
        ("application/yaml", {}, "application/yaml"),
        ("text/html", {"format": "json"}, "application/vnd.oai.openapi+json"),
        ("text/html", {}, "application/vnd.oai.openapi"),
    ],
)
def test_the_schema_is_negotiated_by_accept_or_format(
    api_client: APIClient, accept: str, query: dict[str, str], content_type: str
) -> None:
    response = api_client.get("/api/v1/schema", query, HTTP_ACCEPT=accept)
    assert response.status_code == 200
    assert response["Content-Type"].split(";")[0] == content_type
    assert response.content.lstrip().startswith(b"{") == content_type.endswith("json")


def test_an_unknown_schema_format_is_not_found(api_client: APIClient) -> None:
    response = api_client.get("/api/v1/schema", {"format": "xml"}, HTTP_ACCEPT="text/html")
    assert response.status_code == 404
