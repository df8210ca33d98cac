"""Integrations and SaaS connections in the admin: add (secret shown once), edit, disable and
enable, regenerate the secret, send a test notification to a real loopback broker."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from procrastinate.contrib.django.models import ProcrastinateJob

from devtools.broker_simulator import BrokerSimulator, Reply
from integrations.drop.calendar import drop_time_text
from integrations.models import (
    Broker,
    Integration,
    LedgerEvent,
    RequestState,
    SaasConnection,
)
from integrations.services.staff.integrations import (
    integration_callback_secrets,
    integration_disable,
    integration_retire,
)
from integrations.services.staff.saas import saas_connection_disable
from tests.builders import (
    DeletionRequestFactory,
    SaasConnectionFactory,
    webhook_integration_created,
)

pytestmark = pytest.mark.django_db

SECRET_RE = re.compile(r"whsec_[A-Za-z0-9_-]{43}")


@pytest.fixture
def staff(client: Client) -> Client:
    user = User.objects.create_superuser("alice", "alice@example.com", "pw-alice-123")
    client.force_login(user)
    return client


@pytest.fixture
def receiver() -> Iterator[BrokerSimulator]:
    with BrokerSimulator() as running:
        yield running


def _add(staff: Client, broker: Broker, url: str) -> str:
    return staff.post(
        "/admin/integrations/integration/add/",
        {"broker": broker.pk, "name": "Acme CRM", "url": url},
        follow=True,
    ).content.decode()


def test_adding_a_webhook_integration_shows_its_secret_once(staff: Client, broker: Broker) -> None:
    page = _add(staff, broker, "https://crm.acme.example/drop")

    (shown,) = set(SECRET_RE.findall(page))
    integration = Integration.objects.get()
    assert integration.webhook_secret == shown
    with connection.cursor() as cursor:
        cursor.execute("SELECT webhook_secret FROM integrations_integration")
        assert shown not in cursor.fetchone()[0]  # encrypted at rest
    change_page = staff.get(f"/admin/integrations/integration/{integration.pk}/change/")
    assert shown not in change_page.content.decode()
    event = LedgerEvent.objects.get(kind="integration.created")
    assert event.actor == "staff:alice"
    assert shown not in str(event.data)


def test_a_plain_http_url_is_refused_on_the_form(staff: Client, broker: Broker) -> None:
    page = _add(staff, broker, "http://crm.acme.example/drop")

    assert "plain http is refused" in page
    assert not Integration.objects.exists()


def test_editing_and_disabling_go_through_the_services(staff: Client, broker: Broker) -> None:
    integration = webhook_integration_created(broker, "https://crm.acme.example/drop").integration
    url = f"/admin/integrations/integration/{integration.pk}/change/"

    # As a browser posts the page: the box as it showed it beside the one submitted.
    staff.post(
        url,
        {"name": "Acme CRM 2", "url": "https://crm2.acme.example/drop", "initial-enabled": "True"},
    )
    integration.refresh_from_db()
    assert (integration.name, integration.url, integration.enabled) == (
        "Acme CRM 2",
        "https://crm2.acme.example/drop",
        False,  # "enabled" was not ticked
    )
    assert LedgerEvent.objects.get(kind="integration.updated").data["changes"]["name"] == {
        "from": "Acme CRM",
        "to": "Acme CRM 2",
    }
    assert LedgerEvent.objects.get(kind="integration.disabled").actor == "staff:alice"

    waiting = DeletionRequestFactory.create(integration=integration, state=RequestState.QUEUED)
    staff.post(
        url,
        {"name": "Acme CRM 2", "url": integration.url, "enabled": "on", "initial-enabled": "False"},
    )
    integration.refresh_from_db()
    assert integration.enabled
    job = ProcrastinateJob.objects.get(task_name="integrations.tasks.deliver_deletion_requests")
    assert job.args == {"request_ids": [waiting.pk]}


def test_a_page_opened_before_a_disable_does_not_enable_again_on_save(
    staff: Client, broker: Broker
) -> None:
    """Staff open the page while the integration is enabled; meanwhile the broker answers
    410 and it is disabled. Saving a rename from that page leaves it disabled: the box was
    not changed by the person, only shown as it was."""
    integration = webhook_integration_created(broker, "https://crm.acme.example/drop").integration
    page = staff.get(f"/admin/integrations/integration/{integration.pk}/change/")
    assert 'name="initial-enabled" value="True"' in page.content.decode()
    integration_disable(integration=integration, reason="410 gone from broker", actor="system")

    staff.post(
        f"/admin/integrations/integration/{integration.pk}/change/",
        {"name": "Renamed", "url": integration.url, "enabled": "on", "initial-enabled": "True"},
    )

    integration.refresh_from_db()
    assert (integration.name, integration.enabled) == ("Renamed", False)
    assert not LedgerEvent.objects.filter(kind="integration.enabled").exists()
    connection_ = SaasConnectionFactory.create(broker=broker)
    saas_disable = f"/admin/integrations/saasconnection/{connection_.pk}/change/"
    saas_connection_disable(connection=connection_, reason="vendor outage", actor="system")
    staff.post(
        saas_disable,
        {
            "name": "Renamed",
            "url": connection_.url,
            "categories": "email",
            "enabled": "on",
            "initial-enabled": "True",
        },
    )
    connection_.refresh_from_db()
    assert (connection_.name, connection_.enabled) == ("Renamed", False)


def test_regenerating_shows_the_new_secret_once_and_keeps_the_old_one_for_24_hours(
    staff: Client, broker: Broker
) -> None:
    created = webhook_integration_created(broker, "https://crm.acme.example/drop")
    integration = created.integration

    page = staff.post(
        f"/admin/integrations/webhookintegration/{integration.pk}/rotate-secret/", follow=True
    ).content.decode()

    (shown,) = set(SECRET_RE.findall(page))
    integration.refresh_from_db()
    assert shown == integration.webhook_secret != created.webhook_secret
    assert integration.previous_webhook_secret == created.webhook_secret
    assert integration.previous_secret_expires_at is not None
    # When the old secret stops working, in DROP's zone as every time the admin shows.
    until = drop_time_text(integration.previous_secret_expires_at)
    assert until.endswith(("PST", "PDT")) and f"until {until}." in page
    assert LedgerEvent.objects.get(kind="integration.secret_rotated").actor == "staff:alice"
    assert (
        staff.get(
            f"/admin/integrations/webhookintegration/{integration.pk}/rotate-secret/"
        ).status_code
        == 403
    )


def test_regenerate_pressed_twice_keeps_the_brokers_secret_for_its_24_hours(
    staff: Client, broker: Broker
) -> None:
    """A double click posts the button twice from one page: the first new secret is shown to
    no one, and the broker's must not stop verifying at once."""
    created = webhook_integration_created(broker, "https://crm.acme.example/drop")
    integration = created.integration
    page = staff.get(f"/admin/integrations/webhookintegration/{integration.pk}/change/")
    (button,) = re.findall(r'"(/admin/[^"]*rotate-secret/\?shown=[^"]*)"', page.content.decode())

    staff.post(button.replace("&amp;", "&"))
    shown = staff.post(button.replace("&amp;", "&"), follow=True).content.decode()

    integration.refresh_from_db()
    (second,) = set(SECRET_RE.findall(shown))
    assert integration_callback_secrets(integration) == [second, created.webhook_secret]
    events = LedgerEvent.objects.filter(kind="integration.secret_rotated").order_by("id")
    assert [e.data["replaced_unused_secret"] for e in events] == [False, True]

    # Pressed again later from a fresh page: the secret the broker was given since is the
    # one that stays valid, as for any rotation.
    fresh = staff.get(f"/admin/integrations/webhookintegration/{integration.pk}/change/")
    (button,) = re.findall(r'"(/admin/[^"]*rotate-secret/\?shown=[^"]*)"', fresh.content.decode())
    staff.post(button.replace("&amp;", "&"))
    integration.refresh_from_db()
    assert integration.previous_webhook_secret == second


def test_a_retired_integration_gets_no_new_secret_in_the_admin(
    staff: Client, broker: Broker
) -> None:
    created = webhook_integration_created(broker, "https://crm.acme.example/drop")
    integration = created.integration
    change = f"/admin/integrations/webhookintegration/{integration.pk}/change/"
    shown_before = staff.get(change).content.decode()
    (button,) = re.findall(r'"(/admin/[^"]*rotate-secret/\?shown=[^"]*)"', shown_before)
    integration_retire(integration=integration, reason="CRM decommissioned", actor="test")

    # The button of a page shown before it was retired: refused, the page says why.
    page = staff.post(button.replace("&amp;", "&"), follow=True)

    assert page.redirect_chain[-1][0] == change
    assert "retired is final" in html.unescape(page.content.decode())
    assert not SECRET_RE.findall(page.content.decode())
    integration.refresh_from_db()
    assert integration.webhook_secret == created.webhook_secret
    assert not LedgerEvent.objects.filter(kind="integration.secret_rotated").exists()
    # Its page now offers no new secret at all.
    assert "rotate-secret" not in staff.get(change).content.decode()


def test_a_test_notification_shows_the_brokers_answer(
    staff: Client, broker: Broker, receiver: BrokerSimulator, settings
) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    created = webhook_integration_created(broker, receiver.url)
    receiver.secrets = [created.webhook_secret]
    receiver.script(Reply(status=200, body=b"pong from acme"), Reply(status=410, body=b"gone"))
    url = f"/admin/integrations/webhookintegration/{created.integration.pk}/test-notification/"

    ok = staff.post(url, follow=True).content.decode()
    failed = staff.post(url, follow=True).content.decode()

    assert "HTTP 200" in ok and "pong from acme" in ok
    assert "failed: HTTP 410" in failed and "gone" in failed
    first = receiver.received[0]
    assert first.signature_ok is True
    assert first.json["topic"] == "drop.test"
    events = LedgerEvent.objects.filter(kind="integration.test_sent").order_by("id")
    assert [e.data["status"] for e in events] == [200, 410]


@pytest.mark.parametrize(
    ("reply", "shown"),
    [
        (
            Reply(status=200, body=b"pong for s3cr3t-t0ken"),
            "The broker answered: pong for [redacted]",
        ),
        (
            Reply(status=404, body=b"Cannot POST /?code=s3cr3t-t0ken from ann@example.com"),
            "The broker answered: Cannot POST /?[redacted] from <email>",
        ),
    ],
)
def test_a_test_notification_keeps_no_token_of_the_urls_query_in_its_message(
    staff: Client, broker: Broker, receiver: BrokerSimulator, settings, reply: Reply, shown: str
) -> None:
    """The message may travel in a cookie, signed but readable: the URL without its query,
    the answer as an attempt keeps it."""
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    created = webhook_integration_created(broker, receiver.url + "?code=s3cr3t-t0ken")
    receiver.secrets = [created.webhook_secret]
    receiver.script(reply)
    url = f"/admin/integrations/webhookintegration/{created.integration.pk}/test-notification/"

    posted = staff.post(url)

    (message,) = [str(m) for m in get_messages(posted.wsgi_request)]
    sent_to = f"Test notification to {receiver.url}"
    assert message.startswith((f"{sent_to}: HTTP 200", f"{sent_to} failed: HTTP 404"))
    assert shown in message
    assert "s3cr3t" not in message
    assert "?code=s3cr3t-t0ken" in receiver.received[0].path  # what the broker asked for


def test_no_test_notification_goes_to_a_retired_integration(
    staff: Client, broker: Broker, receiver: BrokerSimulator, settings
) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    created = webhook_integration_created(broker, receiver.url)
    integration_retire(integration=created.integration, reason="CRM decommissioned", actor="test")
    url = f"/admin/integrations/webhookintegration/{created.integration.pk}/test-notification/"

    page = html.unescape(staff.post(url, follow=True).content.decode())

    assert "No test notification sent: 'Acme CRM' was retired (CRM decommissioned)" in page
    assert receiver.received == []
    assert not LedgerEvent.objects.filter(kind="integration.test_sent").exists()


def test_a_saas_connection_whose_categories_name_none_is_refused(
    staff: Client, broker: Broker
) -> None:
    page = staff.post(
        "/admin/integrations/saasconnection/add/",
        {
            "broker": broker.pk,
            "name": "Mailer",
            "url": "https://api.mailer.example/erase",
            "categories": " , ,",
            "enabled": "on",
        },
    ).content.decode()

    assert "name at least one identifier category" in page
    assert not SaasConnection.objects.exists()


def test_a_saas_connection_is_added_with_its_token_write_only(
    staff: Client, broker: Broker
) -> None:
    response = staff.post(
        "/admin/integrations/saasconnection/add/",
        {
            "broker": broker.pk,
            "name": "Mailer",
            "url": "https://api.mailer.example/erase",
            "token": "s3cr3t-token",
            "categories": "email, phone",
            "enabled": "on",
        },
        follow=True,
    )

    assert response.status_code == 200
    connection_ = SaasConnection.objects.get()
    assert connection_.token == "s3cr3t-token"
    assert connection_.identifier_categories == ["email", "phone"]
    page = staff.get(f"/admin/integrations/saasconnection/{connection_.pk}/change/")
    assert "s3cr3t-token" not in page.content.decode()
    event = LedgerEvent.objects.get(kind="saas_connection.created")
    assert event.actor == "staff:alice"
    assert "s3cr3t-token" not in str(event.data)
