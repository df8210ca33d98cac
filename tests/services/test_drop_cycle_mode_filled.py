"""0070 fills each cycle made before it with its broker's mode as it is now, in batches,
rewriting only the cycles of brokers in test mode (the column's default is production)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
from django.conf import settings
from django.db import connection

from integrations.models import DropCycle
from tests.builders import BrokerFactory, DropCycleFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def migration(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    (path,) = (Path(settings.BASE_DIR) / "integrations" / "migrations").glob("0070_*.py")
    module = importlib.import_module(f"integrations.migrations.{path.stem}")
    monkeypatch.setattr(module, "BATCH", 2)  # several batches of a few rows
    return module


def _ctid(cycle: DropCycle) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT ctid FROM integrations_dropcycle WHERE id = %s", [cycle.pk])
        return str(cursor.fetchone()[0])


def test_each_cycle_takes_its_brokers_mode_and_only_sandbox_ones_are_written(
    migration: ModuleType,
) -> None:
    sandbox, production = BrokerFactory.create(mode="test"), BrokerFactory.create(mode="production")
    # As the release before made them: the column's default, whatever the broker's mode.
    made = [
        DropCycleFactory.create(broker=broker, drop_session_id=str(n))
        for n in range(1, 4)
        for broker in (sandbox, production)
    ]
    assert {cycle.mode for cycle in made} == {"production"}
    before = {cycle.pk: _ctid(cycle) for cycle in made}

    migration.filled(None, SimpleNamespace(connection=connection))

    for cycle in made:
        cycle.refresh_from_db()
        assert cycle.mode == cycle.broker.mode
        # A production broker's cycles already say so: not rewritten.
        assert (_ctid(cycle) == before[cycle.pk]) == (cycle.broker == production)
    # Run again (a migration cut short is): nothing left to rewrite.
    after = {cycle.pk: _ctid(cycle) for cycle in made}
    migration.filled(None, SimpleNamespace(connection=connection))
    assert {cycle.pk: _ctid(cycle) for cycle in made} == after
