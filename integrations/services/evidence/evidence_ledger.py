"""The ledger range of an evidence pack: the broker's events from a given time to the export,
in full, with every other event of the chain between them as its hashes, so an auditor can
recompute the chain over the range without seeing another broker's events::

    span = LedgerRange(broker=broker, since=period.ledger_since())
    span.lines()        # one JSON document per line, streamed from PostgreSQL's COPY
    span.describe()     # the range's ends and chain hashes, for the manifest
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from django.db import connection

from integrations import exports
from integrations.ledger_hash import GENESIS_HASH
from integrations.models import Broker


class LedgerRange:
    def __init__(self, *, broker: Broker, since: dt.datetime) -> None:
        self.broker_id = broker.broker_id
        with connection.cursor() as cursor:
            ends: list[tuple[int | None, int | None]] = []
            for direction in ("ASC", "DESC"):
                cursor.execute(
                    _RANGE_END_SQL.format(direction=direction),
                    {"broker": self.broker_id, "since": since},
                )
                ends.append(cursor.fetchone() or (None, None))
            self.first, self.first_id = ends[0]
            self.last, self.last_id = ends[1]
            self.before: str | None = None
            self.after: str | None = None
            if self.first is not None:
                cursor.execute(_LINK_BEFORE, [self.first])
                row = cursor.fetchone()
                self.before = row[0] if row else GENESIS_HASH
                cursor.execute(
                    "SELECT chain_hash FROM integrations_ledgerchainlink WHERE position = %s",
                    [self.last],
                )
                self.after = cursor.fetchone()[0]
            cursor.execute(_UNSEALED_COUNT, {"broker": self.broker_id, "since": since})
            self.unsealed = cursor.fetchone()[0]
        self.since = since
        self.lines_written = 0

    def describe(self) -> dict[str, Any]:
        return {
            "since": self.since.isoformat(),
            "first_event_id": self.first_id,
            "last_event_id": self.last_id,
            "first_position": self.first,
            "last_position": self.last,
            "chain_hash_before": self.before,
            "chain_hash_after": self.after,
            "unsealed_events": self.unsealed,
        }

    def lines(self) -> Iterator[bytes]:
        params = {
            "broker": self.broker_id,
            "first": self.first or 0,
            "last": self.last or -1,
            "since": self.since,
        }
        with connection.cursor() as cursor:
            for sql in (_CHAIN_LINES, _UNSEALED_LINES):
                with cursor.copy(sql, params) as copy:
                    yield from exports.rechunk(copy)


# The broker's first and last chained event since ``since``: the range's two ends.
_RANGE_END_SQL = """
SELECT l.position, e.id
FROM integrations_ledgerchainlink l JOIN integrations_ledgerevent e ON e.id = l.event_id
WHERE e.broker_id = %(broker)s AND e.created_at >= %(since)s
ORDER BY l.position {direction} LIMIT 1
"""
_LINK_BEFORE = """
SELECT chain_hash FROM integrations_ledgerchainlink WHERE position < %s
ORDER BY position DESC LIMIT 1
"""
_EVENT_JSON = """json_build_object(
    'position', {position}, 'id', e.id,
    'created_at', to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                  || '+00:00',
    'broker_id', e.broker_id, 'kind', e.kind, 'subject', e.subject, 'actor', e.actor,
    'data', e.data, 'event_hash', e.event_hash, 'chain_hash', {chain_hash})"""
# One JSON document per line. CSV with a quote and a delimiter that JSON never holds raw
# (it escapes control characters) writes each document unquoted and unescaped.
_COPY_LINES = "COPY ({select}) TO STDOUT WITH (FORMAT csv, QUOTE E'\\x01', DELIMITER E'\\x02')"
# Built from constants only; every value is a parameter.
_CHAIN_LINES = _COPY_LINES.format(
    select="SELECT CASE WHEN e.broker_id = %(broker)s THEN "  # noqa: S608
    + _EVENT_JSON.format(position="l.position", chain_hash="l.chain_hash")
    + " ELSE json_build_object('position', l.position, 'id', e.id, 'event_hash', e.event_hash,"
    " 'chain_hash', l.chain_hash) END"
    " FROM integrations_ledgerchainlink l JOIN integrations_ledgerevent e ON e.id = l.event_id"
    " WHERE l.position BETWEEN %(first)s AND %(last)s ORDER BY l.position"
)
# Events committed after the last seal (the snapshot sees them, the chain not yet): hashed,
# not chained.
_UNSEALED_WHERE = """
FROM integrations_ledgerevent e
WHERE e.broker_id = %(broker)s AND e.created_at >= %(since)s
  AND e.txid >= coalesce((SELECT horizon_txid FROM integrations_ledgerchainlink
                          ORDER BY position DESC LIMIT 1), 0)
  AND NOT EXISTS (SELECT 1 FROM integrations_ledgerchainlink l WHERE l.event_id = e.id)
"""
_UNSEALED_COUNT = "SELECT count(*) " + _UNSEALED_WHERE
_UNSEALED_LINES = _COPY_LINES.format(
    select="SELECT "
    + _EVENT_JSON.format(position="NULL::bigint", chain_hash="NULL::text")
    + _UNSEALED_WHERE
    + " ORDER BY e.id"
)
