"""The broker's signed callbacks over HTTP: every outcome, idempotency, and every bad input
with its status and ``code``, none of which changes a request.

Each bad-input case starts from the same signed, accepted callback and breaks one thing.
"""

from __future__ import annotations

import codecs
import datetime as dt
import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import DatabaseError, connection
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob
from rest_framework.test import APIClient, APIRequestFactory

from devtools.broker_simulator import BrokerSimulator
from integrations import enqueue, tasks
from integrations.dispatch import signing
from integrations.models import (
    ApiKey,
    Broker,
    DeletionRequest,
    Integration,
    LedgerEvent,
    OptOutRecord,
    RequestState,
    ResolutionRequest,
    SaasDeletion,
    WorkItem,
)
from integrations.services.dispatch import callback_rejections
from integrations.services.dispatch.deliveries import deletion_requests_deliver
from integrations.services.dispatch.redelivery import (
    deletion_request_redeliver,
    deletion_request_redispatch,
    resolution_request_redeliver,
)
from integrations.services.staff.integrations import integration_secret_rotate
from integrations.services.staff.keys import api_key_create
from integrations.web.throttling import throttle_address
from tests.api import bad_callbacks
from tests.api.bad_callbacks import (
    BAD_CALLBACKS,
    WITHOUT_A_VALID_KEY,
    cases_for,
    other_broker_key,
    revoked_key,
)
from tests.builders import (
    DeletionRequestFactory,
    ResolutionRequestFactory,
    SaasConnectionFactory,
    webhook_integration_created,
)
from tests.conftest import SIGNATURE_CLOCK

pytestmark = pytest.mark.django_db

DELETION = "/api/v1/drop/callbacks/deletion"
RESOLUTION = "/api/v1/drop/callbacks/resolution"
ISI = "/api/v1/drop/callbacks/isi"


@dataclass
class Broker_:
    """One broker's side: its callback key and the Webhook Secret of its integration."""

    key: str
    secret: str
    integration: Integration
    api_key: ApiKey
    extra_headers: dict[str, str] = field(default_factory=dict)


@pytest.fixture
def side(broker: Broker) -> Broker_:
    created = webhook_integration_created(broker, "https://crm.acme.example/drop")
    key = api_key_create(broker=broker, scopes=["webhook_callback"], actor="test")
    return Broker_(key.key, created.webhook_secret, created.integration, key.api_key)


@pytest.fixture
def dispatched(side: Broker_) -> DeletionRequest:
    return DeletionRequestFactory.create(
        integration=side.integration, state=RequestState.DISPATCHED, dispatched_at=timezone.now()
    )


def body_for(request: DeletionRequest, outcome: str = "deleted", **extra: Any) -> dict[str, Any]:
    return {
        "schema_version": "1.0",
        "status": "completed",
        "request_uuid": str(request.request_uuid),
        "drop_outcome": outcome,
        **extra,
    }


def put(
    path: str,
    payload: dict[str, Any] | bytes,
    *,
    key: str | None,
    secret: str | None,
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
    return APIClient().put(path, data=raw, content_type="application/json", **sent)


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


@pytest.mark.parametrize(("outcome", "code"), [("deleted", 3), ("not_found", 5), ("exempt", 2)])
def test_an_outcome_is_recorded_with_its_drop_code(
    side: Broker_, dispatched: DeletionRequest, outcome: str, code: int
) -> None:
    response = put(DELETION, body_for(dispatched, outcome), key=side.key, secret=side.secret)

    assert response.status_code == 200, response.content
    assert response.json() == {
        "status": "recorded",
        "request_uuid": str(dispatched.request_uuid),
        "drop_outcome": outcome,
    }
    dispatched.refresh_from_db()
    assert dispatched.state == RequestState.COMPLETED
    assert (dispatched.drop_outcome, dispatched.drop_status_code) == (outcome, code)
    assert dispatched.completed_at is not None
    event = LedgerEvent.objects.get(kind="deletion_request.outcome_recorded")
    assert event.subject == str(dispatched.request_uuid)
    assert event.actor == f"apikey:{side.api_key.prefix}"
    assert event.data["drop_status_code"] == code


@pytest.mark.parametrize("accept", ["text/plain", "text/html", "application/xml"])
def test_a_signed_callback_asking_for_another_media_type_is_recorded_and_answered_in_json(
    side: Broker_, dispatched: DeletionRequest, accept: str
) -> None:
    response = put(
        DELETION,
        body_for(dispatched),
        key=side.key,
        secret=side.secret,
        headers={"HTTP_ACCEPT": accept},
    )

    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/json"
    assert response.json()["status"] == "recorded"
    dispatched.refresh_from_db()
    assert dispatched.drop_outcome == "deleted"


def test_the_work_item_is_settled_with_the_outcome(
    side: Broker_, dispatched: DeletionRequest
) -> None:
    assert put(DELETION, body_for(dispatched), key=side.key, secret=side.secret).status_code == 200

    item = WorkItem.objects.get(deletion_requests=dispatched)
    assert (item.status_code, item.state) == (3, "reportable")


def test_a_recorded_callback_is_two_statements(
    side: Broker_, dispatched: DeletionRequest, django_assert_num_queries: Any
) -> None:
    # The hot path's design (docs/benchmarks.md, callbacks): the key with the request it
    # answers (sql/api_key_lookup.sql), then the outcome with its opt-out record, ledger
    # event and settlement (sql/deletion_outcome_record.sql).
    warm = DeletionRequestFactory.create(
        integration=side.integration, state=RequestState.DISPATCHED
    )
    put(DELETION, body_for(warm), key=side.key, secret=side.secret)  # stamps last_used_at
    with django_assert_num_queries(2) as captured:
        response = put(
            DELETION,
            body_for(dispatched, "opted_out", identifiers={"email": [{"email": "a@b.example"}]}),
            key=side.key,
            secret=side.secret,
        )
    assert response.status_code == 200, response.content
    assert "dropportal_api_key_lookup" in captured.captured_queries[0]["sql"]
    assert "dropportal_deletion_outcome_record" in captured.captured_queries[1]["sql"]
    assert OptOutRecord.objects.get(deletion_request=dispatched).email == "a@b.example"
    item = WorkItem.objects.get(deletion_requests=dispatched)
    assert (item.status_code, item.state) == (4, "reportable")


def generic_plans(sql: str, params: list[Any]) -> list[str]:
    """The plans of every statement ``sql`` runs, nested ones included, as PostgreSQL
    caches them for a connection (generic plans, forced)."""
    plans: list[str] = []
    with connection.cursor() as cursor:
        try:
            cursor.execute("LOAD 'auto_explain'")
        except DatabaseError:
            pytest.skip("auto_explain is not available on this server")
        # Plans an earlier test cached in this connection would be reused as they are.
        cursor.execute("DISCARD PLANS")
        for setting in (
            "plan_cache_mode = force_generic_plan",
            # The test's tables hold a few rows, where a server that has analyzed them (the
            # embedded one's autovacuum) rightly reads them whole: the question is which
            # index the plan takes once they are large.
            "enable_seqscan = off",
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_nested_statements = on",
            "auto_explain.log_level = notice",
            "client_min_messages = notice",
        ):
            cursor.execute(f"SET LOCAL {setting}")
        connection.connection.add_notice_handler(lambda d: plans.append(d.message_primary))
        cursor.execute(sql, params)
    return plans


# The lookup's plan is cached per connection (sql/api_key_lookup.sql). One cached while the
# tables were nearly empty once found the request through the broker_id index, reading every
# request of the broker for every callback, slower as they grew; another through the
# isi_connection_id index, where every webhook request is NULL. Read the generic plan
# PostgreSQL would keep: the request is found by the index of the key the callback names,
# and by no other.


@pytest.mark.parametrize("kind", ["webhook", "isi"])
def test_the_cached_lookup_plan_finds_the_request_by_its_key_alone(
    side: Broker_, dispatched: DeletionRequest, kind: str
) -> None:
    plans = generic_plans(
        "SELECT * FROM dropportal_api_key_lookup(%s, %s, %s)",
        [side.api_key.digest, kind, str(dispatched.request_uuid) if kind == "webhook" else "t"],
    )
    (plan,) = [p for p in plans if "integrations_deletionrequest" in p]
    key = {
        "webhook": "integrations_deletionrequest_request_uuid_key",
        "isi": "deletion_request_results_token",
    }[kind]
    used = re.findall(r"Index (?:Only )?Scan using (\S+) on integrations_deletionrequest", plan)
    assert used == [key], plan


def test_opted_out_keeps_the_email_verbatim_and_out_of_the_ledger(
    side: Broker_, dispatched: DeletionRequest
) -> None:
    email = " Ann.Smith+drop@Example.COM "
    body = body_for(dispatched, "opted_out", identifiers={"email": [{"email": email}]})

    response = put(DELETION, body, key=side.key, secret=side.secret)

    assert response.status_code == 200, response.content
    record = OptOutRecord.objects.get(deletion_request=dispatched)
    assert record.email == email
    assert dispatched.__class__.objects.get(pk=dispatched.pk).drop_status_code == 4
    with connection.cursor() as cursor:
        cursor.execute("SELECT email FROM integrations_optoutrecord")
        (stored,) = cursor.fetchone()
    assert "Ann.Smith" not in stored  # encrypted at rest
    assert not LedgerEvent.objects.filter(data__icontains="Ann.Smith").exists()
    assert "Ann.Smith" not in json.dumps(list(LedgerEvent.objects.values_list("data", flat=True)))


def _failed_with(message: str, side: Broker_, dispatched: DeletionRequest) -> Any:
    """The broker's signed callback: ``dispatched`` failed, for ``message``."""
    return put(
        DELETION,
        body_for(dispatched, "failed", error_message=message),
        key=side.key,
        secret=side.secret,
    )


def test_a_long_error_message_is_recorded_cut_at_2000_characters(
    side: Broker_, dispatched: DeletionRequest
) -> None:
    message = "Stack trace: " + "x" * 5000

    response = _failed_with(message, side, dispatched)

    assert response.status_code == 200, response.content
    dispatched.refresh_from_db()
    assert dispatched.state == "failed"
    assert dispatched.error_message == message[:2000]


def test_an_identifier_in_an_error_message_is_masked_on_the_row_and_in_the_ledger(
    side: Broker_, dispatched: DeletionRequest
) -> None:
    message = "cannot delete Ann.Smith@Example.com (+1 415 555 9317): record locked"

    response = _failed_with(message, side, dispatched)

    assert response.status_code == 200, response.content
    dispatched.refresh_from_db()
    assert dispatched.error_message == "cannot delete <email> (<number>): record locked"
    event = LedgerEvent.objects.get(kind="deletion_request.outcome_recorded")
    assert event.data["error_message"] == dispatched.error_message
    again = _failed_with(message, side, dispatched)  # a repeat is judged on what was kept
    assert again.json()["status"] == "unchanged"


def test_an_error_message_keeps_the_requests_own_uuid_and_masks_any_other(
    side: Broker_, dispatched: DeletionRequest
) -> None:
    # Google's advertising ID is written as a request UUID is: only the row's own is ours.
    message = f"request {dispatched.request_uuid}: device 38400000-8cf0-11bd-b23e-10b96e40000d"

    response = put(
        DELETION,
        body_for(dispatched, "failed", error_message=message),
        key=side.key,
        secret=side.secret,
    )

    assert response.status_code == 200, response.content
    dispatched.refresh_from_db()
    assert dispatched.error_message == f"request {dispatched.request_uuid}: device <maid>"


def test_failed_is_recorded_and_a_later_outcome_replaces_it(
    side: Broker_, dispatched: DeletionRequest
) -> None:
    failed = body_for(dispatched, "failed", error_message="CRM timeout")

    assert put(DELETION, failed, key=side.key, secret=side.secret).status_code == 200
    dispatched.refresh_from_db()
    assert (dispatched.state, dispatched.drop_outcome) == ("failed", "failed")
    assert dispatched.error_message == "CRM timeout"
    assert dispatched.drop_status_code is None

    response = put(DELETION, body_for(dispatched, "deleted"), key=side.key, secret=side.secret)

    assert response.status_code == 200
    dispatched.refresh_from_db()
    assert (dispatched.state, dispatched.drop_outcome, dispatched.drop_status_code) == (
        "completed",
        "deleted",
        3,
    )


def test_the_same_outcome_twice_is_200_and_changes_nothing(
    side: Broker_, dispatched: DeletionRequest
) -> None:
    assert put(DELETION, body_for(dispatched), key=side.key, secret=side.secret).status_code == 200
    before = snapshot(dispatched)

    response = put(DELETION, body_for(dispatched), key=side.key, secret=side.secret)

    assert response.status_code == 200
    assert response.json()["status"] == "unchanged"
    assert snapshot(dispatched) == before
    assert LedgerEvent.objects.filter(kind="deletion_request.outcome_recorded").count() == 1
    assert LedgerEvent.objects.filter(kind="deletion_request.outcome_repeated").count() == 1


def test_a_callback_that_overtakes_its_acknowledgement_is_recorded(
    side: Broker_,
) -> None:
    queued = DeletionRequestFactory.create(integration=side.integration, state=RequestState.QUEUED)

    response = put(DELETION, body_for(queued), key=side.key, secret=side.secret)

    assert response.status_code == 200
    queued.refresh_from_db()
    assert queued.state == RequestState.COMPLETED
    assert queued.dispatched_at is not None


def test_the_previous_secret_is_accepted_within_24_hours_of_a_rotation(
    side: Broker_, dispatched: DeletionRequest
) -> None:
    integration_secret_rotate(integration=side.integration, actor="test")

    response = put(DELETION, body_for(dispatched), key=side.key, secret=side.secret)

    assert response.status_code == 200


def test_the_callback_is_in_the_openapi_schema() -> None:
    schema = APIClient().get("/api/v1/schema?format=json").json()
    for path in (DELETION, RESOLUTION):
        operation = schema["paths"][path]["put"]
        assert {"200", "400", "401", "403", "404", "409", "413", "429"} <= set(
            operation["responses"]
        )
        assert {"apiKey": []} in operation["security"]
    assert schema["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"


# -- rejected: each through HTTP, nothing changes -------------------------------------------


@pytest.mark.parametrize("case", cases_for(bad_callbacks.DELETION))
def test_bad_input_is_refused_with_its_code_and_changes_nothing(
    side: Broker_, dispatched: DeletionRequest, case: str, signature_clock: float
) -> None:
    bad = BAD_CALLBACKS[case]
    status, code = bad.status, bad.code
    call: dict[str, Any] = {"payload": body_for(dispatched), "key": side.key, "secret": side.secret}
    call.update(bad.variant(side, dispatched, body_for))
    before = snapshot(dispatched)

    response = put(DELETION, call.pop("payload"), **call)

    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == code
    assert problem["status"] == status
    assert snapshot(dispatched) == before
    # RFC 9110: a 401 names how to authenticate, whichever check refused it.
    assert response.get("WWW-Authenticate") == ("Bearer" if status == 401 else None)
    assert not OptOutRecord.objects.exists()
    if case in WITHOUT_A_VALID_KEY:
        assert not LedgerEvent.objects.filter(kind="callback.rejected").exists()
    else:
        rejected = LedgerEvent.objects.get(kind="callback.rejected")
        assert rejected.data["code"] == code
        assert rejected.data["callback"] == "deletion"
    assert not LedgerEvent.objects.filter(kind__startswith="deletion_request.").exists()


@pytest.mark.parametrize("spelling", bad_callbacks.UUID_SPELLINGS)
def test_a_request_uuid_spelt_otherwise_is_told_the_form_it_was_sent_in(
    side: Broker_, dispatched: DeletionRequest, spelling: str
) -> None:
    sent = bad_callbacks.UUID_SPELLINGS[spelling](dispatched.request_uuid)

    response = put(
        DELETION, body_for(dispatched, request_uuid=sent), key=side.key, secret=side.secret
    )

    assert response.status_code == 400, response.content
    problem = response.json()
    assert problem["detail"] == (
        "request_uuid must be echoed as the dispatch wrote it: hexadecimal digits, 8-4-4-4-12."
    )
    assert problem["errors"] == {
        "request_uuid": [
            "Must be the UUID as the service wrote it: hexadecimal digits, 8-4-4-4-12."
        ]
    }
    assert LedgerEvent.objects.get(kind="callback.rejected").data["fields"] == ["request_uuid"]


def test_a_byte_order_mark_is_skipped(side: Broker_, dispatched: DeletionRequest) -> None:
    # RFC 8259 lets a parser ignore one; some platforms' writers add it.
    body = codecs.BOM_UTF8 + json.dumps(body_for(dispatched)).encode()

    response = put(DELETION, body, key=side.key, secret=side.secret)

    assert response.status_code == 200, response.content
    dispatched.refresh_from_db()
    assert dispatched.drop_outcome == "deleted"


def test_a_request_uuid_in_upper_case_is_the_same_request(
    side: Broker_, dispatched: DeletionRequest
) -> None:
    # RFC 9562: a UUID's text is read in either case; a broker's database may give it back so.
    sent = str(dispatched.request_uuid).upper()

    response = put(
        DELETION, body_for(dispatched, request_uuid=sent), key=side.key, secret=side.secret
    )

    assert response.status_code == 200, response.content
    dispatched.refresh_from_db()
    assert dispatched.drop_outcome == "deleted"


@pytest.mark.parametrize("skew", [-300, 300], ids=["300 s old", "300 s ahead"])
def test_a_timestamp_at_the_windows_edge_is_accepted(
    side: Broker_, dispatched: DeletionRequest, signature_clock: float, skew: int
) -> None:
    # The stopped clock makes the edge exact: 300 s away is in, 301 s (above) is out.
    response = put(
        DELETION, body_for(dispatched), key=side.key, secret=side.secret, now=signature_clock + skew
    )

    assert response.status_code == 200, response.content


def test_validation_errors_are_keyed_by_field(side: Broker_, dispatched: DeletionRequest) -> None:
    for payload, field_name in [
        (body_for(dispatched, "failed"), "error_message"),
        (body_for(dispatched, "opted_out"), "identifiers.email[0].email"),
        ({**body_for(dispatched), "schema_version": "2.0"}, "schema_version"),
        (body_for(dispatched, "erased"), "drop_outcome"),
    ]:
        response = put(DELETION, payload, key=side.key, secret=side.secret)
        assert response.status_code == 400
        assert field_name in response.json()["errors"], response.json()


@pytest.mark.parametrize(
    ("field_name", "value", "message"),
    [
        ("schema_version", 1.0, 'Must be the string "1.0".'),
        ("schema_version", 1, 'Must be the string "1.0".'),
        ("status", True, 'Must be the string "completed".'),
        (
            "drop_outcome",
            3,
            'Must be a string, one of "deleted", "not_found", "opted_out", "exempt", "failed".',
        ),
    ],
    ids=["schema_version 1.0", "schema_version 1", "status true", "drop_outcome 3"],
)
def test_a_choice_sent_as_another_json_type_is_told_to_send_the_string(
    side: Broker_, dispatched: DeletionRequest, field_name: str, value: Any, message: str
) -> None:
    payload = {**body_for(dispatched), field_name: value}

    response = put(DELETION, payload, key=side.key, secret=side.secret)

    assert response.status_code == 400, response.content
    assert response.json()["errors"] == {field_name: [message]}


def test_a_different_final_outcome_is_a_409_conflict_recorded_in_the_ledger(
    side: Broker_, dispatched: DeletionRequest
) -> None:
    assert put(DELETION, body_for(dispatched), key=side.key, secret=side.secret).status_code == 200
    before = snapshot(dispatched)

    response = put(DELETION, body_for(dispatched, "not_found"), key=side.key, secret=side.secret)

    assert response.status_code == 409
    assert response.json()["code"] == "outcome_conflict"
    assert snapshot(dispatched) == before
    rejected = LedgerEvent.objects.get(kind="callback.rejected")
    assert rejected.subject == str(dispatched.request_uuid)
    assert (rejected.data["current"], rejected.data["attempted"]) == ("deleted", "not_found")


def test_a_second_opt_out_with_another_email_is_a_conflict(
    side: Broker_, dispatched: DeletionRequest
) -> None:
    first = body_for(dispatched, "opted_out", identifiers={"email": [{"email": "a@x.com"}]})
    second = body_for(dispatched, "opted_out", identifiers={"email": [{"email": "b@x.com"}]})
    assert put(DELETION, first, key=side.key, secret=side.secret).status_code == 200

    assert put(DELETION, first, key=side.key, secret=side.secret).status_code == 200
    response = put(DELETION, second, key=side.key, secret=side.secret)

    assert response.status_code == 409
    assert OptOutRecord.objects.get().email == "a@x.com"
    # It says which detail differs, not that 'opted_out' is refused; and names no email.
    detail = response.json()["detail"]
    assert detail == (
        "The request already has the outcome 'opted_out' with another"
        " identifiers.email[0].email; it is kept, and this one is refused."
    )
    rejected = LedgerEvent.objects.get(kind="callback.rejected")
    assert rejected.data["detail"] == detail
    assert "@x.com" not in json.dumps(rejected.data)


def test_a_cancelled_request_takes_no_outcome(side: Broker_) -> None:
    cancelled = DeletionRequestFactory.create(
        integration=side.integration, state=RequestState.CANCELLED
    )
    before = snapshot(cancelled)

    response = put(DELETION, body_for(cancelled), key=side.key, secret=side.secret)

    assert response.status_code == 409
    assert response.json()["code"] == "outcome_conflict"
    assert snapshot(cancelled) == before


# -- a failure redispatched ------------------------------------------------------------------
# A redispatch sends the same request_uuid again, and a callback carries no dispatch id: while
# the redispatch waits to be sent no callback can answer it, so a failed then answers the
# dispatch before it, whose failure is on record.


@pytest.fixture
def receiver(settings: Any) -> Iterator[BrokerSimulator]:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    with BrokerSimulator() as running:
        yield running


@pytest.fixture
def looped(broker: Broker, receiver: BrokerSimulator) -> Broker_:
    """A broker whose integration is the loopback simulator: dispatches really go out."""
    created = webhook_integration_created(broker, receiver.url)
    receiver.secrets = [created.webhook_secret]
    key = api_key_create(broker=broker, scopes=["webhook_callback"], actor="test")
    return Broker_(key.key, created.webhook_secret, created.integration, key.api_key)


def failed_and_redispatched(side: Broker_, receiver: BrokerSimulator) -> DeletionRequest:
    """Dispatched (the broker has it), answered failed, then redispatched by staff."""
    request = DeletionRequestFactory.create(integration=side.integration)
    assert deletion_requests_deliver(request_ids=[request.pk]) == {"delivered": 1}
    failed = body_for(request, "failed", error_message="CRM timeout")
    assert put(DELETION, failed, key=side.key, secret=side.secret).json()["status"] == "recorded"
    deletion_request_redispatch(deletion_request=request, actor="staff:ann")
    assert len(receiver.received) == 1  # queued, not sent yet
    return request


def delivery_job_run(request: DeletionRequest) -> Any:
    """Run the delivery job the redispatch queued, as the worker does."""
    # Due by the database's clock, which stands still at the test transaction's start.
    DeletionRequest.objects.filter(pk=request.pk, next_attempt_at__isnull=False).update(
        next_attempt_at=timezone.now() - dt.timedelta(hours=1)
    )
    (job,) = ProcrastinateJob.objects.filter(
        task_name=enqueue.DELIVER_DELETION_REQUESTS, args__request_ids=[request.pk]
    )
    return tasks.deliver_deletion_requests(**job.args)


def test_a_stale_failure_before_the_redispatch_is_sent_changes_nothing_and_it_goes_out(
    looped: Broker_, receiver: BrokerSimulator
) -> None:
    request = failed_and_redispatched(looped, receiver)
    queued = snapshot(request)
    failed = body_for(request, "failed", error_message="CRM timeout")

    response = put(DELETION, failed, key=looped.key, secret=looped.secret)

    assert response.status_code == 200, response.content
    assert response.json() == {
        "status": "unchanged",
        "request_uuid": str(request.request_uuid),
        "drop_outcome": "failed",
    }
    assert snapshot(request) == queued
    assert queued[:2] == (RequestState.QUEUED, "")  # still awaiting the redispatch's outcome
    # What an identical repeat records: the attempt, and no outcome.
    recorded = LedgerEvent.objects.filter(kind="deletion_request.outcome_recorded")
    assert recorded.count() == 1
    repeated = LedgerEvent.objects.get(kind="deletion_request.outcome_repeated")
    assert (repeated.subject, repeated.actor, repeated.data) == (
        str(request.request_uuid),
        recorded.get().actor,
        {"drop_outcome": "failed"},
    )

    delivery_job_run(request)

    first, again = receiver.received
    assert again.json["request_uuid"] == first.json["request_uuid"] == str(request.request_uuid)
    assert again.json["webhook_request_id"] != first.json["webhook_request_id"]
    request.refresh_from_db()
    assert (request.state, request.drop_outcome) == (RequestState.DISPATCHED, "")


def test_a_stale_failure_with_another_message_before_the_redispatch_is_sent_is_unchanged(
    looped: Broker_, receiver: BrokerSimulator
) -> None:
    # Its error cannot be compared (the redispatch cleared it), and the request is about to be
    # sent again anyway, which is all a failure asks for.
    request = failed_and_redispatched(looped, receiver)
    failed = body_for(request, "failed", error_message="CRM down for maintenance")

    response = put(DELETION, failed, key=looped.key, secret=looped.secret)

    assert (response.status_code, response.json()["status"]) == (200, "unchanged")
    request.refresh_from_db()
    assert request.state == RequestState.QUEUED


def test_a_final_outcome_before_the_redispatch_is_sent_is_recorded_and_nothing_goes_out(
    looped: Broker_, receiver: BrokerSimulator
) -> None:
    request = failed_and_redispatched(looped, receiver)

    response = put(DELETION, body_for(request, "deleted"), key=looped.key, secret=looped.secret)

    assert (response.status_code, response.json()["status"]) == (200, "recorded")
    delivery_job_run(request)

    assert len(receiver.received) == 1  # the broker answered: the redispatch is not sent
    request.refresh_from_db()
    assert (request.state, request.drop_outcome) == (RequestState.COMPLETED, "deleted")


def test_a_failure_once_the_redispatch_is_sent_is_recorded(
    looped: Broker_, receiver: BrokerSimulator
) -> None:
    # Sent, it may be the redispatch's own answer: a callback names no dispatch, so a stale
    # one cannot be told from it (docs/contracts.md §5.3).
    request = failed_and_redispatched(looped, receiver)
    delivery_job_run(request)
    failed = body_for(request, "failed", error_message="CRM timeout")

    response = put(DELETION, failed, key=looped.key, secret=looped.secret)

    assert (response.status_code, response.json()["status"]) == (200, "recorded")
    request.refresh_from_db()
    assert (request.state, request.drop_outcome) == (RequestState.FAILED, "failed")


def test_a_failure_before_a_redelivery_is_sent_is_recorded(
    looped: Broker_, receiver: BrokerSimulator
) -> None:
    # A redelivery resends what got no answer: the broker may well have had it, and its first
    # failure is a new outcome, even after an earlier redispatch (the one redelivered).
    request = failed_and_redispatched(looped, receiver)
    delivery_job_run(request)
    deletion_request_redeliver(deletion_request=request, actor="staff:ann")
    failed = body_for(request, "failed", error_message="CRM timeout")

    response = put(DELETION, failed, key=looped.key, secret=looped.secret)

    assert (response.status_code, response.json()["status"]) == (200, "recorded")
    request.refresh_from_db()
    assert request.state == RequestState.FAILED


def test_more_callbacks_than_the_keys_rate_get_429_with_retry_after(
    side: Broker_, dispatched: DeletionRequest, settings
) -> None:
    settings.DROPPORTAL_CALLBACK_RATE_LIMIT = 1  # bursts of 2
    others = [
        DeletionRequestFactory.create(integration=side.integration, state="dispatched")
        for _ in range(2)
    ]

    answers = [
        put(DELETION, body_for(r), key=side.key, secret=side.secret) for r in [*others, dispatched]
    ]

    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[2].json()["code"] == "rate_limited"
    assert int(answers[2]["Retry-After"]) >= 1
    assert snapshot(dispatched)[0] == RequestState.DISPATCHED
    assert LedgerEvent.objects.get(kind="callback.rejected").data["code"] == "rate_limited"


# -- resolution -----------------------------------------------------------------------------


@pytest.fixture
def notified(side: Broker_) -> ResolutionRequest:
    return ResolutionRequestFactory.create(
        integration=side.integration, state=RequestState.DISPATCHED
    )


def resolution_body(request: ResolutionRequest, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "status": "completed",
        "results_token": request.results_token,
        "identifiers": {
            "email": [{"email": "Ann.Smith@Example.com"}],
            "phone": [{"phone": "+14155559317"}],
        },
    }
    body.update(extra)
    return {k: v for k, v in body.items() if v is not None}


def test_resolved_identifiers_are_kept_encrypted_and_start_one_saas_deletion_per_connection(
    side: Broker_, notified: ResolutionRequest
) -> None:
    broker = side.integration.broker
    mailer = SaasConnectionFactory.create(
        broker=broker, url="https://api.mailer.example/erase", name="Mailer"
    )
    paused = SaasConnectionFactory.create(
        broker=broker, url="https://ads.example/erase", name="Ads", enabled=False
    )
    SaasConnectionFactory.create(  # gone for good: no deletion for it
        broker=broker, url="https://old.example/erase", name="Old", enabled=False,
        retired_at=timezone.now(), retired_reason="contract ended",
    )  # fmt: skip

    response = put(RESOLUTION, resolution_body(notified), key=side.key, secret=side.secret)

    assert response.status_code == 200, response.content
    assert response.json()["request_uuid"] == str(notified.request_uuid)
    notified.refresh_from_db()
    assert notified.state == RequestState.COMPLETED
    assert json.loads(notified.identifiers) == resolution_body(notified)["identifiers"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT identifiers FROM integrations_resolutionrequest")
        (stored,) = cursor.fetchone()
    assert "Ann.Smith" not in stored
    # One each for the enabled and the paused connection (that one waits until enabled).
    deletions = list(SaasDeletion.objects.order_by("pk"))
    assert {d.saas_connection for d in deletions} == {mailer, paused}
    assert {d.state for d in deletions} == {RequestState.QUEUED}
    jobs = ProcrastinateJob.objects.filter(task_name="integrations.tasks.deliver_saas_deletions")
    assert sorted(pk for job in jobs for pk in job.args["deletion_ids"]) == [
        d.pk for d in deletions
    ]
    event = LedgerEvent.objects.get(kind="resolution_request.outcome_recorded")
    assert event.data["identifiers"] == {"email": 1, "phone": 1}
    assert "Ann.Smith" not in json.dumps(event.data)


def test_a_category_keyed_by_an_identifier_is_ledgered_by_its_length(
    side: Broker_, notified: ResolutionRequest
) -> None:
    SaasConnectionFactory.create(
        broker=side.integration.broker, url="https://api.mailer.example/erase", name="Mailer"
    )
    body = resolution_body(notified)
    body["identifiers"]["alice@example.com"] = [{"alice@example.com": "true"}]

    response = put(RESOLUTION, body, key=side.key, secret=side.secret)

    assert response.status_code == 200, response.content
    event = LedgerEvent.objects.get(kind="resolution_request.outcome_recorded")
    assert event.data["identifiers"] == {"email": 1, "phone": 1, "<key of 17 characters>": 1}
    assert "alice" not in json.dumps(list(LedgerEvent.objects.values_list("data", flat=True)))


@pytest.mark.parametrize(
    "answer",
    [{"drop_outcome": "opted_out"}, {"drop_outcome": "exempt", "exemption_basis": "glba"}],
)
def test_opted_out_or_exempt_starts_no_saas_deletion_and_keeps_nothing(
    side: Broker_, notified: ResolutionRequest, answer: dict[str, str]
) -> None:
    SaasConnectionFactory.create(
        broker=side.integration.broker, url="https://api.mailer.example/erase"
    )

    response = put(
        RESOLUTION, resolution_body(notified, **answer), key=side.key, secret=side.secret
    )

    assert response.status_code == 200
    notified.refresh_from_db()
    assert notified.drop_outcome == answer["drop_outcome"]
    assert notified.exemption_basis == answer.get("exemption_basis", "")
    assert notified.identifiers == ""
    assert notified.identifiers_purged_at is not None
    assert not SaasDeletion.objects.exists()
    opted_out = answer["drop_outcome"] == "opted_out"
    # The opted-out email is kept verbatim, as the opt-out record, and only there.
    records = list(OptOutRecord.objects.filter(resolution_request=notified))
    assert [r.email for r in records] == (["Ann.Smith@Example.com"] if opted_out else [])
    event = LedgerEvent.objects.get(kind="resolution_request.outcome_recorded")
    assert event.data["opt_out_record"] is opted_out
    assert "Ann.Smith" not in json.dumps(event.data)


def test_an_identifier_in_an_exemption_basis_is_masked_on_the_row_and_in_the_ledger(
    side: Broker_, notified: ResolutionRequest
) -> None:
    answer = resolution_body(
        notified, drop_outcome="exempt", exemption_basis="legal_hold for ann.smith@example.com"
    )

    response = put(RESOLUTION, answer, key=side.key, secret=side.secret)

    assert response.status_code == 200, response.content
    notified.refresh_from_db()
    assert notified.exemption_basis == "legal_hold for <email>"
    event = LedgerEvent.objects.get(kind="resolution_request.outcome_recorded")
    assert event.data["exemption_basis"] == "legal_hold for <email>"
    again = put(RESOLUTION, answer, key=side.key, secret=side.secret)
    assert again.json()["status"] == "unchanged"  # a repeat is judged on what was kept


def test_an_exemption_basis_keeps_the_requests_own_uuid_and_masks_any_other(
    side: Broker_, notified: ResolutionRequest
) -> None:
    basis = f"{notified.request_uuid} 38400000-8cf0-11bd-b23e-10b96e40000d"
    answer = resolution_body(notified, drop_outcome="exempt", exemption_basis=basis)

    response = put(RESOLUTION, answer, key=side.key, secret=side.secret)

    assert response.status_code == 200, response.content
    notified.refresh_from_db()
    assert notified.exemption_basis == f"{notified.request_uuid} <maid>"


def test_a_repeated_opt_out_with_another_email_is_refused(
    side: Broker_, notified: ResolutionRequest
) -> None:
    opted_out = resolution_body(notified, drop_outcome="opted_out")
    assert put(RESOLUTION, opted_out, key=side.key, secret=side.secret).status_code == 200

    again = put(RESOLUTION, opted_out, key=side.key, secret=side.secret)
    other = put(
        RESOLUTION,
        {**opted_out, "identifiers": {"email": [{"email": "ann.smith@example.com"}]}},
        key=side.key,
        secret=side.secret,
    )

    assert again.json()["status"] == "unchanged"
    assert other.status_code == 409
    assert [r.email for r in OptOutRecord.objects.all()] == ["Ann.Smith@Example.com"]


def test_the_same_resolution_answer_twice_is_200_and_a_different_one_409(
    side: Broker_, notified: ResolutionRequest
) -> None:
    SaasConnectionFactory.create(
        broker=side.integration.broker, url="https://api.mailer.example/erase"
    )
    assert (
        put(RESOLUTION, resolution_body(notified), key=side.key, secret=side.secret).status_code
        == 200
    )

    again = put(RESOLUTION, resolution_body(notified), key=side.key, secret=side.secret)
    other = put(
        RESOLUTION,
        resolution_body(notified, identifiers={"email": [{"email": "someone@else.com"}]}),
        key=side.key,
        secret=side.secret,
    )

    assert again.status_code == 200
    assert again.json()["status"] == "unchanged"
    assert other.status_code == 409
    assert other.json()["code"] == "outcome_conflict"
    assert other.json()["detail"] == (
        "The request already has an answer with another identifiers; it is kept, and this one"
        " is refused."
    )
    assert SaasDeletion.objects.count() == 1


RESOLUTION_BAD_INPUTS: dict[str, tuple[Callable[[ResolutionRequest], dict[str, Any]], int, str]] = {
    "exempt without exemption_basis": (
        lambda r: resolution_body(r, drop_outcome="exempt"),
        400,
        "validation_failed",
    ),
    "unknown results_token": (
        lambda r: resolution_body(r, results_token="ab" * 32),
        404,
        "not_found",
    ),
    "no results_token": (
        lambda r: {k: v for k, v in resolution_body(r).items() if k != "results_token"},
        400,
        "validation_failed",
    ),
    "opted_out without the email": (
        lambda r: resolution_body(
            r, drop_outcome="opted_out", identifiers={"phone": [{"phone": "+14155559317"}]}
        ),
        400,
        "validation_failed",
    ),
    "wrong status": (lambda r: resolution_body(r, status="done"), 400, "validation_failed"),
    "drop_outcome not allowed here": (
        lambda r: resolution_body(r, drop_outcome="deleted"),
        400,
        "validation_failed",
    ),
    "identifiers not arrays of objects": (
        lambda r: resolution_body(r, identifiers={"email": "Ann.Smith@Example.com"}),
        400,
        "validation_failed",
    ),
    "no identifiers and no outcome": (
        lambda r: {k: v for k, v in resolution_body(r).items() if k != "identifiers"},
        400,
        "validation_failed",
    ),
    "an email object without its email key": (
        lambda r: resolution_body(r, identifiers={"email": [{"address": "a@x.com"}]}),
        400,
        "validation_failed",
    ),
    "a phone object without its phone key": (
        lambda r: resolution_body(r, identifiers={"phone": [{"number": "+14155559317"}]}),
        400,
        "validation_failed",
    ),
}


def test_a_redelivered_notification_keeps_its_token_and_either_answer_is_the_requests_one(
    side: Broker_, notified: ResolutionRequest
) -> None:
    """A redelivery sends the same request again (same ``results_token``, a new
    ``webhook_request_id``), and only while it has no answer: the broker's answer to the
    first notification answers it; one differing answer to the second is a 409; and once
    answered, nothing is sent again under that token."""
    SaasConnectionFactory.create(  # the identifiers are kept, and compared, for its deletion
        broker=side.integration.broker, url="https://api.mailer.example/erase", name="Mailer"
    )
    first_id = notified.webhook_request_id
    redelivered = resolution_request_redeliver(resolution_request=notified, actor="staff:ann")
    assert redelivered.results_token == notified.results_token
    assert redelivered.webhook_request_id != first_id

    answer_to_first = put(RESOLUTION, resolution_body(notified), key=side.key, secret=side.secret)
    other = resolution_body(notified, identifiers={"email": [{"email": "bob@example.com"}]})
    answer_to_second = put(RESOLUTION, other, key=side.key, secret=side.secret)

    assert (answer_to_first.status_code, answer_to_first.json()["status"]) == (200, "recorded")
    assert answer_to_second.status_code == 409
    assert answer_to_second.json()["code"] == "outcome_conflict"
    notified.refresh_from_db()
    assert json.loads(notified.identifiers or "{}") in (
        {},
        resolution_body(notified)["identifiers"],
    )
    assert notified.state == RequestState.COMPLETED
    with pytest.raises(ValidationError, match="the broker has answered it"):
        resolution_request_redeliver(resolution_request=notified, actor="staff:ann")


@pytest.mark.parametrize("case", RESOLUTION_BAD_INPUTS, ids=list(RESOLUTION_BAD_INPUTS))
def test_bad_resolution_input_is_refused_and_changes_nothing(
    side: Broker_, notified: ResolutionRequest, case: str
) -> None:
    SaasConnectionFactory.create(
        broker=side.integration.broker, url="https://api.mailer.example/erase"
    )
    make, status, code = RESOLUTION_BAD_INPUTS[case]

    response = put(RESOLUTION, make(notified), key=side.key, secret=side.secret)

    assert response.status_code == status, response.content
    assert response.json()["code"] == code
    notified.refresh_from_db()
    assert (notified.state, notified.identifiers, notified.completed_at) == ("dispatched", "", None)
    assert not SaasDeletion.objects.exists()
    assert LedgerEvent.objects.get(kind="callback.rejected").data["callback"] == "resolution"


# Each: the identifiers answered, the object at fault by its path, and its error.
WRONG_OBJECTS: dict[str, tuple[dict[str, Any], tuple[str, str], str]] = {
    "without its category's key": (
        {
            "email": [{"email": "Ann.Smith@Example.com"}],
            "phone": [{"phone": "+14155559317"}, {"number": "+14155559318"}],
        },
        ("phone", "1"),
        "This field is required.",
    ),
    "its category's key not a string": (
        {"email": [{"email": "Ann.Smith@Example.com"}, {"email": 5, "primary": True}]},
        ("email", "1"),
        "Not a valid string.",
    ),
}


@pytest.mark.parametrize("case", WRONG_OBJECTS, ids=list(WRONG_OBJECTS))
def test_an_object_of_the_wrong_shape_is_named_by_its_path(
    side: Broker_, notified: ResolutionRequest, case: str
) -> None:
    identifiers, (category, index), error = WRONG_OBJECTS[case]

    response = put(
        RESOLUTION,
        resolution_body(notified, identifiers=identifiers),
        key=side.key,
        secret=side.secret,
    )

    assert response.status_code == 400, response.content
    assert response.json()["errors"] == {"identifiers": {category: {index: {category: [error]}}}}
    rejected = LedgerEvent.objects.get(kind="callback.rejected")
    assert rejected.data["fields"] == ["identifiers"]
    assert "example.com" not in json.dumps(rejected.data).lower()
    assert "1415555931" not in json.dumps(rejected.data)


@pytest.mark.parametrize(
    "identifiers",
    [
        {},
        {"email": []},
        {"email": [{"email": "Ann.Smith@Example.com", "type": "work"}]},
        {"email": [{"email": "Ann.Smith@Example.com", "primary": True, "rank": 1, "x": None}]},
    ],
    ids=[
        "no category",
        "an empty category",
        "a key besides the category's",
        "keys of other JSON types besides it",
    ],
)
def test_nothing_resolved_or_a_key_besides_the_categorys_is_accepted(
    side: Broker_, notified: ResolutionRequest, identifiers: dict[str, Any]
) -> None:
    response = put(
        RESOLUTION,
        resolution_body(notified, identifiers=identifiers),
        key=side.key,
        secret=side.secret,
    )

    assert response.status_code == 200, response.content
    notified.refresh_from_db()
    assert notified.state == RequestState.COMPLETED


@pytest.mark.parametrize(
    "answer",
    [{"drop_outcome": "opted_out"}, {"drop_outcome": "exempt", "exemption_basis": "glba"}],
)
def test_identifiers_null_with_an_outcome_is_taken_as_absent(
    side: Broker_, notified: ResolutionRequest, answer: dict[str, str]
) -> None:
    body = {**resolution_body(notified, **answer), "identifiers": None}

    response = put(RESOLUTION, body, key=side.key, secret=side.secret)

    if answer["drop_outcome"] == "exempt":
        assert response.status_code == 200, response.content
        notified.refresh_from_db()
        assert (notified.drop_outcome, notified.identifiers) == ("exempt", "")
    else:  # its email is read from the identifiers, so null lacks it as absent would
        assert response.status_code == 400, response.content
        assert response.json()["errors"] == {
            "identifiers.email[0].email": ["Required when drop_outcome is 'opted_out'."]
        }


def test_identifiers_null_without_an_outcome_is_refused_as_absent(
    side: Broker_, notified: ResolutionRequest
) -> None:
    absent = resolution_body(notified)
    del absent["identifiers"]

    answers = [
        put(RESOLUTION, body, key=side.key, secret=side.secret)
        for body in (absent, {**absent, "identifiers": None})
    ]

    assert [a.status_code for a in answers] == [400, 400]
    assert (
        answers[1].json()["errors"]
        == answers[0].json()["errors"]
        == {"identifiers": ["Required unless drop_outcome is 'opted_out' or 'exempt'."]}
    )


@pytest.mark.parametrize(
    ("call", "code"),
    [
        ({"key": None}, "authentication_failed"),
        ({"secret": None}, "signature_invalid"),
        ({"secret": signing.generate_webhook_secret()}, "signature_invalid"),
        ({"now": SIGNATURE_CLOCK + 301}, "timestamp_out_of_range"),
    ],
    ids=["no key", "no signature", "wrong signature", "timestamp 301 s ahead"],
)
def test_every_401_to_a_resolution_callback_carries_the_bearer_challenge(
    side: Broker_,
    notified: ResolutionRequest,
    signature_clock: float,
    call: dict[str, Any],
    code: str,
) -> None:
    sent: dict[str, Any] = {"key": side.key, "secret": side.secret, **call}

    response = put(RESOLUTION, resolution_body(notified), **sent)

    assert (response.status_code, response.json()["code"]) == (401, code)
    assert response["WWW-Authenticate"] == "Bearer"


def test_another_brokers_results_token_is_not_found(
    side: Broker_, notified: ResolutionRequest
) -> None:
    other_key = other_broker_key(side)

    response = put(RESOLUTION, resolution_body(notified), key=other_key, secret=side.secret)

    assert response.status_code == 404
    notified.refresh_from_db()
    assert notified.completed_at is None


# -- unauthenticated traffic ----------------------------------------------------------------


def test_unauthenticated_callbacks_are_counted_and_logged_not_ledgered(
    side: Broker_, dispatched: DeletionRequest, settings, caplog: pytest.LogCaptureFixture
) -> None:
    settings.DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT = 0  # no throttle: every one reaches us
    callback_rejections.UNAUTHENTICATED._logged_at = float("-inf")
    revoked = revoked_key(side)
    counted = callback_rejections.UNAUTHENTICATED.count
    events = LedgerEvent.objects.count()
    body = body_for(dispatched)

    with caplog.at_level(
        logging.WARNING, logger="integrations.services.dispatch.callback_rejections"
    ):
        answers = [
            put(DELETION, body, key=None, secret=side.secret),
            put(DELETION, body, key="dpk_not-a-key", secret=side.secret),
            put(DELETION, body, key=revoked, secret=side.secret),
            put(DELETION, body_for(dispatched, error_message="x" * 65_536), key=None, secret=None),
        ] + [put(DELETION, body, key=f"dpk_guess-{n}", secret=None) for n in range(20)]

    assert {a.status_code for a in answers} == {401, 413}
    assert LedgerEvent.objects.count() == events
    assert not LedgerEvent.objects.filter(kind="callback.rejected").exists()
    assert callback_rejections.UNAUTHENTICATED.count == counted + 24
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    # Rate-limited: one line, then one a minute at most (not Django's line per request).
    assert len(lines) == 1, lines
    assert "dpk_" not in lines[0] and side.secret not in lines[0]


def test_an_address_refused_too_often_gets_429_and_valid_keys_cost_it_nothing(
    side: Broker_, dispatched: DeletionRequest, settings
) -> None:
    settings.DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT = 1  # bursts of 2
    body = body_for(dispatched)
    flood = {"REMOTE_ADDR": "203.0.113.7"}
    # A broker's own callbacks never take a token of its address.
    valid = [put(DELETION, body, key=side.key, secret=side.secret, headers=flood) for _ in range(3)]

    answers = [
        put(DELETION, body, key=f"dpk_guess-{n}", secret=None, headers=flood) for n in range(4)
    ]
    keyless = put(DELETION, body, key=None, secret=None, headers=flood)
    elsewhere = put(DELETION, body, key="dpk_guess", secret=None, headers={"REMOTE_ADDR": "::1"})

    assert [v.status_code for v in valid] == [200, 200, 200], valid[0].content
    assert [a.status_code for a in answers] == [401, 401, 429, 429]
    assert answers[2]["Content-Type"] == "application/problem+json"
    assert answers[2].json()["code"] == "rate_limited"
    assert int(answers[2]["Retry-After"]) >= 1
    assert keyless.status_code == 429
    assert elsewhere.status_code == 401
    assert not LedgerEvent.objects.filter(kind="callback.rejected").exists()


@pytest.mark.parametrize("path", [DELETION, RESOLUTION, ISI])
def test_a_throttled_address_is_refused_before_any_key_lookup_or_body_parsing(
    side: Broker_, settings, django_assert_num_queries: Any, path: str
) -> None:
    settings.DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT = 1  # bursts of 2
    flood = {"REMOTE_ADDR": "203.0.113.8"}
    for n in range(2):
        put(path, b"{}", key=f"dpk_guess-{n}", secret=None, headers=flood)

    # Not JSON, and a key: refused as throttled without a query, so neither was read.
    with django_assert_num_queries(0):
        refused = put(path, b"{not json", key="dpk_guess-2", secret=side.secret, headers=flood)
    with django_assert_num_queries(0):
        valid = put(path, b"{not json", key=side.key, secret=side.secret, headers=flood)

    assert (refused.status_code, refused.json()["code"]) == (429, "rate_limited")
    assert (valid.status_code, valid.json()["code"]) == (429, "rate_limited")


def test_ipv6_clients_are_throttled_by_their_64() -> None:
    request = APIRequestFactory().put("/", REMOTE_ADDR="2001:db8:1:2:aaaa::1")
    other = APIRequestFactory().put("/", REMOTE_ADDR="2001:db8:1:2:bbbb::9")

    assert throttle_address(request) == throttle_address(other)
    assert throttle_address(request) == "2001:db8:1:2::/64"


def test_behind_the_tls_proxy_the_throttle_counts_the_forwarded_address(settings: Any) -> None:
    forwarded = {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": "1.2.3.4, 203.0.113.7"}
    request = APIRequestFactory().put("/", **forwarded)

    settings.DROPPORTAL_BEHIND_TLS_PROXY = False
    assert throttle_address(request) == "10.0.0.2"
    settings.DROPPORTAL_BEHIND_TLS_PROXY = True
    # The proxy's own entry, never the client's claim before it.
    assert throttle_address(request) == "203.0.113.7"


def test_the_throttle_counts_an_ipv6_client_by_its_64_and_remembers_only_addresses(
    settings: Any,
) -> None:
    from integrations.client_address import _network

    settings.DROPPORTAL_BEHIND_TLS_PROXY = True
    _network.cache_clear()
    for host in ("2001:db8::1", "2001:db8::ffff"):
        request = APIRequestFactory().put("/", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR=host)
        assert throttle_address(request) == "2001:db8::/64"
    junk = "x" * 46  # what a proxy passing a client's header through could hand on
    request = APIRequestFactory().put("/", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR=junk)
    assert throttle_address(request) == junk
    # Two addresses remembered, the longer-than-any-address text not.
    assert _network.cache_info().currsize == 2


def test_a_metrics_key_of_every_broker_is_refused_on_a_callback(
    side: Broker_, dispatched: DeletionRequest
) -> None:
    every_broker = api_key_create(broker=None, scopes=["metrics"], actor="test").key

    response = put(DELETION, body_for(dispatched), key=every_broker, secret=side.secret)

    assert (response.status_code, response.json()["code"]) == (403, "scope_missing")
    event = LedgerEvent.objects.get(kind="callback.rejected")
    assert event.broker_id == ""
    dispatched.refresh_from_db()
    assert dispatched.state == RequestState.DISPATCHED
