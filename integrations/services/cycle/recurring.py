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
(its ``drop_session_id`` and ``match_date``). The requests carry their ``round`` number, so
delivery, callbacks, ISI and SaaS need nothing of their own, and the settlement ignores
them: a round never changes the status DROP holds. A consumer the broker has forgotten since
gets no round (nothing of it is registered to point at). Each round directs the broker's
service providers and contractors again (``services.providers.directives``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from psycopg import sql

from integrations.drop.calendar import drop_today
from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, DirectiveReason, RequestState
from integrations.selectors.recurring import rounds_sql
from integrations.services.cycle.requests import (
    MATCHES_TABLE,
    matches_table_create,
    requests_insert_for_matches,
)
from integrations.services.ledger import ledger_event_append
from integrations.services.locks import matching_lock
from integrations.services.providers.directives import directives_issue


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


# The round's pairs: each consumer the match gave a due item (round 0, a request not
# cancelled), with the match's own match_date and late_match, marked with the new round. One
# statement from the schedule (selectors.recurring), so a million due items never leave
# PostgreSQL.
_ROUND_PAIRS_SQL = """
    INSERT INTO {matches} (work_item_id, consumer_id, late_match, round, match_date)
    SELECT d.work_item_id, d.consumer_id, bool_or(d.late_match), s.round + 1, min(d.match_date)
      FROM ({schedule}) s
      JOIN integrations_deletionrequest d ON d.work_item_id = s.work_item_id AND d.round = 0
     WHERE s.final AND s.due_on <= %(until)s
       AND d.consumer_id IS NOT NULL AND d.state <> %(cancelled)s
     GROUP BY d.work_item_id, d.consumer_id, s.round
"""


def recurring_rounds_send(
    *, broker: Broker, actor: str, ahead_days: int = 0, now: dt.datetime | None = None
) -> RecurringRoundsSent:
    """Send now every round of ``broker`` due today or within ``ahead_days`` days (DROP's
    calendar), in one transaction with their delivery jobs and one ledger event.

    Serialized with matching for the broker, so two runs at once (the worker's and a
    command's) cannot both send the same round: the second sees the first's requests.
    Nothing while ``DROPPORTAL_RECURRING_DAYS`` is 0.
    """
    if ahead_days < 0:
        raise ValueError("ahead_days must be 0 or more")
    until = drop_today(now) + dt.timedelta(days=ahead_days)
    with transaction.atomic():
        matching_lock(broker=broker)
        if settings.DROPPORTAL_RECURRING_DAYS <= 0:
            return RecurringRoundsSent(until, 0, 0, 0, 0, 0)
        matches_table_create()
        schedule, params = rounds_sql(broker=broker)
        with connection.cursor() as cursor:
            cursor.execute(
                _ROUND_PAIRS_SQL.format(matches=MATCHES_TABLE, schedule=schedule),
                {**params, "until": until, "cancelled": RequestState.CANCELLED},
            )
            cursor.execute(f"SELECT count(DISTINCT work_item_id) FROM {MATCHES_TABLE}")  # noqa: S608
            work_items = int(cursor.fetchone()[0])
        if not work_items:
            return RecurringRoundsSent(until, 0, 0, 0, 0, 0)
        # match_date is each pair's own (the original match's); this one is never used.
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
            data={**result.as_json(), "ahead_days": ahead_days},
        )
    return result


def recurring_rounds_send_all(*, actor: str, now: dt.datetime | None = None) -> int:
    """The worker's daily duty: every broker's rounds due today. Returns how many work items
    got a round."""
    return sum(
        recurring_rounds_send(broker=broker, actor=actor, now=now).work_items
        for broker in Broker.objects.order_by("pk")
    )
