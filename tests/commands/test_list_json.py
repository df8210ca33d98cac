"""``--json`` of every list command prints one JSON object, ``{"items": [...]}``, as every
other ``--json`` does (a list at the top level is not what scripts reading it expect)."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from integrations.models import Broker
from integrations.services.staff.integrations import webhook_integration_create
from integrations.services.staff.keys import api_key_create
from tests.builders import SaasConnectionFactory, ServiceProviderFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("command", "field", "value"),
    [
        ("brokers", "broker_id", "4821"),
        ("apikeys", "name", None),
        ("integrations", "name", "Acme CRM"),
        ("saas", "name", "Mailer"),
        ("providers", "name", "Mailhouse"),
    ],
)
def test_list_json_is_one_object_with_its_items(
    broker: Broker, command: str, field: str, value: str | None
) -> None:
    webhook_integration_create(
        broker=broker, name="Acme CRM", url="https://crm.acme.example/drop", actor="test"
    )
    SaasConnectionFactory.create(broker=broker, url="https://api.mailer.example/erase")
    ServiceProviderFactory.create(broker=broker, name="Mailhouse")
    created = api_key_create(broker=broker, scopes=["ingest"], actor="test")
    out = io.StringIO()

    call_command(command, "list", "--json", stdout=out)

    printed = json.loads(out.getvalue())
    assert isinstance(printed, dict) and list(printed) == ["items"]
    (item,) = printed["items"]
    assert item[field] == (value if value is not None else created.api_key.name)


@pytest.mark.parametrize("command", ["integrations", "saas"])
def test_a_list_prints_a_target_url_without_its_query(broker: Broker, command: str) -> None:
    # A query may carry the target's token: printed, it would land in shells' scrollback.
    webhook_integration_create(
        broker=broker, name="Acme CRM", url="https://crm.acme.example/drop?key=s3cr3t", actor="test"
    )
    SaasConnectionFactory.create(broker=broker, url="https://api.mailer.example/erase?key=s3cr3t")
    out = io.StringIO()

    call_command(command, "list", "--json", stdout=out)

    (item,) = json.loads(out.getvalue())["items"]
    assert item["url"] in ("https://crm.acme.example/drop", "https://api.mailer.example/erase")
    assert "s3cr3t" not in out.getvalue()
