"""PostgreSQL unreachable: the API answers 503 problem+json with Retry-After, the admin a
short 503 page, /readyz 503; one WARNING line per process per outage; the next request
after PostgreSQL is back works, nothing restarted.

The outage is real for this process: its connection is pointed at a closed port (the
shared server stays up for everyone else)."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, RequestFactory
from rest_framework.test import APIClient

from dropportal.startup import bound_web_statements
from integrations.operations.outage import outage_response
from tests.conftest import bearer, database_url

pytestmark = pytest.mark.django_db(transaction=True)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again when the block ends


class Database:
    def __init__(self) -> None:
        self.settings = dict(connection.settings_dict)

    def stop(self) -> None:
        connection.close()
        connection.settings_dict.update(HOST="127.0.0.1", PORT=str(_closed_port()))

    def start(self) -> None:
        connection.close()
        connection.settings_dict.update(self.settings)


@pytest.fixture
def database() -> Iterator[Database]:
    db = Database()
    yield db
    db.start()


def _outage_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "integrations.operations.outage"]


def test_api_admin_and_readyz_answer_503_then_recover(
    database: Database, api_client: APIClient, make_key: Any, caplog: pytest.LogCaptureFixture
) -> None:
    key = make_key("webhook_callback").key
    staff = Client()
    staff.force_login(User.objects.create_superuser("ops", password="pw-1"))
    assert staff.get("/admin/").status_code == 200
    assert api_client.get("/api/v1/ping", **bearer(key)).status_code == 200

    database.stop()
    caplog.set_level(logging.INFO)
    callback = api_client.put(
        "/api/v1/drop/callbacks/deletion", data={"x": 1}, format="json", **bearer(key)
    )
    ping = api_client.get("/api/v1/ping", **bearer(key))
    admin = staff.get("/admin/")
    ready = staff.get("/readyz")
    healthy = staff.get("/healthz")

    for response in (callback, ping):
        assert response.status_code == 503
        assert response["Content-Type"] == "application/problem+json"
        assert response["Retry-After"] == "30"
        assert response.json()["code"] == "database_unavailable"
    assert admin.status_code == 503
    assert admin["Retry-After"] == "30"
    assert b"Temporarily unavailable" in admin.content
    assert ready.status_code == 503
    assert ready.json() == {"ready": False}  # why is in the log, not for anyone to read
    (why,) = [r for r in caplog.records if r.name == "integrations.operations.health"]
    assert "database: unreachable: connection" in why.getMessage()
    assert healthy.status_code == 200
    # One WARNING for the outage; no per-request error (django.request) nor traceback.
    warnings = _outage_lines(caplog)
    assert [r.levelname for r in warnings] == ["WARNING"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not [r for r in caplog.records if r.exc_info]

    database.start()
    assert api_client.get("/api/v1/ping", **bearer(key)).status_code == 200
    assert staff.get("/admin/").status_code == 200
    assert [r.levelname for r in _outage_lines(caplog)] == ["WARNING", "INFO"]

    # A second outage is logged again, once.
    database.stop()
    assert api_client.get("/api/v1/ping", **bearer(key)).status_code == 503
    assert api_client.get("/api/v1/ping", **bearer(key)).status_code == 503
    assert [r.levelname for r in _outage_lines(caplog)] == ["WARNING", "INFO", "WARNING"]


def test_a_web_statement_past_its_bound_answers_503_instead_of_waiting(
    settings: Any, api_client: APIClient, make_key: Any
) -> None:
    """What ``dropportal.wsgi`` sets for web processes: the server cancels a statement that
    waits longer (here on a lock another session holds) and the request answers 503."""
    key = make_key("webhook_callback").key
    settings.DROPPORTAL_WEB_STATEMENT_TIMEOUT_MS = 300
    options = connection.settings_dict["OPTIONS"]
    unbounded = dict(options)
    bound_web_statements()
    try:
        with psycopg.connect(database_url()) as locker:
            # Released after 5 s whatever happens: unbounded, the request would wait that long.
            locker.execute("SET idle_in_transaction_session_timeout = '5s'")
            locker.execute("LOCK TABLE integrations_apikey IN ACCESS EXCLUSIVE MODE")
            waited = api_client.get("/api/v1/ping", **bearer(key))
        assert waited.status_code == 503
        assert waited["Retry-After"] == "30"
        assert waited.json()["code"] == "database_unavailable"
        assert api_client.get("/api/v1/ping", **bearer(key)).status_code == 200
    finally:
        options.clear()
        options.update(unbounded)
        connection.close()


@pytest.mark.parametrize(
    ("path", "cut_short", "said"),
    [
        ("/api/v1/ping", False, "The database is unreachable"),
        ("/api/v1/ping", True, "The database did not answer in time"),
        ("/admin/", False, "cannot reach its database"),
        ("/admin/", True, "did not get its database's answer in time"),
    ],
)
def test_a_statement_cut_short_is_not_called_an_unreachable_database(
    path: str, cut_short: bool, said: str
) -> None:
    # The database answered, late: saying it is unreachable sends operators after the
    # wrong fault. Same status and Retry-After either way.
    response = outage_response(RequestFactory().get(path), cut_short=cut_short)

    assert response.status_code == 503 and int(response["Retry-After"]) > 0
    assert said in response.content.decode()
