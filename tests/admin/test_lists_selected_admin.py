"""The broker admin records the lists selected in DROP's portal through the service: a
reason is required when they change, and each change is a ledger event by the staff
member."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from integrations.models import Broker, LedgerEvent, ListSelection
from integrations.selectors.list_selection import lists_selected_at
from integrations.services.staff.brokers import broker_lists_select

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("alice", "alice@example.com", "pw-alice-1"))
    return client


def change(staff: Client, broker: Broker, **fields: Any) -> Any:
    form = {"name": broker.name, "mode": broker.mode, "drop_base_url": "", "drop_api_key": ""}
    return staff.post(f"/admin/integrations/broker/{broker.pk}/change/", {**form, **fields})


def test_lists_selected_with_a_reason_are_recorded_by_the_staff_member(
    staff: Client, broker: Broker
) -> None:
    response = change(
        staff, broker, lists_selected=["email", "ndz"], lists_selected_reason="emails and NDZ"
    )

    assert response.status_code == 302
    selection = ListSelection.objects.get()
    assert (selection.lists, selection.actor) == (["email", "ndz"], "staff:alice")
    event = LedgerEvent.objects.get(kind="broker.lists_selected")
    assert (event.actor, event.data["lists"]) == ("staff:alice", ["Email", "NDZ"])
    page = staff.get(f"/admin/integrations/broker/{broker.pk}/change/").content.decode()
    assert "Email, NDZ" in page and "emails and NDZ" in page


def test_a_change_of_lists_without_a_reason_is_refused(staff: Client, broker: Broker) -> None:
    response = change(staff, broker, lists_selected=["email"])

    assert response.status_code == 200
    assert "Say why the broker selected these lists." in response.content.decode()
    assert not ListSelection.objects.exists()


def test_saving_other_fields_records_no_new_selection(staff: Client, broker: Broker) -> None:
    change(staff, broker, lists_selected=["email"], lists_selected_reason="emails")

    response = change(staff, broker, name="Acme Renamed", lists_selected=["email"])

    assert response.status_code == 302
    assert ListSelection.objects.count() == 1
    assert LedgerEvent.objects.filter(kind="broker.lists_selected").count() == 1


def test_a_page_opened_before_a_new_selection_keeps_it_on_save(
    staff: Client, broker: Broker
) -> None:
    change(staff, broker, lists_selected=["email"], lists_selected_reason="emails")
    url = f"/admin/integrations/broker/{broker.pk}/change/"
    page = staff.get(url).content.decode()
    # What the page showed, as it sends it back beside the fields (Django's initial-*).
    shown: dict[str, list[str]] = {}
    for name, value in re.findall(r'name="(initial-\w+)"(?: value="([^"]*)")?', page):
        shown.setdefault(name, []).append(value)
    # Meanwhile a colleague records the broker's new selection.
    broker_lists_select(
        broker=broker, lists=["email", "phone"], reason="phones too", actor="staff:bob"
    )

    response = staff.post(
        url,
        {
            **shown,
            "name": "Acme Renamed",
            "mode": broker.mode,
            "drop_base_url": "",
            "drop_api_key": "",
            "pull_interval_days": "30",
            "lists_selected": ["email"],  # as the page showed them
        },
    )

    assert response.status_code == 302
    broker.refresh_from_db()
    assert broker.name == "Acme Renamed"
    in_force = lists_selected_at(broker)
    assert in_force is not None and in_force.lists == ["email", "phone"]
    assert LedgerEvent.objects.filter(kind="broker.lists_selected").count() == 2
