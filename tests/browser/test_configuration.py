"""Staff configuring a broker in a real browser: log in, add a broker, create an API key."""

from __future__ import annotations

import hashlib

from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from pytest_django.fixtures import Settings
from pytest_django.live_server_helper import LiveServer

from devtools.isi_simulator import IsiSimulator
from integrations.models import ApiKey, Broker, Integration, LedgerEvent
from integrations.services.staff.brokers import broker_create
from tests.browser.staff import PASSWORD, log_in, screenshot, sign_in
from tests.builders import broker_connections


def test_log_in_lands_on_the_dashboard(
    page: Page, live_server: LiveServer, staff_user: User
) -> None:
    page.goto(f"{live_server.url}/admin/")
    expect(page).to_have_url(f"{live_server.url}/admin/login/?next=/admin/")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill(PASSWORD + "-wrong")
    page.get_by_role("button", name="Log in").click()
    wrong = page.locator(".errornote", has_text="enter the correct username and password")
    expect(wrong).to_be_visible()

    log_in(page, live_server, "alice")
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
    expect(page.get_by_role("heading", name="No broker yet")).to_be_visible()


def test_add_a_broker_from_the_dashboard(
    page: Page, live_server: LiveServer, staff_user: User
) -> None:
    sign_in(page, live_server, "alice")
    page.get_by_role("link", name="Add a broker").click()
    page.get_by_label("DROP broker id").fill("4821")
    page.get_by_role("textbox", name="Name").fill("Acme Data")
    page.get_by_label("Mode").select_option("test")
    page.get_by_label("DROP API key").fill("drop-key-from-the-portal")
    page.get_by_role("button", name="Save", exact=True).click()

    expect(page.locator(".messagelist")).to_contain_text("was added successfully")
    broker = Broker.objects.get(broker_id="4821")
    assert broker.drop_api_key == "drop-key-from-the-portal"
    assert LedgerEvent.objects.get(kind="broker.created").actor == "staff:alice"
    page.goto(f"{live_server.url}/admin/")
    expect(page.locator("#broker-4821")).to_contain_text("Acme Data")


def test_an_api_key_is_shown_once_with_a_copy_button(
    page: Page, live_server: LiveServer, staff_user: User
) -> None:
    broker_create(broker_id="4821", name="Acme Data", actor="test")
    sign_in(page, live_server, "alice", "/admin/integrations/apikey/add/")
    page.get_by_label("Broker").select_option(label="4821 Acme Data")
    page.get_by_label("Name").fill("callbacks")
    page.get_by_label("Webhook callback").check()
    page.get_by_role("button", name="Save", exact=True).click()

    expect(page.get_by_role("heading", name="API key created")).to_be_visible()
    expect(page.locator(".messagelist")).to_contain_text("only time this API key is shown")
    key = page.locator("[data-secret]").input_value()
    stored = ApiKey.objects.get()
    assert hashlib.sha256(key.encode()).hexdigest() == stored.digest
    assert key.startswith(stored.prefix)
    page.get_by_role("button", name="Copy").click()
    expect(page.locator(".dp-copy-status")).to_have_text("Copied to the clipboard.")

    page.reload()  # the secret left the session when the page was first rendered
    expect(page.get_by_role("heading", name="This secret was already shown")).to_be_visible()
    assert key not in page.content()
    page.goto(f"{live_server.url}/admin/integrations/apikey/{stored.pk}/change/")
    assert key not in page.content()


def test_a_webhook_integration_shows_its_secret_once_next_to_the_guide(
    page: Page, live_server: LiveServer, staff_user: User
) -> None:
    broker_create(broker_id="4821", name="Acme Data", actor="test")
    sign_in(page, live_server, "alice", "/admin/integrations/integration/add/")
    page.get_by_label("Broker").select_option(label="4821 Acme Data")
    page.get_by_label("Name").fill("Acme deletions")
    page.get_by_label("URL").fill("https://hooks.acme.example/drop")
    page.get_by_role("button", name="Save", exact=True).click()

    expect(page.get_by_role("heading", name="Webhook integration created")).to_be_visible()
    secret = page.locator("[data-secret]").input_value()
    integration = Integration.objects.get()
    assert secret == integration.webhook_secret
    expect(page.locator(".dp-secret-facts")).to_contain_text(str(integration.uuid))
    screenshot(page, "webhook-secret-shown-once.png")

    page.get_by_role("link", name="broker guide: Webhook Secret").click()
    expect(page.locator("#webhook-secret")).to_be_in_viewport()
    page.go_back()
    expect(page.get_by_role("heading", name="This secret was already shown")).to_be_visible()


def test_an_isi_integration_is_guided_from_the_list_to_its_secret_and_connection_check(
    page: Page, live_server: LiveServer, staff_user: User, settings: Settings
) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True  # the broker's API is on loopback here
    broker_create(broker_id="4821", name="Acme Data", actor="test")
    with IsiSimulator(connections=broker_connections(), token="static-t0ken") as api:
        sign_in(page, live_server, "alice", "/admin/integrations/integration/")
        page.get_by_role("link", name="Add ISI integration").click()
        page.get_by_label("Broker").select_option(label="4821 Acme Data")
        page.get_by_label("Name").fill("Acme API")
        page.get_by_label("Base URL").fill(api.base_url)
        page.get_by_role("radio", name="Static bearer token").check()
        page.locator("input[name=token]").fill("static-t0ken")
        page.get_by_role("button", name="Save", exact=True).click()

        expect(page.get_by_role("heading", name="ISI integration created")).to_be_visible()
        secret = page.locator("[data-secret]").input_value()
        integration = Integration.objects.get()
        assert secret == integration.webhook_secret
        expect(page.locator(".dp-secret-facts")).to_contain_text("2 of 3")

        page.get_by_role("link", name="Done, back to Acme API").click()
        page.get_by_role("button", name="Check connection").click()
        expect(page.locator(".messagelist")).to_contain_text("2 take part in DROP")
        assert secret not in page.content()
