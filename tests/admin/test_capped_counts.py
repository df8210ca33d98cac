"""The big lists count their rows up to a cap, not all of them on every page: past the cap
they read "10,000+" (here a cap of 3: "3+"), and a small list still reads its exact count."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from integrations.admin.capped_count import CappedCountPaginator
from integrations.admin.consumers import ConsumerAdmin
from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker
from integrations.services.ledger import ledger_event_append
from tests.builders import (
    ConsumerFactory,
    DeletionRequestFactory,
    DropCycleFactory,
    ResolutionRequestFactory,
    WorkItemFactory,
    webhook_integration_created,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("alice", "alice@example.com", "pw-alice-1"))
    return client


def _consumers(broker: Broker, n: int) -> None:
    ConsumerFactory.create_batch(n, broker=broker)


def _work_items(broker: Broker, n: int) -> None:
    WorkItemFactory.create_batch(n, cycle=DropCycleFactory.create(broker=broker))


def _deletion_requests(broker: Broker, n: int) -> None:
    integration = webhook_integration_created(broker, "https://crm.acme.example/drop").integration
    DeletionRequestFactory.create_batch(n, integration=integration)


def _resolution_requests(broker: Broker, n: int) -> None:
    integration = webhook_integration_created(broker, "https://crm.acme.example/drop").integration
    ResolutionRequestFactory.create_batch(n, integration=integration)


def _ledger_events(broker: Broker, n: int) -> None:
    for number in range(n):
        ledger_event_append(
            kind=LedgerKind.BROKER_CREATED, broker_id="4821", subject=str(number), actor="test"
        )


# (list, table, rows written, what the list's foot calls them)
LISTS = [
    ("consumer", "integrations_consumer", _consumers, "consumers"),
    ("workitem", "integrations_workitem", _work_items, "work items"),
    ("deletionrequest", "integrations_deletionrequest", _deletion_requests, "deletion requests"),
    (
        "resolutionrequest",
        "integrations_resolutionrequest",
        _resolution_requests,
        "resolution requests",
    ),
    ("ledgerevent", "integrations_ledgerevent", _ledger_events, "ledger events"),
]


def _text(page: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", page).split())


@pytest.mark.parametrize(("model", "table", "write", "plural"), LISTS)
def test_a_big_list_counts_no_further_than_the_cap(
    staff: Client,
    broker: Broker,
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    table: str,
    write: Callable[[Broker, int], None],
    plural: str,
) -> None:
    write(broker, 4)
    monkeypatch.setattr(CappedCountPaginator, "cap", 3)

    with CaptureQueriesContext(connection) as queries:
        response = staff.get(f"/admin/integrations/{model}/")

    assert response.status_code == 200
    counts = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].upper().startswith("SELECT COUNT(*)") and f'FROM "{table}"' in q["sql"]
    ]
    assert counts, "the list counts its rows"
    assert all(re.search(r"LIMIT 4\b", sql) for sql in counts), counts
    assert f"3+ {plural}" in _text(response.content.decode())


@pytest.mark.parametrize(("model", "table", "write", "plural"), LISTS)
def test_a_list_under_the_cap_reads_its_exact_count(
    staff: Client,
    broker: Broker,
    model: str,
    table: str,
    write: Callable[[Broker, int], None],
    plural: str,
) -> None:
    write(broker, 4)
    expected = 4 if model != "ledgerevent" else None  # staff and brokers write events too

    page = _text(staff.get(f"/admin/integrations/{model}/").content.decode())

    assert "+ " + plural not in page
    if expected is not None:
        assert f"{expected} {plural}" in page


def test_the_page_links_end_at_the_caps_page(
    staff: Client, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    ConsumerFactory.create_batch(6, broker=broker)
    monkeypatch.setattr(ConsumerAdmin, "list_per_page", 2)
    uncapped = staff.get("/admin/integrations/consumer/").content.decode()
    monkeypatch.setattr(CappedCountPaginator, "cap", 3)

    capped = staff.get("/admin/integrations/consumer/").content.decode()
    second = staff.get("/admin/integrations/consumer/", {"p": 2})

    assert 'href="?p=3"' in uncapped and "6 consumers" in _text(uncapped)
    assert 'href="?p=2"' in capped and 'href="?p=3"' not in capped
    assert second.status_code == 200 and "3+ consumers" in _text(second.content.decode())
