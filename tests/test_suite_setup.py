"""The suite's own set-up: what a test that flushes the database leaves for the next one."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection

from integrations.models import Broker
from tests.conftest import MIGRATED_TABLES


def _rows() -> dict[str, list[tuple[Any, ...]]]:
    with connection.cursor() as cursor:
        found = {}
        for table in MIGRATED_TABLES:
            cursor.execute(f"SELECT * FROM {table} ORDER BY id")  # noqa: S608 (our constant)
            found[table] = cursor.fetchall()
        return found


@pytest.mark.django_db(transaction=True)
def test_a_flush_leaves_the_rows_migrations_made_with_their_ids() -> None:
    before = _rows()
    assert {"Auditors", "Operators", "Connections managers"} <= {
        g.name for g in Group.objects.all()
    }
    broker_type = ContentType.objects.get_for_model(Broker).pk  # cached by the manager

    call_command("flush", interactive=False, verbosity=0)  # as a transactional test ends

    assert _rows() == before
    assert ContentType.objects.get_for_model(Broker).pk == broker_type
    assert ContentType.objects.filter(pk=broker_type, model="broker").exists()
