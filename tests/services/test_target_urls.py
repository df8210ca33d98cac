"""Target URLs: a user:password part is refused wherever one is set, and no ledger event
keeps a URL's query string (where tokens and identifiers travel)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, LedgerEvent
from integrations.outbound_http import deliver
from integrations.services.brokers import broker_create, broker_update
from integrations.services.integrations import webhook_integration_create
from integrations.services.isi import isi_integration_create
from integrations.services.ledger import ledger_event_append
from integrations.services.saas import saas_connection_create

WITH_CREDENTIALS = "https://drop:hunter2@hooks.acme.example/drop"

SETTERS: dict[str, Any] = {
    "webhook url": lambda broker, url: webhook_integration_create(
        broker=broker, name="CRM", url=url, actor="test"
    ),
    "ISI base url": lambda broker, url: isi_integration_create(
        broker=broker, name="CRM", base_url=url, token="tok", actor="test"
    ),
    "ISI token url": lambda broker, url: isi_integration_create(
        broker=broker,
        name="CRM",
        base_url="https://api.acme.example",
        token_url=url,
        client_id="id",
        client_secret="secret",
        actor="test",
    ),
    "SaaS url": lambda broker, url: saas_connection_create(
        broker=broker, name="Mailer", url=url, token="tok", actor="test"
    ),
    "DROP base url, new broker": lambda broker, url: broker_create(
        broker_id="5930", name="Other", drop_base_url=url, actor="test"
    ),
    "DROP base url, changed": lambda broker, url: broker_update(
        broker=broker, actor="test", drop_base_url=url
    ),
}


@pytest.mark.parametrize("setter", SETTERS, ids=list(SETTERS))
def test_a_url_with_a_user_and_password_is_refused(broker: Broker, setter: str) -> None:
    events = LedgerEvent.objects.count()

    with pytest.raises(ValidationError) as raised:
        SETTERS[setter](broker, WITH_CREDENTIALS)

    assert "user name or password" in str(raised.value)
    assert "hunter2" not in str(raised.value)
    assert LedgerEvent.objects.count() == events  # nothing written


def test_a_call_to_a_url_with_credentials_is_refused_before_connecting() -> None:
    result = deliver("POST", WITH_CREDENTIALS, body=b"{}", headers={}, allow_private=False)

    assert (result.status, result.error) == (
        None,
        "invalid URL: a user name or password in the URL is not allowed",
    )


def test_no_ledger_event_keeps_a_query_string(broker: Broker) -> None:
    webhook_integration_create(
        broker=broker, name="CRM", url="https://hooks.acme.example/drop?key=s3cr3t#x", actor="t"
    )
    ledger_event_append(
        kind=LedgerKind.INTEGRATION_DISABLED,
        data={
            "reason": "410 Gone from https://a:b@hooks.acme.example/drop?key=s3cr3t at noon",
            "nested": [{"url": "http://127.0.0.1:9/x?email=ann@example.com"}],
            "quoted": 'see "https://hooks.acme.example/q?key=s3cr3t"',
        },
    )

    stored = json.dumps(list(LedgerEvent.objects.values_list("data", flat=True)))
    assert "s3cr3t" not in stored and "ann@example.com" not in stored
    created = LedgerEvent.objects.get(kind="integration.created")
    assert created.data["url"] == "https://hooks.acme.example/drop"
    note = LedgerEvent.objects.get(kind="integration.disabled")
    assert note.data == {
        "reason": "410 Gone from https://hooks.acme.example/drop at noon",
        "nested": [{"url": "http://127.0.0.1:9/x"}],
        "quoted": 'see "https://hooks.acme.example/q"',
    }
