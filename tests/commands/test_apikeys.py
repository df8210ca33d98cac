"""API keys: shown once, stored only as a SHA-256 digest, scoped, revocable."""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from rest_framework.test import APIClient

from integrations.models import ApiKey, Broker, LedgerEvent
from tests.conftest import bearer

pytestmark = pytest.mark.django_db


def create(*args: str) -> dict:
    out = io.StringIO()
    call_command("apikeys", "create", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def test_create_prints_the_key_once_and_stores_only_its_digest(broker: Broker) -> None:
    printed = create("--broker", "4821", "--scope", "webhook_callback", "--name", "callbacks")
    key = printed["key"]
    assert key.startswith(printed["prefix"])
    assert printed["scopes"] == ["webhook_callback"]
    assert len(key) >= 40
    stored = ApiKey.objects.get()
    assert stored.digest == hashlib.sha256(key.encode()).hexdigest()
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(k)::text FROM integrations_apikey k")
        (row,) = cursor.fetchone()
    assert key not in row
    events = LedgerEvent.objects.filter(kind="api_key.created")
    assert key not in json.dumps(list(events.values()), default=str)
    # listed afterwards without the key
    out = io.StringIO()
    call_command("apikeys", "list", "--json", stdout=out)
    assert key not in out.getvalue()
    assert json.loads(out.getvalue())["items"][0]["prefix"] == printed["prefix"]


def test_list_shows_each_key_with_its_creation_in_drops_calendar(broker: Broker) -> None:
    printed = create("--broker", "4821", "--scope", "audit", "--name", "auditors")
    # 03:00 UTC on July 2 is still July 1 in California, where staff read the date.
    ApiKey.objects.update(created_at=dt.datetime(2026, 7, 2, 3, 0, tzinfo=dt.UTC))
    out = io.StringIO()
    call_command("apikeys", "list", stdout=out)
    (line,) = out.getvalue().splitlines()
    assert line.startswith(f"{printed['prefix']}  4821  audit")
    assert "created 2026-07-01 20:00 PDT  active  last used never  auditors" in line


def test_keys_are_unique(broker: Broker) -> None:
    keys = {create("--broker", "4821", "--scope", "ingest")["key"] for _ in range(5)}
    assert len(keys) == 5


def test_revoke_by_prefix_stops_the_key(broker: Broker, api_client: APIClient) -> None:
    printed = create("--broker", "4821", "--scope", "audit")
    assert api_client.get("/api/v1/ping", **bearer(printed["key"])).status_code == 200
    call_command("apikeys", "revoke", printed["prefix"], stdout=io.StringIO())
    assert api_client.get("/api/v1/ping", **bearer(printed["key"])).status_code == 401
    assert LedgerEvent.objects.filter(kind="api_key.revoked", subject=printed["prefix"]).exists()


def test_unknown_prefix_and_broker_and_scope_are_clear_errors(broker: Broker) -> None:
    with pytest.raises(CommandError, match="no API key with prefix"):
        call_command("apikeys", "revoke", "dpk_nothing")
    with pytest.raises(CommandError, match="no broker with id '9999'"):
        create("--broker", "9999", "--scope", "audit")
    with pytest.raises(CommandError, match="invalid choice"):
        create("--broker", "4821", "--scope", "admin")
    assert not ApiKey.objects.exists()


def test_a_name_longer_than_its_column_is_refused_in_one_line(broker: Broker) -> None:
    with pytest.raises(CommandError, match=r"^name: at most 200 characters, not 201$"):
        create("--broker", "4821", "--scope", "audit", "--name", "n" * 201)
    assert not ApiKey.objects.exists()
    assert create("--broker", "4821", "--scope", "audit", "--name", "n" * 200)["name"] == "n" * 200


def test_a_metrics_key_of_every_broker_reads_every_brokers_series(
    broker: Broker, api_client: APIClient
) -> None:
    printed = create("--all-brokers", "--scope", "metrics", "--name", "prometheus")

    assert printed["broker_id"] is None
    response = api_client.get("/metrics", **bearer(printed["key"]))
    assert response.status_code == 200
    assert "dropportal_ledger_events_total" in response.content.decode()
    out = io.StringIO()
    call_command("apikeys", "list", "--json", stdout=out)
    assert json.loads(out.getvalue())["items"][0]["broker_id"] is None
    with pytest.raises(CommandError, match="only have the metrics scope"):
        create("--all-brokers", "--scope", "metrics", "--scope", "audit")
    with pytest.raises(CommandError):
        create("--all-brokers", "--broker", "4821", "--scope", "metrics")
