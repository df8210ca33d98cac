"""Auditors export the ledger from the admin: exactly the filtered list, streamed."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client

from integrations.ledger_kinds import LedgerKind
from integrations.models import LedgerEvent
from integrations.services import ledger as ledger_service
from integrations.services.ledger import ledger_event_append, ledger_seal

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
