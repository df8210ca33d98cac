"""The admin: brokers and keys go through services (ledger events); the ledger is read-only."""

from __future__ import annotations

import hashlib
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from integrations.ledger_kinds import LedgerKind
from integrations.models import ApiKey, Broker, LedgerEvent
from integrations.services.ledger import ledger_event_append
from integrations.services.staff.brokers import broker_update

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client: Client) -> Client:
    user = User.objects.create_superuser("alice", "alice@example.com", "pw-alice-123")
    client.force_login(user)
    return client


def test_add_broker_writes_a_ledger_event_with_the_staff_actor(staff: Client) -> None:
    response = staff.post(
        "/admin/integrations/broker/add/",
        {
            "broker_id": "4821",
            "name": "Acme",
            "mode": "test",
            "drop_base_url": "",
            "drop_api_key": "k",
        },
    )
    assert response.status_code == 302
    assert Broker.objects.get().drop_api_key == "k"
    event = LedgerEvent.objects.get(kind="broker.created")
    assert event.actor == "staff:alice"


def test_bad_broker_id_is_refused_in_the_form(staff: Client) -> None:
    response = staff.post(
        "/admin/integrations/broker/add/",
        {"broker_id": "482", "name": "Acme", "mode": "test", "drop_base_url": ""},
    )
    assert response.status_code == 200
    assert b"exactly four digits" in response.content
    assert not Broker.objects.exists()


def test_edit_broker_records_the_change(staff: Client, broker: Broker) -> None:
    response = staff.post(
        f"/admin/integrations/broker/{broker.pk}/change/",
        {"name": "Acme Renamed", "mode": "production", "drop_base_url": "", "drop_api_key": ""},
    )
    assert response.status_code == 302
    event = LedgerEvent.objects.get(kind="broker.updated")
    assert event.data["changes"]["name"] == {"from": "Acme Data", "to": "Acme Renamed"}
    assert "drop_api_key" not in event.data["changes"]


def test_a_rename_from_a_page_opened_before_another_change_keeps_that_change(
    staff: Client, broker: Broker
) -> None:
    url = f"/admin/integrations/broker/{broker.pk}/change/"
    page = staff.get(url).content.decode()
    # What the page showed, as it sends it back beside the fields (Django's initial-*).
    shown = dict(re.findall(r'name="initial-(\w+)"(?: value="([^"]*)")?', page))
    assert shown["mode"] == "test"
    # Meanwhile another manager switches the broker to production and enters its key.
    broker_update(broker=broker, actor="staff:bob", mode="production", drop_api_key="PRODKEY")

    response = staff.post(
        url,
        {
            **{f"initial-{name}": value for name, value in shown.items()},
            "name": "Acme Renamed",
            "mode": shown["mode"],
            "drop_base_url": shown["drop_base_url"],
            "drop_api_key": "",
            "pull_interval_days": shown["pull_interval_days"],
        },
    )

    assert response.status_code == 302
    broker.refresh_from_db()
    assert (broker.name, broker.mode, broker.drop_api_key) == (
        "Acme Renamed",
        "production",
        "PRODKEY",
    )
    event = LedgerEvent.objects.filter(kind="broker.updated").latest("id")
    assert set(event.data["changes"]) == {"name"}


@pytest.mark.parametrize("page", ["add", "change"])
@pytest.mark.parametrize(
    ("entered", "message"),
    [
        (
            {"drop_base_url": "https://u:p@drop.example.com/"},
            "must not carry a user name or password",
        ),
        ({"drop_api_key": "dk live 4821"}, "DROP API key must be non-empty printable ASCII"),
        ({"drop_base_url": "http://drop.example.com/"}, "DROP base URL must use https"),
    ],
)
def test_a_drop_key_or_base_url_the_drop_client_refuses_is_refused_in_the_form(
    staff: Client, broker: Broker, page: str, entered: dict[str, str], message: str
) -> None:
    url = (
        "/admin/integrations/broker/add/"
        if page == "add"
        else f"/admin/integrations/broker/{broker.pk}/change/"
    )
    form = {"broker_id": "4822", "name": "Acme", "mode": "test", "pull_interval_days": "30"}
    events = LedgerEvent.objects.count()
    response = staff.post(url, {**form, **entered})
    assert response.status_code == 200  # the form again, the error on the field
    assert message in response.content.decode()
    assert LedgerEvent.objects.count() == events
    assert not Broker.objects.filter(broker_id="4822").exists()
    broker.refresh_from_db()
    assert (broker.name, broker.drop_base_url, broker.drop_api_key) == ("Acme Data", "", "")
    # The same form without the refused value is saved.
    saved = staff.post(url, {**form, "drop_base_url": "https://drop.example.com/"})
    assert saved.status_code == 302


def test_key_is_shown_once_on_creation_and_revocable(staff: Client, broker: Broker) -> None:
    response = staff.post(
        "/admin/integrations/apikey/add/",
        {"broker": broker.pk, "name": "cb", "scopes": ["webhook_callback"]},
        follow=True,
    )
    page = response.content.decode()
    match = re.search(r"(dpk_[A-Za-z0-9_-]{40,})", page)
    assert match, "the new key is shown"
    key = match.group(1)
    stored = ApiKey.objects.get()
    assert stored.digest == hashlib.sha256(key.encode()).hexdigest()
    assert key not in staff.get(f"/admin/integrations/apikey/{stored.pk}/change/").content.decode()
    assert key not in staff.get("/admin/integrations/apikey/").content.decode()
    staff.post(
        "/admin/integrations/apikey/",
        {"action": "revoke_keys", "_selected_action": [stored.pk]},
    )
    stored.refresh_from_db()
    assert stored.revoked_at is not None
    assert LedgerEvent.objects.get(kind="api_key.revoked").actor == "staff:alice"


def test_ledger_is_read_only_in_the_admin(staff: Client) -> None:
    event = ledger_event_append(kind=LedgerKind.BROKER_UPDATED)
    assert staff.get("/admin/integrations/ledgerevent/").status_code == 200
    assert staff.get("/admin/integrations/ledgerevent/add/").status_code == 403
    assert staff.post(f"/admin/integrations/ledgerevent/{event.pk}/delete/").status_code == 403
    page = staff.get(f"/admin/integrations/ledgerevent/{event.pk}/change/")
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
