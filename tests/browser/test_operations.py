"""Operating a cycle in a real browser: a pull shows on the dashboard; a stuck request is
redelivered from the number that flagged it."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.utils import timezone
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from devtools.drop_simulator import DropSimulator, build_drop_zip, work_items
from integrations.models import DeletionRequest, LedgerEvent, RequestState
from integrations.services.staff.brokers import broker_create
from tests.browser.staff import make_staff, screenshot, sign_in
from tests.builders import sample_cycle


def test_a_simulated_pull_shows_its_cycle_on_the_dashboard(
    page: Page, live_server: LiveServer, transactional_db: None, settings: Any
) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True  # the DROP simulator is on loopback
    make_staff("olga", "Operators")
    with DropSimulator(api_key="sim-key", broker_id="4821") as drop:
        broker_create(
            broker_id="4821",
            name="Acme Data",
            drop_api_key="sim-key",
            drop_base_url=drop.url,
            actor="test",
        )
        today = timezone.localdate()
        drop.queue_package(build_drop_zip("4821", today, {"Email": list(work_items(12))}))
        call_command("drop", "pull", "--broker", "4821", stdout=io.StringIO())

    sign_in(page, live_server, "olga")
    card = page.locator("#broker-4821")
    expect(card.get_by_role("heading", name="Cycle 1")).to_be_visible()
    expect(card.locator(".dp-badge").first).to_have_text("45 days left")
    expect(card.locator(".chart-timeline")).to_contain_text("day 0 of 45")
    # No consumer matched: all 12 work items got status 5 at once.
    not_found = card.locator(".dp-matrix tfoot td").nth(3)
    expect(not_found).to_have_text("12")
    not_found.get_by_role("link").click()
    expect(page.locator("#result_list tbody tr")).to_have_count(12)


def test_an_operator_redelivers_an_undeliverable_request_from_the_dashboard(
    page: Page, live_server: LiveServer, transactional_db: None
) -> None:
    broker = broker_create(broker_id="4821", name="Acme Data", actor="test")
    world = sample_cycle(broker, today=timezone.localdate())
    make_staff("olga", "Operators")
    stuck = world.requests["undeliverable"]

    sign_in(page, live_server, "olga")
    attention = page.locator("#broker-4821 .dp-attention li", has_text="undeliverable")
    attention.get_by_role("link", name="1").click()
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    page.locator("#result_list tbody tr input.action-select").check()
    page.locator("select[name=action]").select_option("redeliver")
    page.get_by_role("button", name="Go").click()

    expect(page.locator(".messagelist")).to_contain_text("Queued for redelivery: 1")
    stuck.refresh_from_db()
    assert stuck.state == RequestState.QUEUED
    assert stuck.attempts == 0
    event = LedgerEvent.objects.filter(subject=str(stuck.request_uuid)).latest("id")
    assert event.actor == "staff:olga"
    assert DeletionRequest.objects.filter(state=RequestState.UNDELIVERABLE).count() == 0
    page.goto(f"{live_server.url}/admin/")
    expect(
        page.locator("#broker-4821 .dp-attention li", has_text="undeliverable").locator(".dp-num")
    ).to_have_text("0")
    screenshot(page, "dashboard-after-redelivery.png")


def test_an_imported_consumer_file_is_found_in_the_admin_by_its_identifier(
    page: Page, live_server: LiveServer, transactional_db: None, tmp_path: Path
) -> None:
    broker_create(broker_id="4821", name="Acme Data", actor="test")
    make_staff("olga", "Operators")
    consumers = tmp_path / "consumers.csv"
    consumers.write_text(
        "remote_identifier,email,phone\r\n"
        "CRM-1,Ann.Smith@Example.com,+1 (415) 555-0101\r\n"
        "CRM-2,bob@example.com,\r\n"
    )
    out = io.StringIO()
    call_command("consumers", "import", "--broker", "4821", str(consumers), stdout=out)
    assert "2 imported, 0 rejected" in out.getvalue()

    sign_in(page, live_server, "olga", "/admin/integrations/consumer/")
    page.get_by_role("textbox", name="Search").fill("CRM-1")
    page.get_by_role("button", name="Search").click()
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("email")
    expect(rows.first).to_contain_text("phone")
    assert "Ann.Smith" not in page.content()  # only hashes were kept
