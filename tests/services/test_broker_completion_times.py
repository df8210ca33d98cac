"""A broker's ``completed_at`` is checked against when we first sent the request: a delete
cannot finish before it was sent, but it may finish before a retry was acknowledged."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from integrations.services.dispatch.outcomes import broker_completed_at_refusal
from tests.builders import (
    DeletionRequestFactory,
    DeliveryAttemptFactory,
    WebhookIntegrationFactory,
)

pytestmark = pytest.mark.django_db


def test_a_completion_of_the_first_send_is_accepted_after_a_later_retry_was_acknowledged() -> None:
    """The first send's 2xx was lost; the retry 40 minutes later was acknowledged. The broker
    finished the first one: that time is true, and must not be refused for ever."""
    now = timezone.now()
    request = DeletionRequestFactory.create(
        integration=WebhookIntegrationFactory.create(), dispatched=True, dispatched_at=now
    )
    DeliveryAttemptFactory.create(
        deletion_request=request, number=1, started_at=now - dt.timedelta(minutes=40)
    )
    DeliveryAttemptFactory.create(deletion_request=request, number=2, started_at=now)

    finished = now - dt.timedelta(minutes=38)
    assert broker_completed_at_refusal(deletion_request=request, completed_at=finished) is None

    before_any_send = now - dt.timedelta(minutes=50)
    refusal = broker_completed_at_refusal(deletion_request=request, completed_at=before_any_send)
    assert refusal is not None and "before the delete was sent" in refusal


def test_without_an_attempt_the_acknowledgement_then_the_creation_bound_it() -> None:
    now = timezone.now()
    acknowledged = DeletionRequestFactory.create(dispatched=True, dispatched_at=now)
    early = now - dt.timedelta(minutes=20)
    assert broker_completed_at_refusal(deletion_request=acknowledged, completed_at=early)

    queued = DeletionRequestFactory.create()
    assert broker_completed_at_refusal(deletion_request=queued, completed_at=now) is None
