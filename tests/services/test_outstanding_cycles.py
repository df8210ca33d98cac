"""Forgetting cycles with nothing outstanding (``outstanding_cycles_clear``), against the
transactions that mark them, and the readers that pass a forgotten cycle by.

These tests commit (the clearing runs only outside a transaction, and a second connection
must see the rows).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import psycopg
import pytest
from django.db import connection, connections, transaction

from integrations import tasks
from integrations.models import (
    Broker,
    CycleState,
    DropCycle,
    OutstandingCycle,
    ReportFile,
    WorkItem,
    WorkItemState,
)
from integrations.selectors.deadlines import drop_cycles_by_urgency
from integrations.services.cycle import outstanding
from integrations.services.cycle.cycle_state import cycle_state_refresh
from integrations.services.cycle.outstanding import outstanding_cycles_clear
from integrations.services.cycle.work_items import work_item_status_set
from integrations.services.reporting.report_files import report_files_write
from tests.builders import BrokerFactory, DropCycleFactory, WorkItemFactory
from tests.conftest import database_url, sessions_waiting_for_locks, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _marked() -> set[int]:
    return set(OutstandingCycle.objects.values_list("cycle_id", flat=True))


class _Thread(threading.Thread):
    """Runs ``target`` on a database connection of its own; its result or error kept."""

    def __init__(self, target: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.call = target
        self.result: object = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as exc:  # reported by the test, in its thread
            self.error = exc
        finally:
            connections.close_all()

    def outcome(self) -> object:
        self.join(timeout=30)
        assert not self.is_alive(), "the thread did not end"
        if self.error is not None:
            raise self.error
        return self.result


def test_clearing_forgets_a_cycle_with_nothing_outstanding_and_keeps_the_others(
    broker: Broker,
) -> None:
    reported, waiting = (
        DropCycleFactory.create(broker=broker, drop_session_id=session) for session in "12"
    )
    item = WorkItemFactory.create(cycle=reported, status_code=3)
    WorkItemFactory.create(cycle=waiting)
    other_broker = WorkItemFactory.create(cycle__broker=BrokerFactory.create(), status_code=3)
    # DROP took the statuses: the rows leave outstanding, the marks stay until cleared.
    WorkItem.objects.filter(pk__in=[item.pk, other_broker.pk]).update(state=WorkItemState.REPORTED)
    assert _marked() == {reported.pk, waiting.pk, other_broker.cycle_id}

    assert outstanding_cycles_clear(broker=broker) == 1

    assert _marked() == {waiting.pk, other_broker.cycle_id}  # another broker's is its own


def test_the_periodic_job_forgets_every_brokers_settled_cycles(broker: Broker) -> None:
    # A broker whose files staff upload by hand runs no report job: its cycles are
    # forgotten all the same.
    by_hand = BrokerFactory.create()
    settled = [
        WorkItemFactory.create(cycle__broker=each, status_code=3) for each in (broker, by_hand)
    ]
    waiting = WorkItemFactory.create(
        cycle=DropCycleFactory.create(broker=by_hand, drop_session_id="2")
    )
    WorkItem.objects.filter(pk__in=[item.pk for item in settled]).update(
        state=WorkItemState.REPORTED
    )

    assert tasks.forget_settled_cycles() == 2

    assert _marked() == {waiting.cycle_id}


def test_clearing_inside_a_transaction_clears_nothing(broker: Broker) -> None:
    item = WorkItemFactory.create(cycle__broker=broker, status_code=3)
    WorkItem.objects.filter(pk=item.pk).update(state=WorkItemState.REPORTED)

    with transaction.atomic():
        assert outstanding_cycles_clear(broker=broker) == 0

    assert _marked() == {item.cycle_id}


@pytest.fixture
def reported_item(broker: Broker) -> WorkItem:
    """A work item DROP holds status 5 for, its cycle still marked (not yet cleared)."""
    item: WorkItem = WorkItemFactory.create(cycle__broker=broker, status_code=5)
    WorkItem.objects.filter(pk=item.pk).update(state=WorkItemState.REPORTED, reported_status_code=5)
    assert _marked() == {item.cycle_id}
    return item


@pytest.fixture
def second_connection() -> Iterator[psycopg.Connection]:
    with psycopg.connect(database_url()) as conn:
        yield conn


def test_a_clearing_waits_for_a_transaction_that_marked_the_cycle_and_keeps_it(
    broker: Broker, reported_item: WorkItem, second_connection: psycopg.Connection
) -> None:
    # A transaction moves the item back into outstanding (an amendment) and has not ended:
    # its mark holds the cycle's row.
    second_connection.execute(
        "UPDATE integrations_workitem SET state = 'reportable' WHERE id = %s", [reported_item.pk]
    )
    clearing = _Thread(lambda: outstanding_cycles_clear(broker=broker))
    clearing.start()
    wait_until(
        lambda: sessions_waiting_for_locks() > 0,
        "the clearing did not wait for the marking transaction",
    )
    second_connection.commit()

    assert clearing.outcome() == 0
    assert _marked() == {reported_item.cycle_id}


def test_a_transaction_marking_after_a_clearing_deleted_the_row_marks_it_again(
    broker: Broker, reported_item: WorkItem, monkeypatch: pytest.MonkeyPatch
) -> None:
    deleted, go_on = threading.Event(), threading.Event()
    asked = outstanding._has_outstanding

    def after_the_delete(cycle_pk: int) -> bool:
        if connection.in_atomic_block:  # the clearing's own transaction: the row is deleted
            deleted.set()
            assert go_on.wait(timeout=30)
        return asked(cycle_pk)

    monkeypatch.setattr(outstanding, "_has_outstanding", after_the_delete)
    clearing = _Thread(lambda: outstanding_cycles_clear(broker=broker))
    clearing.start()
    assert deleted.wait(timeout=30)
    # Staff set another status: the item is reportable again (an amendment to send).
    setting = _Thread(
        lambda: work_item_status_set(
            work_item=reported_item, status_code=3, reason="confirmed deleted", actor="staff:a"
        )
    )
    setting.start()
    wait_until(
        lambda: sessions_waiting_for_locks() > 0, "the status setting did not wait for the clearing"
    )
    go_on.set()

    assert clearing.outcome() == 1  # it saw nothing outstanding, and committed
    setting.outcome()
    assert WorkItem.objects.get(pk=reported_item.pk).state == WorkItemState.REPORTABLE
    assert _marked() == {reported_item.cycle_id}


def test_a_cycle_without_its_mark_is_passed_by(broker: Broker) -> None:
    """The readers ask the mark first. With the mark deleted by hand (which the triggers
    never let happen to a cycle with an outstanding item), a cycle with a reportable item
    is not written, not counted as owing, and taken for reported."""
    cycle: DropCycle = DropCycleFactory.create(broker=broker)
    WorkItemFactory.create(cycle=cycle, status_code=3)
    OutstandingCycle.objects.filter(cycle=cycle).delete()

    assert report_files_write(broker=broker) == []
    assert not ReportFile.objects.exists()
    assert drop_cycles_by_urgency().get(pk=cycle.pk).owed_items == 0  # type: ignore[attr-defined]
    assert cycle_state_refresh(cycle=cycle).state == CycleState.REPORTED
