"""Auditors export the ledger from the admin: exactly the filtered list, streamed."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import connection
from django.db.models import QuerySet
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from integrations.admin.date_drill_down import _probed
from integrations.drop.calendar import drop_timezone
from integrations.ledger_kinds import LedgerKind
from integrations.models import LedgerEvent
from integrations.services import ledger as ledger_service
from integrations.services.ledger import ledger_event_append, ledger_seal
from tests.builders import BrokerFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def auditor(client: Client) -> Client:
    user = User.objects.create_user("ada", password="pw-ada-123", is_staff=True)
    user.groups.add(Group.objects.get(name="Auditors"))
    client.force_login(user)
    return client


@pytest.fixture(autouse=True)
def events() -> None:
    ledger_event_append(
        kind=LedgerKind.BROKER_CREATED, broker_id="4821", subject="4821", actor="cli:ops"
    )
    ledger_event_append(
        kind=LedgerKind.API_KEY_CREATED, broker_id="4821", subject="dpk_abc", actor="x"
    )
    ledger_event_append(
        kind=LedgerKind.BROKER_CREATED, broker_id="4822", subject="4822", actor="cli:ops"
    )
    ledger_seal()


def body(response) -> str:  # type: ignore[no-untyped-def]
    assert response.streaming
    return b"".join(response.streaming_content).decode()


def test_the_csv_export_holds_what_the_filtered_list_shows(auditor: Client) -> None:
    page = auditor.get("/admin/integrations/ledgerevent/?kind__exact=broker.created")
    assert (
        '<form method="post" action="/admin/integrations/ledgerevent/export.csv'
        '?kind__exact=broker.created"'
    ) in page.content.decode()
    response = auditor.post("/admin/integrations/ledgerevent/export.csv?kind__exact=broker.created")
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="ledger-')
    rows = list(csv.DictReader(io.StringIO(body(response))))
    assert [(r["broker_id"], r["kind"]) for r in rows] == [
        ("4821", "broker.created"),
        ("4822", "broker.created"),
    ]
    assert all(len(r["chain_hash"]) == 64 for r in rows)
    (record,) = LedgerEvent.objects.filter(kind="ledger.exported")
    assert record.actor == "staff:ada"
    assert record.data == {
        "via": "admin",
        "format": "csv",
        "filters": {"kind__exact": "broker.created"},
    }


def test_the_jsonl_export_follows_the_search_too(auditor: Client) -> None:
    response = auditor.post("/admin/integrations/ledgerevent/export.jsonl?q=dpk_abc")
    (line,) = body(response).splitlines()
    assert json.loads(line)["kind"] == "api_key.created"


def test_exports_need_the_view_permission_and_a_known_format(client: Client) -> None:
    nobody = User.objects.create_user("eve", password="pw-eve-123", is_staff=True)
    client.force_login(nobody)
    assert client.post("/admin/integrations/ledgerevent/export.csv").status_code == 403
    nobody.groups.add(Group.objects.get(name="Auditors"))
    assert client.post("/admin/integrations/ledgerevent/export.xml").status_code == 400
    assert client.post("/admin/integrations/ledgerevent/export.csv?nope=1").status_code == 400


def test_an_export_is_a_post_a_link_cannot_trigger(auditor: Client) -> None:
    # It writes a ledger event: a GET (a link, a prefetch, an image tag) must not.
    response = auditor.get("/admin/integrations/ledgerevent/export.csv")

    assert response.status_code == 405
    assert not LedgerEvent.objects.filter(kind="ledger.exported").exists()


# 03:00 UTC on January 1, 2027 is 19:00 on December 31, 2026 in California.
LATE_EVENING = dt.datetime(2027, 1, 1, 3, 0, tzinfo=dt.UTC)
DEC_31 = "created_at__day=31&created_at__month=12&created_at__year=2026"  # as the list links it


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
def test_the_date_drill_down_and_its_export_count_drop_days_as_the_command_does(
    auditor: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger_service.timezone, "now", lambda: LATE_EVENING)
    late = ledger_event_append(
        kind=LedgerKind.BROKER_CREATED, broker_id="4823", subject="4823", actor="cli:ops"
    )
    monkeypatch.undo()
    ledger_seal()
    from_command = io.StringIO()
    call_command(
        "ledger", "export", "--since", "2026-12-31", "--until", "2026-12-31", stdout=from_command
    )

    # The list, showing its times in DROP's zone, offers the event's day as December 31 ...
    month = auditor.get(
        "/admin/integrations/ledgerevent/?created_at__year=2026&created_at__month=12"
    )
    assert f"?{DEC_31}" in month.content.decode().replace("&amp;", "&")
    # ... that day's list holds it, and so does that day's export, as the command's.
    day = auditor.get(f"/admin/integrations/ledgerevent/?{DEC_31}")
    assert list(day.context["cl"].result_list) == [late]
    exported = body(auditor.post(f"/admin/integrations/ledgerevent/export.csv?{DEC_31}"))
    assert [r["id"] for r in csv.DictReader(io.StringIO(exported))] == [str(late.pk)]
    assert exported == from_command.getvalue()


def test_the_list_reads_no_column_of_every_event_for_its_filters_or_drill_down(
    auditor: Client,
) -> None:
    """A few million events: ``SELECT DISTINCT`` for the brokers' filter or the drill-down's
    periods read them all, on every page."""
    BrokerFactory.create(broker_id="4821")
    with CaptureQueriesContext(connection) as queries:
        page = auditor.get("/admin/integrations/ledgerevent/")
    assert page.status_code == 200
    assert not [q["sql"] for q in queries.captured_queries if "DISTINCT" in q["sql"].upper()]
    shown = page.content.decode()
    assert "?broker_id__exact=4821" in shown
    assert "?broker_id__exact=4822" not in shown  # no such broker: the events' own value
    filtered = auditor.get("/admin/integrations/ledgerevent/?broker_id__exact=4822")
    assert "dpk_abc" not in filtered.content.decode()
    assert "4822" in filtered.content.decode()


@pytest.mark.parametrize("kind", ["year", "month", "day"])
def test_the_drill_down_lists_the_periods_djangos_own_query_lists(kind: Any) -> None:
    """Probed through the index, in DROP's zone: the same periods as ``DISTINCT``, a day's
    events near midnight UTC on the day they are in Los Angeles."""
    utc = dt.UTC
    moments = [
        dt.datetime(2025, 12, 31, 7, 59, tzinfo=utc),  # 23:59 on December 30th in LA
        dt.datetime(2026, 1, 1, 8, 0, tzinfo=utc),  # midnight of the year, in LA
        dt.datetime(2026, 3, 8, 9, 30, tzinfo=utc),  # the day the clocks go forward
        dt.datetime(2026, 3, 9, 6, 59, tzinfo=utc),
        dt.datetime(2026, 11, 1, 8, 30, tzinfo=utc),  # and back
    ]
    with connection.cursor() as cursor:
        for moment in moments:
            cursor.execute(
                "INSERT INTO integrations_ledgerevent (created_at, broker_id, kind, subject,"
                " actor, data, event_hash) VALUES (%s, '', 'drop.api_call', '', 'system',"
                " '{}', '')",
                [moment],
            )
    zone = drop_timezone()
    probed = _probed(QuerySet)(model=LedgerEvent)
    with timezone.override(zone):
        for narrowed in (
            {},
            {"created_at__year": 2026},
            {"created_at__year": 2026, "created_at__month": 3},
        ):
            ours = [
                (p.year, p.month, p.day)
                for p in probed.filter(**narrowed).datetimes("created_at", kind)
            ]
            djangos = [
                (p.year, p.month, p.day)
                for p in LedgerEvent.objects.filter(**narrowed).datetimes("created_at", kind)
            ]
            assert ours == djangos, (narrowed, kind)
