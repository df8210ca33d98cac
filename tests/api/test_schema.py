"""The OpenAPI schema documents the errors as they are sent: RFC 9457 problem details."""

from __future__ import annotations

import re
import uuid

import pytest
from rest_framework.test import APIClient

from integrations.api.schema import NUL_FREE_PATTERN
from integrations.dispatch import signing

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


def test_the_schema_states_what_the_server_takes(api_client: APIClient) -> None:
    schema = api_client.get("/api/v1/schema", {"format": "json"}).json()
    components = schema["components"]["schemas"]
    outcomes = {
        p["name"]: p["schema"]
        for p in schema["paths"]["/api/v1/drop/outcomes"]["get"]["parameters"]
    }

    # Dates and times by format and pattern, the cursor by its pattern: no free strings.
    for name in ("since", "until"):
        assert [b["format"] for b in outcomes[name]["anyOf"]] == ["date", "date-time"]
        assert all(b["pattern"] for b in outcomes[name]["anyOf"])
    assert outcomes["cursor"]["pattern"] == "^[0-7]?[0-9a-f]{1,15}$"
    # A consumer without remote_identifier is answered row by row, not refused.
    registration = components["RegistrationRequest"]
    assert registration["properties"]["consumers"]["items"]["anyOf"] == [
        {"$ref": "#/components/schemas/Consumer"},
        {"$ref": "#/components/schemas/JsonValue"},
    ]
    assert registration["additionalProperties"] is False
    # No string may hold a NUL, as json_body refuses it.
    assert components["Consumer"]["properties"]["remote_identifier"]["pattern"] == ("^[^\\u0000]*$")
    assert components["Consumer"]["propertyNames"]["pattern"] == "^[^\\u0000]*$"


def test_the_callbacks_identifiers_may_be_null_and_their_keys_hold_no_nul(
    api_client: APIClient,
) -> None:
    components = api_client.get("/api/v1/schema", {"format": "json"}).json()["components"]
    resolution = components["schemas"]["ResolutionCallback"]["properties"]["identifiers"]
    deletion = components["schemas"]["DeletionCallback"]["properties"]["identifiers"]

    # null is taken as absent by both callbacks, as the schema says.
    assert resolution["type"] == ["object", "null"]
    assert {"type": "null"} in deletion["oneOf"]
    assert resolution["propertyNames"] == {"type": "string", "pattern": NUL_FREE_PATTERN}


def test_the_deletion_callbacks_request_uuid_is_documented_as_the_service_writes_it(
    api_client: APIClient,
) -> None:
    components = api_client.get("/api/v1/schema", {"format": "json"}).json()["components"]
    request_uuid = components["schemas"]["DeletionCallback"]["properties"]["request_uuid"]

    assert request_uuid["format"] == "uuid"
    written = uuid.uuid4()
    assert re.fullmatch(request_uuid["pattern"], str(written))
    assert re.fullmatch(request_uuid["pattern"], str(written).upper())
    assert not re.fullmatch(request_uuid["pattern"], written.hex)


def test_the_signed_callbacks_document_their_signature_headers(api_client: APIClient) -> None:
    schema = api_client.get("/api/v1/schema", {"format": "json"}).json()
    callbacks = {
        (path, method): operation
        for path, operations in schema["paths"].items()
        if path.startswith("/api/v1/drop/callbacks/")
        for method, operation in operations.items()
    }

    assert set(callbacks) == {
        ("/api/v1/drop/callbacks/deletion", "put"),
        ("/api/v1/drop/callbacks/resolution", "put"),
        ("/api/v1/drop/callbacks/isi", "put"),
        ("/api/v1/drop/callbacks/isi", "post"),
    }
    for operation in callbacks.values():
        headers = {p["name"]: p for p in operation["parameters"] if p["in"] == "header"}
        # The names the server reads, each required and described.
        assert {signing.TIMESTAMP_HEADER, signing.SIGNATURE_HEADER} <= set(headers)
        for name in (signing.TIMESTAMP_HEADER, signing.SIGNATURE_HEADER):
            assert headers[name]["required"] is True
            assert headers[name]["description"]
    # What the schema allows is what signing.verify takes apart from the HMAC itself.
    timestamp, signature = (
        headers[signing.TIMESTAMP_HEADER]["schema"]["pattern"],
        headers[signing.SIGNATURE_HEADER]["schema"]["pattern"],
    )
    assert re.fullmatch(timestamp, "1767225600")
    assert re.fullmatch(signature, signing.sign("whsec_x", 1767225600, b"{}"))


@pytest.mark.parametrize("name", ["bogus", "openapi-json"])
def test_a_format_the_schema_has_not_is_a_json_problem(api_client: APIClient, name: str) -> None:
    # The view renders YAML by default: its error must not be YAML labelled as JSON.
    answer = api_client.get("/api/v1/schema", {"format": name})

    assert answer.status_code == 404
    assert answer["Content-Type"] == "application/problem+json"
    assert answer.json()["code"] == "not_found"


@pytest.mark.parametrize("path", ["/api/v1/schema", "/api/v1/docs"])
@pytest.mark.parametrize("authorization", ["Basic dXNlcjpwYXNz", "Bearer dpk_not_a_key"])
def test_the_schema_and_its_page_need_no_key_whatever_a_proxy_adds(
    api_client: APIClient, path: str, authorization: str
) -> None:
    assert api_client.get(path, HTTP_AUTHORIZATION=authorization).status_code == 200
