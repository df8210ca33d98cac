"""Service providers and directives in the admin: a provider added through the service, a
directive downloaded as its CSV and signature (which verify), an acknowledgement recorded
with its reference by an Operator, and the dashboard's count of those awaiting one."""

from __future__ import annotations

import datetime as dt
import io
import zipfile
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from integrations.drop.calendar import drop_midnight
from integrations.evidence import pack
from integrations.evidence.directives import directive_verify
from integrations.evidence.signing_key import evidence_signing_key
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    Directive,
    DirectiveReason,
    LedgerEvent,
    ServiceProvider,
)
from integrations.services.providers.directives import directive_acknowledge, directives_issue
from integrations.services.providers.providers import service_provider_add
from tests.builders import DirectiveFactory, DropCycleFactory, WorkItemFactory

pytestmark = pytest.mark.django_db


def role_client(role: str) -> Client:
    user = User.objects.create_user(role.lower(), password="pw-123-role", is_staff=True)
    user.groups.add(Group.objects.get(name=role))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def directive(broker: Broker) -> Directive:
    provider = service_provider_add(broker=broker, name="Mailhouse", actor="test")
    item = WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker))
    (issued,) = directives_issue(broker=broker, work_items=[item.pk], reason=DirectiveReason.MATCH)
    assert issued.provider == provider
    return issued


def test_a_connections_manager_adds_a_provider_through_the_service(broker: Broker) -> None:
    client = role_client("Connections managers")
    answer = client.post(
        reverse("admin:integrations_serviceprovider_add"),
        {"broker": broker.pk, "name": "Warehouse", "contact": "", "s3_prefix": "s3://wh"},
    )
    assert answer.status_code == 200  # the form again, with the prefix refused
    assert "ending in a slash" in answer.content.decode()
    client.post(
        reverse("admin:integrations_serviceprovider_add"),
        {"broker": broker.pk, "name": "Warehouse", "contact": "", "s3_prefix": "s3://wh/x/"},
    )
    provider = ServiceProvider.objects.get(name="Warehouse")
    assert provider.s3_prefix == "s3://wh/x/"
    event = LedgerEvent.objects.get(kind=LedgerKind.SERVICE_PROVIDER_ADDED)
    assert event.actor == "staff:connections managers"


def test_an_auditor_downloads_the_csv_and_its_signature(directive: Directive) -> None:
    answer = role_client("Auditors").post(
        reverse("admin:integrations_directive_download", args=[directive.pk])
    )
    assert answer.status_code == 200
    assert answer["Content-Type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(answer.content)) as archive:
        content = archive.read(directive.file_name)
        signature = archive.read(f"{directive.file_name}.sig")
    assert content == bytes(directive.content)
    public_key = pack.load_public_key(pack.public_key_pem(evidence_signing_key()))
    directive_verify(public_key, content, signature)
    event = LedgerEvent.objects.get(kind=LedgerKind.DIRECTIVE_DOWNLOADED)
    assert (event.actor, event.data["via"]) == ("staff:auditors", "admin")


def test_a_get_of_a_directive_download_is_refused_and_writes_nothing(
    directive: Directive,
) -> None:
    # A download is a ledger event in the staff member's name: a prefetch, a link or another
    # site's <img> must not write one.
    answer = role_client("Auditors").get(
        reverse("admin:integrations_directive_download", args=[directive.pk])
    )
    assert answer.status_code == 405
    assert not LedgerEvent.objects.filter(kind=LedgerKind.DIRECTIVE_DOWNLOADED).exists()


@pytest.mark.parametrize("page", ["list", "record"])
def test_the_download_button_posts_the_pages_csrf_form(directive: Directive, page: str) -> None:
    user = User.objects.create_user("ada", password="pw-123-role", is_staff=True)
    user.groups.add(Group.objects.get(name="Auditors"))
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    url = reverse("admin:integrations_directive_download", args=[directive.pk])
    where = {
        "list": reverse("admin:integrations_directive_changelist"),
        "record": reverse("admin:integrations_directive_change", args=[directive.pk]),
    }[page]
    html = client.get(where).content.decode()
    assert f'href="{url}"' not in html  # no link a prefetch could follow
    assert f'form="dp-directive-download" formaction="{url}"' in html
    form = html.split('<form id="dp-directive-download" method="post"')[1].split("</form>")[0]
    token = form.split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]
    answer = client.post(url, {"csrfmiddlewaretoken": token})
    assert answer.status_code == 200
    assert answer["Content-Type"] == "application/zip"
    assert LedgerEvent.objects.filter(kind=LedgerKind.DIRECTIVE_DOWNLOADED).count() == 1


def test_an_operator_records_the_acknowledgement_with_its_reference(
    directive: Directive,
) -> None:
    client = role_client("Operators")
    changelist = reverse("admin:integrations_directive_changelist")
    chosen = {"action": "acknowledge_directives", "_selected_action": [directive.pk]}
    asked = client.post(changelist, chosen)
    assert asked.status_code == 200
    assert "reference" in asked.content.decode()
    directive.refresh_from_db()
    assert directive.acknowledged_at is None  # nothing before the reference is given
    client.post(changelist, {**chosen, "apply": "1", "reference": "letter of May 2"})
    directive.refresh_from_db()
    assert directive.acknowledgement_reference == "letter of May 2"
    assert directive.acknowledged_by == "staff:operators"


def test_the_list_shows_the_acknowledgement_on_drops_day(directive: Directive) -> None:
    # An hour before midnight in California: UTC's date is already the next day's. Staff
    # read DROP's calendar, as the message about an acknowledgement recorded before says.
    evening = drop_midnight(dt.date(2026, 11, 30)) - dt.timedelta(hours=1)
    Directive.objects.filter(pk=directive.pk).update(
        acknowledged_at=evening, acknowledged_by="staff:operators", acknowledgement_reference="R-7"
    )
    page = role_client("Operators").get(reverse("admin:integrations_directive_changelist"))
    assert "2026-11-29 R-7" in page.content.decode()


def test_an_auditor_cannot_record_an_acknowledgement(directive: Directive) -> None:
    client = role_client("Auditors")
    client.post(
        reverse("admin:integrations_directive_changelist"),
        {
            "action": "acknowledge_directives",
            "_selected_action": [directive.pk],
            "apply": "1",
            "reference": "x",
        },
    )
    directive.refresh_from_db()
    assert directive.acknowledged_at is None


def test_the_dashboard_counts_directives_awaiting_and_overdue(directive: Directive) -> None:
    client = role_client("Operators")
    page = client.get("/admin/").content.decode()
    assert "Directives to service providers" in page
    assert "awaiting acknowledgement" in page
    Directive.objects.filter(pk=directive.pk).update(
        created_at=directive.created_at - dt.timedelta(days=11)
    )
    page = client.get("/admin/").content.decode()
    assert (
        'class="dp-num dp-bad"'
        in page.split("Directives to service providers")[1].split("Requests needing attention")[0]
    )


def test_an_edit_is_recorded_with_what_changed(broker: Broker) -> None:
    provider = service_provider_add(broker=broker, name="Mailhouse", actor="test")
    role_client("Connections managers").post(
        reverse("admin:integrations_serviceprovider_change", args=[provider.pk]),
        {"name": "Mailhouse", "contact": "dpo@mailhouse.example", "s3_prefix": ""},
    )
    provider.refresh_from_db()
    assert provider.contact == "dpo@mailhouse.example"
    event = LedgerEvent.objects.get(kind=LedgerKind.SERVICE_PROVIDER_UPDATED)
    assert event.data == {"changes": {"contact": {"from": "", "to": "dpo@mailhouse.example"}}}


def test_a_rename_to_a_name_the_broker_already_uses_is_refused_on_the_name(
    broker: Broker,
) -> None:
    service_provider_add(broker=broker, name="Mailhouse", actor="test")
    provider = service_provider_add(broker=broker, name="Warehouse", actor="test")
    client = role_client("Connections managers")
    url = reverse("admin:integrations_serviceprovider_change", args=[provider.pk])
    events = LedgerEvent.objects.count()

    answer = client.post(url, {"name": "Mailhouse", "contact": "", "s3_prefix": ""})

    assert answer.status_code == 200  # the form again, with the name refused
    assert "already has a provider named &#x27;Mailhouse&#x27;" in answer.content.decode()
    provider.refresh_from_db()
    assert provider.name == "Warehouse"
    assert LedgerEvent.objects.count() == events
    # A name the broker does not use yet is saved.
    moved = client.post(url, {"name": "Warehouse Two", "contact": "", "s3_prefix": ""})
    assert moved.status_code == 302


def _messages(answer: Any) -> list[str]:
    return [str(message) for message in answer.context["messages"]]


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
def test_a_directive_acknowledged_since_the_page_was_opened_is_named_not_counted(
    broker: Broker, directive: Directive
) -> None:
    other = DirectiveFactory.create(provider=directive.provider)
    client = role_client("Operators")
    changelist = reverse("admin:integrations_directive_changelist")
    chosen = {"action": "acknowledge_directives", "_selected_action": [directive.pk, other.pk]}
    assert client.post(changelist, chosen).status_code == 200  # the page asking the reference
    # Meanwhile the provider acknowledges the first with its own key.
    directive_acknowledge(directive=directive, reference="ticket 4410", actor="apikey:dpk_ab12")

    answer = client.post(
        changelist, {**chosen, "apply": "1", "reference": "letter of May 2"}, follow=True
    )

    shown = " ".join(_messages(answer))
    assert "Recorded 1 acknowledgement(s)." in shown
    assert f"directive {directive.pk} was already acknowledged" in shown
    assert "by apikey:dpk_ab12 ('ticket 4410')" in shown
    directive.refresh_from_db()
    other.refresh_from_db()
    assert directive.acknowledgement_reference == "ticket 4410"
    assert (other.acknowledgement_reference, other.acknowledged_by) == (
        "letter of May 2",
        "staff:operators",
    )


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
def test_the_same_acknowledgement_sent_again_is_not_counted_again(directive: Directive) -> None:
    client = role_client("Operators")
    changelist = reverse("admin:integrations_directive_changelist")
    form = {
        "action": "acknowledge_directives",
        "_selected_action": [directive.pk],
        "apply": "1",
        "reference": "letter of May 2",
    }
    first = " ".join(_messages(client.post(changelist, form, follow=True)))
    again = " ".join(_messages(client.post(changelist, form, follow=True)))  # a replayed submit

    assert "Recorded 1 acknowledgement(s)." in first
    assert "Recorded" not in again
    assert f"directive {directive.pk} was already acknowledged" in again
    assert LedgerEvent.objects.filter(kind=LedgerKind.DIRECTIVE_ACKNOWLEDGED).count() == 1
