"""The dashboard's recurring deletion counts, counted by the worker
(``services.cycle.recurring_counts``): the job stores what the live read counts, the
dashboard shows a fresh row without reading the schedule, and counts live otherwise.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
from typing import Any

import croniter
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from procrastinate.contrib.django import app

from integrations import tasks
from integrations.drop.calendar import drop_clock_text, drop_today
from integrations.models import (
    Broker,
    Consumer,
    DeletionRequest,
    Integration,
    RecurringCounts,
    RequestState,
)
from integrations.selectors import dashboard
from integrations.selectors.dashboard import dashboard_overview
from integrations.selectors.recurring import (
    RECURRING_COUNTS_FRESH,
    RecurringOverview,
    recurring_overviews,
)
from integrations.services.cycle.recurring import recurring_rounds_send
from integrations.services.cycle.recurring_counts import recurring_counts_store
from integrations.services.staff.brokers import broker_create
from integrations.services.staff.integrations import webhook_integration_create
from tests.builders import (
    BrokerFactory,
    ConsumerFactory,
    DeletionRequestFactory,
    WorkItemFactory,
    drop_noon,
)

pytestmark = pytest.mark.django_db

DAY = dt.timedelta(days=1)
# Only the schedule's read sets these (``selectors.recurring.schedule_execute``).
SCHEDULE_MARK = "dropportal.schedule_jit"


@pytest.fixture(autouse=True)
def private_targets(settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True


def _answered(broker: Broker, target: Integration, *, at: dt.datetime) -> None:
    """A work item whose match answered ``deleted`` at ``at``, settled to 3."""
    item = WorkItemFactory.create(cycle__broker=broker, status_code=3)
    consumer: Consumer = ConsumerFactory.create(broker=broker)
    DeletionRequestFactory.create(
        integration=target,
        work_item=item,
        consumer=consumer,
        remote_identifier=consumer.remote_identifier,
        drop_outcome="deleted",
        completed_at=at,
    )


def _every_count(broker: Broker) -> None:
    """Rounds of ``broker`` in each of the overview's counts: sent, answered, failing, due,
    and due long enough ago to be overdue."""
    target = webhook_integration_create(
        broker=broker, name="CRM", url="http://127.0.0.1:9/crm", actor="test"
    ).integration
    now = drop_noon()
    for _ in range(4):
        _answered(broker, target, at=now - 50 * DAY)
    assert recurring_rounds_send(broker=broker, actor="test", now=now).work_items == 4
    first, second, third, _ = DeletionRequest.objects.filter(round=1).order_by("id")
    DeletionRequest.objects.filter(pk__in=[first.pk, second.pk]).update(
        state=RequestState.COMPLETED, drop_outcome="deleted", drop_status_code=3, completed_at=now
    )
    DeletionRequest.objects.filter(pk=third.pk).update(
        state=RequestState.FAILED, drop_outcome="failed", completed_at=now
    )
    _answered(broker, target, at=now - 46 * DAY)  # due today
    _answered(broker, target, at=now - 60 * DAY)  # due 15 days ago: overdue too


def _as_counted(row: RecurringCounts) -> RecurringOverview:
    return RecurringOverview(
        row.days, row.due, row.sent, row.answered, row.failing, row.overdue, row.counted_at
    )


def test_the_job_stores_each_brokers_counts_as_the_live_read_counts_them(
    broker: Broker, settings: Any
) -> None:
    _every_count(broker)
    quiet = BrokerFactory.create()  # no round to count: zeros, not no row
    live = recurring_overviews(today=drop_today())
    assert all(dataclasses.astuple(live[broker.pk])[1:6])  # every count has something

    before = timezone.now()
    assert tasks.count_recurring() == 2

    rows = {row.broker_id: row for row in RecurringCounts.objects.all()}
    assert rows.keys() == {broker.pk, quiet.pk}
    for row in rows.values():
        assert row.counted_for == drop_today()
        assert before <= row.counted_at <= timezone.now()
        assert row.days == settings.DROPPORTAL_RECURRING_DAYS
    assert _as_counted(rows[broker.pk]) == dataclasses.replace(
        live[broker.pk], counted_at=rows[broker.pk].counted_at
    )
    assert (rows[quiet.pk].due, rows[quiet.pk].sent, rows[quiet.pk].overdue) == (0, 0, 0)

    # The next run replaces them: one row per broker, whatever the runs.
    DeletionRequest.objects.filter(round=1, state=RequestState.FAILED).update(
        state=RequestState.COMPLETED, drop_outcome="deleted", drop_status_code=3
    )
    assert recurring_counts_store() == 2
    again = RecurringCounts.objects.get(broker=broker)
    assert (again.failing, again.answered) == (0, rows[broker.pk].answered + 1)
    assert RecurringCounts.objects.count() == 2


def _minutes_run(periodic_id: str, *, hour: dt.datetime) -> list[int]:
    """The minutes of ``hour`` at which the worker defers the periodic job ``periodic_id``."""
    (periodic,) = [
        task
        for task in app.periodic_registry.periodic_tasks.values()
        if task.periodic_id == periodic_id
    ]
    runs = croniter.croniter(periodic.cron, hour - dt.timedelta(seconds=1))
    minutes = []
    while (moment := runs.get_next(dt.datetime)) < hour + dt.timedelta(hours=1):
        minutes.append(moment.minute)
    return minutes


def test_the_worker_counts_every_5_minutes_apart_from_the_alerts_stuck_check() -> None:
    """Within the dashboard's 15 minutes two runs may be missed; the alerts' evaluation reads
    the same schedule every 5 minutes, and the two reads do not start together."""
    hour = dt.datetime(2026, 12, 3, 18, tzinfo=dt.UTC)
    counts = _minutes_run("count_recurring", hour=hour)
    assert [b - a for a, b in itertools.pairwise(counts)] == [5] * 11
    assert 3 * dt.timedelta(minutes=5) <= RECURRING_COUNTS_FRESH
    assert not set(counts) & set(_minutes_run("evaluate_alerts", hour=hour))


def test_the_dashboard_shows_fresh_counts_without_reading_the_schedule(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    _every_count(broker)
    recurring_counts_store()
    row = RecurringCounts.objects.get(broker=broker)
    # Told apart from any live count: the page shows the row's.
    RecurringCounts.objects.filter(pk=row.pk).update(due=row.due + 1000)

    def no_live_read(**kwargs: Any) -> dict[int, RecurringOverview]:
        raise AssertionError("the schedule was read")

    monkeypatch.setattr(dashboard, "recurring_overviews", no_live_read)
    with CaptureQueriesContext(connection) as queries:
        (overview,) = dashboard_overview(now=timezone.now())

    assert not [q for q in queries.captured_queries if SCHEDULE_MARK in q["sql"]]
    assert overview.recurring is not None
    assert overview.recurring.due == row.due + 1000
    assert overview.recurring.counted_at == row.counted_at
    assert (overview.recurring.sent, overview.recurring.overdue) == (row.sent, row.overdue)


def test_the_dashboard_page_says_when_the_counts_were_counted(broker: Broker) -> None:
    recurring_counts_store()
    counted_at = RecurringCounts.objects.get(broker=broker).counted_at
    client = Client()
    client.force_login(User.objects.create_superuser("alice", "a@example.com", "pw-alice-123"))

    page = client.get("/admin/").content.decode()
    assert f"counted at {drop_clock_text(counted_at)}" in page

    RecurringCounts.objects.all().delete()  # counted live: nothing to say
    assert "counted at" not in client.get("/admin/").content.decode()


@pytest.mark.parametrize(
    "stale",
    [
        {"counted_for": drop_today() - DAY},  # yesterday's: what is due has moved on
        {"counted_at": timezone.now() - RECURRING_COUNTS_FRESH - dt.timedelta(seconds=1)},
        {"days": 30},  # counted with another interval
    ],
    ids=["yesterday", "too-old", "other-days"],
)
def test_a_stale_row_is_not_shown_the_dashboard_counts_live(
    broker: Broker, stale: dict[str, Any]
) -> None:
    _every_count(broker)
    recurring_counts_store()
    RecurringCounts.objects.update(due=10_000, **stale)

    with CaptureQueriesContext(connection) as queries:
        (overview,) = dashboard_overview(now=timezone.now())

    assert [q for q in queries.captured_queries if SCHEDULE_MARK in q["sql"]]
    assert overview.recurring == recurring_overviews(today=drop_today())[broker.pk]
    assert overview.recurring is not None and overview.recurring.counted_at is None


def test_a_broker_added_since_the_count_has_the_dashboard_count_live(broker: Broker) -> None:
    _every_count(broker)
    recurring_counts_store()
    RecurringCounts.objects.update(due=10_000)
    broker_create(broker_id="4822", name="Newcomer", actor="test")

    overviews = dashboard_overview(now=timezone.now())

    assert [o.recurring.due for o in overviews if o.recurring] == [
        recurring_overviews(today=drop_today())[broker.pk].due,
        0,
    ]


def test_a_deleted_brokers_row_goes_with_it() -> None:
    gone, stays = BrokerFactory.create_batch(2)
    assert recurring_counts_store() == 2

    gone.delete()

    assert list(RecurringCounts.objects.values_list("broker_id", flat=True)) == [stays.pk]


def test_with_rounds_off_nothing_is_counted_or_shown(broker: Broker, settings: Any) -> None:
    settings.DROPPORTAL_RECURRING_DAYS = 0
    assert tasks.count_recurring() == 0
    assert not RecurringCounts.objects.exists()
    (overview,) = dashboard_overview(now=timezone.now())
    assert overview.recurring is not None and overview.recurring.off


def test_sending_rounds_drops_the_brokers_stored_counts_the_dashboard_counts_live(
    broker: Broker,
) -> None:
    """Just after rounds are sent the worker's row still counts them due: it goes with them,
    so the dashboard counts live (them sent) until the next count. Another broker's row, and
    a send that sent nothing, leave the rows alone."""
    target = webhook_integration_create(
        broker=broker, name="CRM", url="http://127.0.0.1:9/crm", actor="test"
    ).integration
    other = BrokerFactory.create()
    now = drop_noon()
    for _ in range(2):
        _answered(broker, target, at=now - 46 * DAY)
    recurring_counts_store(now=now)
    assert RecurringCounts.objects.get(broker=broker).due == 2

    assert recurring_rounds_send(broker=other, actor="test", now=now).work_items == 0
    assert RecurringCounts.objects.count() == 2
    assert recurring_rounds_send(broker=broker, actor="test", now=now).work_items == 2

    assert list(RecurringCounts.objects.values_list("broker_id", flat=True)) == [other.pk]
    overviews = {o.broker.pk: o for o in dashboard_overview(now=now)}
    recurring = overviews[broker.pk].recurring
    assert recurring is not None and recurring.counted_at is None
    assert (recurring.due, recurring.sent) == (0, 2)
