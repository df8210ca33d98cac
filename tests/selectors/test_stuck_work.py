"""The stuck check (``drop doctor``, its alert, ``/metrics``) reads a few statements, however
many reasons, brokers and kinds of rows it finds."""

from __future__ import annotations

from typing import Any

import pytest

from integrations.drop.calendar import drop_today
from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, ReportFileState
from integrations.selectors.stuck import StuckReason, stuck_work_items
from integrations.services.ledger import ledger_event_append
from integrations.services.staff.brokers import broker_create
from tests.builders import DropCycleFactory, WorkItemFactory, items_reported, sample_cycle

pytestmark = pytest.mark.django_db

# The response files that hold items, the brokers whose DROP key was refused, every count of
# rows holding items (one UNION ALL), and the recurring rounds.
STATEMENTS = 4


def test_the_stuck_check_reads_the_same_few_statements_whatever_it_finds(
    broker: Broker, django_assert_max_num_queries: Any
) -> None:
    with django_assert_max_num_queries(STATEMENTS):
        assert stuck_work_items() == []
    sample_cycle(broker, today=drop_today())
    other = broker_create(broker_id="4822", name="Broker 4822", actor="test")
    sample_cycle(other, today=drop_today())
    refused = DropCycleFactory.create(broker=other, drop_session_id="7", due_in_days=30)
    held = WorkItemFactory.create(cycle=refused, status_code=3)
    items_reported(refused, [held], kind="amend", state=ReportFileState.REFUSED)
    ledger_event_append(
        kind=LedgerKind.DROP_PULL_FAILED,
        broker_id="4822",
        subject="4822",
        actor="system:auto-pull",
        data={"error": "DROP refused the API key (HTTP 401)", "status": 401},
    )
    with django_assert_max_num_queries(STATEMENTS):
        groups = stuck_work_items()
    assert {(g.broker_id, g.reason) for g in groups} == {
        (broker_id, reason)
        for broker_id in ("4821", "4822")
        for reason in (
            StuckReason.FAILED_WAITING_FOR_STAFF,
            StuckReason.UNDELIVERABLE,
            StuckReason.NO_CALLBACK,
        )
    } | {("4822", StuckReason.REPORT_FILE_REFUSED), ("4822", StuckReason.DROP_KEY_REFUSED)}
