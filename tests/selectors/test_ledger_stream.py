"""The ledger's export rows stream from the server as they are read: their cursor is not a
held one, which PostgreSQL fills with the whole result (every event of the ledger, for an
export without filters) before it gives the first row.

This test commits (outside a transaction is where a held cursor is made).
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from integrations.ledger_kinds import LedgerKind
from integrations.selectors.ledger import ledger_events
from integrations.services.ledger import ledger_event_append, ledger_seal

pytestmark = pytest.mark.django_db(transaction=True)


def held_cursors() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_cursors WHERE is_holdable")
        return int(cursor.fetchone()[0])


def test_the_ledger_export_streams_without_a_held_cursor() -> None:
    with transaction.atomic():
        for i in range(5):
            ledger_event_append(kind=LedgerKind.BROKER_UPDATED, broker_id="4821", data={"i": i})
    ledger_seal()

    rows = ledger_events(chunk_size=2)
    first = next(rows)
    assert held_cursors() == 0
    assert [first["id"], *(row["id"] for row in rows)] == sorted(
        row["id"] for row in ledger_events()
    )
