"""The dashboard (admin index): the right numbers, each linked to the list that holds them."""

from __future__ import annotations

import datetime as dt
import io
import re
from html import unescape
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from integrations.drop.calendar import drop_today
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    CycleState,
    DeletionRequest,
    ReportFileState,
    ReportKind,
    RequestState,
)
from integrations.selectors.dashboard import dashboard_overview, integration_delivery_health
from integrations.services.ledger import ledger_event_append
from integrations.services.staff.brokers import broker_create
from tests.builders import (
    DeletionRequestFactory,
    DropAccessObligationFactory,
    DropCycleFactory,
    ReportFileFactory,
    WorkItemFactory,
    sample_cycle,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser() -> User:
    return User.objects.create_superuser("alice", "alice@example.com", "pw-alice-123")


def staff_client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_overview_counts_what_needs_attention(broker: Broker) -> None:
    today = drop_today()
    world = sample_cycle(broker, today=today)
    now = dt.datetime.combine(today, dt.time(12, tzinfo=dt.UTC))  # the sample's own now

    (overview,) = dashboard_overview(now=now)

    assert overview.current_cycle is not None
    assert overview.current_cycle.cycle == world.cycle
    assert overview.current_cycle.not_removed == 14  # 15 work items, one removed
    assert overview.current_cycle.with_status == 10
    assert [c.cycle.drop_session_id for c in overview.recent_cycles] == ["1", "2"]
    assert overview.attention.failed == 1
    assert overview.attention.undeliverable == 1
    assert overview.attention.awaiting_callback == 1  # 8 days; the 1-day-old one is fine
    (health,) = overview.integrations
    assert health.last_success_at is not None
    # The sample's clock is noon UTC of DROP's today; its last 2xx came two days before.
    sample_now = dt.datetime.combine(today, dt.time(12, tzinfo=dt.UTC))
    assert health.last_success_at == sample_now - dt.timedelta(days=2)
    assert health.failures_in_a_row == 3
    assert overview.last_download_at == world.cycle.downloaded_at
    assert overview.last_upload_at == world.report_file.uploaded_at


def test_integration_health_looks_at_the_latest_attempts_only(broker: Broker) -> None:
    world = sample_cycle(broker, today=drop_today())
    # The four attempts, oldest first: 200, 500, no answer, 503.
    health, complete = integration_delivery_health(attempts_looked_at=10)
    assert complete
    last_success, failures = health[world.integration.pk]
    assert last_success is not None and failures == 3

    health, complete = integration_delivery_health(attempts_looked_at=2)
    assert not complete  # the success is older than the two attempts looked at
    assert health[world.integration.pk] == (None, 2)


def test_dashboard_queries_do_not_grow_with_brokers_or_cycles(
    broker: Broker, superuser: User, django_assert_max_num_queries
) -> None:
    sample_cycle(broker, today=drop_today())
    DropAccessObligationFactory.create(broker=broker)
    client = staff_client(superuser)
    client.get("/admin/")  # warm the session and content types
    # 24: one each for the canary rounds and the ledger's outside anchor, whatever the brokers.
    with django_assert_max_num_queries(24) as one_broker:
        client.get("/admin/")
    for broker_id in ("4822", "4823", "4824"):
        other = broker_create(broker_id=broker_id, name=f"Broker {broker_id}", actor="test")
        sample_cycle(other, today=drop_today())
        DropAccessObligationFactory.create_batch(2, broker=other)
    with django_assert_max_num_queries(len(one_broker.captured_queries)):
        page = client.get("/admin/").content.decode()
    assert page.count('class="dp-broker"') == 4


def test_dashboard_shows_each_cycle_and_its_deadline(broker: Broker, superuser: User) -> None:
    sample_cycle(broker, today=drop_today())
    page = staff_client(superuser).get("/admin/").content.decode()
    assert "4821 · Acme Data" in page
    assert "35 days left" in page
    assert "day 10 of 45 · 35 left" in page
    assert "awaiting a callback for more than 7 days" in page
    assert "Acme deletions" in page
    assert "Configuration and records" in page  # the model list stays reachable
    assert 'href="/admin/integrations/broker/"' in page


def dashboard_links(page: str) -> list[tuple[str, str]]:
    """(url, number) for every linked number of the dashboard."""
    return [
        (unescape(url), number)
        for url, number in re.findall(r'<a class="dp-num[^"]*" href="([^"]+)">(\d+)</a>', page)
    ]


def test_every_linked_number_opens_its_filtered_list_with_that_many_rows(
    broker: Broker, superuser: User
) -> None:
    sample_cycle(broker, today=drop_today())
    client = staff_client(superuser)
    page = client.get("/admin/").content.decode()
    assert dashboard_links(page)
    # Each URL opened once: the sidebar and the model list link the same lists, some of them
    # the numbers' own, and a page asked for again answers the same.
    opened: dict[str, Any] = {}
    for url, number in dashboard_links(page):
        if url not in opened:
            opened[url] = client.get(url)
        response = opened[url]
        assert response.status_code == 200, url  # a refused filter redirects to ?e=1
        if "cl" in response.context_data:  # a list, not a single row's page
            assert response.context_data["cl"].result_count == int(number), url
    for url in dict.fromkeys(unescape(u) for u in re.findall(r'<a href="(/admin/[^"]+)"', page)):
        if url not in opened:
            assert client.get(url).status_code == 200, url


def test_without_permission_a_number_is_not_a_link(broker: Broker) -> None:
    sample_cycle(broker, today=drop_today())
    manager = User.objects.create_user("carol", password="pw-carol-123", is_staff=True)
    manager.groups.add(Group.objects.get(name="Connections managers"))
    page = staff_client(manager).get("/admin/").content.decode()
    assert "4821 · Acme Data" in page  # every staff member sees the state of the cycle
    assert "/admin/integrations/deletionrequest/" not in page
    assert 'href="/admin/integrations/broker/' in page


def test_without_a_broker_the_dashboard_says_what_to_do_first(superuser: User) -> None:
    page = staff_client(superuser).get("/admin/").content.decode()
    assert "No broker yet" in page
    assert 'href="/admin/integrations/broker/add/"' in page


def test_staff_without_a_role_see_no_figures(broker: Broker) -> None:
    sample_cycle(broker, today=drop_today())
    nobody = User.objects.create_user("nina", password="pw-nina-123", is_staff=True)
    page = staff_client(nobody).get("/admin/").content.decode()
    assert "Acme Data" not in page
    assert "Open cycles" not in page


def test_a_late_cycle_and_a_late_download_are_flagged(broker: Broker, superuser: User) -> None:
    world = sample_cycle(broker, today=drop_today() - dt.timedelta(days=50))
    assert world.cycle.due_date < drop_today()
    page = staff_client(superuser).get("/admin/").content.decode()
    assert "overdue by 15 days" in page  # downloaded 60 days ago, due 45 days after
    assert "(late)" in page  # no download for more than 45 days


def test_an_open_cycle_owing_nothing_is_not_overdue(broker: Broker, superuser: User) -> None:
    """Every status with DROP, an amendment waiting for approval: the cycle stays open to
    send it, but owes no status, as the alerts and the cycles list count it."""
    cycle = DropCycleFactory.create(broker=broker, due_date=drop_today() - dt.timedelta(days=3))
    WorkItemFactory.create(cycle=cycle, reported=True)
    ReportFileFactory.create(
        cycle=cycle, kind=ReportKind.AMEND, state=ReportFileState.AWAITING_APPROVAL
    )
    assert cycle.state == CycleState.OPEN

    page = unescape(staff_client(superuser).get("/admin/").content.decode())
    cycle_page = staff_client(superuser).get(f"/admin/integrations/dropcycle/{cycle.pk}/change/")

    badge = re.search(r'<span class="dp-badge dp-tone-(\w+)">([^<]*)</span>', page)
    assert badge is not None and badge.groups() == ("calm", "nothing owed")
    assert "overdue by 3 days" not in page  # the badge's, nor the timeline's
    assert "no status owed to DROP" in page  # no nearest deadline
    assert "overdue" not in cycle_page.content.decode()
    assert ": nothing owed" in cycle_page.content.decode()


def test_a_pull_that_found_nothing_new_counts_as_a_download(
    broker: Broker, superuser: User
) -> None:
    """DROP answering "nothing new" is the broker downloading as the law asks; the evidence
    pack counts it so, and the dashboard must not call the download late. A failed pull
    after it changes nothing."""
    sample_cycle(broker, today=drop_today() - dt.timedelta(days=50))
    ledger_event_append(
        kind=LedgerKind.DROP_PULLED,
        broker_id=broker.broker_id,
        data={"outcome": "nothing_new", "message": "No new data"},
    )
    ledger_event_append(
        kind=LedgerKind.DROP_PULL_FAILED, broker_id=broker.broker_id, data={"error": "503"}
    )
    page = staff_client(superuser).get("/admin/").content.decode()
    assert "overdue by 15 days" in page  # the cycle's statuses are still late
    assert "(late)" not in page


def test_a_cycles_outcome_bar_is_labelled_with_its_drop_download_day(
    broker: Broker, superuser: User
) -> None:
    """06:30 UTC on November 26 is 22:30 on November 25 in California, the day DROP dates
    the download by."""
    DropCycleFactory.create(
        broker=broker, downloaded_at=dt.datetime(2026, 11, 26, 6, 30, tzinfo=dt.UTC)
    )
    page = staff_client(superuser).get("/admin/").content.decode()

    sublabels = re.findall(r'<text [^>]*font-size="10"[^>]*>([^<]*)</text>', page)
    assert "Nov 25" in sublabels, sublabels
    assert "Nov 26" not in sublabels


def test_the_dashboard_and_check_warn_while_private_targets_are_allowed(
    broker: Broker, superuser: User, settings: Any
) -> None:
    client = staff_client(superuser)
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = False
    closed = client.get("/admin/").content.decode()
    quiet = io.StringIO()
    call_command("check", stdout=quiet, stderr=quiet)

    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    opened = client.get("/admin/").content.decode()
    warned = io.StringIO()
    call_command("check", stdout=warned, stderr=warned)

    assert 'id="private-targets-open"' not in closed
    assert "dropportal.W001" not in quiet.getvalue()
    assert 'id="private-targets-open"' in opened
    assert "DROPPORTAL_ALLOW_PRIVATE_TARGETS is on" in opened
    assert "dropportal.W001" in warned.getvalue()


def test_a_recurring_rounds_answers_are_not_added_to_its_cycles_outcomes(
    broker: Broker, superuser: User
) -> None:
    """The cycle's bar counts the match's own answers (round 0): a round carries the cycle's
    session too, and every 45 days would add its answers again."""
    world = sample_cycle(broker, today=drop_today())
    answered = world.requests["completed"]
    DeletionRequest.objects.filter(pk=answered.pk).update(drop_outcome="deleted")
    now = timezone.now()

    def deleted_in_cycle() -> int:
        (overview,) = dashboard_overview(now=now)
        (cycle,) = [c for c in overview.recent_cycles if c.cycle.pk == world.cycle.pk]
        return cycle.request_outcomes.get("deleted", 0)

    assert deleted_in_cycle() == 1
    DeletionRequestFactory.create(
        work_item=answered.work_item,
        consumer=answered.consumer,
        integration=answered.integration,
        drop_session_id=answered.drop_session_id,
        round=1,
        state=RequestState.COMPLETED,
        drop_outcome="deleted",
    )

    assert deleted_in_cycle() == 1
    # The bar's link lists those same requests.
    page = staff_client(superuser).get("/admin/").content.decode()
    links = re.findall(r'href="(/admin/integrations/deletionrequest/[^"]+)"', page)
    (url,) = {unescape(u) for u in links if "drop_outcome__exact=deleted" in unescape(u)}
    listed = staff_client(superuser).get(url).context_data
    assert listed is not None
    assert listed["cl"].result_count == 1
