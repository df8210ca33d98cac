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
from integrations.services.dispatch.outcomes import deletion_outcome_record
from integrations.services.ledger import ledger_event_append
from integrations.services.staff.brokers import broker_create, broker_update
from integrations.services.staff.integrations import webhook_integration_create
from integrations.services.staff.isi import isi_integration_create
from integrations.services.staff.saas import saas_connection_create
from tests.builders import DeletionRequestFactory

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


# A password may hold characters that end a host where a parser reads one ("?", "#", ";").
CREDENTIALS = [
    WITH_CREDENTIALS,
    "https://drop:hun?ter2@hooks.acme.example/drop",
    "https://drop:hun#ter2@hooks.acme.example/drop",
    "https://drop:hun;ter2@hooks.acme.example/drop",
]


@pytest.mark.parametrize("url", CREDENTIALS)
@pytest.mark.parametrize("setter", SETTERS, ids=list(SETTERS))
def test_a_url_with_a_user_and_password_is_refused(broker: Broker, setter: str, url: str) -> None:
    events = LedgerEvent.objects.count()

    with pytest.raises(ValidationError) as raised:
        SETTERS[setter](broker, url)

    assert "user name or password" in str(raised.value)
    assert "ter2" not in str(raised.value)
    assert LedgerEvent.objects.count() == events  # nothing written


# URLValidator takes any port of five digits; the call itself would refuse these.
PORTS_PAST_RANGE = ["https://hooks.acme.example:99999/drop", "https://hooks.acme.example:65536"]


@pytest.mark.parametrize("url", PORTS_PAST_RANGE)
@pytest.mark.parametrize("setter", SETTERS, ids=list(SETTERS))
def test_a_url_with_a_port_past_65535_is_refused(broker: Broker, setter: str, url: str) -> None:
    events = LedgerEvent.objects.count()

    with pytest.raises(ValidationError) as raised:
        SETTERS[setter](broker, url)

    assert "a port is a number up to 65535" in str(raised.value)
    assert LedgerEvent.objects.count() == events  # nothing written


def test_a_url_with_the_highest_port_is_taken(broker: Broker) -> None:
    created = webhook_integration_create(
        broker=broker, name="CRM", url="https://hooks.acme.example:65535/drop", actor="t"
    )
    assert created.integration.url == "https://hooks.acme.example:65535/drop"


def test_an_at_sign_in_the_query_of_a_url_without_a_path_is_no_password(broker: Broker) -> None:
    created = webhook_integration_create(
        broker=broker, name="CRM", url="https://hooks.acme.example?to=ann@x.example", actor="t"
    )
    assert created.integration.url == "https://hooks.acme.example?to=ann@x.example"


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


# How a URL's query may be spelt in text a broker or a peer sends: any case, JSON's escaped
# slashes, percent-encoded (a URL inside another URL's text).
SPELLINGS = {
    "upper case": ("HTTPS://Hooks.Acme.example/drop?key=s3cr3t", "https://Hooks.Acme.example/drop"),
    "escaped slashes": (
        "https:\\/\\/hooks.acme.example\\/drop?key=s3cr3t",
        "https://hooks.acme.example/drop",
    ),
    "percent-encoded": (
        "https%3A%2F%2Fhooks.acme.example%2Fdrop%3Fkey%3Ds3cr3t",
        "https://hooks.acme.example/drop",
    ),
    "credentials, fragment": ("Http://a:s3cr3t@h.example:8443/p#s3cr3t", "http://h.example:8443/p"),
}


def _ledgered_with(url: str) -> dict[str, Any]:
    """The data of an event whose texts carry ``url``, as the ledger kept it."""
    ledger_event_append(
        kind=LedgerKind.INTEGRATION_DISABLED,
        data={"reason": f"410 Gone from {url} at noon", "answer": f'{{"next":"{url}"}}'},
    )
    return LedgerEvent.objects.get(kind="integration.disabled").data


@pytest.mark.parametrize("spelling", SPELLINGS, ids=list(SPELLINGS))
def test_no_ledger_event_keeps_a_query_string_however_the_url_is_spelt(
    broker: Broker, spelling: str
) -> None:
    url, kept = SPELLINGS[spelling]
    data = _ledgered_with(url)
    assert "s3cr3t" not in json.dumps(data)
    assert data["reason"] == f"410 Gone from {kept} at noon"
    assert data["answer"] == f'{{"next":"{kept}"}}'


# What else may carry a secret past a URL's host and path: a query spelt with encoded
# separators, ";" parameters, a space inside a query value, and a password holding
# characters that end a host ("?", "#", "/", ";", "@").
MASKED = {
    "encoded separators in the query": (
        "https://h.example/drop?a=1%26key%3Ds3cr3t",
        "https://h.example/drop",
    ),
    "an encoded query in the path": (
        "https://h.example/drop%3Fkey%3Ds3cr3t",
        "https://h.example/drop",
    ),
    "a query encoded twice": (
        "https://h.example/drop%253Fkey%253Ds3cr3t",
        "https://h.example/drop",
    ),
    "an encoded assignment in the path": (
        "https://h.example/drop/key%3Ds3cr3t",
        "https://h.example/drop/key",
    ),
    "a ';' parameter": ("https://h.example/drop;jsessionid=s3cr3t", "https://h.example/drop"),
    "a ';' parameter and a query": (
        "https://h.example/drop;k=s3cr3t?x=s3cr3t",
        "https://h.example/drop",
    ),
    "a ';' parameter on the host": ("https://h.example:8443;k=s3cr3t", "https://h.example:8443"),
    "a space inside a query value": (
        "https://h.example/drop?name=Ann Lee&key=s3cr3t",
        "https://h.example/drop",
    ),
    "'?' in the password": ("https://drop:s3?cr3t@h.example/drop", "https://h.example/drop"),
    "'#' in the password": ("https://drop:s3#cr3t@h.example/drop", "https://h.example/drop"),
    "'/' in the password": ("https://drop:s3/cr3t@h.example/drop", "https://h.example/drop"),
    "';' in the password": (
        "https://drop:s3;cr3t@h.example:8443/drop",
        "https://h.example:8443/drop",
    ),
    "'@' in the password": ("https://drop:s3@cr3t@h.example/drop", "https://h.example/drop"),
    "'?' in an encoded password": (
        "https%3A%2F%2Fdrop%3As3%3Fcr3t%40h.example%2Fdrop",
        "https://h.example/drop",
    ),
}


@pytest.mark.parametrize("case", MASKED, ids=list(MASKED))
def test_no_ledger_event_keeps_what_a_url_carries_past_its_host_and_path(
    broker: Broker, case: str
) -> None:
    url, kept = MASKED[case]
    data = _ledgered_with(url)
    assert "cr3t" not in json.dumps(data)
    assert "drop:" not in json.dumps(data)
    assert data["reason"] == f"410 Gone from {kept} at noon"
    assert data["answer"] == f'{{"next":"{kept}"}}'


def test_a_value_that_is_a_url_keeps_no_query_value_however_spaced(broker: Broker) -> None:
    # In running text a space may end a URL; a value of its own is the URL to its end.
    ledger_event_append(
        kind=LedgerKind.INTEGRATION_DISABLED,
        data={"url": "https://h.example/drop?key=s3 cr3t", "reason": "from https://h.example/x"},
    )

    data = LedgerEvent.objects.get(kind="integration.disabled").data
    assert data == {"url": "https://h.example/drop", "reason": "from https://h.example/x"}


def test_an_outcome_recorded_in_sql_keeps_no_query_string_in_its_event(broker: Broker) -> None:
    integration = webhook_integration_create(
        broker=broker, name="CRM", url="https://hooks.acme.example/drop", actor="t"
    ).integration
    request = DeletionRequestFactory.create(integration=integration, state="dispatched")

    deletion_outcome_record(
        deletion_request=request,
        drop_outcome="failed",
        error_message="see HTTPS://crm.acme.example/case?email=ann%40example.com",
        actor="apikey:dpk_test",
    )

    event = LedgerEvent.objects.get(kind="deletion_request.outcome_recorded")
    assert event.data["error_message"] == "see https://crm.acme.example/case"
