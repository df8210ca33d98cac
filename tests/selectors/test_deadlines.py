"""Deadlines: each cycle's due date, days left, statuses still owed, most urgent first."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin import ModelAdmin
from django.contrib.auth.models import User
from django.test import Client

from integrations.models import Broker, DropCycle, WorkItem, WorkItemState
from integrations.selectors.deadlines import cycle_deadlines, drop_cycles_by_urgency
from tests.admin.markup import cells
from tests.builders import (
    DropCycleFactory,
    WorkItemFactory,
)

pytestmark = pytest.mark.django_db

TODAY = dt.date(2026, 4, 20)


@pytest.fixture
def cycles(broker: Broker) -> dict[str, object]:
    overdue = DropCycleFactory.create(
        broker=broker, drop_session_id="1", match_date=dt.date(2026, 3, 1)
    )  # due 04-15
    WorkItemFactory.create(cycle=overdue, status_code=5)  # reportable, not yet sent
    soon = DropCycleFactory.create(
        broker=broker, drop_session_id="2", match_date=dt.date(2026, 3, 12)
    )  # due 04-26
    WorkItemFactory.create(cycle=soon)  # waiting for an outcome
    WorkItemFactory.create(cycle=soon, status_code=3)
    WorkItemFactory.create(cycle=soon, state=WorkItemState.REMOVED)
    done = DropCycleFactory.create(
        broker=broker, drop_session_id="3", match_date=dt.date(2026, 4, 1), state="reported"
    )
    WorkItemFactory.create(
        cycle=done, status_code=3, state=WorkItemState.REPORTED, reported_at=dt.datetime.now(dt.UTC)
    )
    return {"overdue": overdue, "soon": soon, "done": done}


def test_open_cycles_by_urgency_with_days_left_and_what_is_owed(
    cycles: dict[str, object],
) -> None:
    deadlines = cycle_deadlines(today=TODAY)

    assert [(d.cycle.drop_session_id, d.days_left, d.overdue) for d in deadlines] == [
        ("1", -5, True),
        ("2", 6, False),
    ]
    assert (deadlines[1].owed, deadlines[1].not_reportable) == (2, 1)


def test_a_reported_late_match_owes_nothing_new(cycles: dict[str, object]) -> None:
    # Reported before and reopened by a late match: DROP has a status, an amendment may follow.
    WorkItem.objects.filter(cycle__drop_session_id="1").update(
        state=WorkItemState.OPEN, reported_at=dt.datetime.now(dt.UTC), status_code=None
    )
    assert [d.cycle.drop_session_id for d in cycle_deadlines(today=TODAY)] == ["2"]


def test_the_admin_order_puts_cycles_owing_statuses_first(cycles: dict[str, object]) -> None:
    ordered = list(drop_cycles_by_urgency())
    assert [c.drop_session_id for c in ordered] == ["1", "2", "3"]
    assert [c.owed_items for c in ordered] == [1, 2, 0]  # type: ignore[attr-defined]


def test_the_cycles_admin_shows_what_is_owed_and_waiting(
    cycles: dict[str, object], client: Client
) -> None:
    client.force_login(User.objects.create_superuser("alice", "a@example.com", "pw-alice-123"))
    page = client.get("/admin/integrations/dropcycle/").content.decode()
    assert "Of which waiting for an outcome" in page
    # Cycles owing statuses first, by due date: 1 (overdue), 2, then 3 (all reported).
    assert cells(page, "owed") == ["1", "2", "0"]
    assert cells(page, "waiting") == ["0", "1", "0"]


def test_every_cycle_by_urgency_is_a_fresh_query_each_time_that_sees_new_rows(
    broker: Broker,
) -> None:
    first = DropCycleFactory.create(broker=broker, drop_session_id="1")
    shown = drop_cycles_by_urgency()
    assert [c.pk for c in shown] == [first.pk]

    second = DropCycleFactory.create(broker=broker, drop_session_id="2")
    WorkItemFactory.create(cycle=second)  # owed: it comes first
    again = drop_cycles_by_urgency()

    assert again is not shown
    assert [(c.pk, c.owed_items) for c in again] == [(second.pk, 1), (first.pk, 0)]  # type: ignore[attr-defined]
    assert str(again.query) == str(drop_cycles_by_urgency(DropCycle.objects.all()).query)


def test_the_cycles_admin_lists_what_djangos_queryset_by_urgency_would(rf: Any) -> None:
    model_admin = admin.site._registry[DropCycle]
    request = rf.get("/admin/integrations/dropcycle/")
    request.user = User(is_superuser=True, is_staff=True, is_active=True)
    djangos = ModelAdmin.get_queryset(model_admin, request)  # the manager's, the list's order

    assert str(model_admin.get_queryset(request).query) == str(
        drop_cycles_by_urgency(djangos).query
    )
