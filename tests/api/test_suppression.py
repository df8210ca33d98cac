"""POST /api/v1/drop/suppression/check: a pipeline asks before it collects."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from integrations.models import Broker, Consumer, ConsumerHash, LedgerEvent, WorkItemState
from integrations.services.staff.brokers import broker_create
from integrations.services.staff.keys import CreatedApiKey
from tests.builders import DropCycleFactory, WorkItemFactory
from tests.conftest import bearer

pytestmark = pytest.mark.django_db

URL = "/api/v1/drop/suppression/check"
ANNA = "KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE="  # Anna.Smith@Domain.com
PHONE = "vGM7y5n+hBXRSEAklhHDPCbysyNgYTmXdMcagGUOY8E="  # +1(415)555-9317
OTHER = base64.b64encode(hashlib.sha256(b"someone else").digest()).decode()


@pytest.fixture
def suppression(make_key: Callable[..., CreatedApiKey]) -> dict[str, Any]:
    return bearer(make_key("suppression").key)


@pytest.fixture
def suppressed(broker: Broker) -> None:
    """DROP sent Anna's email and the phone; it removed a third hash (no longer suppressed)."""
    cycle = DropCycleFactory.create(broker=broker)
    WorkItemFactory.create(cycle=cycle, hash=base64.b64decode(ANNA), status_code=5)
    WorkItemFactory.create(
        cycle=cycle, list_type="Phone", hash=base64.b64decode(PHONE), reported=True
    )
    WorkItemFactory.create(cycle=cycle, hash=base64.b64decode(OTHER), state=WorkItemState.REMOVED)


def post(client: APIClient, body: Any, headers: dict[str, Any]) -> Any:
    return client.post(URL, body, format="json", **headers)


BODY = {
    "consumers": [
        {"email": ["  Anna.Smith@Domain.COM "]},  # clear: standardized as DROP does
        {"hashes": {"phone": [PHONE]}, "email": ["bob@example.com"]},
        {"email": ["bob@example.com"]},
        {"hashes": {"email": [OTHER]}},  # removed by DROP: not suppressed
    ]
}


def test_answers_each_entry_in_order_with_its_list_types(
    api_client: APIClient, suppression: dict[str, Any], suppressed: None
) -> None:
    response = post(api_client, BODY, suppression)

    assert response.status_code == 200
    assert response.json() == {
        "results": [
            {"index": 0, "suppressed": True, "list_types": ["email"]},
            {"index": 1, "suppressed": True, "list_types": ["phone"]},
            {"index": 2, "suppressed": False, "list_types": []},
            {"index": 3, "suppressed": False, "list_types": []},
        ]
    }


def test_nothing_is_stored_and_the_ledger_holds_counts_only(
    api_client: APIClient, suppression: dict[str, Any], suppressed: None
) -> None:
    post(api_client, BODY, suppression)

    assert not Consumer.objects.exists() and not ConsumerHash.objects.exists()
    event = LedgerEvent.objects.get(kind="suppression.checked")
    assert event.actor.startswith("apikey:dpk_") and event.broker_id == "4821"
    assert event.data == {
        "entries": 4,
        "rejected": 0,
        "hashes_checked": 5,
        "suppressed": 2,
        "suppressed_by_list_type": {"email": 1, "phone": 1},
    }
    # Neither a clear value nor a hash of the call reaches the ledger.
    text = json.dumps(event.data)
    assert "anna" not in text.lower() and ANNA not in text and PHONE not in text


def test_a_bad_entry_is_answered_in_place_and_the_others_checked(
    api_client: APIClient, suppression: dict[str, Any], suppressed: None
) -> None:
    body = {
        "consumers": [
            {"email": ["anna.smith@domain.com"], "phone": ["no digits"]},
            {"remote_identifier": "C-1", "email": ["anna.smith@domain.com"]},
            {},
            "anna.smith@domain.com",
            {"hashes": {"email": ["not base64"]}},
            {"email": ["anna.smith@domain.com"]},
        ]
    }
    response = post(api_client, body, suppression)

    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["suppressed"] for r in results] == [None, None, None, None, None, True]
    assert list(results[0]["errors"]) == ["phone[0]"]
    assert list(results[1]["errors"]) == ["remote_identifier"]  # not part of a check
    assert list(results[2]["errors"]) == ["non_field_errors"]  # no identifier
    assert results[3]["errors"] == {"non_field_errors": ["must be a JSON object"]}
    assert list(results[4]["errors"]) == ["hashes.email[0]"]
    assert "errors" not in results[5]
    assert LedgerEvent.objects.get(kind="suppression.checked").data["rejected"] == 5


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([{"email": ["a@b.co"]}], "non_field_errors"),
        ({"entries": []}, "entries"),
        ({"consumers": {"email": []}}, "consumers"),
        ({"consumers": [{"email": ["a@b.co"]}] * 10_001}, "consumers"),
    ],
)
def test_a_malformed_body_is_refused_whole_as_problem_details(
    api_client: APIClient, suppression: dict[str, Any], suppressed: None, body: Any, field: str
) -> None:
    response = post(api_client, body, suppression)

    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == "validation_failed" and field in problem["errors"]
    assert not LedgerEvent.objects.filter(kind="suppression.checked").exists()


def test_ten_thousand_entries_are_answered(
    api_client: APIClient, suppression: dict[str, Any], suppressed: None
) -> None:
    body = {"consumers": [{"email": [f"person{n}@example.com"]} for n in range(9_999)]}
    body["consumers"].append({"email": ["anna.smith@domain.com"]})

    results = post(api_client, body, suppression).json()["results"]

    assert len(results) == 10_000 and [r["index"] for r in results] == list(range(10_000))
    assert [r["index"] for r in results if r["suppressed"]] == [9_999]


def test_a_key_without_the_suppression_scope_is_refused(
    api_client: APIClient, make_key: Callable[..., CreatedApiKey], suppressed: None
) -> None:
    response = post(api_client, BODY, bearer(make_key("ingest", "audit").key))

    assert response.status_code == 403
    assert response.json()["code"] == "scope_missing"
    assert not LedgerEvent.objects.filter(kind="suppression.checked").exists()


def test_another_brokers_list_is_not_asked(
    api_client: APIClient, make_key: Callable[..., CreatedApiKey], suppressed: None
) -> None:
    other = broker_create(broker_id="1234", name="Other", mode="test", actor="test")
    headers = bearer(make_key("suppression", for_broker=other).key)

    results = post(api_client, BODY, headers).json()["results"]

    assert not any(r["suppressed"] for r in results)


def test_the_check_is_in_the_openapi_schema(api_client: APIClient) -> None:
    schema = api_client.get("/api/v1/schema", {"format": "json"}).json()
    operation = schema["paths"]["/api/v1/drop/suppression/check"]["post"]
    components = schema["components"]["schemas"]

    assert operation["operationId"] == "drop_suppression_check"
    assert {"200", "400", "401", "403", "413"} <= operation["responses"].keys()
    request = components["SuppressionCheckRequest"]
    assert request["additionalProperties"] is False
    assert request["properties"]["consumers"]["maxItems"] == 10_000
    assert "remote_identifier" not in components["CheckedConsumer"]["properties"]
    result = components["SuppressionResult"]["properties"]
    assert result["suppressed"]["type"] == ["boolean", "null"]  # null: the entry had errors
    assert "errors" not in components["SuppressionResult"]["required"]


def test_a_key_made_by_the_command_with_the_scope_may_check(
    api_client: APIClient, suppressed: None
) -> None:
    out = io.StringIO()
    call_command(
        "apikeys", "create", "--broker", "4821", "--scope", "suppression", "--json", stdout=out
    )
    key = json.loads(out.getvalue())["key"]

    response = post(api_client, {"consumers": [{"hashes": {"email": [ANNA]}}]}, bearer(key))

    assert response.json()["results"] == [{"index": 0, "suppressed": True, "list_types": ["email"]}]
    # And nothing else: the registration answers it 403.
    assert (
        api_client.post(
            "/api/v1/drop/consumers", {"consumers": []}, format="json", **bearer(key)
        ).status_code
        == 403
    )
