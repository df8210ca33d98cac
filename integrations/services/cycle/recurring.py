"""Recurring deletion: send the rounds due of the broker's deleted and opted-out consumers.

The law does not end at DROP's status: after a deletion the broker must delete that
consumer's data again at least every 45 days (Civil Code 1798.99.86(d)). Each work item
whose status is ``deleted`` or ``opted_out`` gets a new round ``DROPPORTAL_RECURRING_DAYS``
after its latest round's final outcome (``selectors.recurring``)::

    sent = recurring_rounds_send(broker=broker, actor="system:recurring")
    sent = recurring_rounds_send(broker=broker, ahead_days=5, actor="staff:alice")  # a holiday

A round goes through the match's own bulk path (``services.cycle.requests``): one request
per matched consumer and deletion target not retired (a paused one's wait), an identifier
retrieval per resolving target when a SaaS connection is configured, each with a new
``request_uuid`` and ``webhook_request_id``, and the dispatch body of the match unchanged
(its ``drop_session_id``, ``match_date``, ``mode`` and ``broker_id_code``, whatever the
broker's are now). The requests carry their ``round`` number, so delivery, callbacks, ISI and
SaaS need nothing of their own, and the settlement ignores them: a round never changes the
status DROP holds. A consumer the broker has forgotten since gets no round (nothing of it is
registered to point at). Each round directs the broker's service providers and contractors
again (``services.providers.directives``).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from psycopg import sql

from integrations.drop.calendar import drop_today
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    DirectiveReason,
    RecurringCounts,
    RequestState,
    WorkItemState,
)
from integrations.selectors.recurring import ROUNDS_OWED, rounds_sql, schedule_execute
from integrations.services.cycle.requests import (
    MATCHES_TABLE,
    matches_table_create,
    requests_insert_for_matches,
)
from integrations.services.ledger import ledger_event_append
from integrations.services.locks import matching_lock
from integrations.services.providers.directives import directives_issue

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecurringRoundsSent:
    """What ``recurring_rounds_send`` did."""

    until: dt.date  # rounds due on this DROP day or before were sent
    work_items: int  # items given a new round
    deletion_requests: int
    queued: int  # with a target, delivery job deferred (a paused target's wait in the loop)
    pending: int  # no target configured: they wait for one
    resolution_requests: int

    def as_json(self) -> dict[str, object]:
        return {
            "until": self.until.isoformat(),
            "work_items": self.work_items,
            "deletion_requests": self.deletion_requests,
            "queued": self.queued,
            "pending": self.pending,
            "resolution_requests": self.resolution_requests,
        }


# A day's rounds go in batches of this many work items, each its own transaction (under the
# matching lock) with its delivery jobs, directives and ledger event: a million due items
# would otherwise be one transaction holding millions of deferred foreign key checks, its
# WAL and the matching lock until the last one, with nothing to show until then.
ROUND_BATCH_ITEMS = 50_000

# The rounds due, read once: each consumer the match gave a due item (round 0, a request
# not cancelled), with the match's own match_date, mode, broker_id_code and late_match (a
# round's body is the match's: an item matched in test mode is not deleted for real every
# 45 days once the broker goes to production), marked with the new round and its batch.
# One statement from the schedule (selectors.recurring), so a million due items never leave
# PostgreSQL. A session temp table: it outlives the batches' commits.
_DUE_TABLE = "drop_rounds_due"
_DUE_SQL = """
    CREATE TEMP TABLE {due} AS
    SELECT p.*, (dense_rank() OVER (ORDER BY p.work_item_id) - 1) / %(batch_items)s AS batch
      FROM (SELECT d.work_item_id, d.consumer_id, bool_or(d.late_match) AS late_match,
                   (s.round + 1)::smallint AS round, min(d.match_date) AS match_date,
                   min(d.mode) AS mode, min(d.broker_id_code) AS broker_id_code
              FROM ({schedule}) s
              JOIN integrations_deletionrequest d
                ON d.work_item_id = s.work_item_id AND d.round = 0
             WHERE s.final AND s.due_on <= %(until)s
               AND d.consumer_id IS NOT NULL AND d.state <> %(cancelled)s
             GROUP BY d.work_item_id, d.consumer_id, s.round) p
"""

# One batch's pairs into the match's drop_matches. Read before this batch's transaction
# took the lock, so each item is checked again: still owed rounds (the schedule's rule:
# deleted or opted out, not removed), its consumer still registered (one forgotten since
# gets no round: it is not counted, nor named in the directives), and its round not sent
# meanwhile (by another run: a round's requests always include a deletion request).
_BATCH_PAIRS_SQL = """
    INSERT INTO {matches} (work_item_id, consumer_id, late_match, round, match_date, mode,
                           broker_id_code)
    SELECT p.work_item_id, p.consumer_id, p.late_match, p.round, p.match_date, p.mode,
           p.broker_id_code
      FROM {due} p
      JOIN integrations_workitem w ON w.id = p.work_item_id
      JOIN integrations_consumer c ON c.id = p.consumer_id
     WHERE p.batch = %(batch)s
       AND {owed}
       AND NOT EXISTS (SELECT 1 FROM integrations_deletionrequest d
                        WHERE d.work_item_id = p.work_item_id AND d.round >= p.round)
"""


def recurring_rounds_send(
    *,
    broker: Broker,
    actor: str,
    ahead_days: int = 0,
    now: dt.datetime | None = None,
    batch_items: int = ROUND_BATCH_ITEMS,
) -> RecurringRoundsSent:
    """Send now every round of ``broker`` due today or within ``ahead_days`` days (DROP's
    calendar); returns the totals.

    The schedule is read once; the rounds then go in batches of ``batch_items`` work items,
    each in one transaction with its delivery jobs, its directives and one ledger event
    (``batch`` of ``batches``). Each batch is serialized with matching for the broker and
    checks its items again, so two runs at once (the worker's and a command's) cannot both
    send the same round: the second skips what the first sent. Should a run stop midway,
    the batches committed stay sent and the next run sends the rest. Nothing while
    ``DROPPORTAL_RECURRING_DAYS`` is 0.
    """
    if ahead_days < 0:
        raise ValueError("ahead_days must be 0 or more")
    if batch_items < 1:
        raise ValueError("batch_items must be 1 or more")
    until = drop_today(now) + dt.timedelta(days=ahead_days)
    totals = RecurringRoundsSent(until, 0, 0, 0, 0, 0)
    if settings.DROPPORTAL_RECURRING_DAYS <= 0:
        return totals
    schedule, params = rounds_sql(broker=broker)
    params.update(until=until, batch_items=batch_items, removed=WorkItemState.REMOVED)
    with transaction.atomic(), connection.cursor() as cursor:
        matching_lock(broker=broker)
        cursor.execute(f"DROP TABLE IF EXISTS {_DUE_TABLE}")
        schedule_execute(cursor, _DUE_SQL.format(due=_DUE_TABLE, schedule=schedule), params)
        cursor.execute(f"SELECT max(batch) FROM {_DUE_TABLE}")  # noqa: S608
        last = cursor.fetchone()[0]
    batches = 0 if last is None else int(last) + 1
    for batch in range(batches):
        sent = _batch_send(
            broker=broker,
            actor=actor,
            until=until,
            params={**params, "batch": batch},
            ledger={"ahead_days": ahead_days, "batch": batch + 1, "batches": batches},
        )
        totals = RecurringRoundsSent(
            until=until,
            work_items=totals.work_items + sent.work_items,
            deletion_requests=totals.deletion_requests + sent.deletion_requests,
            queued=totals.queued + sent.queued,
            pending=totals.pending + sent.pending,
            resolution_requests=totals.resolution_requests + sent.resolution_requests,
        )
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {_DUE_TABLE}")
    return totals


def _batch_send(
    *,
    broker: Broker,
    actor: str,
    until: dt.date,
    params: dict[str, Any],
    ledger: dict[str, int],
) -> RecurringRoundsSent:
    """One batch of ``drop_rounds_due``: its requests, jobs, directives and ledger event."""
    with transaction.atomic():
        matching_lock(broker=broker)
        matches_table_create()
        with connection.cursor() as cursor:
            cursor.execute(
                _BATCH_PAIRS_SQL.format(matches=MATCHES_TABLE, due=_DUE_TABLE, owed=ROUNDS_OWED),
                {**params, "cancelled": RequestState.CANCELLED},
            )
            cursor.execute(f"SELECT count(DISTINCT work_item_id) FROM {MATCHES_TABLE}")  # noqa: S608
            work_items = int(cursor.fetchone()[0])
        if not work_items:
            return RecurringRoundsSent(until, 0, 0, 0, 0, 0)
        # match_date, mode and broker_id_code are each pair's own (the original match's);
        # the call's are never used.
        created = requests_insert_for_matches(broker=broker, match_date=until)
        # The broker's service providers and contractors are directed again with each round.
        directives_issue(
            broker=broker,
            work_items=sql.Identifier(MATCHES_TABLE),
            reason=DirectiveReason.RECURRING,
            actor=actor,
        )
        result = RecurringRoundsSent(
            until=until,
            work_items=work_items,
            deletion_requests=created.deletion_requests,
            queued=created.queued,
            pending=created.pending,
            resolution_requests=created.resolution_requests,
        )
        ledger_event_append(
            kind=LedgerKind.RECURRING_ROUNDS_SENT,
            broker_id=broker.broker_id,
            subject=broker.broker_id,
            actor=actor,
            data={**result.as_json(), **ledger},
        )
        # The worker's stored counts still show these rounds as due: dropped with the rounds
        # (a run stopped midway included), the dashboard counts live until the next count.
        RecurringCounts.objects.filter(broker=broker).delete()
    return result


def recurring_rounds_send_all(*, actor: str, now: dt.datetime | None = None) -> int:
    """The worker's daily duty: every broker's rounds due today. Returns how many work items
    got a round.

    Each broker owes its own consumers their rounds: one whose rounds cannot be sent (its
    directives cannot be signed, say) is logged and the next brokers' are sent all the
    same; the first such error is raised once every broker was tried, so the job fails and
    says why (the next hour tries that broker again).
    """
    sent = 0
    failure: Exception | None = None
    for broker in Broker.objects.order_by("pk"):
        try:
            sent += recurring_rounds_send(broker=broker, actor=actor, now=now).work_items
        except Exception as exc:
            logger.exception("broker %s: its recurring rounds were not sent", broker.broker_id)
            failure = failure or exc
    if failure is not None:
        raise failure
    return sent
