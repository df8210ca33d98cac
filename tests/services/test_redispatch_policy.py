"""The automatic redispatch of failed outcomes (docs/contracts.md §5.3: off by default), run
as the hourly job does."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob

from integrations import tasks
from integrations.models import Broker, DeletionRequest, Integration, LedgerEvent, RequestState
from integrations.services.dispatch.outcomes import deletion_outcome_record
from integrations.services.dispatch.redelivery import (
    AUTO_REDISPATCH_ACTOR,
    AUTO_REDISPATCH_MAX,
    deletion_request_redispatch,
)
from integrations.services.staff.integrations import integration_disable
from tests.builders import (
    DeletionRequestFactory,
    webhook_integration_created,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def integration(broker: Broker) -> Integration:
    return webhook_integration_created(broker, "https://crm.example/hooks").integration


def redispatched_and_failed_again(request: DeletionRequest, *, by: str) -> None:
    deletion_request_redispatch(deletion_request=request, actor=by)
    # Sent, its 2xx recorded: only then can a failure answer the redispatch (one before it
    # answers the dispatch that already failed, and changes nothing).
    DeletionRequest.objects.filter(pk=request.pk).update(
        state=RequestState.DISPATCHED, attempts=1, dispatched_at=timezone.now()
    )
    deletion_outcome_record(
        deletion_request=DeletionRequest.objects.get(pk=request.pk),
        drop_outcome="failed",
        error_message="CRM timeout",
        actor="apikey:dpk_test",
        now=timezone.now() - dt.timedelta(hours=7),
    )


def jobs_for(request: DeletionRequest) -> int:
    return ProcrastinateJob.objects.filter(args={"request_ids": [request.pk]}).count()


def test_off_by_default_failed_outcomes_wait_for_staff(integration: Integration) -> None:
    old = DeletionRequestFactory.create(
        integration=integration,
        failed=True,
        completed_at=timezone.now() - dt.timedelta(hours=500),
        remote_identifier="C-old",
    )

    assert tasks.redispatch_failed() == 0

    old.refresh_from_db()
    assert old.state == RequestState.FAILED
    assert jobs_for(old) == 0


def test_failed_outcomes_older_than_the_setting_are_sent_again(
    integration: Integration, settings
) -> None:
    settings.DROPPORTAL_AUTO_REDISPATCH_HOURS = 6
    due = DeletionRequestFactory.create(
        integration=integration,
        failed=True,
        completed_at=timezone.now() - dt.timedelta(hours=7),
        remote_identifier="C-due",
    )
    recent = DeletionRequestFactory.create(
        integration=integration,
        failed=True,
        completed_at=timezone.now() - dt.timedelta(hours=1),
        remote_identifier="C-recent",
    )
    webhook_request_id = due.webhook_request_id

    assert tasks.redispatch_failed() == 1

    due.refresh_from_db()
    assert (due.state, due.drop_outcome, due.error_message) == (RequestState.QUEUED, "", "")
    assert due.webhook_request_id != webhook_request_id  # a new notification for the broker
    assert jobs_for(due) == 1
    event = LedgerEvent.objects.get(kind="deletion_request.redispatched")
    assert (event.subject, event.actor) == (str(due.request_uuid), AUTO_REDISPATCH_ACTOR)
    recent.refresh_from_db()
    assert recent.state == RequestState.FAILED


def test_a_request_that_keeps_failing_is_left_to_staff_after_three_tries(
    integration: Integration, settings
) -> None:
    settings.DROPPORTAL_AUTO_REDISPATCH_HOURS = 6
    request = DeletionRequestFactory.create(
        integration=integration,
        failed=True,
        completed_at=timezone.now() - dt.timedelta(hours=7),
        remote_identifier="C-stubborn",
    )
    for _ in range(AUTO_REDISPATCH_MAX):
        redispatched_and_failed_again(request, by=AUTO_REDISPATCH_ACTOR)
    # A staff redispatch does not count against the policy's tries.
    staff_tried = DeletionRequestFactory.create(
        integration=integration,
        failed=True,
        completed_at=timezone.now() - dt.timedelta(hours=7),
        remote_identifier="C-staff",
    )
    redispatched_and_failed_again(staff_tried, by="staff:alice")

    assert tasks.redispatch_failed() == 1

    request.refresh_from_db()
    assert request.state == RequestState.FAILED
    staff_tried.refresh_from_db()
    assert staff_tried.state == RequestState.QUEUED


def test_a_disabled_integration_keeps_its_failures_and_the_others_go_on(
    broker: Broker, integration: Integration, settings
) -> None:
    settings.DROPPORTAL_AUTO_REDISPATCH_HOURS = 6
    other = webhook_integration_created(broker, "https://erp.example/hooks", name="ERP").integration
    stuck = DeletionRequestFactory.create(
        integration=integration,
        failed=True,
        completed_at=timezone.now() - dt.timedelta(hours=8),
        remote_identifier="C-stuck",
    )
    sent = DeletionRequestFactory.create(
        integration=other,
        failed=True,
        completed_at=timezone.now() - dt.timedelta(hours=7),
        remote_identifier="C-sent",
    )
    integration_disable(integration=integration, reason="410 from the broker", actor="test")

    assert tasks.redispatch_failed() == 1

    stuck.refresh_from_db()
    sent.refresh_from_db()
    assert (stuck.state, sent.state) == (RequestState.FAILED, RequestState.QUEUED)


def test_a_stale_failure_before_the_redispatch_is_sent_leaves_it_queued_and_uses_no_try(
    integration: Integration, settings
) -> None:
    # The broker sends its old failed callback again while the redispatch waits to be sent:
    # recorded, it would fail the request once more, skip the send, and cost a try.
    settings.DROPPORTAL_AUTO_REDISPATCH_HOURS = 6
    request = DeletionRequestFactory.create(
        integration=integration,
        failed=True,
        completed_at=timezone.now() - dt.timedelta(hours=7),
        remote_identifier="C-stale",
    )
    assert tasks.redispatch_failed() == 1

    repeated = deletion_outcome_record(
        deletion_request=DeletionRequest.objects.get(pk=request.pk),
        drop_outcome="failed",
        error_message="CRM timeout",
        actor="apikey:dpk_test",
    )

    assert (repeated.changed, repeated.state) == (False, RequestState.QUEUED)
    request.refresh_from_db()
    assert (request.state, request.drop_outcome) == (RequestState.QUEUED, "")
    assert jobs_for(request) == 1
    assert tasks.redispatch_failed() == 0
    assert LedgerEvent.objects.filter(kind="deletion_request.redispatched").count() == 1
