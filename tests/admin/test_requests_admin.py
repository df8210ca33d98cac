"""Requests in the admin: lists filtered as staff filter them, attempts inline, and the
redeliver / redispatch / cancel actions through their services (ledger events by staff)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob

from integrations.models import (
    Broker,
    DeletionRequest,
    Integration,
    LedgerEvent,
    RequestState,
    ResolutionRequest,
    SaasDeletion,
)
from tests.builders import (
    DeletionRequestFactory,
    DeliveryAttemptFactory,
    OptOutRecordFactory,
    ResolutionRequestFactory,
    SaasConnectionFactory,
    SaasDeletionFactory,
    WorkItemFactory,
    webhook_integration_created,
    work_item_of,
)

pytestmark = pytest.mark.django_db

LIST = "/admin/integrations/deletionrequest/"


@pytest.fixture
def staff(client: Client) -> Client:
    user = User.objects.create_superuser("alice", "alice@example.com", "pw-alice-123")
    client.force_login(user)
    return client


@pytest.fixture
def integration(broker: Broker) -> Integration:
    return webhook_integration_created(broker, "https://crm.acme.example/drop").integration


def _listed(page: str, request: DeletionRequest | ResolutionRequest) -> bool:
    return str(request.request_uuid) in page


def test_lists_filter_by_state_outcome_integration_and_cycle(
    staff: Client, broker: Broker, integration: Integration
) -> None:
    other = webhook_integration_created(
        broker, "https://other.example/drop", name="Other"
    ).integration
    undeliverable = DeletionRequestFactory.create(
        integration=integration, state=RequestState.UNDELIVERABLE
    )
    deleted = DeletionRequestFactory.create(
        integration=integration,
        state=RequestState.COMPLETED,
        drop_outcome="deleted",
        drop_status_code=3,
    )
    elsewhere = DeletionRequestFactory.create(
        integration=other,
        state=RequestState.DISPATCHED,
        work_item=WorkItemFactory.create(cycle__broker=broker, cycle__drop_session_id="2"),
    )

    by_state = staff.get(LIST, {"state__exact": "undeliverable"}).content.decode()
    by_outcome = staff.get(LIST, {"drop_outcome__exact": "deleted"}).content.decode()
    by_integration = staff.get(LIST, {"integration__id__exact": other.pk}).content.decode()
    by_cycle = staff.get(LIST, {"cycle": work_item_of(elsewhere).cycle_id}).content.decode()

    assert _listed(by_state, undeliverable) and not _listed(by_state, deleted)
    assert _listed(by_outcome, deleted) and not _listed(by_outcome, undeliverable)
    assert _listed(by_integration, elsewhere) and not _listed(by_integration, deleted)
    assert _listed(by_cycle, elsewhere) and not _listed(by_cycle, undeliverable)


@pytest.mark.parametrize(
    ("model", "factory"),
    [("deletionrequest", DeletionRequestFactory), ("resolutionrequest", ResolutionRequestFactory)],
)
def test_the_round_and_integration_filters_read_no_request_to_offer_their_choices(
    staff: Client,
    broker: Broker,
    integration: Integration,
    model: str,
    factory: type[DeletionRequestFactory] | type[ResolutionRequestFactory],
) -> None:
    listed = f"/admin/integrations/{model}/"
    other = webhook_integration_created(
        broker, "https://other.example/drop", name="Other"
    ).integration
    first = factory.create(integration=integration)  # the match's own, round 0
    recurring = factory.create(integration=other, round=2)

    with CaptureQueriesContext(connection) as queries:
        page = staff.get(listed).content.decode()
    # SELECT DISTINCT round / integration_id read every request of the table on each page.
    distinct = [
        q["sql"]
        for q in queries.captured_queries  # read before the next request empties the log
        if "DISTINCT" in q["sql"].upper() and f'"integrations_{model}"' in q["sql"]
    ]
    by_first = staff.get(listed, {"round": "0"}).content.decode()
    by_recurring = staff.get(listed, {"round": "recurring"}).content.decode()
    by_integration = staff.get(listed, {"integration__id__exact": other.pk}).content.decode()

    assert distinct == []
    assert "1 or later" in page and "Other (webhook)" in page
    assert _listed(by_first, first) and not _listed(by_first, recurring)
    assert _listed(by_recurring, recurring) and not _listed(by_recurring, first)
    assert _listed(by_integration, recurring) and not _listed(by_integration, first)


def test_resolution_requests_filter_by_their_outcome(
    staff: Client, integration: Integration
) -> None:
    listed = "/admin/integrations/resolutionrequest/"
    opted_out = ResolutionRequestFactory.create(
        integration=integration, completed=True, drop_outcome="opted_out"
    )
    resolved = ResolutionRequestFactory.create(integration=integration, resolved=True)

    by_outcome = staff.get(listed, {"drop_outcome__exact": "opted_out"}).content.decode()
    unknown = staff.get(listed, {"drop_outcome__exact": "deleted"}).content.decode()

    assert _listed(by_outcome, opted_out) and not _listed(by_outcome, resolved)
    assert not _listed(unknown, opted_out) and not _listed(unknown, resolved)


def test_a_request_page_shows_its_attempts_with_what_was_sent(
    staff: Client, integration: Integration
) -> None:
    request = DeletionRequestFactory.create(
        integration=integration, state=RequestState.QUEUED, attempts=1
    )
    DeliveryAttemptFactory.create(
        deletion_request=request,
        request_headers={"X-Webhook-Signature": "c2lnbmF0dXJl"},
        status=503,
        response_body="maintenance",
        error="",
    )

    page = staff.get(f"{LIST}{request.pk}/change/").content.decode()

    assert "503" in page
    assert "maintenance" in page
    assert "X-Webhook-Signature: c2lnbmF0dXJl" in page


def test_redeliver_gives_a_new_webhook_request_id_and_queues_a_job(
    staff: Client, integration: Integration
) -> None:
    request = DeletionRequestFactory.create(
        integration=integration,
        state=RequestState.UNDELIVERABLE,
        attempts=10,
        last_error="HTTP 500",
    )
    old_id = request.webhook_request_id

    response = staff.post(
        LIST, {"action": "redeliver", "_selected_action": [request.pk]}, follow=True
    )

    assert "Queued for redelivery: 1." in response.content.decode()
    request.refresh_from_db()
    assert request.state == RequestState.QUEUED
    assert request.webhook_request_id != old_id
    assert (request.attempts, request.last_error) == (0, "")
    job = ProcrastinateJob.objects.get(task_name="integrations.tasks.deliver_deletion_requests")
    assert job.args == {"request_ids": [request.pk]}
    event = LedgerEvent.objects.get(kind="deletion_request.redelivery_requested")
    assert event.actor == "staff:alice"
    assert event.data["webhook_request_id"] == str(request.webhook_request_id)


def test_redeliver_refuses_what_already_has_an_outcome_and_says_why(
    staff: Client, integration: Integration
) -> None:
    request = DeletionRequestFactory.create(
        integration=integration,
        state=RequestState.COMPLETED,
        drop_outcome="deleted",
        drop_status_code=3,
    )

    response = staff.post(
        LIST, {"action": "redeliver", "_selected_action": [request.pk]}, follow=True
    )

    assert "only what has no outcome yet can be redelivered" in response.content.decode()
    request.refresh_from_db()
    assert request.state == RequestState.COMPLETED
    assert not ProcrastinateJob.objects.exists()
    assert not LedgerEvent.objects.filter(actor="staff:alice").exists()


def test_redeliver_to_a_disabled_integration_is_refused(
    staff: Client, integration: Integration
) -> None:
    Integration.objects.filter(pk=integration.pk).update(enabled=False, disabled_reason="410")
    request = DeletionRequestFactory.create(
        integration=integration, state=RequestState.UNDELIVERABLE
    )

    response = staff.post(
        LIST, {"action": "redeliver", "_selected_action": [request.pk]}, follow=True
    )

    assert "enable it first" in response.content.decode()
    request.refresh_from_db()
    assert request.state == RequestState.UNDELIVERABLE


def test_redispatch_sends_a_failed_outcome_again(staff: Client, integration: Integration) -> None:
    request = DeletionRequestFactory.create(
        integration=integration,
        state=RequestState.FAILED,
        drop_outcome="failed",
        error_message="CRM timeout",
        completed_at=timezone.now(),
        attempts=1,
    )

    staff.post(LIST, {"action": "redispatch", "_selected_action": [request.pk]})

    request.refresh_from_db()
    assert request.state == RequestState.QUEUED
    assert (request.drop_outcome, request.error_message, request.completed_at) == ("", "", None)
    assert ProcrastinateJob.objects.filter(args={"request_ids": [request.pk]}).exists()
    assert LedgerEvent.objects.get(kind="deletion_request.redispatched").actor == "staff:alice"


def test_an_opt_out_email_is_shown_on_its_page_only(
    staff: Client, integration: Integration
) -> None:
    request = DeletionRequestFactory.create(
        integration=integration,
        state=RequestState.COMPLETED,
        drop_outcome="opted_out",
        drop_status_code=4,
    )
    record = OptOutRecordFactory.create(deletion_request=request, email=" Ann.Smith@Example.com")
    resolution = ResolutionRequestFactory.create(
        integration=integration, state=RequestState.COMPLETED
    )
    OptOutRecordFactory.create(resolution_request=resolution, email="Bo@Example.com")

    listing = staff.get("/admin/integrations/optoutrecord/").content.decode()
    detail = staff.get(f"/admin/integrations/optoutrecord/{record.pk}/change/").content.decode()

    assert str(request.request_uuid) in listing
    assert str(resolution.request_uuid) in listing
    assert "Ann.Smith@Example.com" not in listing
    assert "Bo@Example.com" not in listing
    assert "Ann.Smith@Example.com" in detail
    assert staff.get("/admin/integrations/optoutrecord/add/").status_code == 403


def test_resolved_identifiers_are_never_displayed(staff: Client, integration: Integration) -> None:
    resolution = ResolutionRequestFactory.create(
        integration=integration,
        state=RequestState.COMPLETED,
        identifiers=json.dumps({"email": [{"email": "Ann.Smith@Example.com"}]}),
    )

    page = staff.get(f"/admin/integrations/resolutionrequest/{resolution.pk}/change/")

    assert page.status_code == 200
    assert "Ann.Smith" not in page.content.decode()


def test_cancelling_the_last_open_saas_deletion_purges_the_identifiers(
    staff: Client, broker: Broker, integration: Integration
) -> None:
    resolution = ResolutionRequestFactory.create(
        integration=integration,
        state=RequestState.COMPLETED,
        completed_at=timezone.now() - dt.timedelta(days=3),
        identifiers=json.dumps({"email": [{"email": "Ann.Smith@Example.com"}]}),
    )
    mailer = SaasConnectionFactory.create(broker=broker, url="https://api.mailer.example/erase")
    done = SaasDeletionFactory.create(
        resolution=resolution, saas_connection=mailer, state=RequestState.COMPLETED
    )
    stuck = SaasDeletionFactory.create(
        resolution=resolution,
        saas_connection=SaasConnectionFactory.create(
            broker=broker, url="https://ads.example/erase", name="Ads"
        ),
        state=RequestState.UNDELIVERABLE,
        attempts=10,
    )

    staff.post(
        "/admin/integrations/saasdeletion/",
        {"action": "cancel", "_selected_action": [done.pk, stuck.pk]},
    )

    stuck.refresh_from_db()
    assert stuck.state == RequestState.CANCELLED
    resolution.refresh_from_db()
    assert resolution.identifiers == ""
    assert resolution.identifiers_purged_at is not None
    assert LedgerEvent.objects.get(kind="saas_deletion.cancelled").actor == "staff:alice"
    assert LedgerEvent.objects.filter(kind="resolution_request.identifiers_purged").count() == 1
    assert SaasDeletion.objects.get(pk=done.pk).state == RequestState.COMPLETED


def test_an_operator_without_change_permission_cannot_redeliver(
    client: Client, integration: Integration
) -> None:
    viewer = User.objects.create_user("victor", password="pw-victor-123", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_deletionrequest"))
    client.force_login(viewer)
    request = DeletionRequestFactory.create(
        integration=integration, state=RequestState.UNDELIVERABLE
    )

    client.post(LIST, {"action": "redeliver", "_selected_action": [request.pk]})

    request.refresh_from_db()
    assert request.state == RequestState.UNDELIVERABLE
