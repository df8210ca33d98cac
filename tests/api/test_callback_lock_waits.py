"""A deletion callback that meets a row another transaction holds (a dispatch batch holding
its request, a report upload marking its work item) waits no longer than a web statement may
(``dropportal.wsgi``): it answers 503 problem+json with ``Retry-After``, writes nothing, and
the broker's retry once the batch committed is recorded.

This test commits (a second connection holds the rows).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone
from psycopg import sql
from rest_framework.test import APIClient

from dropportal.startup import bound_web_statements
from integrations.dispatch import signing
from integrations.models import Broker, DeletionRequest, LedgerEvent, RequestState, WorkItemState
from integrations.services.staff.keys import api_key_create
from tests.builders import DeletionRequestFactory, WorkItemFactory, webhook_integration_created
from tests.conftest import database_url

pytestmark = pytest.mark.django_db(transaction=True)

DELETION = "/api/v1/drop/callbacks/deletion"


@pytest.fixture
def web_statements_bounded(settings: Any) -> Iterator[None]:
    """The web's statement bound, short enough for a test."""
    settings.DROPPORTAL_WEB_STATEMENT_TIMEOUT_MS = 300
    options = connection.settings_dict["OPTIONS"]
    unbounded = dict(options)
    bound_web_statements()
    yield
    options.clear()
    options.update(unbounded)
    connection.close()


def _callback(request: DeletionRequest, key: str, secret: str) -> Any:
    raw = json.dumps(
        {
            "schema_version": "1.0",
            "status": "completed",
            "request_uuid": str(request.request_uuid),
            "drop_outcome": "deleted",
        }
    ).encode()
    signed = signing.signed_headers(secret, raw)
    return APIClient().put(
        DELETION,
        data=raw,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
        HTTP_X_WEBHOOK_TIMESTAMP=signed["X-Webhook-Timestamp"],
        HTTP_X_WEBHOOK_SIGNATURE=signed["X-Webhook-Signature"],
    )


@pytest.mark.parametrize(
    "held",
    ["integrations_deletionrequest", "integrations_workitem"],
    ids=["dispatch_batch_holds_the_request", "report_upload_holds_the_work_item"],
)
def test_a_callback_waiting_on_a_held_row_answers_503_then_its_retry_is_recorded(
    broker: Broker, web_statements_bounded: None, held: str
) -> None:
    created = webhook_integration_created(broker, "https://crm.acme.example/drop")
    key = api_key_create(broker=broker, scopes=["webhook_callback"], actor="test").key
    item = WorkItemFactory.create(cycle__broker=broker)
    request = DeletionRequestFactory.create(
        integration=created.integration,
        work_item=item,
        state=RequestState.DISPATCHED,
        dispatched_at=timezone.now(),
    )
    row = request.pk if held == "integrations_deletionrequest" else item.pk
    with psycopg.connect(database_url()) as batch:
        # Released after 5 s whatever happens: unbounded, the callback would wait that long.
        batch.execute("SET idle_in_transaction_session_timeout = '5s'")
        locking = sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(held))
        batch.execute(locking, [row])
        waited = _callback(request, key, created.webhook_secret)
        batch.rollback()

    assert waited.status_code == 503
    assert waited["Content-Type"] == "application/problem+json"
    assert int(waited["Retry-After"]) > 0
    problem = waited.json()
    assert problem["status"] == 503 and problem["code"] == "database_unavailable"
    # The database answered, late: not "unreachable", which would mislead whoever reads it.
    assert problem["detail"].startswith("The database did not answer in time"), problem
    request.refresh_from_db()
    assert (request.state, request.drop_outcome) == (RequestState.DISPATCHED, "")
    assert not LedgerEvent.objects.filter(kind="deletion_request.outcome_recorded").exists()

    retried = _callback(request, key, created.webhook_secret)
    assert retried.status_code == 200, retried.content
    assert retried.json()["status"] == "recorded"
    request.refresh_from_db()
    item.refresh_from_db()
    assert (request.state, request.drop_outcome) == (RequestState.COMPLETED, "deleted")
    assert (item.status_code, item.state) == (3, WorkItemState.REPORTABLE)
