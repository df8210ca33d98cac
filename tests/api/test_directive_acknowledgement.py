"""``POST /api/v1/drop/directives/{id}/acknowledgement``: a service provider acknowledges a
directive with its own key (scope ``directive_ack``), and that provider's directives only."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, Directive, LedgerEvent, ServiceProvider
from integrations.services.providers.providers import service_provider_add
from integrations.services.staff.brokers import broker_create
from integrations.services.staff.keys import api_key_create
from tests.builders import DirectiveFactory
from tests.conftest import bearer

pytestmark = pytest.mark.django_db


def provider_key(provider: ServiceProvider) -> str:
    """The provider's own key, as staff mint it: ``apikeys create --provider``."""
    out = io.StringIO()
    call_command(
        "apikeys",
        "create",
        "--broker",
        provider.broker.broker_id,
        "--scope",
        "directive_ack",
        "--provider",
        str(provider.pk),
        "--json",
        stdout=out,
    )
    printed = json.loads(out.getvalue())
    assert printed["provider_id"] == provider.pk
    return str(printed["key"])


@pytest.fixture
def mailhouse(broker: Broker) -> ServiceProvider:
    return service_provider_add(broker=broker, name="Mailhouse", actor="test")


@pytest.fixture
def directive(mailhouse: ServiceProvider) -> Directive:
    return DirectiveFactory.create(provider=mailhouse)


def acknowledge(api_client: APIClient, directive_id: int, key: str, body: Any = None) -> Any:
    return api_client.post(
        f"/api/v1/drop/directives/{directive_id}/acknowledgement",
        body if body is not None else {"reference": "MH-4410"},
        format="json",
        **bearer(key),
    )


def test_the_providers_own_key_acknowledges_its_directive(
    api_client: APIClient, directive: Directive, mailhouse: ServiceProvider
) -> None:
    key = provider_key(mailhouse)
    answer = acknowledge(api_client, directive.pk, key)
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["id"] == directive.pk
    assert body["reference"] == "MH-4410"
    assert body["acknowledged_by"] == f"apikey:{key[:12]}"
    directive.refresh_from_db()
    assert directive.acknowledged_at is not None
    assert directive.acknowledgement_reference == "MH-4410"
    event = LedgerEvent.objects.get(kind=LedgerKind.DIRECTIVE_ACKNOWLEDGED)
    assert event.actor == f"apikey:{key[:12]}"
    # Again: what was recorded, unchanged.
    again = acknowledge(api_client, directive.pk, key, {"reference": "other"})
    assert again.status_code == 200
    assert again.json()["reference"] == "MH-4410"
    assert LedgerEvent.objects.filter(kind=LedgerKind.DIRECTIVE_ACKNOWLEDGED).count() == 1


def test_another_providers_key_is_refused_403(
    api_client: APIClient, broker: Broker, directive: Directive
) -> None:
    other = service_provider_add(broker=broker, name="Warehouse", actor="test")
    answer = acknowledge(api_client, directive.pk, provider_key(other))
    assert answer.status_code == 403
    assert answer["Content-Type"] == "application/problem+json"
    assert answer.json()["code"] == "directive_of_another_provider"
    directive.refresh_from_db()
    assert directive.acknowledged_at is None


def test_another_brokers_key_or_no_such_directive_is_404(
    api_client: APIClient, directive: Directive, mailhouse: ServiceProvider
) -> None:
    elsewhere = broker_create(broker_id="4822", name="Other", mode="test", actor="test")
    stranger = service_provider_add(broker=elsewhere, name="Mailhouse", actor="test")
    answer = acknowledge(api_client, directive.pk, provider_key(stranger))
    assert answer.status_code == 404
    assert answer.json()["code"] == "not_found"
    assert acknowledge(api_client, 999_999, provider_key(mailhouse)).status_code == 404
    directive.refresh_from_db()
    assert directive.acknowledged_at is None


def test_a_key_without_the_scope_is_refused_403(
    api_client: APIClient, directive: Directive, make_key: Any
) -> None:
    answer = acknowledge(api_client, directive.pk, make_key("ingest").key)
    assert answer.status_code == 403
    assert answer.json()["code"] == "scope_missing"


@pytest.mark.parametrize(
    "body",
    [{}, {"reference": ""}, {"reference": "x" * 501}, {"reference": 12}, {"reference": True}],
)
def test_a_missing_or_bad_reference_is_400(
    api_client: APIClient, directive: Directive, mailhouse: ServiceProvider, body: Any
) -> None:
    answer = acknowledge(api_client, directive.pk, provider_key(mailhouse), body)
    assert answer.status_code == 400
    assert answer.json()["code"] == "validation_failed"
    assert "reference" in answer.json()["errors"]


@pytest.mark.parametrize(
    "reference",
    ["ok\u001b]0;pwned\u0007\u001b[2J", "MH\t4410", "MH-4410\r\nforged line", "MH\u009b4410"],
)
def test_a_reference_with_control_characters_is_400(
    api_client: APIClient, directive: Directive, mailhouse: ServiceProvider, reference: str
) -> None:
    # Staff print it in a terminal: ESC and the rest would be commands there.
    answer = acknowledge(
        api_client, directive.pk, provider_key(mailhouse), {"reference": reference}
    )
    assert answer.status_code == 400
    assert answer["Content-Type"] == "application/problem+json"
    assert answer.json()["code"] == "validation_failed"
    assert answer.json()["errors"] == {"reference": ["Control characters are not allowed."]}
    directive.refresh_from_db()
    assert directive.acknowledged_at is None


def test_a_directive_ack_key_is_bound_to_one_provider_of_its_broker(
    broker: Broker, mailhouse: ServiceProvider
) -> None:
    elsewhere = broker_create(broker_id="4822", name="Other", mode="test", actor="test")
    for kwargs in (
        {"broker": broker, "scopes": ["directive_ack"]},  # no provider
        {"broker": elsewhere, "scopes": ["directive_ack"], "provider": mailhouse},
        {"broker": broker, "scopes": ["directive_ack", "ingest"], "provider": mailhouse},
        {"broker": broker, "scopes": ["ingest"], "provider": mailhouse},
    ):
        with pytest.raises(Exception, match="service provider's own"):
            api_key_create(actor="test", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(CommandError, match="no service provider 999"):
        call_command(
            "apikeys", "create", "--broker", "4821", "--scope", "directive_ack",
            "--provider", "999", stdout=io.StringIO(),
        )  # fmt: skip


def test_the_schema_describes_it(api_client: APIClient) -> None:
    schema = api_client.get("/api/v1/schema?format=json").json()
    operation = schema["paths"]["/api/v1/drop/directives/{directive_id}/acknowledgement"]["post"]
    assert operation["operationId"] == "drop_directive_acknowledge"
    assert {"200", "400", "401", "403", "404"} <= set(operation["responses"])
