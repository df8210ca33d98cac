"""Names staff give (a broker's, an API key's, an integration's, ...) hold no control
character, and the list commands show one stored before as an escape: a terminal obeys a
control character it is sent (ESC retitles it, clears it, rewrites what it shows)."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError

from integrations.models import (
    ApiKey,
    Broker,
    Integration,
    LedgerEvent,
    SaasConnection,
    ServiceProvider,
)
from integrations.services.providers.providers import service_provider_add
from integrations.services.staff.brokers import broker_update
from integrations.services.staff.integrations import (
    integration_update,
    webhook_integration_create,
)
from integrations.services.staff.keys import api_key_create
from integrations.services.staff.saas import saas_connection_create, saas_connection_update

pytestmark = pytest.mark.django_db

RED = "\x1b[31mred"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


ADDS = {
    "broker": (
        ["brokers", "add", "--broker-id", "1234", "--mode", "test", "--name"],
        lambda: Broker.objects.filter(broker_id="1234").exists(),
    ),
    "api key": (
        ["apikeys", "create", "--broker", "4821", "--scope", "ingest", "--name"],
        ApiKey.objects.exists,
    ),
    "webhook": (
        [
            "integrations",
            "add",
            "webhook",
            "--broker",
            "4821",
            "--url",
            "https://crm.example/h",
            "--name",
        ],
        Integration.objects.exists,
    ),
    "saas": (
        ["saas", "add", "--broker", "4821", "--url", "https://mail.example/erase", "--name"],
        SaasConnection.objects.exists,
    ),
    "provider": (
        ["providers", "add", "--broker", "4821", "--name"],
        ServiceProvider.objects.exists,
    ),
}


@pytest.mark.parametrize("name", ["Acme\x01Data", RED, "Acme\tData", "Acme\x9bData"])
@pytest.mark.parametrize("what", list(ADDS))
def test_a_name_with_a_control_character_is_refused(broker: Broker, what: str, name: str) -> None:
    args, added = ADDS[what]
    events = LedgerEvent.objects.count()

    with pytest.raises(CommandError, match=r"^name: a name must not hold control characters"):
        run(*args, name)

    assert not added()
    assert LedgerEvent.objects.count() == events


def test_a_name_of_printable_characters_from_any_script_is_kept(broker: Broker) -> None:
    run("brokers", "add", "--broker-id", "1234", "--mode", "test", "--name", "Société Δ «Ω»")

    assert Broker.objects.get(broker_id="1234").name == "Société Δ «Ω»"


RENAMES: dict[str, Callable[[Broker], Any]] = {
    # The admin's change pages go through these.
    "broker": lambda broker: broker_update(broker=broker, actor="t", name=RED),
    "integration": lambda broker: integration_update(
        integration=webhook_integration_create(
            broker=broker, name="CRM", url="https://crm.example/h", actor="t"
        ).integration,
        actor="t",
        name=RED,
    ),
    "saas": lambda broker: saas_connection_update(
        connection=saas_connection_create(
            broker=broker, name="Mailer", url="https://mail.example/erase", actor="t"
        ),
        actor="t",
        name=RED,
    ),
}


@pytest.mark.parametrize("what", list(RENAMES))
def test_a_rename_to_a_name_with_a_control_character_is_refused(broker: Broker, what: str) -> None:
    with pytest.raises(ValidationError, match="control characters"):
        RENAMES[what](broker)

    assert not [
        name
        for model in (Broker, Integration, SaasConnection)
        for name in model.objects.values_list("name", flat=True)
        if "\x1b" in name
    ]


def stored_before(broker: Broker) -> None:
    """Rows named as they could be before names were checked: written past the services."""
    Broker.objects.filter(pk=broker.pk).update(name="Acme\x01" + RED)
    key = api_key_create(broker=broker, scopes=["ingest"], name="k", actor="t").api_key
    ApiKey.objects.filter(pk=key.pk).update(name=RED)
    integration = webhook_integration_create(
        broker=broker, name="CRM", url="https://crm.example/h", actor="t"
    ).integration
    Integration.objects.filter(pk=integration.pk).update(name=RED)
    connection = saas_connection_create(
        broker=broker, name="Mailer", url="https://mail.example/erase", actor="t"
    )
    SaasConnection.objects.filter(pk=connection.pk).update(name=RED)
    provider = service_provider_add(broker=broker, name="Mailhouse", actor="t")
    ServiceProvider.objects.filter(pk=provider.pk).update(name=RED)


@pytest.mark.parametrize(
    "command",
    [
        ["brokers", "list"],
        ["apikeys", "list"],
        ["integrations", "list"],
        ["saas", "list"],
        ["providers", "list"],
    ],
)
def test_the_lists_show_a_name_stored_before_escaped(broker: Broker, command: list[str]) -> None:
    stored_before(broker)

    out = run(*command)

    assert r"\x1b[31mred" in out
    assert "\x1b" not in out
    assert "\x01" not in out
