"""A change page opened before someone else changed the record, then saved: what this person
changed is saved, and what the other changed meanwhile stays (a setting left as the page
showed it is not put back). As a browser posts the page: the fields, and beside them the
values the page showed (Django's ``initial-*``)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, LedgerEvent, SaasConnection, ServiceProvider
from integrations.services.providers.providers import (
    service_provider_add,
    service_provider_update,
)
from integrations.services.staff.integrations import integration_update
from integrations.services.staff.saas import saas_connection_create, saas_connection_update
from tests.builders import webhook_integration_created

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_superuser("alice", "alice@example.com", "pw-al-123"))
    return client


def _shown(page: str) -> dict[str, str]:
    """What the page sends back beside its fields: the values it showed."""
    return {
        f"initial-{name}": value
        for name, value in re.findall(r'name="initial-(\w+)"(?: value="([^"]*)")?', page)
    }


def test_a_provider_renamed_from_an_old_page_keeps_the_contact_changed_meanwhile(
    staff: Client, broker: Broker
) -> None:
    provider = service_provider_add(
        broker=broker, name="Mailhouse", contact="ops@mailhouse.example", actor="test"
    )
    url = reverse("admin:integrations_serviceprovider_change", args=[provider.pk])
    shown = _shown(staff.get(url).content.decode())
    # Meanwhile a colleague enters the provider's new contact and S3 prefix.
    service_provider_update(
        provider,
        changes={"contact": "dpo@mailhouse.example", "s3_prefix": "s3://mailhouse/drop/"},
        actor="staff:bob",
    )

    answer = staff.post(
        url,
        {**shown, "name": "Mailhouse Ltd", "contact": "ops@mailhouse.example", "s3_prefix": ""},
    )

    assert answer.status_code == 302
    provider = ServiceProvider.objects.get(pk=provider.pk)
    assert (provider.name, provider.contact, provider.s3_prefix) == (
        "Mailhouse Ltd",
        "dpo@mailhouse.example",
        "s3://mailhouse/drop/",
    )
    event = LedgerEvent.objects.filter(kind=LedgerKind.SERVICE_PROVIDER_UPDATED).latest("id")
    assert (event.actor, set(event.data["changes"])) == ("staff:alice", {"name"})


def test_a_webhook_renamed_from_an_old_page_keeps_the_url_changed_meanwhile(
    staff: Client, broker: Broker
) -> None:
    integration = webhook_integration_created(broker, "https://crm.acme.example/drop").integration
    url = f"/admin/integrations/integration/{integration.pk}/change/"
    shown = _shown(staff.get(url).content.decode())
    # Meanwhile a colleague points it at the broker's new endpoint.
    integration_update(
        integration=integration, actor="staff:bob", url="https://crm2.acme.example/drop"
    )

    answer = staff.post(
        url,
        {**shown, "name": "Acme CRM 2", "url": "https://crm.acme.example/drop", "enabled": "on"},
    )

    assert answer.status_code == 302
    integration.refresh_from_db()
    assert (integration.name, integration.url) == ("Acme CRM 2", "https://crm2.acme.example/drop")
    event = LedgerEvent.objects.filter(kind=LedgerKind.INTEGRATION_UPDATED).latest("id")
    assert (event.actor, set(event.data["changes"])) == ("staff:alice", {"name"})


def test_a_saas_connection_renamed_from_an_old_page_keeps_its_new_url_and_token(
    staff: Client, broker: Broker
) -> None:
    created = saas_connection_create(
        broker=broker,
        name="Mailer",
        url="https://api.mailer.example/erase",
        token="tok-old-123",
        categories=["email"],
        actor="test",
    )
    url = f"/admin/integrations/saasconnection/{created.pk}/change/"
    shown = _shown(staff.get(url).content.decode())
    # Meanwhile a colleague moves it to the vendor's new API, with the token for it.
    saas_connection_update(
        connection=created,
        actor="staff:bob",
        url="https://api2.mailer.example/erase",
        token="tok-new-456",
        categories=["email", "phone"],
    )

    answer = staff.post(
        url,
        {
            **shown,
            "name": "Mailer EU",
            "url": "https://api.mailer.example/erase",
            "token": "",
            "categories": "email",
            "enabled": "on",
        },
    )

    assert answer.status_code == 302
    connection = SaasConnection.objects.get(pk=created.pk)
    assert (connection.name, connection.url, connection.token) == (
        "Mailer EU",
        "https://api2.mailer.example/erase",
        "tok-new-456",
    )
    assert connection.identifier_categories == ["email", "phone"]
    event = LedgerEvent.objects.filter(kind=LedgerKind.SAAS_CONNECTION_UPDATED).latest("id")
    assert (event.actor, set(event.data["changes"])) == ("staff:alice", {"name"})
