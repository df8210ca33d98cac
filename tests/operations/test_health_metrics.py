"""GET /healthz, /readyz and /metrics (the ``metrics`` API key scope)."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection
from django.test import Client
from rest_framework.test import APIClient

from integrations.counters import CALLBACKS, DELIVERIES
from integrations.drop.calendar import drop_today
from integrations.models import (
    ApiKey,
    LedgerEvent,
    ReportFileState,
    RequestState,
    WorkItemState,
)
from integrations.operations import health
from integrations.services.staff.brokers import broker_create
from integrations.services.staff.keys import api_key_create
from tests.builders import (
    DeletionRequestFactory,
    DropCycleFactory,
    WorkItemFactory,
    items_reported,
    webhook_integration_created,
)
from tests.conftest import bearer

pytestmark = pytest.mark.django_db


def _worker_beats() -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_workers")
        cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES")


def _no_worker() -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_workers")


def test_healthz_answers_without_touching_the_database(client: Client) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(connection, "cursor", _refuse)
        response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
@pytest.mark.parametrize("method", ["post", "put", "delete", "options"])
def test_a_probe_takes_only_get_and_head(path: str, method: str) -> None:
    client = Client(enforce_csrf_checks=True)  # as a real request meets it

    answer = getattr(client, method)(path)

    assert answer.status_code == 405
    assert answer["Allow"] == "GET, HEAD"
    assert client.head(path).status_code in (200, 503)


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("/healthz touched the database")


@pytest.fixture
def operator() -> dict[str, Any]:
    """The headers of a request with the operator's ``metrics`` key (of every broker):
    /readyz says what is missing."""
    return bearer(api_key_create(broker=None, scopes=["metrics"], actor="test").key)


def test_readyz_is_ready_with_a_recent_worker_heartbeat(
    client: Client, operator: dict[str, Any]
) -> None:
    _worker_beats()
    response = client.get("/readyz", **operator)
    assert response.status_code == 200
    assert response.json() == {
        "ready": True,
        "checks": {"database": "ok", "encryption_keys": "ok", "migrations": "ok", "worker": "ok"},
        "missing": [],
    }


def test_readyz_names_a_missing_worker(client: Client, operator: dict[str, Any]) -> None:
    _no_worker()
    response = client.get("/readyz", **operator)
    assert response.status_code == 503
    body = response.json()
    assert body["missing"] == ["worker"]
    assert "manage.py worker" in body["checks"]["worker"]


def test_readyz_names_an_old_heartbeat(client: Client, operator: dict[str, Any]) -> None:
    _worker_beats()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE procrastinate_workers SET last_heartbeat = now() - interval '3 min'")
    assert client.get("/readyz", **operator).json()["missing"] == ["worker"]


def test_readyz_names_migrations_not_applied(client: Client, operator: dict[str, Any]) -> None:
    _worker_beats()
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM django_migrations WHERE app = 'integrations' "
            "AND name = '0014_alerts_and_metrics_scope'"
        )
    response = client.get("/readyz", **operator)
    assert response.status_code == 503
    body = response.json()
    assert body["missing"] == ["encryption_keys", "migrations"]  # unknown while one is missing
    assert "integrations.0014_alerts_and_metrics_scope" in body["checks"]["migrations"]


def test_readyz_is_not_ready_on_a_database_that_takes_no_writes(
    client: Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standby (in recovery, as after a failover not yet done) or a database made
    read-only answers SELECT 1 and reads the migrations and the heartbeats of workers
    writing to the primary, yet every callback and job would fail on it."""
    monkeypatch.setattr(health, "readiness", health._Readiness())
    caplog.set_level(logging.INFO, logger="integrations.operations.health")
    _worker_beats()
    assert client.get("/readyz").status_code == 200
    with connection.cursor() as cursor:
        # What a standby's sessions see (transaction_read_only is on there).
        cursor.execute("SET TRANSACTION READ ONLY")

    response = client.get("/readyz")

    assert response.status_code == 503
    assert response.json() == {"ready": False}
    line = [r for r in caplog.records if r.name == "integrations.operations.health"][-1]
    assert line.getMessage().startswith("not ready (database): database: read-only")


def test_readyz_tells_only_ready_or_not_without_a_metrics_key(
    client: Client, make_key, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(health, "readiness", health._Readiness())  # this process: ready so far
    _no_worker()
    caplog.set_level(logging.INFO, logger="integrations.operations.health")
    anonymous = client.get("/readyz")
    other_scope = client.get("/readyz", **bearer(make_key("audit").key))
    unknown_key = client.get("/readyz", HTTP_AUTHORIZATION="Bearer dp_live_nosuchkey")

    for response in (anonymous, other_scope, unknown_key):
        assert response.status_code == 503
        assert response.json() == {"ready": False}
    # The operator reads why in the log: one line for the change, not one per probe.
    (line,) = [r for r in caplog.records if r.name == "integrations.operations.health"]
    assert line.levelname == "WARNING"
    assert "worker: no worker heartbeat within 120 s" in line.getMessage()

    _worker_beats()
    assert client.get("/readyz").json() == {"ready": True}
    assert client.get("/readyz").json() == {"ready": True}
    lines = [r for r in caplog.records if r.name == "integrations.operations.health"]
    assert [(r.levelname, r.getMessage()) for r in lines[1:]] == [("INFO", "ready")]


def test_readyz_details_are_for_a_metrics_key_of_every_broker_only(
    client: Client, make_key, operator: dict[str, Any]
) -> None:
    _no_worker()
    # A broker's own metrics key sees its broker's series, not the operator's set-up (the
    # database's host, port and user, the migrations, the worker).
    brokers_own = client.get("/readyz", **bearer(make_key("metrics").key))
    operators = client.get("/readyz", **operator)

    assert brokers_own.json() == {"ready": False}
    assert operators.json()["missing"] == ["worker"]


def test_readyz_wrong_keys_cost_a_token_and_are_then_refused_429(
    client: Client, make_key, operator: dict[str, Any], settings
) -> None:
    settings.DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT = 1  # bursts of 2
    _worker_beats()
    flood: dict[str, Any] = {"REMOTE_ADDR": "203.0.113.9"}
    # Valid keys, even without the right to the details, cost nothing.
    valid = [client.get("/readyz", **bearer(make_key("audit").key), **flood) for _ in range(3)]
    guesses = [
        client.get("/readyz", HTTP_AUTHORIZATION=f"Bearer dpk_guess-{n}", **flood) for n in range(2)
    ]
    malformed = client.get("/readyz", HTTP_AUTHORIZATION="Basic dpk_guess", **flood)
    out_of_tokens = client.get("/readyz", **operator, **flood)
    probe = client.get("/readyz", **flood)  # a load balancer's probe carries no key
    elsewhere = client.get("/readyz", **operator, REMOTE_ADDR="203.0.113.10")

    assert [v.json() for v in valid] == [{"ready": True}] * 3
    assert [g.json() for g in guesses] == [{"ready": True}] * 2
    assert malformed.status_code == 429
    assert (out_of_tokens.status_code, out_of_tokens.json()["code"]) == (429, "rate_limited")
    assert out_of_tokens["Content-Type"] == "application/problem+json"
    assert int(out_of_tokens["Retry-After"]) >= 1
    assert (probe.status_code, probe.json()) == (200, {"ready": True})
    assert elsewhere.json()["missing"] == []


def _sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text format, or None."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if match and ",".join(sorted((match.group(1) or "").split(","))) == wanted:
            return float(match.group(2))
    return None


def test_metrics_need_the_metrics_scope(api_client: APIClient, make_key) -> None:
    assert api_client.get("/metrics").status_code == 401
    refused = api_client.get("/metrics", **bearer(make_key("audit").key))
    assert refused.status_code == 403
    assert refused.json()["code"] == "scope_missing"


def test_metrics_in_prometheus_text_format(api_client: APIClient, make_key, broker) -> None:
    today = drop_today()  # days left count California's days
    cycle = DropCycleFactory.create(broker=broker, drop_session_id="7", match_date=today)
    WorkItemFactory.create(cycle=cycle)  # waiting for an outcome
    WorkItemFactory.create(cycle=cycle, status_code=3)  # reportable
    WorkItemFactory.create(cycle=cycle, state=WorkItemState.REMOVED)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, status, args) "
            "VALUES ('dispatch', 'integrations.tasks.deliver_deletion_requests', 'todo', '{}')"
        )
    callbacks_before = CALLBACKS.labels(endpoint="deletion", status="401")._value.get()
    deliveries_before = DELIVERIES.labels(kind="deletion_request", result="delivered")._value.get()
    DELIVERIES.labels(kind="deletion_request", result="delivered").inc()
    # A refused callback counts too.
    api_client.put("/api/v1/drop/callbacks/deletion", data={}, format="json")

    # The operator's key (no broker, a superuser's choice) sees every series.
    every_broker = api_key_create(broker=None, scopes=["metrics"], actor="test").key
    response = api_client.get("/metrics", **bearer(every_broker))

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    text = response.content.decode()
    assert _sample(text, "dropportal_work_items_open", broker="4821") == 2
    assert (
        _sample(text, "dropportal_cycle_days_left", broker="4821") == (cycle.due_date - today).days
    )
    assert _sample(text, "dropportal_jobs", queue="dispatch", status="todo") == 1
    assert _sample(text, "dropportal_ledger_events_total") == LedgerEvent.objects.count()
    assert (
        _sample(text, "dropportal_callbacks_total", endpoint="deletion", status="401")
        == callbacks_before + 1
    )
    assert (
        _sample(text, "dropportal_deliveries_total", kind="deletion_request", result="delivered")
        == deliveries_before + 1
    )


def test_metrics_count_a_status_as_owed_until_drop_accepts_its_file(
    api_client: APIClient, make_key, broker
) -> None:
    today = drop_today()
    cycle = DropCycleFactory.create(broker=broker, drop_session_id="7", match_date=today)
    written = WorkItemFactory.create(cycle=cycle, status_code=3)
    items_reported(cycle, [written], state=ReportFileState.WRITTEN)  # not sent yet
    rejected = WorkItemFactory.create(cycle=cycle, status_code=5)
    items_reported(cycle, [rejected], state=ReportFileState.REJECTED)
    items_reported(
        cycle, [WorkItemFactory.create(cycle=cycle, status_code=4)]
    )  # DROP took this one

    text = api_client.get("/metrics", **bearer(make_key("metrics").key)).content.decode()

    assert _sample(text, "dropportal_work_items_open", broker="4821") == 2
    assert (
        _sample(text, "dropportal_cycle_days_left", broker="4821") == (cycle.due_date - today).days
    )


def test_a_brokers_metrics_key_sees_its_brokers_series_only(
    api_client: APIClient, make_key, broker
) -> None:
    other = broker_create(broker_id="5930", name="Other", mode="test", actor="test")
    today = drop_today()  # days left count California's days
    for owner in (broker, other):
        WorkItemFactory.create(
            cycle=DropCycleFactory.create(broker=owner, drop_session_id="7", match_date=today)
        )
        crm = webhook_integration_created(owner, f"https://crm{owner.broker_id}.test/drop")
        DeletionRequestFactory.create(integration=crm.integration, state=RequestState.UNDELIVERABLE)

    text = api_client.get("/metrics", **bearer(make_key("metrics").key)).content.decode()

    assert _sample(text, "dropportal_work_items_open", broker="4821") == 2
    assert _sample(text, "dropportal_stuck_work_items", broker="4821", reason="undeliverable") == 1
    assert _sample(text, "dropportal_cycle_days_left", broker="4821") is not None
    assert 'broker="5930"' not in text
    # The service's own series (jobs, ledger, process counters) are the operator's.
    assert "dropportal_jobs" not in text and "dropportal_ledger_events" not in text
    assert "dropportal_callbacks" not in text and "dropportal_deliveries" not in text


def test_a_key_without_a_broker_has_the_metrics_scope_alone(broker) -> None:
    with pytest.raises(ValidationError, match="only have the metrics scope"):
        api_key_create(broker=None, scopes=["metrics", "audit"], actor="test")
    with pytest.raises(IntegrityError):  # the table's own check, written past the service
        ApiKey.objects.create(prefix="dpk_x", digest="x" * 64, scopes=["audit"])


def test_metrics_count_stuck_work_items_by_broker_and_reason(
    api_client: APIClient, make_key, broker
) -> None:
    crm = webhook_integration_created(broker, "https://crm.acme.test/drop").integration
    DeletionRequestFactory.create(integration=crm, state=RequestState.UNDELIVERABLE)
    DeletionRequestFactory.create(integration=crm, state=RequestState.UNDELIVERABLE)
    DeletionRequestFactory.create(integration=crm, state=RequestState.QUEUED)  # live: not stuck

    text = api_client.get("/metrics", **bearer(make_key("metrics").key)).content.decode()

    assert _sample(text, "dropportal_stuck_work_items", broker="4821", reason="undeliverable") == 2
