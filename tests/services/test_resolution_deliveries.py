"""Identifier retrieval notifications and SaaS deletions, through the same delivery loop, to
real loopback receivers: body §2.3, the generic SaaS body with its bearer token, and the
resolved identifiers purged once every SaaS deletion is final."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from devtools.broker_simulator import BrokerSimulator, Reply
from integrations import tasks
from integrations.dispatch.policy import MAX_ATTEMPTS
from integrations.models import (
    Broker,
    LedgerEvent,
    RequestState,
    ResolutionRequest,
    SaasConnection,
    SaasDeletion,
    WorkItem,
    WorkItemState,
)
from integrations.services.dispatch.deliveries import (
    resolution_requests_deliver,
    saas_deletions_deliver,
)
from integrations.services.dispatch.redelivery import resolution_request_redeliver
from integrations.services.dispatch.resolutions import resolution_outcome_record
from tests.builders import (
    ResolutionRequestFactory,
    SaasConnectionFactory,
    SaasDeletionFactory,
    webhook_integration_created,
)

pytestmark = pytest.mark.django_db

RESOLVED = {
    "email": [{"email": " Ann.Smith@Example.com"}, {"email": "ann@old.example"}],
    "phone": [{"phone": "+14155559317"}],
}


@pytest.fixture(autouse=True)
def private_targets(settings) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    settings.DROPPORTAL_PUBLIC_URL = "https://portal.example"


@pytest.fixture
def receiver() -> Iterator[BrokerSimulator]:
    with BrokerSimulator() as running:
        yield running


@pytest.fixture
def saas_receiver() -> Iterator[BrokerSimulator]:
    with BrokerSimulator(path="/v1/erase") as running:
        yield running


def test_a_resolution_notification_carries_body_2_3_signed(
    broker: Broker, receiver: BrokerSimulator
) -> None:
    created = webhook_integration_created(broker, receiver.url)
    receiver.secrets = [created.webhook_secret]
    request = ResolutionRequestFactory.create(
        integration=created.integration, remote_identifier="C-7"
    )

    assert resolution_requests_deliver(request_ids=[request.pk]) == {"delivered": 1}

    (arrived,) = receiver.received
    assert arrived.signature_ok is True
    assert arrived.headers["X-Webhook-Id"] == str(request.webhook_request_id)
    assert arrived.json == {
        "integration_name": "Acme CRM",
        "integration_kind": "webhook",
        "webhook_request_id": str(request.webhook_request_id),
        "request_type": "drop_resolution",
        "topic": "drop.resolution:create",
        "request_uuid": str(request.request_uuid),
        "integration_id": str(created.integration.uuid),
        "results_token": request.results_token,
        "broker_id": "4821",
        "drop_session_id": "1",
        "match_date": "2026-11-20",
        "mode": "test",
        "identifiers": {"external_id": [{"external_id": "C-7"}]},
        "webhook_callback_url": "https://portal.example/api/v1/drop/callbacks/resolution",
    }
    request.refresh_from_db()
    assert request.state == RequestState.DISPATCHED
    assert LedgerEvent.objects.filter(kind="resolution_request.delivered").count() == 1


def test_a_retry_carries_the_first_attempts_body_though_the_broker_changed_mode_between(
    broker: Broker, receiver: BrokerSimulator
) -> None:
    """The broker's id and mode are the request's, fixed when it was made: a broker switched
    to production between two attempts does not change what one webhook_request_id says."""
    created = webhook_integration_created(broker, receiver.url)
    receiver.secrets = [created.webhook_secret]
    request = ResolutionRequestFactory.create(integration=created.integration)
    receiver.script(Reply(503), Reply(200))

    assert resolution_requests_deliver(request_ids=[request.pk]) == {"retry": 1}
    Broker.objects.filter(pk=broker.pk).update(mode="production")
    ResolutionRequest.objects.filter(pk=request.pk).update(next_attempt_at=Now())
    assert resolution_requests_deliver(request_ids=[request.pk]) == {"delivered": 1}

    first, second = receiver.received
    assert first.json["mode"] == "test"
    assert second.body == first.body
    assert second.headers["X-Webhook-Id"] == first.headers["X-Webhook-Id"]
    assert second.signature_ok is True


@pytest.mark.parametrize(("status", "verdict"), [(200, "delivered"), (500, "retry")])
def test_a_notification_answered_with_identifiers_keeps_only_their_shape(
    broker: Broker, receiver: BrokerSimulator, status: int, verdict: str
) -> None:
    """Only the 2xx counts; a broker answering with the identifiers at once (as an ISI
    retrieval does) must not have them kept in clear on the attempt."""
    created = webhook_integration_created(broker, receiver.url)
    request = ResolutionRequestFactory.create(integration=created.integration)
    receiver.script(Reply(status, json.dumps({"identifiers": RESOLVED}).encode()))

    assert resolution_requests_deliver(request_ids=[request.pk]) == {verdict: 1}

    attempt = request.delivery_attempts.get()
    assert attempt.status == status
    assert json.loads(attempt.response_body) == {
        "identifiers": {
            "email": [{"email": "<22 characters>"}, {"email": "<15 characters>"}],
            "phone": [{"phone": "<12 characters>"}],
        }
    }


def _answered(broker: Broker, **fields: Any) -> ResolutionRequest:
    integration = webhook_integration_created(broker, "https://crm.acme.example/drop").integration
    return ResolutionRequestFactory.create(
        integration=integration,
        state=RequestState.COMPLETED,
        identifiers=json.dumps(RESOLVED),
        **fields,
    )


def _mailer(broker: Broker, url: str, **fields: object) -> SaasConnection:
    fields.setdefault("token", "tok-mailer")
    return SaasConnectionFactory.create(
        broker=broker, url=url, name=str(fields.pop("name", "Mailer")), **fields
    )


def test_a_saas_deletion_sends_its_categories_with_the_bearer_token_and_purges_when_done(
    broker: Broker, saas_receiver: BrokerSimulator
) -> None:
    resolution = _answered(broker)
    mailer = _mailer(broker, saas_receiver.url, identifier_categories=["email"])
    deletion = SaasDeletionFactory.create(resolution=resolution, saas_connection=mailer)

    assert saas_deletions_deliver(deletion_ids=[deletion.pk]) == {"delivered": 1}

    (arrived,) = saas_receiver.received
    assert arrived.headers["Authorization"] == "Bearer tok-mailer"
    assert arrived.json == {
        "request_uuid": str(resolution.request_uuid),
        "broker_id": "4821",
        "identifiers": {"email": RESOLVED["email"]},  # verbatim, only its category
    }
    deletion.refresh_from_db()
    assert deletion.state == RequestState.COMPLETED  # no callback: the 2xx is the deletion
    attempt = deletion.delivery_attempts.get()
    assert attempt.request_headers["Authorization"] == "[redacted]"
    resolution.refresh_from_db()
    assert resolution.identifiers == ""
    assert resolution.identifiers_purged_at is not None
    purged = LedgerEvent.objects.get(kind="resolution_request.identifiers_purged")
    assert purged.data["saas_deletions"] == {"Mailer": "completed"}
    assert "Ann.Smith" not in json.dumps(list(LedgerEvent.objects.values_list("data", flat=True)))


def test_identifiers_stay_until_the_last_saas_deletion_is_final(
    broker: Broker, saas_receiver: BrokerSimulator
) -> None:
    resolution = _answered(broker)
    first = SaasDeletionFactory.create(
        resolution=resolution, saas_connection=_mailer(broker, saas_receiver.url)
    )
    second = SaasDeletionFactory.create(
        resolution=resolution,
        saas_connection=_mailer(
            broker, saas_receiver.url, name="Ads", identifier_categories=["phone"]
        ),
    )
    saas_receiver.script(200, 503)

    saas_deletions_deliver(deletion_ids=[first.pk, second.pk], threads=1)  # in this order

    resolution.refresh_from_db()
    assert json.loads(resolution.identifiers) == RESOLVED  # the Ads deletion will retry
    second.refresh_from_db()
    assert (second.state, second.attempts) == (RequestState.QUEUED, 1)
    assert saas_receiver.received[1].json["identifiers"] == {"phone": RESOLVED["phone"]}


def test_an_undeliverable_saas_deletion_keeps_the_identifiers_for_staff(
    broker: Broker, saas_receiver: BrokerSimulator
) -> None:
    resolution = _answered(broker)
    deletion = SaasDeletionFactory.create(
        resolution=resolution,
        saas_connection=_mailer(broker, saas_receiver.url),
        attempts=MAX_ATTEMPTS - 1,
    )
    saas_receiver.script(500)

    assert saas_deletions_deliver(deletion_ids=[deletion.pk]) == {"undeliverable": 1}

    resolution.refresh_from_db()
    assert resolution.identifiers != ""  # staff may still redeliver
    assert resolution.identifiers_purged_at is None


def test_nothing_of_its_categories_cancels_the_saas_deletion_without_a_call(
    broker: Broker, saas_receiver: BrokerSimulator
) -> None:
    resolution = _answered(broker)
    deletion = SaasDeletionFactory.create(
        resolution=resolution,
        saas_connection=_mailer(broker, saas_receiver.url, identifier_categories=["maid"]),
    )

    assert saas_deletions_deliver(deletion_ids=[deletion.pk]) == {"skipped": 1}

    assert saas_receiver.received == []
    deletion.refresh_from_db()
    assert deletion.state == RequestState.CANCELLED
    assert "no identifier of the categories maid" in deletion.last_error
    resolution.refresh_from_db()
    assert resolution.identifiers == ""


def test_410_from_a_saas_disables_the_connection(
    broker: Broker, saas_receiver: BrokerSimulator
) -> None:
    resolution = _answered(broker)
    mailer = _mailer(broker, saas_receiver.url)
    deletion = SaasDeletionFactory.create(resolution=resolution, saas_connection=mailer)
    saas_receiver.script(Reply.gone())

    assert saas_deletions_deliver(deletion_ids=[deletion.pk]) == {"gone": 1}

    mailer.refresh_from_db()
    assert mailer.enabled is False
    assert LedgerEvent.objects.get(kind="saas_connection.disabled").data["alert"] is True
    deletion.refresh_from_db()
    assert deletion.state == RequestState.QUEUED
    assert saas_deletions_deliver(deletion_ids=[deletion.pk]) == {"skipped": 1}
    assert len(saas_receiver.received) == 1


def test_the_hourly_sweep_purges_identifiers_whose_saas_deletions_ended_in_bulk(
    broker: Broker,
) -> None:
    resolution = _answered(broker)
    deletion = SaasDeletionFactory.create(
        resolution=resolution, saas_connection=_mailer(broker, "https://api.mailer.example/erase")
    )
    waiting = _answered(broker)
    SaasDeletionFactory.create(
        resolution=waiting, saas_connection=_mailer(broker, "https://ads.example/erase", name="Ads")
    )
    # As the import does when DROP removes the work item: cancelled in SQL, no purge.
    SaasDeletion.objects.filter(pk=deletion.pk).update(state=RequestState.CANCELLED)

    assert tasks.purge_resolved_identifiers() == 1

    resolution.refresh_from_db()
    assert (resolution.identifiers, resolution.identifiers_purged_at is not None) == ("", True)
    waiting.refresh_from_db()
    assert json.loads(waiting.identifiers) == RESOLVED  # its deletion is still queued
    assert tasks.purge_resolved_identifiers() == 0


def test_a_saas_deletion_of_an_item_drop_removed_is_cancelled_not_sent(
    broker: Broker, saas_receiver: BrokerSimulator
) -> None:
    """One queued while its item was removed (the import's cancel skips what a batch holds):
    the batch reads the removal before sending, and cancels it; the identifiers go."""
    resolution = _answered(broker)
    WorkItem.objects.filter(pk=resolution.work_item_id).update(state=WorkItemState.REMOVED)
    deletion = SaasDeletionFactory.create(
        resolution=resolution, saas_connection=_mailer(broker, saas_receiver.url)
    )

    assert saas_deletions_deliver(deletion_ids=[deletion.pk]) == {"skipped": 1}

    assert saas_receiver.received == []
    deletion.refresh_from_db()
    assert (deletion.state, deletion.last_error) == (
        RequestState.CANCELLED,
        "work item removed by DROP (consumer cancelled)",
    )
    resolution.refresh_from_db()
    assert resolution.identifiers == ""


@pytest.mark.parametrize(
    ("status", "verdict"), [(200, "delivered"), (422, "retry"), (500, "retry")]
)
def test_a_saas_answer_echoing_identifiers_is_kept_only_masked(
    broker: Broker, saas_receiver: BrokerSimulator, status: int, verdict: str
) -> None:
    deletion = SaasDeletionFactory.create(
        resolution=_answered(broker), saas_connection=_mailer(broker, saas_receiver.url)
    )
    echoed = json.dumps(
        {
            "deleted": RESOLVED["email"],
            "note": "Ann.Smith@Example.com gone",
            "Ann.Smith@Example.com": "gone",  # keyed by the identifier itself
            "zip": 94107,  # an identifier as a number
        }
    )
    saas_receiver.script(Reply(status, echoed.encode()))

    assert saas_deletions_deliver(deletion_ids=[deletion.pk]) == {verdict: 1}

    attempt = deletion.delivery_attempts.get()
    assert attempt.status == status
    assert "Ann.Smith" not in attempt.response_body
    assert "old.example" not in attempt.response_body
    assert "94107" not in attempt.response_body
    # Keys not of the protocol or the connection's categories are masked like values.
    assert json.loads(attempt.response_body) == {
        "<key of 7 characters>": [{"email": "<22 characters>"}, {"email": "<15 characters>"}],
        "<key of 4 characters>": "<26 characters>",
        "<key of 21 characters>": "<4 characters>",
        "zip": "<number of 5 characters>",
    }


def test_a_saas_answer_that_is_not_json_is_not_kept(
    broker: Broker, saas_receiver: BrokerSimulator
) -> None:
    deletion = SaasDeletionFactory.create(
        resolution=_answered(broker), saas_connection=_mailer(broker, saas_receiver.url)
    )
    saas_receiver.script(Reply(500, b"cannot delete Ann.Smith@Example.com"))

    assert saas_deletions_deliver(deletion_ids=[deletion.pk]) == {"retry": 1}

    attempt = deletion.delivery_attempts.get()
    assert attempt.response_body == "[not kept: 35 bytes, not JSON]"


def test_a_recurring_rounds_saas_deletion_events_say_recurring_and_the_round(
    broker: Broker, saas_receiver: BrokerSimulator
) -> None:
    """Like its resolution's outcome: every ledger event of a recurring round's SaaS deletion
    (delivered, undeliverable, redelivery asked, cancelled) says ``recurring`` and the round; the
    match's (round 0) say neither."""
    from integrations.services.dispatch.redelivery import saas_deletion_redeliver
    from integrations.services.dispatch.resolutions import saas_deletion_cancel

    match = SaasDeletionFactory.create(
        resolution=_answered(broker), saas_connection=_mailer(broker, saas_receiver.url)
    )
    resolution = _answered(broker, round=2)
    done = SaasDeletionFactory.create(
        resolution=resolution, saas_connection=_mailer(broker, saas_receiver.url, name="Ads")
    )
    failing = SaasDeletionFactory.create(
        resolution=resolution,
        saas_connection=_mailer(broker, saas_receiver.url, name="Crm"),
        attempts=MAX_ATTEMPTS - 1,
    )
    saas_receiver.script(200, 200, 500)

    saas_deletions_deliver(deletion_ids=[match.pk, done.pk, failing.pk], threads=1)
    failing.refresh_from_db()
    assert failing.state == RequestState.UNDELIVERABLE
    saas_deletion_redeliver(saas_deletion=failing, actor="staff:ann")
    saas_deletion_cancel(saas_deletion=failing, reason="the CRM is gone", actor="staff:ann")

    def marks(event: LedgerEvent) -> tuple[Any, Any]:
        return event.data.get("recurring"), event.data.get("round")

    events = LedgerEvent.objects.filter(kind__startswith="saas_deletion.")
    of_round = [e for e in events if e.subject == str(resolution.request_uuid)]
    assert sorted(e.kind for e in of_round) == [
        "saas_deletion.cancelled",
        "saas_deletion.delivered",
        "saas_deletion.redelivery_requested",
        "saas_deletion.undeliverable",
    ]
    assert {marks(e) for e in of_round} == {(True, 2)}
    (of_match,) = [e for e in events if e.subject == str(match.resolution.request_uuid)]
    assert of_match.kind == "saas_deletion.delivered" and marks(of_match) == (None, None)


def test_a_saas_answer_nested_too_deeply_is_not_kept_and_the_batch_goes_on(
    broker: Broker, saas_receiver: BrokerSimulator
) -> None:
    """The answer is masked on the sending thread: JSON nested past Python's recursion limit
    (2,000 brackets fit in the 4 KiB read) raised RecursionError out of it, which undid the
    batch (its other deletions already done) and failed the job, whose retry sent them all
    again, for ever."""
    mailer = _mailer(broker, saas_receiver.url)
    deletions = [
        SaasDeletionFactory.create(resolution=_answered(broker), saas_connection=mailer)
        for _ in range(2)
    ]
    nested = b"[" * 2000 + b"]" * 2000
    saas_receiver.script(Reply(200, nested), Reply(200, b"{}"))

    counts = saas_deletions_deliver(deletion_ids=[d.pk for d in deletions], threads=1)

    assert counts == {"delivered": 2}  # any 2xx is the deletion done
    first = deletions[0].delivery_attempts.get()
    assert first.response_body == "[not kept: 4000 bytes, nested too deeply]"
    assert set(SaasDeletion.objects.values_list("state", flat=True)) == {RequestState.COMPLETED}


# ---------------------------------------------------------------- clocks of several hosts


@pytest.fixture
def web_clock_ahead(monkeypatch: pytest.MonkeyPatch) -> dt.datetime:
    """The web host's clock a minute ahead of the database's (and the worker's): the
    delivery loop decides what is due by the database's time."""
    ahead = timezone.now() + dt.timedelta(minutes=1)
    monkeypatch.setattr(timezone, "now", lambda: ahead)
    return ahead


def test_a_saas_deletion_an_answer_starts_is_due_whatever_the_web_hosts_clock(
    broker: Broker, saas_receiver: BrokerSimulator, web_clock_ahead: dt.datetime
) -> None:
    integration = webhook_integration_created(broker, "https://crm.acme.example/drop").integration
    resolution = ResolutionRequestFactory.create(
        integration=integration, state=RequestState.DISPATCHED
    )
    _mailer(broker, saas_receiver.url)
    resolution_outcome_record(
        resolution_request=resolution,
        drop_outcome="",
        exemption_basis="",
        identifiers=RESOLVED,
        actor="t",
    )
    (deletion,) = SaasDeletion.objects.all()

    assert saas_deletions_deliver(deletion_ids=[deletion.pk]) == {"delivered": 1}


def test_a_redelivery_is_due_whatever_the_web_hosts_clock(
    broker: Broker, receiver: BrokerSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = webhook_integration_created(broker, receiver.url)
    request = ResolutionRequestFactory.create(
        integration=created.integration, state=RequestState.UNDELIVERABLE
    )
    ahead = timezone.now() + dt.timedelta(minutes=1)
    with monkeypatch.context() as web_host:
        web_host.setattr(timezone, "now", lambda: ahead)
        resolution_request_redeliver(resolution_request=request, actor="staff:alice")

    assert resolution_requests_deliver(request_ids=[request.pk]) == {"delivered": 1}
