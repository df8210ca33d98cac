"""The dashboard in a real browser: what a compliance lead sees first."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from integrations.services.staff.brokers import broker_create
from tests.browser.staff import screenshot, sign_in
from tests.builders import sample_cycle


def test_dashboard_shows_the_cycle_and_is_saved_as_a_screenshot(
    page: Page, live_server: LiveServer, staff_user: User
) -> None:
    broker = broker_create(broker_id="4821", name="Acme Data", actor="test")
    sample_cycle(broker, today=timezone.localdate())
    sign_in(page, live_server, "alice")

    card = page.locator("#broker-4821")
    expect(card.get_by_role("heading", name="Cycle 2")).to_be_visible()
    expect(card.locator("svg.chart-timeline")).to_be_visible()
    expect(card.locator("svg.chart-bars rect")).not_to_have_count(0)
    screenshot(page, "dashboard.png")
