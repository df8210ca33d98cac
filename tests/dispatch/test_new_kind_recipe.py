"""The "add a kind of target" recipe of docs/architecture.md, walked with a kind defined here.

A carrier-pigeon kind: its ``Transport`` (the recipe's dispatch step), which builds its own
requests' messages (``RequestMessages``), registered in ``dispatch.transports.TRANSPORTS``.
Nothing in ``services`` names it, yet matching makes its integrations deletion targets (and
asks them for identifiers when its transport says it resolves), and the delivery loop has it
build its messages and applies its verdicts, none of which says anything of HTTP, as it does today's
kinds': the attempt recorded as the verdict says, the row's state, its retry, its target
disabled, its ledger. And its broker, calling back as a webhook's does, is answered with no
SQL of its own: the callback finds the request by the key its body names, whatever kind
dispatched it.

Its admin step: a proxy model and its ModelAdmin on ``admin.integrations.IntegrationAdmin``,
both defined here (the model in an app registry of its own, the admin on a site of the
project's class, ``dropportal.admin.DropportalAdminSite``, next to the list of every
integration), and its pages work: its list (searched by a name, as every kind's list is),
its add form (which creates one through the admin's ``create``), its change page and its
buttons, and the list of every integration offers to add one and hands it its page.

The recipe's model step is stood in for: no member of ``IntegrationKind`` and no migration.
Its rows are webhook rows (``WebhookIntegrationFactory``) turned to the pigeon kind by an
UPDATE, after dropping the kind column's check inside each test's transaction.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, ClassVar, Self

import pytest
from django import forms
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.http import HttpRequest
from django.test import Client
from django.test.utils import isolate_apps
from django.urls import include, path
from django.utils import timezone
from rest_framework.test import APIClient

from devtools.drop_simulator import work_items
from dropportal.admin import DropportalAdminSite
from integrations.admin.integrations import Created, IntegrationAdmin, IntegrationListAdmin
from integrations.admin.shown_once import SecretShownOnce
from integrations.dispatch import signing
from integrations.dispatch.transport import Attempt, Message, Outcome, RequestMessages, Verdict
from integrations.dispatch.transports import TRANSPORTS, direct_target_kinds
from integrations.models import (
    Broker,
    DeletionRequest,
    DeliveryAttempt,
    Integration,
    IntegrationKind,
    LedgerEvent,
    OfItsKind,
    RequestState,
    ResolutionRequest,
)
from integrations.services.cycle.requests import pending_requests_target
from integrations.services.dispatch.deliveries import (
    DELETION_REQUESTS,
    resolution_requests_deliver,
)
from integrations.services.dispatch.delivery_loop import deliverables_deliver
from integrations.services.staff.integrations import integration_update
from integrations.services.staff.keys import api_key_create
from tests.builders import (
    ConsumerFactory,
    DeletionRequestFactory,
    SaasConnectionFactory,
    WebhookIntegrationFactory,
    drop_zip,
    write_zip,
)

pytestmark = pytest.mark.django_db

PIGEON = "pigeon"


class PigeonTransport:
    """Sends nothing anywhere: each message gets the next scripted outcome."""

    kind = PIGEON

    def __init__(
        self, *outcomes: Outcome, retry_after: float | None = None, resolves: bool = False
    ) -> None:
        self.outcomes = list(outcomes)
        self.retry_after = retry_after
        self.resolves = resolves
        self.sent: list[Message] = []

    def deletion_message(self, request: DeletionRequest) -> Message:
        integration = request.integration
        assert integration is not None
        return Message(
            address=f"loft://{integration.name}/{request.request_uuid}",
            body=str(request.request_uuid).encode(),
            headers={"X-Leg": "left"},
        )

    def resolution_message(self, request: ResolutionRequest) -> Message:
        return Message(
            address=f"loft://{request.integration.name}/who/{request.request_uuid}",
            body=str(request.request_uuid).encode(),
        )

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


@pytest.fixture
def loft(broker: Broker) -> Integration:
    """An integration of the pigeon kind (see the module's docstring)."""
    return _loft(broker)


def _loft(broker: Broker) -> Integration:
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE integrations_integration DROP CONSTRAINT integration_kind_valid"
        )
    integration = WebhookIntegrationFactory.create(broker=broker, name="Loft")
    Integration.objects.filter(pk=integration.pk).update(kind=PIGEON)
    integration.refresh_from_db()
    return integration


def _deliver(
    transport: PigeonTransport, request: DeletionRequest, monkeypatch: pytest.MonkeyPatch
) -> dict[str, int]:
    monkeypatch.setitem(TRANSPORTS, PIGEON, transport)
    counts = deliverables_deliver(kind=DELETION_REQUESTS, ids=[request.pk], threads=1)
    request.refresh_from_db()
    return dict(counts)


def _events(request: DeletionRequest) -> list[LedgerEvent]:
    return list(LedgerEvent.objects.filter(subject=str(request.request_uuid)).order_by("id"))


def test_every_kind_has_its_transport_and_nothing_else_has_one() -> None:
    # One transport a kind of integration, one for SaaS connections (the delivery loop's
    # ``target_kind``), none for a kind that does not exist; each filed under its own kind.
    # Derived from ``IntegrationKind``, so a kind the recipe adds holds it as today's do.
    assert set(TRANSPORTS) == {*IntegrationKind.values, "saas"}
    assert all(transport.kind == kind for kind, transport in TRANSPORTS.items())
    # Every kind's transport builds its own messages but ISI's (built in services: its stored
    # token); a SaaS connection is no integration. A kind half added (its transport builds no
    # messages of its requests) fails here rather than leave its integrations' matches
    # waiting for a target.
    assert set(direct_target_kinds()) == set(IntegrationKind.values) - {IntegrationKind.ISI}
    assert isinstance(PigeonTransport(), RequestMessages)


ITEMS = list(work_items(2))


@pytest.mark.parametrize("resolves", [False, True])
def test_matching_makes_its_integrations_targets_once_its_transport_is_registered(
    broker: Broker,
    loft: Integration,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    resolves: bool,
) -> None:
    for number, (_, hashed) in enumerate(ITEMS):
        ConsumerFactory.create(
            broker=broker, remote_identifier=f"C-{number}", hashes={"email": hashed}
        )
    SaasConnectionFactory.create(broker=broker, url="https://api.mailer.example/erase")
    package = write_zip(tmp_path, drop_zip(broker, {"Email": ITEMS}))
    monkeypatch.setitem(TRANSPORTS, PIGEON, PigeonTransport(resolves=resolves))

    call_command("drop", "import", "--broker", "4821", str(package))

    requests = DeletionRequest.objects.filter(integration=loft)
    assert sorted(r.remote_identifier for r in requests) == ["C-0", "C-1"]
    assert {r.state for r in requests} == {RequestState.QUEUED}
    resolutions = ResolutionRequest.objects.filter(integration=loft)
    assert resolutions.count() == (2 if resolves else 0)
    if resolves:  # and the loop has the transport build their messages
        pigeons = PigeonTransport("delivered", "delivered", resolves=True)
        monkeypatch.setitem(TRANSPORTS, PIGEON, pigeons)
        resolution_requests_deliver(request_ids=[r.pk for r in resolutions], threads=1)
        assert sorted(m.address for m in pigeons.sent) == sorted(
            f"loft://Loft/who/{r.request_uuid}" for r in resolutions
        )


@pytest.mark.parametrize("resolves", [False, True])
def test_a_match_waiting_for_a_target_gets_one_of_its_kind_when_it_comes(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, resolves: bool
) -> None:
    ConsumerFactory.create(broker=broker, remote_identifier="C-0", hashes={"email": ITEMS[0][1]})
    SaasConnectionFactory.create(broker=broker, url="https://api.mailer.example/erase")
    call_command(
        "drop", "import", "--broker", "4821",
        str(write_zip(tmp_path, drop_zip(broker, {"Email": ITEMS[:1]}))),
    )  # fmt: skip
    (waiting,) = DeletionRequest.objects.all()
    assert waiting.state == RequestState.PENDING
    monkeypatch.setitem(TRANSPORTS, PIGEON, PigeonTransport(resolves=resolves))
    loft = _loft(broker)

    pending_requests_target(broker=broker, actor="test")

    waiting.refresh_from_db()
    assert (waiting.integration, waiting.state) == (loft, RequestState.QUEUED)
    resolutions = ResolutionRequest.objects.filter(integration=loft)
    assert resolutions.count() == (1 if resolves else 0)


def test_without_its_transport_its_integrations_are_no_targets(
    broker: Broker, loft: Integration, tmp_path: Path
) -> None:
    ConsumerFactory.create(broker=broker, remote_identifier="C-0", hashes={"email": ITEMS[0][1]})
    package = write_zip(tmp_path, drop_zip(broker, {"Email": ITEMS[:1]}))

    call_command("drop", "import", "--broker", "4821", str(package))

    (waiting,) = DeletionRequest.objects.all()
    assert (waiting.integration, waiting.state) == (None, RequestState.PENDING)


def test_a_delivered_verdict_acknowledges_the_request_and_records_the_attempt(
    loft: Integration, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = DeletionRequestFactory.create(integration=loft)
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
    request = DeletionRequestFactory.create(integration=loft)
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
    request = DeletionRequestFactory.create(integration=loft)

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
    request = DeletionRequestFactory.create(integration=loft)

    assert _deliver(PigeonTransport("failed"), request, monkeypatch) == {"undeliverable": 1}

    assert request.state == RequestState.UNDELIVERABLE
    assert request.attempts == 1
    assert request.next_attempt_at is None
    (event,) = _events(request)
    assert event.kind == "deletion_request.undeliverable"


def test_a_kind_without_a_transport_is_held(loft: Integration) -> None:
    request = DeletionRequestFactory.create(integration=loft)
    assert PIGEON not in TRANSPORTS

    assert deliverables_deliver(kind=DELETION_REQUESTS, ids=[request.pk]) == {"skipped": 1}

    request.refresh_from_db()
    assert request.state == RequestState.QUEUED
    assert not DeliveryAttempt.objects.exists()


def test_its_broker_calls_back_as_a_webhook_with_no_sql_of_its_own(
    broker: Broker, loft: Integration, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = DeletionRequestFactory.create(integration=loft)
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
        site = DropportalAdminSite(name="pigeons")
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


def test_its_list_is_searched_by_a_name_as_every_kind_of_integrations_is(
    broker: Broker, loft: Integration, pigeon_site: type[Integration], client: Client
) -> None:
    # Named in no list of the site's: ``IntegrationAdmin`` lets a name of ours travel in the
    # address of every kind's list, so the pigeon's search is not refused as a consumer's.
    coop = WebhookIntegrationFactory.create(broker=broker, name="Coop")
    Integration.objects.filter(pk=coop.pk).update(kind=PIGEON)  # a second pigeon, not found
    pigeons = "/pigeons/integrations/pigeonintegration/"

    posted = client.post(pigeons, {"q": " Loft ", "_search": "1"})
    assert (posted.status_code, posted["Location"]) == (302, f"{pigeons}?q=Loft")
    listed = client.get(posted["Location"])
    assert listed.status_code == 200
    assert listed.context_data is not None
    assert [row.name for row in listed.context_data["cl"].result_list] == ["Loft"]
