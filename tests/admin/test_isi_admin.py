"""ISI integrations in the admin, against a real loopback ISI API: add one (connections
listed, Webhook Secret shown once), see which connections take part in DROP and why the
others do not, "Check connection" with the broker's answer on the page, edit credentials
(write-only secrets)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from devtools.broker_simulator import Reply
from devtools.isi_simulator import IsiSimulator, connection
from integrations.models import Broker, Integration, IsiConnection, LedgerEvent
from integrations.services.staff.isi import CreatedIsiIntegration, isi_integration_update
from tests.builders import (
    CONNECTION_A,
    CONNECTION_B,
    CONNECTION_STANDARD,
    broker_connections,
    isi_integration_created,
)

pytestmark = pytest.mark.django_db

SECRET_RE = re.compile(r"whsec_[A-Za-z0-9_-]{43}")
ADD = "/admin/integrations/integration/add/?kind=isi"


@pytest.fixture(autouse=True)
def private_targets(settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True


@pytest.fixture
def staff(client: Client) -> Client:
    user = User.objects.create_superuser("alice", "alice@example.com", "pw-alice-123")
    client.force_login(user)
    return client


@pytest.fixture
def api() -> Iterator[IsiSimulator]:
    with IsiSimulator(connections=broker_connections(), token="static-t0ken") as running:
        yield running


@pytest.fixture
def created(broker: Broker, api: IsiSimulator) -> CreatedIsiIntegration:
    return isi_integration_created(broker, api)


def _oauth_form(broker: Broker, api: IsiSimulator, **changes: Any) -> dict[str, Any]:
    form: dict[str, Any] = {
        "broker": broker.pk,
        "name": "Acme API",
        "base_url": api.base_url,
        "auth": "oauth",
        "token_url": api.token_url,
        "client_id": api.client_id,
        "client_secret": api.client_secret,
    }
    form.update(changes)
    return form


def _change_url(integration: Integration) -> str:
    return f"/admin/integrations/integration/{integration.pk}/change/"


def _hidden_inputs(page: str) -> dict[str, str]:
    """The change form's hidden inputs (the connections inline's management form)."""
    return {
        name: html.unescape(value)
        for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page)
        if name != "csrfmiddlewaretoken"
    }


def _messages(page: str) -> str:
    return html.unescape(
        " ".join(
            re.sub(r"<[^>]+>", "", inner).strip()
            for inner in re.findall(
                r'<li class="(?:success|error|warning|info)[ "][^>]*>(.*?)</li>', page, re.S
            )
        )
    )


def test_the_list_offers_to_add_an_isi_integration(staff: Client) -> None:
    page = staff.get("/admin/integrations/integration/").content.decode()

    assert 'href="/admin/integrations/isiintegration/add/"' in page
    assert 'href="/admin/integrations/webhookintegration/add/"' in page
    # The list's add page of old, ``?kind=`` naming the kind, is still that kind's.
    assert "Base URL" in staff.get(ADD).content.decode()


def test_adding_an_isi_integration_lists_its_connections_and_shows_its_secret_once(
    staff: Client, broker: Broker, api: IsiSimulator
) -> None:
    page = staff.post(ADD, _oauth_form(broker, api), follow=True).content.decode()

    integration = Integration.objects.get()
    (shown,) = set(SECRET_RE.findall(page))
    assert shown == integration.webhook_secret
    assert "ISI integration created" in page
    assert "2 of 3" in page  # connections taking part in DROP
    assert "/api/v1/drop/callbacks/isi" in page
    assert api.client_secret not in page
    assert (integration.kind, integration.auth, integration.base_url) == (
        "isi",
        "oauth",
        api.base_url,
    )
    assert IsiConnection.objects.filter(integration=integration).count() == 3
    event = LedgerEvent.objects.get(kind="integration.created")
    assert event.actor == "staff:alice"
    assert staff.get(_change_url(integration)).content.decode().count(shown) == 0


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"client_secret": ""}, "required for OAuth client credentials"),
        ({"auth": "token", "token": ""}, "a static token, or OAuth client credentials"),
        ({"base_url": "ftp://api.acme.example"}, "not an absolute https or http URL"),
        (
            {"base_url": "https://api.acme.example/isi?tenant=7"},
            "a base URL must end at its path: no query (?), fragment (#) or ; parameters",
        ),
        (
            {"base_url": "https://api.acme.example/isi#v1"},
            "a base URL must end at its path: no query (?), fragment (#) or ; parameters",
        ),
    ],
)
def test_bad_settings_are_refused_on_the_form(
    staff: Client, broker: Broker, api: IsiSimulator, changes: dict[str, str], error: str
) -> None:
    page = staff.post(ADD, _oauth_form(broker, api, **changes), follow=True).content.decode()

    assert error in html.unescape(page)
    assert not Integration.objects.exists()
    assert api.received == []


def test_plain_http_is_refused_in_production(
    staff: Client, broker: Broker, api: IsiSimulator, settings: Any
) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = False

    page = staff.post(ADD, _oauth_form(broker, api), follow=True).content.decode()

    assert "plain http is refused" in page
    assert not Integration.objects.exists()


def test_the_change_page_shows_which_connections_take_part_and_why_the_others_do_not(
    staff: Client, created: CreatedIsiIntegration, api: IsiSimulator
) -> None:
    page = staff.get(_change_url(created.integration)).content.decode()

    for uuid in (CONNECTION_A, CONNECTION_B, CONNECTION_STANDARD):
        assert uuid in page
    assert "lacks privacy/drop/identifiers and privacy/drop/delete" in page
    assert page.count('aria-label="True"') >= 2  # the two taking part
    assert "Check connection" in page
    assert "Send test notification" not in page
    assert api.client_secret not in page
    assert created.webhook_secret not in page


def test_check_connection_shows_the_brokers_answer_and_the_new_list(
    staff: Client, created: CreatedIsiIntegration, api: IsiSimulator
) -> None:
    api.connections = [connection(CONNECTION_A), connection(CONNECTION_B, ["privacy/access"])]
    url = f"/admin/integrations/isiintegration/{created.integration.pk}/check-connection/"

    page = staff.post(url, follow=True).content.decode()

    said = _messages(page)
    assert "answered HTTP 200: 2 connection(s) listed, 1 take part in DROP" in said
    assert f'The broker answered: {{"results": [{{"uuid": "{CONNECTION_A}"' in said
    assert "no longer listed by the broker" in page
    refreshed = LedgerEvent.objects.filter(kind="isi.connections_refreshed").latest("id")
    assert refreshed.actor == "staff:alice"


def test_check_connection_failure_shows_what_the_broker_said(
    staff: Client, created: CreatedIsiIntegration, api: IsiSimulator
) -> None:
    api.answer_next("connections", Reply(500, b"down for maintenance"))
    url = f"/admin/integrations/isiintegration/{created.integration.pk}/check-connection/"

    page = staff.post(url, follow=True).content.decode()

    said = _messages(page)
    assert "Check connection failed: POST" in said
    assert "HTTP 500. The broker answered: down for maintenance" in said
    assert IsiConnection.objects.filter(listed=True).count() == 3  # the list stays


def test_check_connection_failure_shows_the_answer_without_the_token_it_echoes(
    staff: Client, broker: Broker, api: IsiSimulator
) -> None:
    created = isi_integration_created(broker, api, oauth=False)
    echo = b'{"message": "Bearer static-t0ken is not valid for ann@example.com"}'
    api.answer_next("connections", Reply(401, echo))
    url = f"/admin/integrations/isiintegration/{created.integration.pk}/check-connection/"

    page = staff.post(url, follow=True).content.decode()

    said = _messages(page)
    assert "Bearer [redacted] is not valid for <email>" in said
    assert "static-t0ken" not in page
    assert "ann@example.com" not in page


def test_check_connection_needs_a_post(staff: Client, created: CreatedIsiIntegration) -> None:
    url = f"/admin/integrations/isiintegration/{created.integration.pk}/check-connection/"

    assert staff.get(url).status_code == 403


def test_editing_keeps_a_secret_left_empty_and_switching_to_a_token_drops_oauth(
    staff: Client, broker: Broker, created: CreatedIsiIntegration, api: IsiSimulator
) -> None:
    integration = created.integration
    page = staff.get(_change_url(integration)).content.decode()
    form = {**_hidden_inputs(page), **_oauth_form(broker, api, name="Acme API 2")}
    form.update(client_secret="", enabled="on")

    staff.post(_change_url(integration), form)

    integration.refresh_from_db()
    assert (integration.name, integration.client_secret) == ("Acme API 2", api.client_secret)
    # One edit, one event: the name goes with the settings.
    (renamed,) = LedgerEvent.objects.filter(kind="integration.updated")
    assert renamed.data["changes"]["name"]["to"] == "Acme API 2"

    form.update(auth="token", token="static-t0ken")
    staff.post(_change_url(integration), form)

    integration.refresh_from_db()
    assert (integration.auth, integration.token, integration.client_secret) == (
        "token",
        "static-t0ken",
        "",
    )
    updated = LedgerEvent.objects.filter(kind="integration.updated").last()
    assert updated is not None
    assert updated.data["changes"]["token"] == {"changed": True}
    assert "static-t0ken" not in str(updated.data)


def test_editing_refuses_a_base_url_the_api_paths_would_land_in(
    staff: Client, broker: Broker, created: CreatedIsiIntegration, api: IsiSimulator
) -> None:
    integration = created.integration
    page = staff.get(_change_url(integration)).content.decode()
    form = {**_hidden_inputs(page), **_oauth_form(broker, api, base_url=f"{api.base_url}/isi;v=1")}
    form.update(enabled="on")

    page = staff.post(_change_url(integration), form).content.decode()

    assert "a base URL must end at its path" in html.unescape(page)
    integration.refresh_from_db()
    assert integration.base_url == api.base_url
    assert not LedgerEvent.objects.filter(kind="integration.updated").exists()


def test_a_page_opened_before_a_new_oauth_client_keeps_it_on_rename(
    staff: Client, broker: Broker, created: CreatedIsiIntegration, api: IsiSimulator
) -> None:
    integration = created.integration
    page = staff.get(_change_url(integration)).content.decode()
    # Meanwhile a colleague enters a new OAuth client (id and secret) at the same token URL.
    isi_integration_update(
        integration=integration,
        actor="staff:bob",
        auth="oauth",
        token_url=api.token_url,
        client_id="new-client",
        client_secret="new-secret",
    )
    # This page, every field as it showed it, renames it.
    form = {**_hidden_inputs(page), **_oauth_form(broker, api, name="Acme API 2")}
    form.update(enabled="on", client_secret="")

    assert staff.post(_change_url(integration), form).status_code == 302

    integration.refresh_from_db()
    assert (integration.name, integration.client_id, integration.client_secret) == (
        "Acme API 2",
        "new-client",
        "new-secret",
    )
    saved = LedgerEvent.objects.filter(kind="integration.updated").latest("id")
    assert (saved.actor, set(saved.data["changes"])) == ("staff:alice", {"name"})


def test_a_page_opened_before_a_new_base_url_renames_and_keeps_it(
    staff: Client, broker: Broker, created: CreatedIsiIntegration, api: IsiSimulator
) -> None:
    integration = created.integration
    page = staff.get(_change_url(integration)).content.decode()
    isi_integration_update(
        integration=integration,
        actor="staff:bob",
        base_url=api.base_url + "/v2",
        auth="oauth",
        token_url=api.token_url,
        client_id=api.client_id,
        client_secret="new-secret",
    )
    form = {**_hidden_inputs(page), **_oauth_form(broker, api, name="Acme API 2")}
    form.update(enabled="on", client_secret="")

    # Not "the URL it is sent to changed: enter it again": this page changed no URL.
    assert staff.post(_change_url(integration), form).status_code == 302

    integration.refresh_from_db()
    assert (integration.name, integration.base_url, integration.client_secret) == (
        "Acme API 2",
        api.base_url + "/v2",
        "new-secret",
    )


def test_a_page_opened_before_a_rename_keeps_the_new_name_on_save(
    staff: Client, broker: Broker, created: CreatedIsiIntegration, api: IsiSimulator
) -> None:
    integration = created.integration
    page = staff.get(_change_url(integration)).content.decode()
    # Meanwhile a colleague renames it.
    isi_integration_update(integration=integration, actor="staff:bob", name="Acme API EU")
    # This page, its name as it showed it, saves a new client secret.
    form = {**_hidden_inputs(page), **_oauth_form(broker, api, client_secret="n3w-secret")}
    form.update(enabled="on")

    assert staff.post(_change_url(integration), form).status_code == 302

    integration.refresh_from_db()
    assert (integration.name, integration.client_secret) == ("Acme API EU", "n3w-secret")
    saved = LedgerEvent.objects.filter(kind="integration.updated").latest("id")
    assert (saved.actor, set(saved.data["changes"])) == ("staff:alice", {"client_secret"})
