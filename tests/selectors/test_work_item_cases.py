"""Which work items are in which case with DROP has one home (``WorkItemQuerySet``): every
count that says "owed", "no status yet" or "to amend" reads it, and agrees on a mixed cycle.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from integrations.drop.calendar import drop_date
from integrations.models import Broker, DropCycle, WorkItem, WorkItemState
from integrations.operations.metrics import _work_items_open
from integrations.selectors.cycle_progress import cycle_progress
from integrations.selectors.deadlines import drop_cycles_by_urgency
from integrations.selectors.drop_metrics import METRIC_FILTERS, drop_metrics
from integrations.services.evidence.evidence_period import _cycle_counts
from tests.builders import DropCycleFactory, WorkItemFactory, items_reported

pytestmark = pytest.mark.django_db

NOW = dt.datetime(2026, 3, 20, 12, tzinfo=dt.UTC)


@pytest.fixture
def cycle(broker: Broker) -> DropCycle:
    """An open cycle with a work item in each case, named by its work item id."""
    cycle = DropCycleFactory.create(broker=broker, match_date=dt.date(2026, 3, 1))
    WorkItemFactory.create(cycle=cycle, work_item_id="waiting")  # matched, its outcomes pending
    WorkItemFactory.create(
        cycle=cycle, status_code=5, work_item_id="known"
    )  # not matched: 5, not sent yet
    written = WorkItemFactory.create(cycle=cycle, status_code=3, work_item_id="written")
    items_reported(cycle, [written], state="written")  # DROP has not taken it yet
    taken = WorkItemFactory.create(cycle=cycle, status_code=4, work_item_id="taken")
    items_reported(cycle, [taken])  # DROP holds it
    WorkItemFactory.create(  # DROP holds 5, the outcome since says 3: an amendment
        cycle=cycle,
        status_code=3,
        work_item_id="amend",
        reported_status_code=5,
        reported_at=NOW,
        needs_amendment=True,
    )
    WorkItemFactory.create(  # a late match on a reported 5: waiting for its outcome again
        cycle=cycle,
        work_item_id="late",
        reported_status_code=5,
        reported_at=NOW,
        needs_amendment=True,
    )
    WorkItemFactory.create(cycle=cycle, state=WorkItemState.REMOVED, work_item_id="removed")
    WorkItemFactory.create(
        cycle=cycle,
        state=WorkItemState.REMOVED,
        work_item_id="removed_after",
        reported_status_code=2,
        reported_at=NOW,
    )
    return cycle


def _ids(items: object) -> set[str]:
    return set(items.values_list("work_item_id", flat=True))  # type: ignore[attr-defined]


def test_each_case_names_its_work_items(cycle: DropCycle) -> None:
    items = WorkItem.objects.filter(cycle=cycle)
    assert _ids(items.owed()) == {"waiting", "known", "written"}
    assert _ids(items.outstanding()) == {"waiting", "known", "written", "amend", "late"}
    assert _ids(items.no_status_held()) == {"waiting", "known", "written"}
    assert _ids(items.awaiting_outcome()) == {"waiting", "late"}
    assert _ids(items.reportable()) == {"known", "written", "amend"}
    assert _ids(items.awaiting_amendment()) == {"amend"}


def test_every_count_of_what_is_owed_reads_the_one_definition(
    cycle: DropCycle, broker: Broker
) -> None:
    owed = WorkItem.objects.owed().filter(cycle=cycle).count()
    assert owed == 3
    # The deadlines and the cycles admin.
    annotated = drop_cycles_by_urgency().get(pk=cycle.pk)
    assert annotated.owed_items == owed  # type: ignore[attr-defined]
    waiting = WorkItem.objects.owed().awaiting_outcome().filter(cycle=cycle).count()
    assert annotated.unreportable_items == waiting == 1  # type: ignore[attr-defined]
    # The cycle's page and the dashboard.
    progress = cycle_progress(cycle=cycle, start=cycle.match_date, today=cycle.match_date)
    assert progress.owed == owed
    assert (
        progress.reported
        == WorkItem.objects.filter(cycle=cycle).exclude(state=WorkItemState.REMOVED).count() - owed
    )
    # The Prometheus gauge.
    (sample,) = _work_items_open(broker).samples
    assert sample.value == owed


def test_every_count_of_no_status_yet_reads_the_one_definition(
    cycle: DropCycle, broker: Broker
) -> None:
    held_none = WorkItem.objects.no_status_held().filter(cycle=cycle).count()
    # While DROP's time and code are set together, the items owed are those it holds none for.
    assert held_none == WorkItem.objects.owed().filter(cycle=cycle).count()
    # The yearly figures: the one pass in SQL, and the list behind the figure.
    figures = drop_metrics(broker=broker, year=drop_date(cycle.downloaded_at).year)
    assert figures.total.figures["open"] == held_none
    assert WorkItem.objects.filter(cycle=cycle).filter(METRIC_FILTERS["open"]).count() == held_none
    # The evidence pack's cycle summary.
    counts = {key: n for _, key, n in _cycle_counts([cycle.pk])}
    assert counts == {"open": held_none, "4": 1, "5": 2, "removed": 2}


def test_raw_sql_writes_a_work_items_state_only_through_the_status_rule() -> None:
    """Every UPDATE of work items in the app's raw SQL sets state and amendment flag as
    ``dropportal_work_item_status_fields`` gives them, never by hand."""
    assignment = re.compile(r"(?<![\w.(])(?:state|needs_amendment)\s*=(?!>)")
    updates = 0
    for path in (Path(settings.BASE_DIR) / "integrations").rglob("*.py"):
        if "migrations" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        for start in re.finditer(r"UPDATE integrations_workitem\b", text):
            set_clause = text[start.end() : text.index("WHERE", start.end())]
            updates += 1
            assert not assignment.search(set_clause), (path, set_clause)
            if "(state, needs_amendment)" in set_clause:
                assert "dropportal_work_item_status_fields(" in set_clause, (path, set_clause)
    assert updates >= 6  # settled by hand, matched late, removed, taken, given up, marked


@pytest.mark.parametrize(
    ("state", "code", "reported", "reported_code", "flag", "expected"),
    [
        (None, None, False, None, False, ("open", False)),  # a new item, matched
        (None, 5, False, None, False, ("reportable", False)),  # a new item, no match
        ("reported", None, True, 5, True, ("open", True)),  # a late match on a reported 5
        ("open", 3, False, None, False, ("reportable", False)),
        ("reportable", 3, True, 3, False, ("reported", False)),  # DROP took it
        ("reported", 3, True, 5, False, ("reportable", True)),  # DROP holds another code
        ("reportable", 3, True, None, False, ("reportable", True)),  # an amendment rejected
        ("removed", 3, True, 5, True, ("removed", False)),  # removed stays removed
        ("removed", None, False, None, True, ("removed", False)),
    ],
)
def test_the_state_that_follows_a_status(
    state: str | None,
    code: int | None,
    reported: bool,
    reported_code: int | None,
    flag: bool,
    expected: tuple[str, bool],
) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, needs_amendment FROM dropportal_work_item_status_fields("
            " p_state => %s, p_code => %s, p_reported_at => %s, p_reported_code => %s,"
            " p_needs_amendment => %s)",
            [state, code, NOW if reported else None, reported_code, flag],
        )
        assert cursor.fetchone() == expected


@pytest.mark.parametrize(
    "case",
    [
        "owed",
        "outstanding",
        "no_status_held",
        "awaiting_outcome",
        "reportable",
        "awaiting_amendment",
    ],
)
def test_a_cases_compiled_condition_selects_its_work_items(cycle: DropCycle, case: str) -> None:
    """Raw SQL reads a case through ``where_sql`` (the reporting's marking, the yearly
    figures): the compiled condition selects exactly the queryset's rows."""
    items = getattr(WorkItem.objects, case)()
    condition, params = items.where_sql(alias="w")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT w.work_item_id FROM integrations_workitem w"  # noqa: S608  (compiled)
            f" WHERE w.cycle_id = %s AND {condition}",
            [cycle.pk, *params],
        )
        selected = {work_item_id for (work_item_id,) in cursor.fetchall()}
    assert selected == _ids(items.filter(cycle=cycle))
    assert selected  # the cycle has an item in every case


def test_a_compiled_condition_names_its_table_and_carries_no_join(cycle: DropCycle) -> None:
    condition, params = WorkItem.objects.reportable().filter(cycle=cycle).where_sql()
    assert condition == (
        '("integrations_workitem"."state" = %s AND "integrations_workitem"."cycle_id" = %s)'
    )
    assert params == [WorkItemState.REPORTABLE, cycle.pk]
    assert WorkItem.objects.all().where_sql() == ("TRUE", [])
    assert WorkItem.objects.none().where_sql() == ("FALSE", [])
    with pytest.raises(ValueError, match="joins another table"):
        WorkItem.objects.filter(cycle__broker=cycle.broker).where_sql()


def test_what_a_condition_cannot_say_is_refused(cycle: DropCycle) -> None:
    reportable = WorkItem.objects.reportable()
    for query in (
        reportable[:5],
        reportable.union(WorkItem.objects.all()),
        reportable.distinct("hash_type"),
    ):
        with pytest.raises(ValueError, match="not a condition"):
            query.where_sql()
