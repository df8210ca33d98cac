"""The database marks the cycles that may have outstanding work items
(``sql/outstanding_cycles.sql``): whoever inserts a work item in an outstanding state, or
moves one back into one, marks its cycle; leaving those states marks nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings

from integrations.models import Broker, DropCycle, OutstandingCycle, WorkItem, WorkItemState
from tests.builders import DropCycleFactory, WorkItemFactory

pytestmark = pytest.mark.django_db


def _marked() -> set[int]:
    return set(OutstandingCycle.objects.values_list("cycle_id", flat=True))


@pytest.mark.parametrize("state", list(WorkItemState))
def test_an_inserted_item_marks_its_cycle_when_it_is_outstanding(
    broker: Broker, state: WorkItemState
) -> None:
    cycle = DropCycleFactory.create(broker=broker)
    item = WorkItemFactory.create(cycle=cycle, state=state, status_code=5)
    # The rule is outstanding_status's (the states the triggers name, held to it here).
    outstanding = WorkItem.objects.outstanding().filter(pk=item.pk).exists()
    assert (cycle.pk in _marked()) is outstanding


def test_one_insert_of_many_rows_marks_each_cycle_with_an_outstanding_row(
    broker: Broker,
) -> None:
    open_cycle, reportable, reported = (
        DropCycleFactory.create(broker=broker, drop_session_id=session) for session in "123"
    )
    built = [
        WorkItemFactory.build(cycle=open_cycle),
        WorkItemFactory.build(cycle=open_cycle, reported=True),
        WorkItemFactory.build(cycle=reportable, status_code=3),
        WorkItemFactory.build(cycle=reported, reported=True),
        WorkItemFactory.build(cycle=reported, state=WorkItemState.REMOVED),
    ]
    WorkItem.objects.bulk_create(built)  # one INSERT statement

    assert _marked() == {open_cycle.pk, reportable.pk}


@pytest.mark.parametrize("into", [WorkItemState.OPEN, WorkItemState.REPORTABLE])
@pytest.mark.parametrize("out_of", [WorkItemState.REPORTED, WorkItemState.REMOVED])
def test_an_item_moved_back_into_outstanding_marks_its_cycle(
    broker: Broker, out_of: WorkItemState, into: WorkItemState
) -> None:
    item = WorkItemFactory.create(cycle__broker=broker, reported=True, state=out_of)
    assert _marked() == set()

    WorkItem.objects.filter(pk=item.pk).update(state=into)

    assert _marked() == {item.cycle_id}


def test_leaving_outstanding_or_moving_within_it_marks_nothing(broker: Broker) -> None:
    cycle = DropCycleFactory.create(broker=broker)
    waiting = WorkItemFactory.create(cycle=cycle)
    settled = WorkItemFactory.create(cycle=cycle, status_code=3)
    # As if the report job had cleared the mark: only a move into outstanding sets it again.
    OutstandingCycle.objects.all().delete()

    WorkItem.objects.filter(pk=waiting.pk).update(state=WorkItemState.REPORTABLE)
    WorkItem.objects.filter(pk=settled.pk).update(state=WorkItemState.REPORTED)
    WorkItem.objects.filter(pk=settled.pk).update(state=WorkItemState.REMOVED)
    WorkItem.objects.filter(pk=waiting.pk).update(status_code=4)  # the state not set at all

    assert _marked() == set()


def test_a_cycle_marked_twice_in_one_transaction_has_one_row(broker: Broker) -> None:
    cycle: DropCycle = DropCycleFactory.create(broker=broker)
    WorkItemFactory.create(cycle=cycle)
    reported = WorkItemFactory.create(cycle=cycle, reported=True)
    WorkItem.objects.filter(pk=reported.pk).update(state=WorkItemState.REPORTABLE)

    assert list(OutstandingCycle.objects.values_list("cycle_id", flat=True)) == [cycle.pk]


SOURCE = Path(settings.BASE_DIR) / "integrations" / "sql" / "outstanding_cycles.sql"


def _outstanding_states(broker: Broker) -> set[str]:
    """The states ``outstanding_status`` selects, asked of one work item in each."""
    cycle = DropCycleFactory.create(broker=broker)
    items = {
        state: WorkItemFactory.create(cycle=cycle, state=state, status_code=5, work_item_id=state)
        for state in WorkItemState
    }
    outstanding = set(WorkItem.objects.outstanding().values_list("pk", flat=True))
    return {state.value for state, item in items.items() if item.pk in outstanding}


def test_the_triggers_name_the_states_outstanding_status_selects(broker: Broker) -> None:
    """The triggers spell outstanding_status's states as literals (a trigger cannot call
    the ORM): every list of them in the source is exactly what it selects, so a change to
    the one side fails here until the other (and a migration with its copy) follows."""
    code = "\n".join(line.split("--")[0] for line in SOURCE.read_text().splitlines())
    lists = re.findall(r"\bstate\s+(?:NOT\s+)?IN\s*\(([^)]*)\)", code, flags=re.IGNORECASE)
    assert len(lists) == 3  # the inserted rows', an update's old and new state
    expected = _outstanding_states(broker)
    assert expected  # the helper found some
    for literals in lists:
        assert set(re.findall(r"'([^']*)'", literals)) == expected, literals
    # No other test of a state in the triggers, outside these lists.
    assert len(re.findall(r"\bstate\b\s*(?:=|<>|!=|IN\b|NOT\b)", code, re.IGNORECASE)) == 3


@pytest.mark.parametrize("into", list(WorkItemState))
@pytest.mark.parametrize("out_of", list(WorkItemState))
def test_an_update_marks_its_cycle_exactly_when_it_moves_into_outstanding(
    broker: Broker, out_of: WorkItemState, into: WorkItemState
) -> None:
    """Every move between two states, held to ``outstanding_status`` as the database
    installed the trigger (the migrations' copy, held to the source by test_sql_functions)."""
    item = WorkItemFactory.create(cycle__broker=broker, state=out_of, status_code=5)
    outstanding = WorkItem.objects.outstanding().filter(pk=item.pk)
    was = outstanding.exists()
    OutstandingCycle.objects.all().delete()

    WorkItem.objects.filter(pk=item.pk).update(state=into)

    assert (item.cycle_id in _marked()) is (outstanding.exists() and not was)
