"""The broker's ISI completion callback over HTTP (PUT or POST /api/v1/drop/callbacks/isi):
every outcome, idempotency, and every bad input with its status and ``code``, none of which
changes a request. The same rules as the webhook deletion callback, correlated by
``results_token``.

Each bad-input case starts from the same signed, accepted callback and breaks one thing.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from devtools.isi_simulator import IsiSimulator
from integrations.dispatch import signing
from integrations.models import (
    ApiKey,
    Broker,
    DeletionRequest,
    Integration,
    LedgerEvent,
    OptOutRecord,
    RequestState,
)
from integrations.services.staff.integrations import integration_secret_rotate
from integrations.services.staff.keys import api_key_create
from tests.api import bad_callbacks
from tests.api.bad_callbacks import BAD_CALLBACKS, WITHOUT_A_VALID_KEY, cases_for
from tests.builders import (
    CONNECTION_A,
    DeletionRequestFactory,
    broker_connections,
    isi_integration_created,
    webhook_integration_created,
)

pytestmark = pytest.mark.django_db

ISI = "/api/v1/drop/callbacks/isi"


def utc_text(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Side:
    """The broker's side: its callback key and its ISI integration's Webhook Secret."""

    key: str
    secret: str
    integration: Integration
    api_key: ApiKey


@pytest.fixture
def side(broker: Broker, settings: Any) -> Iterator[Side]:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    with IsiSimulator(connections=broker_connections()) as api:
        created = isi_integration_created(broker, api)
    key = api_key_create(broker=broker, scopes=["webhook_callback"], actor="test")
    yield Side(key.key, created.webhook_secret, created.integration, key.api_key)


@pytest.fixture
def processing(side: Side) -> DeletionRequest:
    """An ISI delete the broker acknowledged with {"status": "processing"}."""
    connection = side.integration.connections.get(uuid=CONNECTION_A)
    return DeletionRequestFactory.create(
        isi_connection=connection, state=RequestState.DISPATCHED, dispatched_at=timezone.now()
    )


def body_for(request: DeletionRequest, outcome: str = "deleted", **extra: Any) -> dict[str, Any]:
    body = {
        "status": "completed",
        "results_token": request.results_token,
        "drop_outcome": outcome,
        # The broker finished a minute ago: within the clocks' tolerance of the dispatch.
        "completed_at": utc_text(timezone.now() - dt.timedelta(minutes=1)),
        **extra,
    }
    return {k: v for k, v in body.items() if v is not None}


def send(
    payload: dict[str, Any] | bytes,
    *,
    key: str | None,
    secret: str | None,
    method: str = "PUT",
    now: float | None = None,
    headers: dict[str, str] | None = None,
) -> Any:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    sent: dict[str, Any] = {}
    if key is not None:
        sent["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    if secret is not None:
        signed = signing.signed_headers(secret, raw, now=now)
        sent["HTTP_X_WEBHOOK_TIMESTAMP"] = signed["X-Webhook-Timestamp"]
        sent["HTTP_X_WEBHOOK_SIGNATURE"] = signed["X-Webhook-Signature"]
    sent.update(headers or {})
    client = APIClient()
    call = client.put if method == "PUT" else client.post
    return call(ISI, data=raw, content_type="application/json", **sent)


def snapshot(request: DeletionRequest) -> tuple[Any, ...]:
    request.refresh_from_db()
    return (
        request.state,
        request.drop_outcome,
        request.drop_status_code,
        request.error_message,
        request.completed_at,
    )


# -- accepted -------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["PUT", "POST"])
@pytest.mark.parametrize(("outcome", "code"), [("deleted", 3), ("not_found", 5), ("exempt", 2)])
def test_a_completion_is_recorded_with_its_drop_code_by_put_or_post(
    side: Side, processing: DeletionRequest, outcome: str, code: int, method: str
) -> None:
    broker_time = timezone.now() - dt.timedelta(minutes=4)
    body = body_for(processing, outcome, completed_at=utc_text(broker_time))
    before = timezone.now()
    response = send(body, key=side.key, secret=side.secret, method=method)

    assert response.status_code == 200, response.content
    assert response.json() == {
        "status": "recorded",
        "request_uuid": str(processing.request_uuid),
        "drop_outcome": outcome,
    }
    processing.refresh_from_db()
    assert processing.state == RequestState.COMPLETED
    assert (processing.drop_outcome, processing.drop_status_code) == (outcome, code)
    # Our clock dates the request and the ledger; the broker's time is kept as data.
    assert processing.completed_at is not None and processing.completed_at >= before
    event = LedgerEvent.objects.get(kind="deletion_request.outcome_recorded")
    assert event.created_at >= before
    assert dt.datetime.fromisoformat(event.data["broker_completed_at"]) == broker_time
    assert event.subject == str(processing.request_uuid)
    assert event.actor == f"apikey:{side.api_key.prefix}"


def test_opted_out_keeps_the_email_verbatim_and_out_of_the_ledger(
    side: Side, processing: DeletionRequest
) -> None:
    email = " Ann.Smith+drop@Example.COM "
    body = body_for(processing, "opted_out", identifiers={"email": [{"email": email}]})

    response = send(body, key=side.key, secret=side.secret)

    assert response.status_code == 200, response.content
    assert OptOutRecord.objects.get(deletion_request=processing).email == email
    assert DeletionRequest.objects.get(pk=processing.pk).drop_status_code == 4
    assert "Ann.Smith" not in json.dumps(list(LedgerEvent.objects.values_list("data", flat=True)))


@pytest.mark.parametrize(
    ("shift", "word"),
    [
        (dt.timedelta(hours=2), "future"),  # ahead of our clock
        (dt.timedelta(minutes=-20), "before the delete was sent"),  # back-dated
    ],
)
def test_a_completion_time_far_from_our_clock_is_refused(
    side: Side, processing: DeletionRequest, shift: dt.timedelta, word: str
) -> None:
    # processing was dispatched now: 20 minutes before is well past the 5 minutes allowed.
    moment = utc_text(timezone.now() + shift)
    before = snapshot(processing)

    response = send(body_for(processing, completed_at=moment), key=side.key, secret=side.secret)

    assert response.status_code == 400, response.content
    problem = response.json()
    assert problem["code"] == "validation_failed"
    assert word in problem["detail"] and "5 minutes" in problem["detail"]
    assert list(problem["errors"]) == ["completed_at"]
    assert snapshot(processing) == before
    assert not LedgerEvent.objects.filter(kind="deletion_request.outcome_recorded").exists()


def test_a_completion_time_a_few_minutes_off_is_accepted_and_dated_by_our_clock(
    side: Side, processing: DeletionRequest
) -> None:
    ahead = timezone.now() + dt.timedelta(minutes=3)
    response = send(
        body_for(processing, completed_at=utc_text(ahead)), key=side.key, secret=side.secret
    )

    assert response.status_code == 200, response.content
    processing.refresh_from_db()
    assert processing.completed_at is not None and processing.completed_at < ahead
    event = LedgerEvent.objects.get(kind="deletion_request.outcome_recorded")
    assert event.created_at < ahead


@pytest.mark.parametrize(
    "spelling", [str.lower, lambda text: text.replace("Z", "z")], ids=["t and z", "z"]
)
def test_a_completion_time_in_rfc_3339_lower_case_is_accepted(
    side: Side, processing: DeletionRequest, spelling: Callable[[str], str]
) -> None:
    # RFC 3339 (section 5.6) lets "T" and "Z" be written "t" and "z": as the outcomes API reads.
    broker_time = timezone.now() - dt.timedelta(minutes=1)
    body = body_for(processing, completed_at=spelling(utc_text(broker_time)))

    response = send(body, key=side.key, secret=side.secret)

    assert response.status_code == 200, response.content
    event = LedgerEvent.objects.get(kind="deletion_request.outcome_recorded")
    assert dt.datetime.fromisoformat(event.data["broker_completed_at"]) == broker_time


def test_the_same_completion_twice_is_200_and_a_different_one_409(
    side: Side, processing: DeletionRequest
) -> None:
    assert send(body_for(processing), key=side.key, secret=side.secret).status_code == 200
    before = snapshot(processing)

    again = send(body_for(processing), key=side.key, secret=side.secret, method="POST")
    other = send(body_for(processing, "not_found"), key=side.key, secret=side.secret)

    assert (again.status_code, again.json()["status"]) == (200, "unchanged")
    assert other.status_code == 409
    assert other.json()["code"] == "outcome_conflict"
    assert snapshot(processing) == before
    rejected = LedgerEvent.objects.get(kind="callback.rejected")
    assert (rejected.data["callback"], rejected.data["current"]) == ("isi", "deleted")


def test_failed_is_recorded_and_a_later_completion_replaces_it(
    side: Side, processing: DeletionRequest
) -> None:
    failed = body_for(processing, "failed", error_message="CRM locked the record")
    assert send(failed, key=side.key, secret=side.secret).status_code == 200
    assert snapshot(processing)[:2] == ("failed", "failed")

    response = send(body_for(processing), key=side.key, secret=side.secret)

    assert response.status_code == 200
    assert snapshot(processing)[:3] == ("completed", "deleted", 3)


def test_an_identifier_in_an_error_message_is_masked_on_the_row_and_in_the_ledger(
    side: Side, processing: DeletionRequest
) -> None:
    failed = body_for(processing, "failed", error_message="VIN 1HGCM82633A004352 not deleted")

    assert send(failed, key=side.key, secret=side.secret).status_code == 200

    assert snapshot(processing)[3] == "VIN <vin> not deleted"
    event = LedgerEvent.objects.get(kind="deletion_request.outcome_recorded")
    assert event.data["error_message"] == "VIN <vin> not deleted"


def test_the_previous_secret_is_accepted_within_24_hours_of_a_rotation(
    side: Side, processing: DeletionRequest
) -> None:
    integration_secret_rotate(integration=side.integration, actor="test")

    response = send(body_for(processing), key=side.key, secret=side.secret)

    assert response.status_code == 200


def test_the_callback_is_in_the_openapi_schema() -> None:
    schema = APIClient().get("/api/v1/schema?format=json").json()
    for method in ("put", "post"):
        operation = schema["paths"][ISI][method]
        assert {"200", "400", "401", "403", "404", "409", "413", "429"} <= set(
            operation["responses"]
        )


# -- rejected: each through HTTP, nothing changes -------------------------------------------


@pytest.mark.parametrize("case", cases_for(bad_callbacks.ISI))
def test_bad_input_is_refused_with_its_code_and_changes_nothing(
    side: Side, processing: DeletionRequest, case: str, signature_clock: float
) -> None:
    bad = BAD_CALLBACKS[case]
    status, code = bad.status, bad.code
    call: dict[str, Any] = {"payload": body_for(processing), "key": side.key, "secret": side.secret}
    call.update(bad.variant(side, processing, body_for))
    before = snapshot(processing)

    response = send(call.pop("payload"), **call)

    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == code
    assert snapshot(processing) == before
    # RFC 9110: a 401 names how to authenticate, whichever check refused it.
    assert response.get("WWW-Authenticate") == ("Bearer" if status == 401 else None)
    assert not OptOutRecord.objects.exists()
    if case in WITHOUT_A_VALID_KEY:
        assert not LedgerEvent.objects.filter(kind="callback.rejected").exists()
    else:
        rejected = LedgerEvent.objects.get(kind="callback.rejected")
        assert (rejected.data["code"], rejected.data["callback"]) == (code, "isi")
    assert not LedgerEvent.objects.filter(kind__startswith="deletion_request.").exists()


def test_validation_errors_are_keyed_by_field(side: Side, processing: DeletionRequest) -> None:
    for payload, field_name in [
        (body_for(processing, "failed"), "error_message"),
        (body_for(processing, "opted_out"), "identifiers.email[0].email"),
        (body_for(processing, completed_at="2026-11-21"), "completed_at"),
        (body_for(processing, "erased"), "drop_outcome"),
    ]:
        response = send(payload, key=side.key, secret=side.secret)
        assert response.status_code == 400
        assert field_name in response.json()["errors"], response.json()


def test_a_webhook_request_cannot_be_completed_here(side: Side) -> None:
    """Its results_token is not an ISI delete's, even with its own integration's secret."""
    created = webhook_integration_created(side.integration.broker, "https://crm.acme.example/drop")
    request = DeletionRequestFactory.create(
        integration=created.integration, results_token="ef" * 32
    )

    response = send(body_for(request), key=side.key, secret=created.webhook_secret)

    assert response.status_code == 404
    assert snapshot(request)[0] == RequestState.QUEUED
