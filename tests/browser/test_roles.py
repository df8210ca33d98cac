"""An auditor in a real browser: every list opens, nothing can be changed, exports work."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from integrations.models import Broker, LedgerEvent
from integrations.services.staff.brokers import broker_create
from tests.browser.staff import make_staff, sign_in
from tests.builders import sample_cycle


def test_an_auditor_reads_everything_and_changes_nothing(
    page: Page, live_server: LiveServer, transactional_db: None
) -> None:
    broker = broker_create(broker_id="4821", name="Acme Data", actor="test")
    make_staff("ada", "Auditors")
    sign_in(page, live_server, "ada")

    expect(page.locator("#broker-4821")).to_be_visible()
    events = LedgerEvent.objects.count()
    # The one thing an auditor adds: an audit API key (the console's lists link no "Add").
    expect(page.locator(".dp-lists").get_by_role("link", name="Add")).to_have_count(0)
    response = page.goto(f"{live_server.url}/admin/integrations/apikey/add/")
    assert response is not None and response.status == 200
    expect(page.locator("input[name=scopes]")).to_have_count(1)  # the audit scope alone
    page.goto(f"{live_server.url}/admin/integrations/broker/{broker.pk}/change/")
    expect(page.get_by_role("heading", name="View broker")).to_be_visible()
    expect(page.get_by_role("button", name="Save", exact=True)).to_have_count(0)
    expect(page.locator("input[name=name]")).to_have_count(0)  # shown as text, not a field

    response = page.goto(f"{live_server.url}/admin/integrations/broker/add/")
    assert response is not None and response.status == 403
    page.goto(f"{live_server.url}/admin/integrations/apikey/")
    expect(page.locator("select[name=action]")).to_have_count(0)  # no action to run
    assert Broker.objects.get().name == "Acme Data"
    assert LedgerEvent.objects.count() == events
    assert User.objects.get(username="ada").groups.get().name == "Auditors"


def test_an_auditor_exports_the_outcome_history_and_the_ledger(
    page: Page, live_server: LiveServer, transactional_db: None
) -> None:
    broker = broker_create(broker_id="4821", name="Acme Data", actor="test")
    world = sample_cycle(broker, today=timezone.localdate())
    make_staff("ada", "Auditors")
    sign_in(page, live_server, "ada", "/admin/integrations/deletionrequest/")
    page.locator("#action-toggle").check()
    page.locator("select[name=action]").select_option("export_outcomes_csv")
    with page.expect_download() as download:
        page.get_by_role("button", name="Go").click()
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
    assert {r["request_uuid"] for r in rows} == {
        str(r.request_uuid) for r in world.requests.values()
    }
    assert {r["state"] for r in rows} == {"failed", "undeliverable", "dispatched", "completed"}

    page.goto(f"{live_server.url}/admin/integrations/ledgerevent/?kind__exact=broker.created")
    with page.expect_download() as download:
        page.get_by_role("button", name="Export JSONL").click()
    (line,) = Path(download.value.path()).read_text().splitlines()
    assert json.loads(line)["subject"] == "4821"
    exports = LedgerEvent.objects.filter(kind__endswith=".exported", actor="staff:ada")
    assert sorted(exports.values_list("kind", flat=True)) == [
        "ledger.exported",
        "outcomes.exported",
    ]
