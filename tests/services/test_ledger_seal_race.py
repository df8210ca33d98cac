"""A transaction that commits while a backlog is being sealed: its event, below the ids the
sealer has passed, is left for the next seal, which finds it (the horizon a seal records
must not pass over it), so the chain stays whole.

This test commits (the late writer runs on a connection of its own, in a thread).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from integrations.ledger_kinds import LedgerKind
from integrations.models import LedgerChainLink, LedgerEvent
from integrations.services.ledger import ledger_event_append, ledger_seal, ledger_verify
from tests.conftest import in_thread, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_event_committed_during_a_backlog_seal_is_sealed_by_the_next() -> None:
    written = threading.Event()
    commit = threading.Event()
    errors: list[BaseException] = []

    def late_writer() -> None:
        with transaction.atomic():
            ledger_event_append(kind=LedgerKind.BROKER_UPDATED, subject="late")
            written.set()
            commit.wait(30)

    writer = in_thread(late_writer, errors)
    wait_until(written.is_set, "the late writer's event")
    backlog = [
        ledger_event_append(kind=LedgerKind.BROKER_UPDATED, subject=str(i)) for i in range(7)
    ]

    def commit_after_the_first_batch(
        execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        result = execute(sql, params, many, context)
        if sql.startswith('INSERT INTO "integrations_ledgerchainlink"') and not commit.is_set():
            commit.set()
            writer.join()
        return result

    with connection.execute_wrapper(commit_after_the_first_batch):
        assert ledger_seal(batch_size=3) == 7
    assert errors == []
    late = LedgerEvent.objects.get(subject="late")
    assert late.id < backlog[0].id  # written first, committed after the first batch
    # Left unsealed, it is still a candidate: the horizon recorded is not past its writer.
    assert LedgerChainLink.objects.latest("position").horizon_txid <= late.txid
    assert ledger_verify().ok

    assert ledger_seal(batch_size=3) == 1
    chain = list(LedgerChainLink.objects.order_by("position").values_list("event_id", flat=True))
    assert chain == [e.id for e in backlog] + [late.id]
    assert ledger_verify().ok
