"""Auditors export the ledger from the admin: exactly the filtered list, streamed."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from integrations.ledger_kinds import LedgerKind
from integrations.models import LedgerEvent
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
