"""The ledger event of a recorded deletion outcome says what the request held just before
it: read by the SQL function under the row's lock, not taken from the caller's copy."""

from __future__ import annotations

import pytest
from django.utils import timezone

from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, DeletionRequest, LedgerEvent, RequestState
from integrations.services.dispatch.outcomes import deletion_outcome_record
from integrations.services.ledger import ledger_seal, ledger_verify
from tests.builders import DeletionRequestFactory, webhook_integration_created

pytestmark = pytest.mark.django_db


def _recorded() -> LedgerEvent:
    return LedgerEvent.objects.filter(kind=LedgerKind.DELETION_REQUEST_OUTCOME_RECORDED).latest(
        "id"
    )


def test_an_outcome_recorded_from_a_stale_copy_names_the_outcome_it_followed(
    broker: Broker,
) -> None:
    crm = webhook_integration_created(broker, "https://crm.acme.example/drop").integration
    request = DeletionRequestFactory.create(
        integration=crm, state=RequestState.DISPATCHED, dispatched_at=timezone.now()
    )
    # Two callbacks at once: the second one's lookup read the row before the first committed.
    seen_by_second = DeletionRequest.objects.get(pk=request.pk)
    deletion_outcome_record(
        deletion_request=DeletionRequest.objects.get(pk=request.pk),
        drop_outcome="failed",
        error_message="CRM down",
        actor="apikey:first",
    )
    assert (_recorded().data["previous_state"], _recorded().data["previous_outcome"]) == (
        "dispatched",
        "",
    )

    deletion_outcome_record(
        deletion_request=seen_by_second, drop_outcome="deleted", actor="apikey:second"
    )

    event = _recorded()
    assert event.data["drop_outcome"] == "deleted"
    assert (event.data["previous_state"], event.data["previous_outcome"]) == ("failed", "failed")
    # The event's hash covers the data as stored: the chain still verifies.
    ledger_seal()
    assert ledger_verify().ok


def test_a_previous_outcome_that_looks_like_json_stays_a_string(broker: Broker) -> None:
    crm = webhook_integration_created(broker, "https://crm.acme.example/drop").integration
    request = DeletionRequestFactory.create(integration=crm, state=RequestState.DISPATCHED)
    # An error message that spells the placeholder the function fills: JSON escapes its
    # quotes, so it is never taken for it.
    tricky = '"previous_outcome":null,"previous_state":null'
    deletion_outcome_record(
        deletion_request=request, drop_outcome="failed", error_message=tricky, actor="apikey:a"
    )

    event = _recorded()
    assert event.data["error_message"] == tricky
    assert (event.data["previous_state"], event.data["previous_outcome"]) == ("dispatched", "")
    ledger_seal()
    assert ledger_verify().ok
