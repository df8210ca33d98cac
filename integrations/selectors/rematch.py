"""Matching re-performed: a cycle's DROP hashes matched again against the consumers
registered now, compared with the matches the service recorded (the deletion requests of
each match, round 0), each difference explained by its ledger event or named unexplained::

    rematch = CycleRematch(broker=broker, cycle=cycle)
    for difference in rematch.differences():   # streamed, unexplained ones first
        difference.reason, difference.explained, difference.describe()
    rematch.summary                            # once streamed: the counts

One SQL statement of set operations, read through a server-side cursor: the join of the
cycle's work items with the broker's consumer hashes (the import's matching rule: same
broker, hash and list type), the recorded pairs, their full outer join, and the ledger
events that explain each kind of difference looked up once per transaction that made
them, not once per row. Memory stays flat for any cycle; read-only, so it runs inside an
evidence export's read-only snapshot.

Why each difference can be explained (services.cycle.matching): every registration
matches its new hashes against every kept work item in its own transaction, under the
broker's matching lock, and a consumer's hashes are removed only with the consumer
(``consumer.forgotten``, ``consumers.replaced``) or by a full replacement that lists the
consumer without them (``consumers.replaced`` counting ``hashes_forgotten``). So a consumer
hash that matches now with no request recording it did not come through a registration; a
recorded match whose consumer still exists but no longer holds the hash lost it outside the
service, unless such a replacement came after the match.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from django.db import connection

from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, DropCycle, WorkItemState

# Reasons, each with what it means; the explained ones name the ledger event that explains.
EXPLAINED: Final = {
    "late_match": "matched after the import by a consumer registered later",
    "work_item_removed": "DROP removed the work item before the consumer was registered",
    "consumer_forgotten": "the consumer was forgotten after the match",
    "consumers_replaced": "the consumer was forgotten after the match by a full replacement",
    "hashes_replaced": "the consumer lost the hash after the match: a full replacement "
    "listed it without the hash",
}
UNEXPLAINED: Final = {
    "match_not_recorded": "matches a consumer now, and no deletion request records the "
    "match: its hash did not come through a registration (which matches at once)",
    "late_match_without_event": "a late match with no drop.late_matched event after it",
    "removed_without_event": "removed, with no drop.work_items_removed event after it",
    "consumer_missing": "a match recorded for a consumer that no longer exists, with no "
    "consumer.forgotten or consumers.replaced event after it",
    "hash_missing": "a match recorded for a consumer that still exists but no longer holds "
    "the hash, with no consumers.replaced event forgetting hashes after it",
}

_REMATCH: Final = """
WITH now_pairs AS MATERIALIZED (
    SELECT w.id AS work_item_pk, ch.consumer_id
      FROM integrations_workitem w
      JOIN integrations_consumerhash ch
        ON ch.broker_id = %(broker)s AND ch.hash = w.hash AND ch.hash_type = w.hash_type
     WHERE w.cycle_id = %(cycle)s
), recorded AS MATERIALIZED (
    SELECT d.work_item_id AS work_item_pk, d.consumer_id, d.remote_identifier,
           bool_and(d.late_match) AS late, min(d.matched_at) AS matched_at,
           bool_or(d.dispatched_at IS NOT NULL) AS dispatched
      FROM integrations_deletionrequest d
      JOIN integrations_workitem w ON w.id = d.work_item_id
     WHERE w.cycle_id = %(cycle)s AND d.round = 0
     GROUP BY d.work_item_id, d.consumer_id, d.remote_identifier
), pairs AS MATERIALIZED (
    SELECT coalesce(n.work_item_pk, r.work_item_pk) AS work_item_pk,
           coalesce(n.consumer_id, r.consumer_id) AS consumer_id,
           n.work_item_pk IS NOT NULL AS matches_now,
           r.work_item_pk IS NOT NULL AS recorded,
           coalesce(r.late, false) AS late, r.matched_at, r.dispatched, r.remote_identifier
      FROM now_pairs n
      FULL JOIN recorded r ON r.work_item_pk = n.work_item_pk AND r.consumer_id = n.consumer_id
), differences AS MATERIALIZED (
    -- since: when what explains the difference can have happened (a removal: the work
    -- item's last change; anything else: the recorded match).
    SELECT f.*, CASE f.found WHEN 'work_item_removed' THEN f.updated_at
                             ELSE f.matched_at END AS since
      FROM (SELECT p.*, w.work_item_id, w.hash_type, w.updated_at,
                   CASE WHEN p.matches_now AND p.recorded THEN 'late_match'
                        WHEN p.matches_now AND w.state = %(removed)s THEN 'work_item_removed'
                        WHEN p.matches_now THEN 'match_not_recorded'
                        WHEN p.consumer_id IS NULL THEN 'consumer_forgotten'
                        ELSE 'hash_missing' END AS found
              FROM pairs p
              JOIN integrations_workitem w ON w.id = p.work_item_pk
             WHERE NOT (p.matches_now AND p.recorded AND NOT p.late)) f
), first_events AS (
    -- The first ledger event since a difference of the kind that explains it: a late
    -- match, a work item's removal, a replacement of the consumers.
    SELECT t.found, t.since, t.kind, e.id, e.created_at
      FROM (SELECT DISTINCT found, since,
                   CASE found WHEN 'late_match' THEN %(late_kind)s
                              WHEN 'work_item_removed' THEN %(removed_kind)s
                              ELSE %(replaced_kind)s END AS kind
              FROM differences
             WHERE found IN ('late_match', 'work_item_removed', 'consumer_forgotten',
                             'hash_missing')) t
      CROSS JOIN LATERAL (
        -- A lost hash: only a replacement that forgot hashes explains it.
        SELECT id, created_at FROM integrations_ledgerevent
         WHERE broker_id = %(code)s AND kind = t.kind AND created_at >= t.since
           AND (t.found <> 'hash_missing'
                OR coalesce((data ->> 'hashes_forgotten')::bigint, 0) > 0)
         ORDER BY created_at, id LIMIT 1) e
), forget_events AS (
    SELECT DISTINCT ON (subject) subject, id, created_at
      FROM integrations_ledgerevent
     WHERE broker_id = %(code)s AND kind = %(forgotten_kind)s
       AND subject IN (SELECT left(remote_identifier, 200) FROM differences
                        WHERE found = 'consumer_forgotten')
     ORDER BY subject, created_at DESC, id DESC
), explained AS (
    SELECT d.found, d.work_item_id, d.hash_type, d.consumer_id,
           coalesce(d.remote_identifier, c.remote_identifier, '') AS remote_identifier,
           d.matched_at, d.dispatched,
           CASE d.found
                WHEN 'late_match' THEN CASE WHEN ev.id IS NULL
                     THEN 'late_match_without_event' ELSE 'late_match' END
                WHEN 'work_item_removed' THEN CASE WHEN ev.id IS NULL
                     THEN 'removed_without_event' ELSE 'work_item_removed' END
                WHEN 'consumer_forgotten' THEN CASE
                     WHEN fe.id IS NOT NULL THEN 'consumer_forgotten'
                     WHEN ev.id IS NOT NULL THEN 'consumers_replaced'
                     ELSE 'consumer_missing' END
                WHEN 'hash_missing' THEN CASE WHEN ev.id IS NULL
                     THEN 'hash_missing' ELSE 'hashes_replaced' END
                ELSE d.found END AS reason,
           CASE WHEN fe.id IS NOT NULL THEN %(forgotten_kind)s ELSE ev.kind END AS event_kind,
           coalesce(fe.id, ev.id) AS event_id,
           coalesce(fe.created_at, ev.created_at) AS event_at
      FROM differences d
      LEFT JOIN integrations_consumer c ON c.id = d.consumer_id
      LEFT JOIN forget_events fe
        ON d.found = 'consumer_forgotten' AND fe.subject = left(d.remote_identifier, 200)
       AND fe.created_at >= d.matched_at
      LEFT JOIN first_events ev
        ON ev.found = d.found AND ev.since = d.since AND fe.id IS NULL
)
SELECT 0 AS part, e.reason, e.event_id IS NOT NULL AS explained, e.work_item_id,
       e.hash_type, e.consumer_id, e.remote_identifier, e.matched_at, e.dispatched,
       e.event_kind, e.event_id, e.event_at, NULL::json AS totals
  FROM explained e
UNION ALL
SELECT 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       json_build_object(
           'pairs_now', count(*) FILTER (WHERE matches_now),
           'matched_now', count(DISTINCT work_item_pk) FILTER (WHERE matches_now),
           'pairs_recorded', count(*) FILTER (WHERE recorded),
           'matched_recorded', count(DISTINCT work_item_pk) FILTER (WHERE recorded),
           'matched_recorded_at_import',
               count(DISTINCT work_item_pk) FILTER (WHERE recorded AND NOT late))
  FROM pairs
ORDER BY part, explained, reason, work_item_id, consumer_id
"""

_FETCH: Final = 2000


@dataclass(frozen=True)
class RematchDifference:
    """One (work item, consumer) pair that matches now and was not recorded at the import,
    or was recorded and does not match now; why, and the ledger event that explains it."""

    reason: str  # a key of EXPLAINED or UNEXPLAINED
    explained: bool
    work_item_id: str
    hash_type: str
    consumer_id: int | None  # None: the consumer no longer exists
    remote_identifier: str
    matched_at: dt.datetime | None  # when the service recorded the match (None: it did not)
    dispatched: bool | None  # a late match: whether one of its requests was acknowledged
    event_kind: str | None
    event_id: int | None
    event_at: dt.datetime | None

    def describe(self) -> str:
        consumer = self.remote_identifier or "?"
        if self.consumer_id is not None:
            consumer = f"{consumer} (row {self.consumer_id})"
        what = (EXPLAINED if self.explained else UNEXPLAINED)[self.reason]
        line = f"work item {self.work_item_id} ({self.hash_type}), consumer {consumer}: {what}"
        if self.event_id is not None and self.event_at is not None:
            line += f" [{self.event_kind} #{self.event_id}, {self.event_at.isoformat()}]"
        if self.reason == "late_match":
            line += "; dispatched" if self.dispatched else "; not dispatched yet"
        return line

    def as_json(self, *, identifiers: bool = True) -> dict[str, Any]:
        """The difference as JSON; without ``identifiers``, no consumer pointer (the
        evidence pack names the consumer by its row id only)."""
        return {
            "reason": self.reason,
            "explained": self.explained,
            "work_item_id": self.work_item_id,
            "hash_type": self.hash_type,
            "consumer_id": self.consumer_id,
            **({"remote_identifier": self.remote_identifier} if identifiers else {}),
            "matched_at": self.matched_at.isoformat() if self.matched_at else None,
            "dispatched": self.dispatched,
            "event": (
                {
                    "kind": self.event_kind,
                    "id": self.event_id,
                    "created_at": self.event_at.isoformat() if self.event_at else None,
                }
                if self.event_id is not None
                else None
            ),
        }


@dataclass
class RematchSummary:
    broker_id: str
    cycle: str
    work_items: int
    matched_at_import: int  # as the import counted it (DropCycle.matched)
    matched_recorded_at_import: int = 0  # work items with a request of the import
    matched_recorded: int = 0  # work items with a request (the import's or a late match's)
    matched_now: int = 0  # work items matching a consumer hash now
    pairs_recorded: int = 0  # (work item, consumer) pairs with requests
    pairs_now: int = 0  # (work item, consumer) pairs matching now
    explained: Counter[str] = field(default_factory=Counter)
    unexplained: Counter[str] = field(default_factory=Counter)

    @property
    def passed(self) -> bool:
        return not self.unexplained

    def as_json(self) -> dict[str, Any]:
        return {
            "broker_id": self.broker_id,
            "cycle": self.cycle,
            "work_items": self.work_items,
            "matched_at_import": self.matched_at_import,
            "matched_recorded_at_import": self.matched_recorded_at_import,
            "matched_recorded": self.matched_recorded,
            "matched_now": self.matched_now,
            "pairs_recorded": self.pairs_recorded,
            "pairs_now": self.pairs_now,
            "explained": dict(sorted(self.explained.items())),
            "unexplained": dict(sorted(self.unexplained.items())),
            "result": "pass" if self.passed else "fail",
        }


class CycleRematch:
    def __init__(self, *, broker: Broker, cycle: DropCycle) -> None:
        self.broker, self.cycle = broker, cycle
        self.summary = RematchSummary(
            broker_id=broker.broker_id,
            cycle=cycle.drop_session_id,
            work_items=cycle.work_items,
            matched_at_import=cycle.matched,
        )

    def differences(self) -> Iterator[RematchDifference]:
        """Every difference, unexplained ones first; ``summary`` is complete once they are
        all read. Call inside a transaction (a server-side cursor lives in one)."""
        params: dict[str, Any] = {
            "broker": self.broker.pk,
            "code": self.broker.broker_id,
            "cycle": self.cycle.pk,
            "removed": WorkItemState.REMOVED,
            "late_kind": LedgerKind.DROP_LATE_MATCHED.value,
            "removed_kind": LedgerKind.DROP_WORK_ITEMS_REMOVED.value,
            "forgotten_kind": LedgerKind.CONSUMER_FORGOTTEN.value,
            "replaced_kind": LedgerKind.CONSUMERS_REPLACED.value,
        }
        summary = self.summary
        with connection.chunked_cursor() as cursor:
            cursor.execute(_REMATCH, params)
            while rows := cursor.fetchmany(_FETCH):
                for part, *columns, totals in rows:
                    if part:
                        for name, value in totals.items():
                            setattr(summary, name, int(value))
                        continue
                    difference = RematchDifference(*columns)
                    counts = summary.explained if difference.explained else summary.unexplained
                    counts[difference.reason] += 1
                    yield difference
