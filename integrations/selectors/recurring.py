"""Where each deleted or opted-out consumer stands in its recurring deletion rounds.

After DROP's status for a work item is ``deleted`` (3) or ``opted_out`` (4), the broker owes
that deletion again at least every ``DROPPORTAL_RECURRING_DAYS`` days (Civil Code
1798.99.86(d)). A round is the item's requests of one ``round`` number (0: the match's own,
and those of a consumer matched after the item settled, which hold no round back).
Its next round is due ``DROPPORTAL_RECURRING_DAYS`` days, in DROP's calendar, after the day
its latest round reached its final outcome; each item has its own date, so rounds spread
over the days as the answers did::

    rounds_sql(broker=broker)                                 # the schedule, as SQL to select from
    recurring_overview(broker=broker)                         # the dashboard's counts
    recurring_overviews(today=drop_today())                   # every broker's, one query
    recurring_overviews_counted(broker_pks=pks, now=now)      # the worker's, while fresh
    recurring_stuck_counts(broker=None, today=drop_today())   # for ``drop doctor``

Removed items are never scheduled: rounds stop when DROP removes the identifier.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.backends.utils import CursorWrapper

from integrations.drop.calendar import drop_timezone, drop_today
from integrations.drop_statuses import DropStatus
from integrations.models import (
    DROP_STATUS_CODES,
    Broker,
    DropOutcome,
    RecurringCounts,
    RequestState,
    WorkItemState,
)
from integrations.models.recurring import RECURRING_COUNTS

# Who is owed rounds (``w``, a work item): its status is deleted or opted out, not removed.
# While it has no status (a consumer matched later or come back is asked, and its answer
# decides: an amendment owed to DROP waits for it), the code DROP holds counts, so a
# consumer DROP holds deleted is not left off the schedule meanwhile; and whatever DROP
# holds (nothing yet, or a 5 or 2 an amendment was to correct), a round-0 answer that made
# it 3 or 4: that consumer's data was deleted, and the status waits for the newcomer's
# answer. The sender checks each item again by the same rule (``services.cycle.recurring``).
ROUNDS_OWED = """(w.status_code = ANY(%(codes)s)
    OR (w.status_code IS NULL
        AND (w.reported_status_code = ANY(%(codes)s)
             OR EXISTS (SELECT 1 FROM integrations_deletionrequest o
                      WHERE o.work_item_id = w.id AND o.round = 0
                        AND o.state = %(completed)s AND o.drop_outcome = ANY(%(outcomes)s))
             OR EXISTS (SELECT 1 FROM integrations_resolutionrequest o
                         WHERE o.work_item_id = w.id AND o.round = 0
                           AND o.state = %(completed)s
                           AND o.drop_outcome = ANY(%(outcomes)s)))))
    AND w.state <> %(removed)s"""
# ``coalesce(w.status_code, w.reported_status_code) = ANY(codes)``, written out as its two
# cases above: the planner has no statistics for the coalesce and took it for 1 % of the
# items, so it read each item's requests by index, one at a time, where it now joins them
# in one pass.

# A round stays open until every request of it is final, as the settlement counts final
# (sql/work_item_settle.sql): cancelled, or completed with a final outcome (a SaaS deletion:
# completed). ``failed`` and undeliverable keep it open: the delivery policy goes on.
#
# Round 0 is the match's own requests. A consumer matched to the item once those were all
# final (a late match, or one come back from a supplier, after the item settled) is asked
# at once, in round 0 too, but holds nothing back: the item's rounds go on as though it had
# not come (docs/recurring-deletion.md), and its answer does not move round 0's date, so a
# consumer of the match is never left longer than the interval. It takes part in every
# later round like any consumer of the match (the sender reads round 0's consumers).
# Requests made together (one match, one late match, one round) share their making time
# (a deletion request's ``matched_at``, a retrieval's ``created_at``, copies keep it): a
# batch. A batch of round 0 other than the first comes after the settlement when it was
# made after every earlier one was final and answered, or after DROP was given the item's
# 3 or 4 (``reported_at``; either says the item had settled, and the first stays when an
# amendment moves ``reported_at`` later); so does every batch after it.
# Per item, its latest round: whether it is final, when it was (its last outcome), and
# when the round before it was (what its due date counts from).
# ``set_at``: when staff set the item's status by hand (``status_set_at`` while the status
# is theirs; a late match puts the status back to none and keeps the time, hence the test).
# NULL for nearly every item, so carrying it costs the sort next to nothing; read only for
# an open round 0, where no round can start (``blocked_on``).
# Each request of the three kinds, of the items ``{where}`` picks.
_PARTS_SQL = """
    SELECT d.work_item_id, w.broker_id, d.round, d.matched_at AS made_at,
           w.reported_status_code = ANY(%(codes)s) AND d.matched_at > w.reported_at
             AS after_report,
           d.state = %(cancelled)s
             OR (d.state = %(completed)s AND d.drop_outcome = ANY(%(final_outcomes)s)) AS final,
           d.state = %(undeliverable)s OR d.drop_outcome = %(failed)s AS failing,
           CASE WHEN d.state <> %(cancelled)s THEN d.completed_at END AS at,
           d.round = 0 AND d.consumer_id IS NOT NULL AND d.state <> %(cancelled)s AS live,
           CASE WHEN w.status_code IS NOT NULL THEN w.status_set_at END AS set_at
      FROM integrations_deletionrequest d
      JOIN integrations_workitem w ON w.id = d.work_item_id
     WHERE {where}
    UNION ALL
    SELECT r.work_item_id, w.broker_id, r.round, r.created_at,
           w.reported_status_code = ANY(%(codes)s) AND r.created_at > w.reported_at,
           r.state = %(cancelled)s
             OR (r.state = %(completed)s AND r.drop_outcome <> %(failed)s),
           r.state = %(undeliverable)s,
           CASE WHEN r.state <> %(cancelled)s THEN r.completed_at END, false,
           CASE WHEN w.status_code IS NOT NULL THEN w.status_set_at END
      FROM integrations_resolutionrequest r
      JOIN integrations_workitem w ON w.id = r.work_item_id
     WHERE {where}
    UNION ALL
    SELECT r.work_item_id, w.broker_id, r.round, r.created_at,
           w.reported_status_code = ANY(%(codes)s) AND r.created_at > w.reported_at,
           s.state IN (%(cancelled)s, %(completed)s),
           s.state = %(undeliverable)s,
           CASE WHEN s.state <> %(cancelled)s THEN s.completed_at END, false,
           CASE WHEN w.status_code IS NOT NULL THEN w.status_set_at END
      FROM integrations_saasdeletion s
      JOIN integrations_resolutionrequest r ON r.id = s.resolution_id
      JOIN integrations_workitem w ON w.id = r.work_item_id
     WHERE {where}
"""
# Only a round 0 of several batches can have one come after the settlement, so only there
# are batches told apart, per item: two window passes over every batch of every item took
# about half the read where nearly every round is one batch. ``g``: the item's round 0.
_COME_BACK_SQL = """
    SELECT bool_and(m.final) FILTER (WHERE NOT m.come_back) AS final,
           max(m.final_at) FILTER (WHERE NOT m.come_back) AS final_at
      FROM (SELECT s.*, coalesce(bool_or(s.settled_before) OVER (ORDER BY s.made_at), false)
                          AS come_back
              FROM (SELECT b.*,
                           count(*) OVER earlier > 0
                             AND (b.after_report OR (bool_and(b.final) OVER earlier
                                                     AND max(b.final_at) OVER earlier
                                                         < b.made_at)) AS settled_before
                      FROM (SELECT p.made_at, bool_or(p.after_report) AS after_report,
                                   bool_and(p.final) AS final, max(p.at) AS final_at
                              FROM ({parts}) p
                             WHERE p.round = 0
                             GROUP BY p.made_at) b
                    WINDOW earlier AS (ORDER BY b.made_at
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)) s
           ) m
     WHERE g.batches
"""
_ROUNDS_SQL = """
WITH grouped AS (
    SELECT work_item_id, min(broker_id) AS broker_id, round,
           bool_and(final) AS final, bool_or(failing) AS failing, max(at) AS final_at,
           bool_or(live) AS live, round = 0 AND min(made_at) <> max(made_at) AS batches,
           min(set_at) AS set_at
      FROM ({parts}) p
     GROUP BY work_item_id, round
), rounds AS (
    SELECT g.work_item_id, g.broker_id, g.round,
           CASE WHEN g.batches THEN c.final ELSE g.final END AS final, g.failing,
           CASE WHEN g.batches THEN c.final_at ELSE g.final_at END AS final_at, g.live,
           g.set_at
      FROM grouped g
      LEFT JOIN LATERAL ({come_back}) c ON true
), latest AS (
    SELECT work_item_id, broker_id, round, final, failing, final_at, set_at,
           lag(final_at) OVER item AS previous_final_at,
           bool_or(live) OVER item AS live,
           lead(round) OVER item IS NULL AS latest
      FROM rounds
    -- One pass in the order the rounds arrive (no second sort): lag and lead ignore the
    -- frame, bool_or reads the item's every round; the latest round is the one with none after.
    WINDOW item AS (PARTITION BY work_item_id ORDER BY round
                    ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
)
SELECT l.work_item_id, l.broker_id, l.round, l.final, l.failing,
       -- final: when the next round is due, if a consumer of the match is left to send it
       -- to (the sender's rule: one the broker has forgotten since gets none); open: when
       -- this one was
       (CASE WHEN l.final AND l.live THEN l.final_at
             WHEN NOT l.final THEN l.previous_final_at END
          AT TIME ZONE %(timezone)s)::date + %(days)s AS due_on,
       -- the match's own requests still open under a status staff set (an undeliverable
       -- request, the deletion confirmed another way): no round starts over them, so the
       -- day a round would have been owed, counted from when the status was set, if a
       -- consumer of the match is left to send it to. Not a due date: nothing is sent.
       (CASE WHEN l.round = 0 AND NOT l.final AND l.live THEN l.set_at END
          AT TIME ZONE %(timezone)s)::date + %(days)s AS blocked_on
  FROM latest l
 WHERE l.latest
"""


def rounds_sql(*, broker: Broker | None) -> tuple[str, dict[str, Any]]:
    """The per-item schedule (columns ``work_item_id, broker_id, round, final, failing,
    due_on, blocked_on``) as SQL text and its parameters, for a caller to select from; run
    it under ``schedule_execute``. ``due_on`` is NULL for an item
    whose match's own requests are still open (a status set by staff: no round is owed on it
    yet), and for one whose consumers the broker has all forgotten since (no one to send a
    round to). ``blocked_on`` is set for the first kind only when staff set the status: the
    day its first round would have been owed, had those requests been answered when it was
    set (``drop doctor`` lists it once past). A consumer matched after the item settled
    holds back no round: see above."""
    params: dict[str, Any] = {
        "cancelled": RequestState.CANCELLED,
        "completed": RequestState.COMPLETED,
        "undeliverable": RequestState.UNDELIVERABLE,
        "failed": DropOutcome.FAILED,
        "final_outcomes": list(DROP_STATUS_CODES),
        "codes": [DropStatus.DELETED.value, DropStatus.OPTED_OUT.value],
        "outcomes": [DropOutcome.DELETED.value, DropOutcome.OPTED_OUT.value],
        "removed": WorkItemState.REMOVED,
        # Days count in DROP's calendar, as its one home names the zone.
        "timezone": drop_timezone().key,
        "days": settings.DROPPORTAL_RECURRING_DAYS,
        "broker": broker.pk if broker is not None else None,
    }
    broker_filter = "AND w.broker_id = %(broker)s" if broker is not None else ""
    parts = _PARTS_SQL.format(where=f"{ROUNDS_OWED} {broker_filter}")
    come_back = _COME_BACK_SQL.format(parts=_PARTS_SQL.format(where="w.id = g.work_item_id"))
    return _ROUNDS_SQL.format(parts=parts, come_back=come_back), params


# The planner settings the schedule is read with, for its one statement only. JIT off: the
# planner charges the owed rule's subqueries to every item, so the plan always costs enough
# to be compiled, and compiling cost more than the read. No hash aggregate: the planner
# takes the groups for a tenth of the requests, so it hashed them, then sorted them all for
# the windows; sorted once, the aggregate and the windows share the order. 64 MB: that sort
# holds a row per request, and spilled at the default 4 MB from a few tens of thousands of
# requests on (figures: docs/benchmarks.md). Sent with the statement in one string (one
# round trip, no transaction of its own): SET LOCAL ends with the string's implicit
# transaction, or, in a caller's transaction, the caller's values are put back right after.
_SETTINGS_BEFORE = (
    "SELECT set_config('dropportal.schedule_jit', current_setting('jit'), true),"
    " set_config('dropportal.schedule_work_mem', current_setting('work_mem'), true),"
    " set_config('dropportal.schedule_hashagg', current_setting('enable_hashagg'), true);"
    " SELECT set_config('jit', 'off', true), set_config('work_mem', '64MB', true),"
    " set_config('enable_hashagg', 'off', true);"
)
_SETTINGS_AFTER = (
    "; SELECT set_config('jit', current_setting('dropportal.schedule_jit'), true),"
    " set_config('work_mem', current_setting('dropportal.schedule_work_mem'), true),"
    " set_config('enable_hashagg', current_setting('dropportal.schedule_hashagg'), true)"
)


def schedule_execute(cursor: CursorWrapper, statement: str, params: dict[str, Any]) -> None:
    """Execute ``statement`` (one that reads ``rounds_sql``) with the schedule's planner
    settings; the cursor is left on its result."""
    cursor.execute(_SETTINGS_BEFORE + statement + _SETTINGS_AFTER, params)
    cursor.nextset()
    cursor.nextset()


@dataclass(frozen=True)
class RecurringOverview:
    """A broker's recurring deletion, as the dashboard shows it (counts of work items)."""

    days: int  # DROPPORTAL_RECURRING_DAYS; 0: off, the broker owes it by other means
    due: int  # latest round final, the next one due today or before, not sent yet
    sent: int  # a round (1 or later) sent, no final outcome yet, none failing
    answered: int  # latest round (1 or later) answered: final
    failing: int  # a round (1 or later) with a failed outcome or undeliverable request
    overdue: int  # a round due more than RECURRING_OVERDUE_DAYS ago and not answered
    # When the worker counted them (``recurring_overviews_counted``); None: read just now.
    counted_at: dt.datetime | None = None

    @property
    def off(self) -> bool:
        return self.days <= 0


# A round not answered this long after its due date is listed by ``drop doctor``.
RECURRING_OVERDUE_DAYS = 7


def recurring_overview(*, broker: Broker, today: dt.date | None = None) -> RecurringOverview:
    """``broker``'s rounds due, sent, answered, failing and overdue."""
    overviews = recurring_overviews(broker=broker, today=today)
    return overviews.get(
        broker.pk, RecurringOverview(settings.DROPPORTAL_RECURRING_DAYS, 0, 0, 0, 0, 0)
    )


def recurring_overviews(
    *, broker: Broker | None = None, today: dt.date | None = None
) -> dict[int, RecurringOverview]:
    """``recurring_overview`` of every broker with a round to count (of ``broker`` only when
    given), by broker pk, in one aggregate query whatever the number of brokers."""
    days = settings.DROPPORTAL_RECURRING_DAYS
    if days <= 0:
        return {}
    today = today or drop_today()
    sql, params = rounds_sql(broker=broker)
    with connection.cursor() as cursor:
        schedule_execute(
            cursor,
            "SELECT s.broker_id,"  # noqa: S608
            " count(*) FILTER (WHERE s.final AND s.due_on <= %(today)s),"
            " count(*) FILTER (WHERE s.round > 0 AND NOT s.final AND NOT s.failing),"
            " count(*) FILTER (WHERE s.round > 0 AND s.final),"
            " count(*) FILTER (WHERE s.round > 0 AND NOT s.final AND s.failing),"
            " count(*) FILTER (WHERE s.due_on < %(overdue_before)s)"
            f" FROM ({sql}) s GROUP BY s.broker_id",
            {
                **params,
                "today": today,
                "overdue_before": today - dt.timedelta(days=RECURRING_OVERDUE_DAYS),
            },
        )
        return {
            broker_pk: RecurringOverview(days, *counts) for broker_pk, *counts in cursor.fetchall()
        }


# The dashboard shows the worker's counts (``services.cycle.recurring_counts``, every 5
# minutes) while they are this recent: two runs missed, or one slow, still leave them shown.
RECURRING_COUNTS_FRESH = dt.timedelta(minutes=15)


def _overview_counted(row: RecurringCounts) -> RecurringOverview:
    counts: dict[str, Any] = {name: getattr(row, name) for name in RECURRING_COUNTS}
    return RecurringOverview(**counts, counted_at=row.counted_at)


def recurring_overviews_counted(
    *, broker_pks: Collection[int], now: dt.datetime
) -> dict[int, RecurringOverview] | None:
    """``recurring_overviews`` of ``broker_pks`` as the worker last counted them, in one
    query, when every one of them was counted for ``now``'s DROP date, with the days setting
    in force, within ``RECURRING_COUNTS_FRESH`` before ``now``; else None (nothing counted
    yet, the worker is not running, a broker added since): the caller counts live."""
    days = settings.DROPPORTAL_RECURRING_DAYS
    if days <= 0:
        return {}
    counted = {
        row.broker_id: _overview_counted(row)
        for row in RecurringCounts.objects.filter(
            broker_id__in=broker_pks,
            days=days,
            counted_for=drop_today(now),
            counted_at__gte=now - RECURRING_COUNTS_FRESH,
        )
    }
    return counted if counted.keys() == set(broker_pks) else None


# Per broker: (DROP broker id, broker pk, work items, rows holding them, nearest due date),
# as the stuck check counts each reason.
StuckCounts = list[tuple[str, int, int, int, dt.date]]

# Which items ``recurring_stuck_counts`` counts, each over the same schedule (``s``), with
# the requests holding them.
_OVERDUE = "s.due_on < %(overdue_before)s"
_FAILING = "s.round > 0 AND NOT s.final AND s.failing"
_BLOCKED = "s.blocked_on < %(today)s"
_ROUND_REQUESTS = (
    "(SELECT count(*) FROM integrations_deletionrequest d"
    " WHERE d.work_item_id = s.work_item_id AND d.round = s.round AND s.round > 0"
    " AND NOT s.final)"
)
# Round 0's deletion requests not final (the schedule's rule): those staff are to answer.
_OPEN_MATCH_REQUESTS = (
    "(SELECT count(*) FROM integrations_deletionrequest d"
    " WHERE d.work_item_id = s.work_item_id AND d.round = 0 AND d.state <> %(cancelled)s"
    " AND NOT (d.state = %(completed)s AND d.drop_outcome = ANY(%(final_outcomes)s)))"
)


def recurring_stuck_counts(
    *, broker: Broker | None, today: dt.date
) -> tuple[StuckCounts, StuckCounts, StuckCounts]:
    """Per broker: (DROP broker id, broker pk, work items, requests holding them, earliest
    due date), for ``drop doctor``, of three sets of items, read in one statement (the
    schedule is built once):

    - overdue: those whose round was due more than ``RECURRING_OVERDUE_DAYS`` days before
      ``today`` and is not answered yet (not sent, or sent and not answered);
    - failing: those whose round has a ``failed`` outcome or an undeliverable request: it
      waits for the broker, or for staff to redeliver or redispatch, as any request does
      (``drop doctor`` and its alert say so at once);
    - blocked: those whose status staff set while the match's own requests were open, and
      still are, more than ``DROPPORTAL_RECURRING_DAYS`` before ``today``: no round starts
      until those requests are final, so the deletion owed again is not sent (the date is
      the day it would have been due; the requests are the match's open ones).

    Nothing while rounds are off (the dashboard says so instead)."""
    if settings.DROPPORTAL_RECURRING_DAYS <= 0:
        return [], [], []
    sql, params = rounds_sql(broker=broker)
    # A round whose previous one was all cancelled has no date: today then.
    sets = (
        (_OVERDUE, _ROUND_REQUESTS, "due_on"),
        (_FAILING, _ROUND_REQUESTS, "due_on"),
        (_BLOCKED, _OPEN_MATCH_REQUESTS, "blocked_on"),
    )
    columns = ", ".join(
        f"count(*) FILTER (WHERE {condition}),"
        f" coalesce(sum({requests}) FILTER (WHERE {condition}), 0)::integer,"
        f" coalesce(min(s.{due}) FILTER (WHERE {condition}), %(today)s)"
        for condition, requests, due in sets
    )
    where = " OR ".join(f"({condition})" for condition, _, _ in sets)
    with connection.cursor() as cursor:
        schedule_execute(
            cursor,
            f"SELECT b.broker_id, b.id, {columns}"  # noqa: S608
            f" FROM ({sql}) s"
            " JOIN integrations_broker b ON b.id = s.broker_id"
            f" WHERE {where}"
            " GROUP BY b.broker_id, b.id ORDER BY b.broker_id",
            {
                **params,
                "today": today,
                "overdue_before": today - dt.timedelta(days=RECURRING_OVERDUE_DAYS),
            },
        )
        rows = cursor.fetchall()
    found: tuple[StuckCounts, StuckCounts, StuckCounts] = ([], [], [])
    for broker_id, broker_pk, *counts in rows:
        for index, each in enumerate(found):
            items, requests, due = counts[3 * index : 3 * index + 3]
            if items:
                each.append((broker_id, broker_pk, items, requests, due))
    return found
