"""The "add a kind of target" recipe of docs/architecture.md, walked with a kind defined here.

A carrier-pigeon kind: its ``Transport`` (the recipe's dispatch step), registered in
``dispatch.transports.TRANSPORTS``, and its message builder with a branch in
``DeletionRequests.outbound`` (the recipe's services step). The delivery loop then applies
its verdicts, none of which says anything of HTTP, as it does today's kinds': the attempt
recorded as the verdict says, the row's state, its retry, its target disabled, its ledger.
And its broker, calling back as a webhook's does, is answered with no SQL of its own: the
callback finds the request by the key its body names, whatever kind dispatched it.

Its admin step: a proxy model and its ModelAdmin on ``admin.integrations.IntegrationAdmin``,
both defined here (the model in an app registry of its own, the admin on a site of its own,
next to the list of every integration), and its pages work: its list, its add form (which
creates one through the admin's ``create``), its change page and its buttons, and the list
of every integration offers to add one and hands it its page.

The recipe's model step (a member of ``IntegrationKind`` and a migration widening the kind
column's check) is stood in for by dropping that check inside each test's transaction.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from typing import Any, ClassVar, Self

import pytest
from django import forms
from django.contrib.auth.models import User
from django.db import connection
from django.http import HttpRequest
from django.test import Client
from django.test.utils import isolate_apps
from django.urls import include, path
from django.utils import timezone
from rest_framework.test import APIClient
from unfold.sites import UnfoldAdminSite

from integrations.admin.integrations import Created, IntegrationAdmin, IntegrationListAdmin
from integrations.admin.shown_once import SecretShownOnce
from integrations.dispatch import signing
from integrations.dispatch.transport import Attempt, Message, Outcome, Verdict
from integrations.dispatch.transports import TRANSPORTS
from integrations.models import (
    Broker,
    DeletionRequest,
    DeliveryAttempt,
    Integration,
    LedgerEvent,
    OfItsKind,
    RequestState,
)
from integrations.services.dispatch.deliveries import DeletionRequests
from integrations.services.dispatch.delivery_loop import deliverables_deliver
from integrations.services.staff.integrations import integration_update
from integrations.services.staff.keys import api_key_create
from tests.builders import deletion_request, webhook

pytestmark = pytest.mark.django_db

PIGEON = "pigeon"


class PigeonTransport:
    """Sends nothing anywhere: each message gets the next scripted outcome."""

    kind = PIGEON

    def __init__(self, *outcomes: Outcome, retry_after: float | None = None) -> None:
        self.outcomes = list(outcomes)
        self.retry_after = retry_after
        self.sent: list[Message] = []

    def send(self, batch: Sequence[Message], pool: Executor | None) -> list[Verdict]:
        verdicts = []
        for message in batch:
            self.sent.append(message)
            outcome = self.outcomes.pop(0)
            verdicts.append(
                Verdict(
                    outcome=outcome,
                    attempt=Attempt(
                        started=timezone.now(),
                        address=message.address,
                        request_headers=dict(message.headers),
                        status=None,  # pigeons have no status codes
                        duration_ms=42,
                        response="coo" if outcome == "delivered" else "",
                        error="" if outcome == "delivered" else "no pigeon came back",
                    ),
                    failure="" if outcome == "delivered" else "no pigeon came back",
                    retry_after=self.retry_after if outcome == "retry" else None,
                    disable_reason="the loft is gone" if outcome == "gone" else "",
                )
            )
        return verdicts


def pigeon_deletion_outbound(request: DeletionRequest) -> Message:
    integration = request.integration
    assert integration is not None
    return Message(
        address=f"loft://{integration.name}/{request.request_uuid}",
        body=str(request.request_uuid).encode(),
        headers={"X-Leg": "left"},
    )


class PigeonDeletionRequests(DeletionRequests):
    def outbound(self, item: DeletionRequest) -> Message | None:
        if item.integration is not None and item.integration.kind == PIGEON:
            return pigeon_deletion_outbound(item)
        return super().outbound(item)


@pytest.fixture
def loft(broker: Broker) -> Integration:
    """An integration of the pigeon kind (see the module's docstring)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE integrations_integration DROP CONSTRAINT integration_kind_valid"
        )
    integration = webhook(broker, "Loft")
    Integration.objects.filter(pk=integration.pk).update(kind=PIGEON)
    integration.refresh_from_db()
    return integration


def _deliver(
    transport: PigeonTransport, request: DeletionRequest, monkeypatch: pytest.MonkeyPatch
) -> dict[str, int]:
    monkeypatch.setitem(TRANSPORTS, PIGEON, transport)
    counts = deliverables_deliver(kind=PigeonDeletionRequests(), ids=[request.pk], threads=1)
    request.refresh_from_db()
    return dict(counts)


def _events(request: DeletionRequest) -> list[LedgerEvent]:
    return list(LedgerEvent.objects.filter(subject=str(request.request_uuid)).order_by("id"))


def test_todays_kinds_each_have_their_transport() -> None:
    assert {kind: type(t).__name__ for kind, t in TRANSPORTS.items()} == {
        "webhook": "WebhookTransport",
        "isi": "IsiTransport",
        "saas": "SaasTransport",
    }


def test_a_delivered_verdict_acknowledges_the_request_and_records_the_attempt(
    loft: Integration, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = deletion_request(loft)
    pigeons = PigeonTransport("delivered")

    assert _deliver(pigeons, request, monkeypatch) == {"delivered": 1}

    (message,) = pigeons.sent
    assert message.body == str(request.request_uuid).encode()
    assert request.state == RequestState.DISPATCHED
    assert request.attempts == 1
    assert request.last_error == ""
    (attempt,) = DeliveryAttempt.objects.filter(deletion_request=request)
    assert attempt.url == f"loft://Loft/{request.request_uuid}"
    assert attempt.request_headers == {"X-Leg": "left"}
    assert (attempt.status, attempt.duration_ms, attempt.response_body, attempt.error) == (
        None,
        42,
        "coo",
        "",
    )
    (event,) = _events(request)
    assert event.kind == "deletion_request.delivered"
    assert event.data["url"] == attempt.url
    assert event.data["status"] is None


def test_a_retry_verdict_waits_as_long_as_the_target_asked(
    loft: Integration, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = deletion_request(loft)
    before = timezone.now()

    assert _deliver(PigeonTransport("retry", retry_after=600), request, monkeypatch) == {"retry": 1}

    after = timezone.now()
    assert request.state == RequestState.QUEUED
    assert request.last_error == "no pigeon came back"
    assert request.next_attempt_at is not None
    # The schedule says 5 s after a first attempt; the pigeon's 600 s is longer, so it wins.
    wait = dt.timedelta(seconds=600)
    assert before + wait <= request.next_attempt_at <= after + wait
    (event,) = _events(request)
    assert event.kind == "deletion_request.delivery_failed"
    assert event.data["error"] == "no pigeon came back"


def test_a_gone_verdict_disables_the_target_and_the_request_waits(
    loft: Integration, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = deletion_request(loft)

    assert _deliver(PigeonTransport("gone"), request, monkeypatch) == {"gone": 1}

    assert request.state == RequestState.QUEUED
    assert request.next_attempt_at is None
    loft.refresh_from_db()
    assert not loft.enabled
    assert loft.disabled_reason.startswith("the loft is gone at ")
    disabled = LedgerEvent.objects.get(kind="integration.disabled", subject=str(loft.uuid))
    assert disabled.data["alert"] is True


def test_a_failed_verdict_makes_the_request_undeliverable_at_once(
    loft: Integration, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = deletion_request(loft)

    assert _deliver(PigeonTransport("failed"), request, monkeypatch) == {"undeliverable": 1}

    assert request.state == RequestState.UNDELIVERABLE
    assert request.attempts == 1
    assert request.next_attempt_at is None
    (event,) = _events(request)
    assert event.kind == "deletion_request.undeliverable"


def test_a_kind_without_a_transport_is_held(loft: Integration) -> None:
    request = deletion_request(loft)
    assert PIGEON not in TRANSPORTS

    assert deliverables_deliver(kind=PigeonDeletionRequests(), ids=[request.pk]) == {"skipped": 1}

    request.refresh_from_db()
    assert request.state == RequestState.QUEUED
    assert not DeliveryAttempt.objects.exists()


def test_its_broker_calls_back_as_a_webhook_with_no_sql_of_its_own(
    broker: Broker, loft: Integration, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = deletion_request(loft)
    assert _deliver(PigeonTransport("delivered"), request, monkeypatch) == {"delivered": 1}
    key = api_key_create(broker=broker, scopes=["webhook_callback"], actor="test").key
    body = json.dumps(
        {
            "schema_version": "1.0",
            "status": "completed",
            "request_uuid": str(request.request_uuid),
            "drop_outcome": "deleted",
        }
    ).encode()
    signed = signing.signed_headers(loft.webhook_secret, body)

    response = APIClient().put(
        "/api/v1/drop/callbacks/deletion",
        data=body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
        HTTP_X_WEBHOOK_TIMESTAMP=signed["X-Webhook-Timestamp"],
        HTTP_X_WEBHOOK_SIGNATURE=signed["X-Webhook-Signature"],
    )

    assert response.status_code == 200, response.content
    request.refresh_from_db()
    assert (request.state, request.drop_outcome) == (RequestState.COMPLETED, "deleted")


# -- its admin pages ------------------------------------------------------------------------

# The URLs of this module's admin site, set by ``pigeon_site`` (this module is the URLconf).
urlpatterns: list[Any] = []


def pigeon_kind() -> tuple[type[Integration], type[IntegrationAdmin]]:
    """The recipe's proxy model and ModelAdmin for the pigeon (call it in isolated apps)."""

    class PigeonIntegration(Integration):
        KIND = PIGEON

        objects: ClassVar[OfItsKind[Self]] = OfItsKind()

        class Meta:
            proxy = True
            app_label = "integrations"
            verbose_name = "pigeon integration"

    class PigeonAddForm(forms.ModelForm):
        url = forms.URLField(assume_scheme="https")

        class Meta:
            model = PigeonIntegration
            fields = ["broker", "name", "url"]

    class PigeonChangeForm(forms.ModelForm):
        class Meta:
            model = PigeonIntegration
            fields = ["name", "enabled"]

    class PigeonIntegrationAdmin(IntegrationAdmin):
        kind_label = "Pigeon"
        add_form = PigeonAddForm
        form = PigeonChangeForm
        add_fieldsets = [(None, {"fields": ["broker", "name", "url"]})]
        fieldsets = [(None, {"fields": ["uuid", "broker", "kind", "name", "enabled", "waiting"]})]
        readonly_fields = ["uuid", "broker", "kind", "waiting"]

        def create(self, request: HttpRequest, data: dict[str, Any], actor: str) -> Created:
            secret = signing.generate_webhook_secret()
            loft = PigeonIntegration.objects.create(
                broker=data["broker"], name=data["name"], url=data["url"], webhook_secret=secret
            )
            return Created(loft, secret)

        def update(self, integration: Integration, data: dict[str, Any], actor: str) -> None:
            integration_update(integration=integration, actor=actor, name=data["name"])

        def secret_shown_once(
            self, integration: Integration, secret: str, title: str
        ) -> SecretShownOnce:
            return SecretShownOnce(
                title=title,
                label="Webhook Secret",
                secret=secret,
                done_url=self.admin_url("change", integration.pk),
                done_label=integration.name,
            )

    return PigeonIntegration, PigeonIntegrationAdmin


@pytest.fixture
def pigeon_site(settings: Any, client: Client) -> Iterator[type[Integration]]:
    """The pigeon's proxy model, its admin at ``/pigeons/`` with the list of every integration,
    and a superuser logged in."""
    with isolate_apps("integrations"):
        model, model_admin = pigeon_kind()
        site = UnfoldAdminSite(name="pigeons")
        site.register(Integration, IntegrationListAdmin)
        site.register(model, model_admin)
        urlpatterns[:] = [path("pigeons/", site.urls), path("", include("dropportal.urls"))]
        settings.ROOT_URLCONF = __name__
        client.force_login(User.objects.create_superuser("pip", "pip@example.com", "pw-coo-123"))
        yield model


def test_its_admin_pages_are_its_modeladmin_alone(
    broker: Broker, loft: Integration, pigeon_site: type[Integration], client: Client
) -> None:
    pigeons = "/pigeons/integrations/pigeonintegration/"

    listed = client.get(pigeons)
    assert listed.status_code == 200
    assert "Loft" in listed.content.decode()
    adding = client.get(f"{pigeons}add/")
    assert adding.status_code == 200
    assert 'name="url"' in adding.content.decode()
    page = client.get(f"{pigeons}{loft.pk}/change/").content.decode()
    assert "Regenerate secret" in page
    assert f'action="{pigeons}{loft.pk}/rotate-secret/?shown=' in page

    every = client.get("/pigeons/integrations/integration/").content.decode()
    assert f'href="{pigeons}add/"' in every
    assert "Add pigeon integration" in every
    handed = client.get(f"/pigeons/integrations/integration/{loft.pk}/change/")
    assert handed.status_code == 200
    assert handed.context_data is not None
    assert handed.context_data["opts"].model_name == "pigeonintegration"

    added = client.post(
        f"{pigeons}add/",
        {"broker": broker.pk, "name": "Loft 2", "url": "https://loft.example/coo"},
    )
    assert added.status_code == 302, added.content.decode()[:2000]
    assert added["Location"].startswith("/admin/shown-once/")
    assert pigeon_site.objects.get(name="Loft 2").kind == PIGEON
