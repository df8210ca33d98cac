"""Cycles against their due dates: what DROP is still owed, most urgent first."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.db.models import Case, Count, OuterRef, QuerySet, Subquery, Value, When
from django.db.models.functions import Coalesce

from integrations.models import (
    CycleState,
    DropCycle,
    UnreadableWorkItem,
    WorkItem,
    cycle_may_have_outstanding,
)


def _count(queryset: QuerySet[Any]) -> Subquery:
    """The number of rows of ``queryset`` as a subquery (correlate it with ``OuterRef``)."""
    return Subquery(
        queryset.order_by().annotate(one=Value(1)).values("one").annotate(n=Count("*")).values("n")
    )


@dataclass(frozen=True)
class CycleDeadline:
    """Where a cycle stands against its due date (``settings.DROPPORTAL_REPORT_DAYS``)."""

    cycle: DropCycle
    days_left: int  # negative when overdue
    owed: int  # work items DROP is owed a status for and holds none (and unreadable rows)
    not_reportable: int  # of which still wait for an outcome (or for staff)

    @property
    def overdue(self) -> bool:
        return self.owed > 0 and self.days_left < 0


def drop_cycles_by_urgency(cycles: QuerySet[DropCycle] | None = None) -> QuerySet[DropCycle]:
    """Cycles annotated with ``owed_items`` (no status DROP holds yet:
    ``WorkItem.objects.owed()``, and ``UnreadableWorkItem.objects.owed()``)
    and ``unreportable_items`` (of which still waiting for an outcome or for staff), most
    urgent first: cycles owing statuses by due date, then the rest, newest first.

    For the cycles admin (``get_queryset``) and ``cycle_deadlines``. Every cycle (no
    ``cycles``) is a fresh copy of a query built once: its subqueries take a few milliseconds
    to build, on every page of the cycles admin and in every alert evaluation, and depend on
    nothing but this code (no data, user, setting or time), as a class-based view's
    ``queryset`` is kept and copied.
    """
    if cycles is None:
        return _every_cycle_by_urgency().all()
    return _by_urgency(cycles)


# Of the cycles owing alike: the earliest due first, then the latest downloaded.
_MOST_URGENT_FIRST = ("due_date", "-downloaded_at")


@cache
def _every_cycle_by_urgency() -> QuerySet[DropCycle]:
    # Never evaluated itself (``.all()`` above): its rows are never kept.
    return _by_urgency(DropCycle.objects.all())


def _by_urgency(cycles: QuerySet[DropCycle]) -> QuerySet[DropCycle]:
    owed = WorkItem.objects.owed().filter(cycle=OuterRef("pk"))
    # A row of the package that could not be read is owed too, while DROP has not sent the
    # next package (UnreadableWorkItem.objects.owed()).
    unreadable = UnreadableWorkItem.objects.owed().filter(cycle=OuterRef("pk"))
    unreadable_owed = Coalesce(_count(unreadable), 0)
    # Counted only for a cycle that may have outstanding items: the others owe none, and a
    # reported cycle's rows are not read at all.
    marked = cycle_may_have_outstanding()
    return cycles.annotate(
        owed_items=Case(When(marked, then=Coalesce(_count(owed), 0)), default=Value(0))
        + unreadable_owed,
        unreportable_items=Case(
            When(marked, then=Coalesce(_count(owed.awaiting_outcome()), 0)), default=Value(0)
        )
        + unreadable_owed,
    ).order_by(Case(When(owed_items__gt=0, then=Value(0)), default=Value(1)), *_MOST_URGENT_FIRST)


def cycle_deadlines(*, broker_id: str | None = None, today: dt.date) -> list[CycleDeadline]:
    """Every cycle still owing statuses to DROP, most urgent first."""
    # Filtered from every cycle's query, built once. The cycles kept all owe statuses, so
    # the urgency's first key (owing or not) orders none of them: left out, the statement
    # reads no cycle's counts twice.
    cycles = (
        drop_cycles_by_urgency()
        .filter(state=CycleState.OPEN)
        .select_related("broker")
        .order_by(*_MOST_URGENT_FIRST)
    )
    if broker_id:
        cycles = cycles.filter(broker__broker_id=broker_id)
    return [
        CycleDeadline(
            cycle=cycle,
            days_left=(cycle.due_date - today).days,
            owed=cycle.owed_items,  # type: ignore[attr-defined]
            not_reportable=cycle.unreportable_items,  # type: ignore[attr-defined]
        )
        for cycle in cycles
        if cycle.owed_items  # type: ignore[attr-defined]
    ]
