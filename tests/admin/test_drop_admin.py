"""DROP cycles and work items in the admin (read-only), and the broker's pull settings."""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path
from zoneinfo import ZoneInfo

import psycopg
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from django.utils import formats, timezone

from devtools.drop_simulator import work_items
from integrations.drop.calendar import drop_today
from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, DropAccessObligation, DropCycle, LedgerEvent, WorkItem
from integrations.services.cycle.drop_access import drop_access_notice_record
from integrations.services.cycle.drop_import import drop_zip_import
from tests.admin.markup import cells, link_texts
from tests.builders import (
    ConsumerFactory,
    DropAccessObligationFactory,
    drop_zip,
    write_zip,
)
from tests.conftest import database_url, sessions_waiting_for_locks

pytestmark = pytest.mark.django_db

ITEMS = list(work_items(5))
CYCLES = "/admin/integrations/dropcycle/"
WORK_ITEMS = "/admin/integrations/workitem/"


@pytest.fixture
def staff(client: Client) -> Client:
    user = User.objects.create_superuser("alice", "alice@example.com", "pw-alice-123")
    client.force_login(user)
    return client


@pytest.fixture
def cycle(broker: Broker, tmp_path: Path) -> DropCycle:
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": ITEMS[0][1]})
    path = write_zip(tmp_path, drop_zip(broker, {"Email": ITEMS[:3], "Phone": ITEMS[3:]}))
    imported = drop_zip_import(
        broker=broker, path=path, downloaded_at=timezone.now(), actor="test"
    ).cycle
    return imported


def listed_ids(page: str) -> list[str]:
    return sorted(link_texts(page, r'[^"]*workitem/\d+/change/[^"]*'))


def test_cycles_list_their_counts_due_date_and_days_left(staff: Client, cycle: DropCycle) -> None:
    page = staff.get(CYCLES).content.decode()
    row = page[page.index("<tbody") :]
    row = row[: row.index("</tr>")]
    assert ">1</a>" in row  # drop_session_id, links to the cycle
    assert formats.localize(cycle.due_date) in row
    assert "45 days" in row
    assert [int(cells(row, name)[0]) for name in ("matched", "owed")] == [1, 5]
    # The package and the other counts are on the cycle's page (the list fits 1280 pixels).
    detail = staff.get(f"{CYCLES}{cycle.pk}/change/").content.decode()
    assert cycle.zip_name in detail
    assert f"?cycle__id__exact={cycle.pk}" in row  # work items count links to them


@pytest.mark.parametrize(
    ("due_in", "shown"),
    [
        (3, "3 days"),
        (1, "1 day"),
        (0, "0 days"),
        (-1, "overdue by 1 day"),
        (-4, "overdue by 4 days"),
    ],
)
def test_days_left_counts_down_to_overdue(
    staff: Client, cycle: DropCycle, due_in: int, shown: str
) -> None:
    # The list is drawn in DROP's zone (California's), whose date it counts from.
    drop_today = timezone.localdate(timezone=ZoneInfo(settings.DROPPORTAL_DROP_TIMEZONE))
    DropCycle.objects.filter(pk=cycle.pk).update(due_date=drop_today + dt.timedelta(days=due_in))
    assert cells(staff.get(CYCLES).content.decode(), "days_left") == [shown]


def test_cycles_owing_statuses_come_first_soonest_due_first(
    staff: Client, broker: Broker, cycle: DropCycle, tmp_path: Path
) -> None:
    later = write_zip(tmp_path, drop_zip(broker, {"Email": list(work_items(1, start=9))}), "2.zip")
    second = drop_zip_import(broker=broker, path=later, actor="test").cycle
    today = timezone.localdate()
    DropCycle.objects.filter(pk=cycle.pk).update(due_date=today + dt.timedelta(days=20))
    DropCycle.objects.filter(pk=second.pk).update(due_date=today + dt.timedelta(days=5))
    page = staff.get(CYCLES).content.decode()
    assert page.index(f"{CYCLES}{second.pk}/change/") < page.index(f"{CYCLES}{cycle.pk}/change/")
    WorkItem.objects.filter(cycle=second).update(state="reported", reported_at=timezone.now())
    page = staff.get(CYCLES).content.decode()
    assert page.index(f"{CYCLES}{cycle.pk}/change/") < page.index(f"{CYCLES}{second.pk}/change/")


def test_a_cycle_owing_nothing_says_so(staff: Client, cycle: DropCycle) -> None:
    WorkItem.objects.filter(cycle=cycle).update(state="reported", reported_at=timezone.now())
    assert cells(staff.get(CYCLES).content.decode(), "days_left") == ["nothing owed"]


def test_a_cycle_page_shows_its_files_and_cannot_be_changed(
    staff: Client, cycle: DropCycle
) -> None:
    url = f"{CYCLES}{cycle.pk}/change/"
    page = staff.get(url).content.decode()
    assert "<td>20261120_4821_Email.csv</td><td>3</td>" in page
    assert cycle.zip_sha256 in page
    assert 'name="_save"' not in page
    before = DropCycle.objects.values().get(pk=cycle.pk)
    assert staff.post(url, {"drop_session_id": "99"}).status_code == 403
    assert DropCycle.objects.values().get(pk=cycle.pk) == before
    assert staff.get(f"{CYCLES}add/").status_code == 403
    assert staff.get(f"{CYCLES}{cycle.pk}/delete/").status_code == 403


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", ITEMS),
        ("hash_type__exact=phone", ITEMS[3:]),
        ("state__exact=open", ITEMS[:1]),
        ("state__exact=reportable", ITEMS[1:]),
        ("status_code__exact=5", ITEMS[1:]),
        ("status_code__exact=3", []),
        ("hash_type__exact=email&status_code__exact=5", ITEMS[1:3]),
        # as the dashboard links: owed and no status yet
        ("state__in=open,reportable&status_code__isnull=1", ITEMS[:1]),
    ],
)
def test_work_items_filter_by_list_type_state_and_status(
    staff: Client, cycle: DropCycle, query: str, expected: list[tuple[str, str]]
) -> None:
    response = staff.get(f"{WORK_ITEMS}?cycle__id__exact={cycle.pk}&{query}")
    assert response.status_code == 200
    assert "?e=1" not in response.get("Location", "")
    assert listed_ids(response.content.decode()) == sorted(wid for wid, _ in expected)


def test_a_work_item_shows_its_hash_as_drop_sent_it_and_is_read_only(
    staff: Client, cycle: DropCycle
) -> None:
    item = WorkItem.objects.get(work_item_id=ITEMS[0][0])
    url = f"{WORK_ITEMS}{item.pk}/change/"
    page = staff.get(url).content.decode()
    assert ITEMS[0][1] in page
    assert 'name="_save"' not in page
    assert staff.post(url, {"state": "removed"}).status_code == 403
    item.refresh_from_db()
    assert item.state == "open"


def test_a_work_item_can_be_found_by_its_id(staff: Client, cycle: DropCycle) -> None:
    page = staff.get(f"{WORK_ITEMS}?q={ITEMS[2][0]}").content.decode()
    assert listed_ids(page) == [ITEMS[2][0]]


# ---------------------------------------------------------------- broker pull settings


def broker_form(**changes: object) -> dict[str, object]:
    return {
        "name": "Acme Data",
        "mode": "test",
        "drop_base_url": "",
        "drop_api_key": "",
        "pull_interval_days": "30",
        **changes,
    }


def test_auto_pull_is_set_in_the_broker_admin_and_recorded(staff: Client, broker: Broker) -> None:
    url = f"/admin/integrations/broker/{broker.pk}/change/"
    response = staff.post(url, broker_form(auto_pull="on", pull_interval_days="14"))
    assert response.status_code == 302
    broker.refresh_from_db()
    assert (broker.auto_pull, broker.pull_interval_days) == (True, 14)
    event = LedgerEvent.objects.get(kind="broker.updated")
    assert event.data["changes"]["auto_pull"] == {"from": False, "to": True}
    assert event.data["changes"]["pull_interval_days"] == {"from": 30, "to": 14}
    listing = staff.get("/admin/integrations/broker/").content.decode()
    assert "field-auto_pull" in listing and "field-last_pulled_at" in listing


@pytest.mark.parametrize(
    ("days", "message"),
    [("45", "choose 44 or fewer"), ("0", "greater than or equal to 1")],
)
def test_a_pull_interval_outside_drops_cadence_is_refused(
    staff: Client, broker: Broker, days: str, message: str
) -> None:
    url = f"/admin/integrations/broker/{broker.pk}/change/"
    for interval, accepted in (("44", True), (days, False)):
        response = staff.post(url, broker_form(pull_interval_days=interval))
        assert (response.status_code == 302) is accepted
    assert message in response.content.decode()
    broker.refresh_from_db()
    assert broker.pull_interval_days == 44


def test_last_pulled_is_shown_and_not_editable(staff: Client, broker: Broker) -> None:
    pulled = timezone.now() - dt.timedelta(days=2)
    Broker.objects.filter(pk=broker.pk).update(last_pulled_at=pulled)
    url = f"/admin/integrations/broker/{broker.pk}/change/"
    assert 'name="last_pulled_at"' not in staff.get(url).content.decode()
    staff.post(url, broker_form(last_pulled_at="2020-01-01 00:00"))
    broker.refresh_from_db()
    assert broker.last_pulled_at == pulled


# ---------------------------------------------------------------- DROP access notice


@pytest.mark.parametrize("first", ["this page", "drop notice"])
def test_a_notice_already_recorded_is_said_so_and_not_recorded_again(
    staff: Client, broker: Broker, first: str
) -> None:
    obligation = DropAccessObligationFactory.create(broker=broker)
    url = f"/admin/integrations/dropaccessobligation/{obligation.pk}/change/"
    notice = {"notice_sent_on": drop_today().isoformat(), "notice_reference": "Letter R-7"}
    if first == "this page":  # a double click
        assert staff.post(url, notice).status_code == 302
    else:  # the page was left open while the command recorded it
        drop_access_notice_record(
            broker=broker, sent_on=drop_today(), reference="Letter R-7", actor="cli:bob"
        )

    again = staff.post(url, {**notice, "notice_reference": "Letter R-8"})

    assert again.status_code == 200  # the page again, with why
    assert "the notice is already recorded" in again.content.decode()
    obligation = DropAccessObligation.objects.get(pk=obligation.pk)
    assert obligation.notice_reference == "Letter R-7"
    recorded = LedgerEvent.objects.filter(kind=LedgerKind.DROP_ACCESS_NOTICE_RECORDED)
    assert recorded.count() == 1


@pytest.mark.django_db(transaction=True)  # two threads and a second connection see the rows
def test_two_notices_submitted_at_once_are_recorded_once_and_the_other_told_why(
    broker: Broker,
) -> None:
    user = User.objects.create_superuser("alice", "alice@example.com", "pw-alice-123")
    obligation = DropAccessObligationFactory.create(broker=broker)
    url = f"/admin/integrations/dropaccessobligation/{obligation.pk}/change/"
    members = {reference: Client(raise_request_exception=False) for reference in ("R-7", "R-8")}
    for member in members.values():
        member.force_login(user)
    answers: dict[str, tuple[int, str]] = {}  # by reference: the status, where it leads

    def submit(reference: str) -> None:
        try:
            notice = {"notice_sent_on": drop_today().isoformat(), "notice_reference": reference}
            answer = members[reference].post(url, notice)
            answers[reference] = (answer.status_code, answer.get("Location", ""))
        finally:
            connections.close_all()

    # Another transaction holds the obligation: both submits pass the page's checks, reach
    # the row together and wait for it.
    holder = psycopg.connect(database_url())
    try:
        holder.execute(
            "SELECT 1 FROM integrations_dropaccessobligation WHERE id = %s FOR UPDATE",
            [obligation.pk],
        )
        threads = [threading.Thread(target=submit, args=(r,)) for r in members]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while sessions_waiting_for_locks() + sum(not t.is_alive() for t in threads) < 2:
            assert time.monotonic() < deadline, "the two submits neither waited nor ended"
            time.sleep(0.05)
        holder.commit()
    finally:
        holder.close()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(status for status, _ in answers.values()) == [302, 302]  # no 500
    (accepted,) = (r for r, (_, location) in answers.items() if location != url)
    (refused,) = (r for r, (_, location) in answers.items() if location == url)
    page = members[refused].get(url).content.decode()
    assert "the notice is already recorded" in page
    assert "nothing was changed" in page
    obligation = DropAccessObligation.objects.get(pk=obligation.pk)
    assert obligation.notice_reference == accepted
    recorded = LedgerEvent.objects.filter(kind=LedgerKind.DROP_ACCESS_NOTICE_RECORDED)
    assert recorded.count() == 1
