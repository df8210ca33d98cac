"""The mark the callbacks' stale-failure rule reads (``sql/deletion_outcome_record.sql``,
docs/contracts.md §5.3): a deletion request's ``redispatched_at``, set by a redispatch and
emptied by a redelivery (``services/dispatch/redelivery.py``); and migration 0056's backfill,
which gives the rows from before it what those services would have."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, DeletionRequest, Integration, LedgerEvent, RequestState
from integrations.services.dispatch.outcomes import deletion_outcome_record
from integrations.services.dispatch.redelivery import (
    deletion_request_redeliver,
    deletion_request_redispatch,
)
from tests.builders import DeletionRequestFactory, webhook_integration_created

pytestmark = pytest.mark.django_db


@pytest.fixture
def integration(broker: Broker) -> Integration:
    return webhook_integration_created(broker, "https://crm.example/hooks").integration


def _redispatch(request: DeletionRequest) -> None:
    deletion_request_redispatch(deletion_request=request, actor="staff:ann")


def _redeliver(request: DeletionRequest) -> None:
    deletion_request_redeliver(deletion_request=request, actor="staff:ann")


def _sent_and_failed(request: DeletionRequest) -> None:
    """Its redispatch sent, and answered failed again."""
    DeletionRequest.objects.filter(pk=request.pk).update(state=RequestState.DISPATCHED, attempts=1)
    deletion_outcome_record(
        deletion_request=DeletionRequest.objects.get(pk=request.pk),
        drop_outcome="failed",
        error_message="CRM timeout",
        actor="apikey:dpk_test",
    )


def test_a_redispatch_marks_the_request_and_a_redelivery_empties_the_mark(
    integration: Integration,
) -> None:
    request = DeletionRequestFactory.create(
        integration=integration, failed=True, remote_identifier="C-1"
    )
    assert request.redispatched_at is None

    _redispatch(request)
    request.refresh_from_db()
    assert request.redispatched_at is not None
    assert (request.state, request.attempts) == (RequestState.QUEUED, 0)
    # The event says which requeue it was; the mark is the row's, not in its data.
    event = LedgerEvent.objects.get(kind=LedgerKind.DELETION_REQUEST_REDISPATCHED)
    assert "redispatched_at" not in event.data

    _redeliver(request)  # before the redispatch went out: what it sends is a redelivery's
    request.refresh_from_db()
    assert request.redispatched_at is None
    assert (request.state, request.attempts) == (RequestState.QUEUED, 0)

    # A failure now may answer the redelivery: recorded, not taken for a stale one.
    recorded = deletion_outcome_record(
        deletion_request=request,
        drop_outcome="failed",
        error_message="CRM timeout",
        actor="apikey:dpk_test",
    )
    assert (recorded.changed, recorded.state) == (True, RequestState.FAILED)


def test_a_redispatch_after_a_redelivery_marks_it_again(integration: Integration) -> None:
    request = DeletionRequestFactory.create(integration=integration)
    _redeliver(request)
    DeletionRequest.objects.filter(pk=request.pk).update(
        state=RequestState.FAILED, drop_outcome="failed", error_message="CRM timeout"
    )

    _redispatch(request)

    request.refresh_from_db()
    assert request.redispatched_at is not None
    repeated = deletion_outcome_record(
        deletion_request=request,
        drop_outcome="failed",
        error_message="CRM timeout",
        actor="apikey:dpk_test",
    )
    assert (repeated.changed, repeated.state) == (False, RequestState.QUEUED)


def _backfill_sql() -> str:
    (path,) = (Path(settings.BASE_DIR) / "integrations" / "migrations").glob("0056_*.py")
    return importlib.import_module(f"integrations.migrations.{path.stem}").BACKFILL_SQL


def test_the_backfill_marks_what_the_services_mark(integration: Integration) -> None:
    # Histories written by the services themselves, then the marks forgotten as before 0056:
    # the backfill, from the ledger alone, gives back the same ones.
    never = DeletionRequestFactory.create(
        integration=integration, failed=True, remote_identifier="C-never"
    )
    redispatched = DeletionRequestFactory.create(
        integration=integration, failed=True, remote_identifier="C-redispatched"
    )
    _redispatch(redispatched)
    then_redelivered = DeletionRequestFactory.create(
        integration=integration, failed=True, remote_identifier="C-then-redelivered"
    )
    _redispatch(then_redelivered)
    _redeliver(then_redelivered)
    redelivered = DeletionRequestFactory.create(integration=integration)
    _redeliver(redelivered)
    # Redispatched, redelivered, redispatched.
    again = DeletionRequestFactory.create(
        integration=integration, failed=True, remote_identifier="C-again"
    )
    _redispatch(again)
    _redeliver(again)
    DeletionRequest.objects.filter(pk=again.pk).update(
        state=RequestState.FAILED, drop_outcome="failed"
    )
    _redispatch(again)
    # Its redispatch went out and failed too.
    sent = DeletionRequestFactory.create(
        integration=integration, failed=True, remote_identifier="C-sent"
    )
    _redispatch(sent)
    _sent_and_failed(sent)
    requests = [never, redispatched, then_redelivered, redelivered, again, sent]
    marked = {
        pk
        for pk, at in DeletionRequest.objects.values_list("pk", "redispatched_at")
        if at is not None
    }
    assert marked == {redispatched.pk, again.pk, sent.pk}
    DeletionRequest.objects.update(redispatched_at=None)

    with connection.cursor() as cursor:
        cursor.execute(_backfill_sql())

    for request in requests:
        request.refresh_from_db()
        if request.pk not in marked:
            assert request.redispatched_at is None, request.remote_identifier
            continue
        # When its last redispatch was written.
        last = LedgerEvent.objects.filter(
            kind=LedgerKind.DELETION_REQUEST_REDISPATCHED, subject=str(request.request_uuid)
        ).latest("id")
        assert request.redispatched_at == last.created_at, request.remote_identifier
