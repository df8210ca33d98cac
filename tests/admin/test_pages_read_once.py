"""What an admin page shows is read once per page: a read-only value the template reads
several times, a broker's list selections (its form and its history), a list's rows judged
together rather than one by one."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from integrations.admin.page_values import page_value
from integrations.models import Broker, CanaryRound, Integration, UnreadableWorkItem, WorkItem
from integrations.services.cycle.canaries import canary_round_send
from integrations.services.staff.brokers import broker_lists_select
from tests.builders import CanaryFactory, sample_cycle

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("alice", "alice@example.com", "pw-alice-1"))
    return client


def queries_of(staff: Client, url: str) -> tuple[list[str], str]:
    """The queries of ``url``'s page, and the page."""
    with CaptureQueriesContext(connection) as queries:
        response = staff.get(url)
    assert response.status_code == 200, url
    return [q["sql"] for q in queries.captured_queries], response.content.decode()


def reads_of(table: str, staff: Client, url: str) -> tuple[int, str]:
    """How many queries of ``url``'s page read ``table`` first, and the page."""
    sql, page = queries_of(staff, url)
    return sum(f'FROM "{table}"' in s for s in sql), page


def test_a_brokers_page_reads_its_list_selections_once(staff: Client, broker: Broker) -> None:
    broker_lists_select(broker=broker, lists=["email"], reason="emails", actor="staff:bob")
    broker_lists_select(broker=broker, lists=["email", "ndz"], reason="and NDZ", actor="staff:bob")

    reads, page = reads_of(
        "integrations_listselection", staff, f"/admin/integrations/broker/{broker.pk}/change/"
    )

    assert reads == 1
    assert "emails" in page and "and NDZ" in page  # the history
    # The lists in force, as the form shows them.
    checked = re.findall(
        r'<input type="checkbox" name="lists_selected" value="(\w+)"[^>]* checked', page
    )
    assert checked == ["email", "ndz"]


@pytest.fixture
def rounds(broker: Broker) -> Iterator[list[CanaryRound]]:
    sample_cycle(broker, today=timezone.localdate())
    CanaryFactory.create(broker=broker)
    sent = [canary_round_send(broker=broker, actor="test") for _ in range(3)]
    yield [r for r in sent if r is not None]


def test_a_list_of_canary_rounds_judges_its_rows_together(
    staff: Client, rounds: list[CanaryRound]
) -> None:
    assert len(rounds) == 3
    reads, page = reads_of(
        "integrations_deletionrequest", staff, "/admin/integrations/canaryround/"
    )
    assert reads == 1
    assert all(f"/admin/integrations/canaryround/{r.pk}/change/" in page for r in rounds)

    reads, _ = reads_of(
        "integrations_deletionrequest",
        staff,
        f"/admin/integrations/canaryround/{rounds[0].pk}/change/",
    )
    assert reads == 1  # its result and its answers per target, one judgement


def test_a_read_only_value_is_looked_up_once_per_page(staff: Client, broker: Broker) -> None:
    integration = sample_cycle(broker, today=timezone.localdate()).integration

    reads, page = reads_of(
        "integrations_deletionrequest",
        staff,
        f"/admin/integrations/integration/{integration.pk}/change/",
    )

    assert reads == 2  # the deliveries waiting: queued, undeliverable
    assert "queued," in page and "undeliverable deletion requests" in page
    assert Integration.objects.filter(pk=integration.pk).exists()


@pytest.mark.parametrize("page", ["workitem", "reportfile", "unreadableworkitem"])
def test_a_rows_page_reads_its_broker_and_cycle_with_the_row(
    staff: Client, broker: Broker, page: str
) -> None:
    """The broker is shown twice on these pages: as itself, and in the cycle's name."""
    world = sample_cycle(broker, today=timezone.localdate())
    row = {
        "workitem": lambda: WorkItem.objects.filter(cycle=world.cycle).first(),
        "reportfile": lambda: world.report_file,
        "unreadableworkitem": lambda: UnreadableWorkItem.objects.create(
            broker=broker, cycle=world.cycle, file_name="f.csv", line=3, text="x", reason="?"
        ),
    }[page]()
    assert row is not None

    sql, shown = queries_of(staff, f"/admin/integrations/{page}/{row.pk}/change/")

    assert f"{broker.broker_id} cycle {row.cycle.drop_session_id}" in shown
    assert sum('"integrations_broker"' in s for s in sql) == 1
    assert sum('"integrations_dropcycle"' in s for s in sql) == 1


def test_a_value_that_raised_is_read_again_not_kept() -> None:
    """unfold shows a failing read-only value as its empty value each time it asks; a kept
    exception would be raised once and then hidden as a value."""

    class Shown:
        pass

    shown, reads = Shown(), []

    def read() -> str:
        reads.append(1)
        if len(reads) == 1:
            raise LookupError("not yet")
        return "value"

    with pytest.raises(LookupError):
        page_value(shown, "field", read)
    assert page_value(shown, "field", read) == "value"
    assert page_value(shown, "field", read) == "value"
    assert len(reads) == 2  # read again after the exception, then kept
