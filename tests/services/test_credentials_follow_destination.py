"""A stored credential follows its destination: changing where it is sent clears it, or
requires entering it again in the same change, and the ledger event says so."""

from __future__ import annotations

import html
import re

import pytest
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from integrations.models import (
    Broker,
    Integration,
    IsiAuth,
    LedgerEvent,
    SaasConnection,
)
from integrations.services.staff.brokers import broker_update
from integrations.services.staff.isi import isi_integration_update
from integrations.services.staff.saas import saas_connection_create, saas_connection_update
from tests.builders import IsiIntegrationFactory

pytestmark = pytest.mark.django_db

KEY = "drop-key-before"


def _last(kind: str) -> dict:
    return LedgerEvent.objects.filter(kind=kind).order_by("-pk").first().data  # type: ignore[union-attr]


@pytest.fixture
def keyed(broker: Broker) -> Broker:
    return broker_update(broker=broker, actor="test", drop_api_key=KEY)


def test_a_new_drop_base_url_clears_the_key(keyed: Broker) -> None:
    broker_update(broker=keyed, actor="test", drop_base_url="https://drop.elsewhere.example")

    stored = Broker.objects.get()
    assert stored.drop_api_key == ""
    assert _last("broker.updated")["changes"]["drop_api_key"]["cleared"] is True


def test_a_new_mode_sends_to_another_drop_and_clears_the_key(keyed: Broker) -> None:
    broker_update(broker=keyed, actor="test", mode="production")

    assert Broker.objects.get().drop_api_key == ""
    assert _last("broker.updated")["changes"]["drop_api_key"]["cleared"] is True


def test_a_key_entered_with_the_new_url_is_kept(keyed: Broker) -> None:
    broker_update(
        broker=keyed,
        actor="test",
        drop_base_url="https://drop.elsewhere.example",
        drop_api_key="drop-key-after",
    )

    assert Broker.objects.get().drop_api_key == "drop-key-after"
    assert _last("broker.updated")["changes"]["drop_api_key"] == {"changed": True}


def test_a_rename_keeps_the_key(keyed: Broker) -> None:
    broker_update(broker=keyed, actor="test", name="Acme Renamed")

    assert Broker.objects.get().drop_api_key == KEY
    assert "drop_api_key" not in _last("broker.updated")["changes"]


def test_the_admin_clears_the_key_through_the_service(keyed: Broker, client: Client) -> None:
    manager = User.objects.create_user("manager", password="pw-123-role", is_staff=True)
    manager.groups.add(Group.objects.get(name="Connections managers"))
    client.force_login(manager)
    response = client.post(
        reverse("admin:integrations_broker_change", args=[keyed.pk]),
        {
            "name": keyed.name,
            "mode": keyed.mode,
            "drop_base_url": "https://drop.attacker.example",
            "drop_api_key": "",
            "pull_interval_days": 30,
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Broker.objects.get().drop_api_key == ""
    assert _last("broker.updated")["changes"]["drop_api_key"]["cleared"] is True


def test_a_new_saas_url_clears_the_token(broker: Broker) -> None:
    connection = saas_connection_create(
        broker=broker, name="Mailer", url="https://api.mailer.example/erase", token="tok", actor="t"
    )
    saas_connection_update(connection=connection, actor="t", url="https://evil.example/erase")

    assert SaasConnection.objects.get().token == ""
    assert _last("saas_connection.updated")["changes"]["token"]["cleared"] is True


def test_a_saas_token_entered_with_the_new_url_is_kept(broker: Broker) -> None:
    connection = saas_connection_create(
        broker=broker, name="Mailer", url="https://api.mailer.example/erase", token="tok", actor="t"
    )
    saas_connection_update(
        connection=connection, actor="t", url="https://new.mailer.example/erase", token="tok2"
    )

    assert SaasConnection.objects.get().token == "tok2"


def _isi(broker: Broker, auth: str) -> Integration:
    credentials = (
        {"token": "isi-token"}
        if auth == IsiAuth.TOKEN
        else {
            "token_url": "https://auth.acme.example/token",
            "client_id": "dp",
            "client_secret": "isi-client-secret",
            "token": "",
        }
    )
    return IsiIntegrationFactory.create(
        broker=broker,
        name="API",
        base_url="https://api.acme.example",
        auth=auth,
        webhook_secret="whsec_" + "A" * 43,
        **credentials,
    )


def test_a_new_isi_base_url_needs_the_token_again(broker: Broker) -> None:
    integration = _isi(broker, IsiAuth.TOKEN)

    with pytest.raises(ValidationError) as refused:
        isi_integration_update(
            integration=integration,
            actor="t",
            base_url="https://api.attacker.example",
            auth=IsiAuth.TOKEN,
        )
    assert "token" in refused.value.message_dict
    assert Integration.objects.get().base_url == "https://api.acme.example"

    isi_integration_update(
        integration=integration,
        actor="t",
        base_url="https://api2.acme.example",
        auth=IsiAuth.TOKEN,
        token="isi-token-2",
    )
    stored = Integration.objects.get()
    assert (stored.base_url, stored.token) == ("https://api2.acme.example", "isi-token-2")
    assert _last("integration.updated")["changes"]["token"] == {
        "changed": True,
        "reason": "the URL it is sent to changed: entered again",
    }


def test_a_new_isi_base_url_alone_needs_the_credential_again(broker: Broker) -> None:
    integration = _isi(broker, IsiAuth.OAUTH)

    with pytest.raises(ValidationError) as refused:
        isi_integration_update(
            integration=integration, actor="t", base_url="https://api.attacker.example"
        )
    assert "client_secret" in refused.value.message_dict


def test_a_new_token_url_needs_the_client_secret_again(broker: Broker) -> None:
    integration = _isi(broker, IsiAuth.OAUTH)

    with pytest.raises(ValidationError) as refused:
        isi_integration_update(
            integration=integration,
            actor="t",
            auth=IsiAuth.OAUTH,
            token_url="https://auth.attacker.example/token",
            client_id="dp",
        )
    assert "client_secret" in refused.value.message_dict
    assert Integration.objects.get().token_url == "https://auth.acme.example/token"

    # The same token URL keeps the stored secret.
    isi_integration_update(
        integration=integration,
        actor="t",
        auth=IsiAuth.OAUTH,
        token_url="https://auth.acme.example/token",
        client_id="dp2",
    )
    assert Integration.objects.get().client_secret == "isi-client-secret"


def test_the_isi_form_asks_for_the_token_with_a_new_base_url(
    broker: Broker, client: Client
) -> None:
    integration = _isi(broker, IsiAuth.TOKEN)
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw-root-123"))
    url = reverse("admin:integrations_integration_change", args=[integration.pk])
    page = client.get(url).content.decode()
    hidden = {
        name: html.unescape(value)
        for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page)
        if name != "csrfmiddlewaretoken"
    }
    form = {
        **hidden,
        "name": "API",
        "enabled": "on",
        "base_url": "https://api.attacker.example",
        "auth": "token",
        "token": "",
    }

    refused = client.post(url, form)
    assert refused.status_code == 200
    assert "The URL it is sent to changed: enter it again." in html.unescape(
        refused.content.decode()
    )
    assert Integration.objects.get().base_url == "https://api.acme.example"


def test_a_saas_token_a_header_cannot_carry_is_refused_on_create_and_on_update(
    broker: Broker,
) -> None:
    """A pasted "’" passed, and each deletion to the connection then raised out of
    http.client, undoing the delivery batch it was in (its other calls already answered)."""
    with pytest.raises(ValidationError) as refused:
        saas_connection_create(
            broker=broker, name="Mailer", url="https://api.mailer.example/erase",
            token="tok\u2019", actor="t",
        )  # fmt: skip
    assert list(refused.value.message_dict) == ["token"]
    assert not SaasConnection.objects.exists()

    connection = saas_connection_create(
        broker=broker, name="Mailer", url="https://api.mailer.example/erase", token="tok", actor="t"
    )
    with pytest.raises(ValidationError):
        saas_connection_update(connection=connection, actor="t", token="tok\u2026")
    assert SaasConnection.objects.get().token == "tok"
