"""Consumers in the admin: exact search, list types and hash counts, read-only, forget."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from integrations.consumers.api_reader import parse_api_consumers
from integrations.models import Broker, Consumer, ConsumerHash, LedgerEvent
from integrations.services.cycle.consumers import consumers_register
from integrations.services.staff.brokers import broker_create
from tests.admin.markup import cells

pytestmark = pytest.mark.django_db

LIST = "/admin/integrations/consumer/"
SECRET_EMAIL = "Secret.Person@Example.com"
ANNA = "KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE="


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("alice", "alice@example.com", "pw-alice-1"))
    return client


@pytest.fixture
def registered(broker: Broker) -> Broker:
    consumers_register(
        broker=broker,
        records=parse_api_consumers(
            [
                {
                    "remote_identifier": "C-1",
                    "email": [SECRET_EMAIL, "Anna.Smith@Domain.com"],
                    "phone": ["+1 (415) 555-0123"],
                },
                {"remote_identifier": "C-10", "maid": ["a3f1c2d4-5678-90ab-cdef-1234567890ab"]},
            ]
        ),
        actor="test",
        source="api",
    )
    return broker


def test_list_shows_list_types_and_hash_counts_and_no_clear_value(
    staff: Client, registered: Broker
) -> None:
    page = staff.get(LIST).content.decode()
    assert "C-1" in page and "C-10" in page
    assert "email 2, phone 1" in page
    assert "maid 1" in page
    for clear in (SECRET_EMAIL, SECRET_EMAIL.lower(), "4155550123", "a3f1c2d4"):
        assert clear not in page


def test_search_is_an_exact_remote_identifier(staff: Client, registered: Broker) -> None:
    other = broker_create(broker_id="7777", name="Other", actor="test")
    consumers_register(
        broker=other,
        records=parse_api_consumers([{"remote_identifier": "C-1", "email": ["x@example.com"]}]),
        actor="test",
        source="api",
    )
    page = staff.get(LIST, {"q": "C-1"}).content.decode()
    assert len(cells(page, "remote_identifier")) == 2  # C-1 of each broker, not C-10
    assert "C-10" not in page
    assert "0 results" in staff.get(LIST, {"q": "-1"}).content.decode()  # not a part of one


def test_detail_lists_the_hashes_read_only_in_base64(staff: Client, registered: Broker) -> None:
    consumer = Consumer.objects.get(remote_identifier="C-1")
    page = staff.get(f"{LIST}{consumer.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert ANNA in text
    assert "email 2, phone 1" in text
    assert SECRET_EMAIL.lower() not in text
    assert 'name="_save"' not in text
    assert staff.get(f"{LIST}add/").status_code == 403
    staff.post(f"{LIST}{consumer.pk}/change/", {"remote_identifier": "changed"})
    consumer.refresh_from_db()
    assert consumer.remote_identifier == "C-1"


def test_delete_forgets_through_the_service_with_the_staff_actor(
    staff: Client, registered: Broker
) -> None:
    consumer = Consumer.objects.get(remote_identifier="C-1")
    response = staff.post(f"{LIST}{consumer.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Consumer.objects.filter(pk=consumer.pk).exists()
    assert not ConsumerHash.objects.filter(consumer_id=consumer.pk).exists()
    event = LedgerEvent.objects.get(kind="consumer.forgotten")
    assert event.actor == "staff:alice"
    assert event.data["hashes_removed"] == {"email": 2, "phone": 1}
    assert Consumer.objects.filter(remote_identifier="C-10").exists()


def test_an_auditor_sees_consumers_but_cannot_delete_them(
    client: Client, registered: Broker
) -> None:
    auditor = User.objects.create_user("audrey", password="pw-audrey-1", is_staff=True)
    auditor.groups.add(Group.objects.get(name="Auditors"))
    client.force_login(auditor)
    assert client.get(LIST).status_code == 200
    consumer = Consumer.objects.get(remote_identifier="C-1")
    assert client.post(f"{LIST}{consumer.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Consumer.objects.filter(pk=consumer.pk).exists()
