"""The suite's own set-up: what a transactional test leaves for the next one."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test import Client, TransactionTestCase

from integrations.enqueue import alerts_evaluate_enqueue
from integrations.models import AdminSession, Broker
from integrations.services.staff.brokers import broker_create
from tests.builders import MIGRATED_TABLES
from tests.conftest import checkout_tag


def _rows() -> dict[str, list[tuple[Any, ...]]]:
    with connection.cursor() as cursor:
        found = {}
        for table in MIGRATED_TABLES:
            cursor.execute(f"SELECT * FROM {table} ORDER BY id")  # noqa: S608 (our constant)
            found[table] = cursor.fetchall()
        return found


@pytest.mark.django_db(transaction=True)
def test_a_transactional_tests_end_keeps_what_migrations_made_and_empties_the_rest() -> None:
    before = _rows()
    assert {"Auditors", "Operators", "Connections managers"} <= {
        g.name for g in Group.objects.all()
    }
    broker_type = ContentType.objects.get_for_model(Broker).pk  # cached by the manager
    broker_create(broker_id="4821", name="Acme Data", actor="test")
    Group.objects.create(name="Made by a test")
    alerts_evaluate_enqueue()  # a row in Procrastinate's tables, which Django's flush skips
    assert _jobs() == 1

    # As a transactional test ends (a method the stubs do not declare).
    TransactionTestCase()._fixture_teardown()  # type: ignore[attr-defined]

    assert _rows() == before
    assert not Broker.objects.exists()
    assert _jobs() == 0
    assert ContentType.objects.get_for_model(Broker).pk == broker_type
    assert ContentType.objects.filter(pk=broker_type, model="broker").exists()


def _jobs() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM procrastinate_jobs")
        return int(cursor.fetchone()[0])


class _Item:
    """Just what the ordering reads of a collected test."""

    def __init__(self, name: str, *, slow: bool = False, demo: bool = False) -> None:
        self.name, self.slow = name, slow
        self.fixturenames = ["demo"] if demo else []

    def get_closest_marker(self, name: str) -> object:
        # Marked slow if so; every test here "uses the database" (the demo's rule is moot).
        if name == "slow":
            return self.slow or None
        return name == "django_db" or None

    def __repr__(self) -> str:
        return self.name


class _Config:
    def __init__(self, workers: int) -> None:
        self.workerinput = {"workercount": workers}


@pytest.mark.parametrize(
    ("slow", "on_the_demo", "plain"), [(0, 5, 3), (2, 4, 2), (6, 0, 1), (3, 2, 40)]
)
def test_the_slow_tests_lead_and_every_test_is_queued_once(
    slow: int, on_the_demo: int, plain: int
) -> None:
    from tests.conftest import pytest_collection_modifyitems

    items: list[Any] = [
        *(_Item(f"demo{n}", slow=True, demo=True) for n in range(on_the_demo)),
        *(_Item(f"plain{n}") for n in range(plain)),
        *(_Item(f"slow{n}", slow=True) for n in range(slow)),
    ]
    collected = list(items)
    pytest_collection_modifyitems(_Config(workers=2), items)  # type: ignore[arg-type]
    assert sorted(items, key=repr) == sorted(collected, key=repr)
    assert items[0].slow


@pytest.mark.django_db
def test_the_test_database_is_named_after_this_checkout() -> None:
    # Two checkouts' suites on one server (a helper's worktree beside the main one) must not
    # share a worker's database: each drops and copies its own at the start.
    name = connection.settings_dict["NAME"]
    assert f"_{checkout_tag()}" in name, name
    assert name.startswith("test_"), name


@pytest.mark.django_db
def test_a_forced_login_saves_one_session_as_a_login_does(admin_user: Any) -> None:
    client = Client()
    client.force_login(admin_user)  # tests/conftest.py: without Django's spare session first

    (session,) = AdminSession.objects.all()
    assert session.user_id == admin_user.pk
    assert client.cookies[settings.SESSION_COOKIE_NAME].value == session.session_key
    assert client.get("/admin/").status_code == 200
    admin_user.refresh_from_db()
    assert admin_user.last_login is not None  # login()'s signals ran
    # Logged in again over its own session, as the same member: login() keeps it.
    client.force_login(admin_user)
    assert AdminSession.objects.get().session_key == session.session_key
