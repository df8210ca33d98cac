"""Matching DROP's identifiers against the broker's consumers, in the database.

Two moments match, both as set-based SQL (no per-row Python loop), both serialized per
broker by ``matching_lock`` so a consumer registered while a download is imported is
matched by one side or the other, never by neither:

1. **A download** (``services.cycle.drop_import.drop_zip_import``). Inside the import's
   transaction::

       staged = staged_items_create()            # the ZIP's rows are COPYed in here
       staged_items_analyze(staged)
       matching_lock(broker=broker)
       staged_items_set_aside_received(...)      # ids received before: not again
       staged_items_match(broker=broker, staged=staged)   # the join with consumer hashes
       staged_match_rates(staged)                # items and matched per list type
       work_items_insert_staged(cycle=cycle, staged=staged)
                                                 # each row written once, with its status:
                                                 #   no match -> reportable, status 5
       cycle_matches_collect()                   # (work item, consumer) -> drop_matches
       requests_create_for_matches(...)          # one request per match per target
       work_items_close_removed(...)             # what DROP's Removed file names
       directives_issue(...)                     # after it: a directive leaves out what
                                                 #   DROP removed
       staged_items_drop(staged)

   Deciding the status while inserting writes each work item once; updating the 90 %
   unmatched rows afterwards would rewrite most of the table and its four indexes.

2. **A consumer registered later** (``services.cycle.consumers``), the ongoing duty of
   docs/contracts.md §1.8: the new consumer hashes are joined against every kept work
   item hash of the broker. They are listed in this module's own table, which the
   registration has its merge insert them into (``ConsumerLoad``), or, for a broker's
   first set, they are all the broker's hashes::

       load = ConsumerLoad(cursor, broker_pk=..., added_into=late_added_create())
       merged = load.finish()                    # each hash added inserted there
       consumer_hashes_match_late(broker=broker, first_set=merged.fresh_partition,
                                  actor=actor)

   Nothing but this module reads that table (a writer only inserts into it), and it
   makes its statistics itself (``ANALYZE``) before the join.

   Matches become deletion requests marked ``late_match``; a work item already reported
   as 5 is flagged ``needs_amendment``. Removed work items get none. A match of a work
   item an earlier consumer had matched (it has requests already) is a **reappearance**:
   given ``source`` (``RegistrationSource``: the file and its SHA-256, or the API key),
   each is recorded as a ``Reappearance`` and ledgered (``consumers.reappeared``).

Each match also directs the broker's service providers and contractors to delete
(``services.providers.directives.directives_issue``), in the same transaction.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Final, NamedTuple

from django.db import connection
from psycopg import sql

from integrations.drop.calendar import drop_today
from integrations.drop_statuses import DropStatus
from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, DirectiveReason, DropCycle, WorkItemState
from integrations.services.cycle.requests import (
    MATCHES_TABLE,
    RequestsCreated,
    matches_table_create,
    requests_create_for_matches,
)
from integrations.services.ledger import SYSTEM_ACTOR, ledger_event_append
from integrations.services.locks import matching_lock, work_items_lock
from integrations.services.providers.directives import directives_issue

STAGED_ITEMS = "drop_staged_items"
STAGED_MATCHES = "drop_staged_matches"


def staged_items_create() -> str:
    """Create the empty table the import COPYs a ZIP's list rows into; return its name.

    An UNLOGGED table, not a TEMP one: parallel workers cannot read temp tables, and the
    join with the consumer hashes runs in parallel like any other big join. It is named
    after this connection's backend, created and dropped inside the import's transaction
    (``staged_items_drop``), so no other session ever sees it and a failed import leaves
    nothing behind. Each row draws its work item's primary key from the work item
    sequence as it is copied, so matches name their work item before it is written.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_backend_pid(), pg_get_serial_sequence('integrations_workitem', 'id')"
        )
        pid, sequence = cursor.fetchone()
        staged = f"{STAGED_ITEMS}_{int(pid)}"
        cursor.execute(f"DROP TABLE IF EXISTS {staged}")
        # hash stays Base64 text as in the file: COPY needs no per-row conversion in
        # Python, and decode() in the join and the insert is C code.
        cursor.execute(
            f"CREATE UNLOGGED TABLE {staged} ("
            "  id bigint NOT NULL DEFAULT nextval(%s::regclass),"
            "  work_item_id text NOT NULL,"
            "  hash_type text NOT NULL,"
            "  hash text NOT NULL,"
            "  file_name text NOT NULL,"
            "  line integer NOT NULL"
            ") WITH (autovacuum_enabled = false)",
            [sequence],
        )
    return staged


def staged_items_analyze(staged: str) -> None:
    """Statistics of the staged rows, for the join's plan (a new table has none)."""
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {staged}")


def staged_items_drop(staged: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {staged}, {STAGED_MATCHES}")


class ReceivedRow(NamedTuple):
    """A staged row whose work item id the broker received in an earlier cycle."""

    file_name: str
    line: int
    work_item_id: str
    hash: str  # as in the file
    drop_session_id: str  # of the earlier cycle
    zip_name: str  # the earlier cycle's


@dataclass(frozen=True)
class ReceivedBefore:
    """The staged rows whose work item id the broker had received in an earlier cycle."""

    counts: dict[str, int]  # per list file, how many
    rows: list[ReceivedRow]  # the first ``kept_per_file`` of each file, by line
    rows_left: bool  # whether any staged row is new


# The earlier work item of each staged id the broker received before (the first cycle that
# had it), through the (broker, work_item_id) index.
_RECEIVED_BEFORE = """
CREATE TEMP TABLE drop_staged_received_before ON COMMIT DROP AS
SELECT DISTINCT ON (s.id) s.id, s.file_name, s.line, s.work_item_id, s.hash,
       c.drop_session_id, c.zip_name
  FROM {staged} s
  JOIN integrations_workitem w ON w.broker_id = %(broker)s AND w.work_item_id = s.work_item_id
  JOIN integrations_dropcycle c ON c.id = w.cycle_id
 ORDER BY s.id, w.cycle_id
"""


def staged_items_set_aside_received(
    *, broker: Broker, staged: str, kept_per_file: int
) -> ReceivedBefore:
    """Take out of the staged rows those whose work item id the broker received in an
    earlier cycle: an id is DROP's for good, and each is one work item, matched and
    answered once (the same package zipped again, or downloaded again by hand, would
    otherwise be a second work item and a second request for every id). Call it under the
    broker's ``matching_lock``, before matching."""
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS drop_staged_received_before")
        cursor.execute(_RECEIVED_BEFORE.format(staged=staged), {"broker": broker.pk})
        if not cursor.rowcount:
            return ReceivedBefore({}, [], rows_left=True)
        cursor.execute(
            f"DELETE FROM {staged} s USING drop_staged_received_before r"  # noqa: S608
            " WHERE s.id = r.id"
        )
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {staged})")  # noqa: S608
        rows_left = bool(cursor.fetchone()[0])
        cursor.execute(
            "SELECT file_name, count(*) FROM drop_staged_received_before GROUP BY file_name"
        )
        counts = {name: int(count) for name, count in cursor.fetchall()}
        cursor.execute(
            "SELECT file_name, line, work_item_id, hash, drop_session_id, zip_name"
            "  FROM (SELECT r.*, row_number() OVER (PARTITION BY file_name ORDER BY line) AS n"
            "          FROM drop_staged_received_before r) r"
            " WHERE n <= %s ORDER BY file_name, line",
            [kept_per_file],
        )
        rows = [ReceivedRow(*row) for row in cursor.fetchall()]
        cursor.execute("DROP TABLE drop_staged_received_before")
    return ReceivedBefore(counts, rows, rows_left)


def staged_items_match(*, broker: Broker, staged: str) -> int:
    """Join the staged rows with the broker's consumer hashes of the same list type.

    Fills ``drop_staged_matches(work_item_pk bigint, consumer_id bigint)`` and returns how
    many staged work items matched at least one consumer. A (work item, consumer) pair
    comes out once: staged ids are unique, and so is (broker, hash, hash_type, consumer).
    """
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {STAGED_MATCHES}")
        cursor.execute(
            f"CREATE TEMP TABLE {STAGED_MATCHES} ON COMMIT DROP AS"  # noqa: S608
            " SELECT s.id AS work_item_pk, ch.consumer_id"
            f"  FROM {staged} s"
            "  JOIN integrations_consumerhash ch"
            "    ON ch.broker_id = %s"
            "   AND ch.hash = decode(s.hash, 'base64')"
            "   AND ch.hash_type = s.hash_type",
            [broker.pk],
        )
        cursor.execute(f"SELECT count(DISTINCT work_item_pk) FROM {STAGED_MATCHES}")  # noqa: S608
        return int(cursor.fetchone()[0])


def staged_match_rates(staged: str) -> dict[str, dict[str, int]]:
    """Per list type of the staged rows: how many there are and how many matched
    (``staged_items_match`` first), as ``DropCycle.match_rates`` keeps them. One pass over the
    staged rows, the matches hashed (they are the few)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT s.hash_type, count(*), count(m.work_item_pk)"  # noqa: S608
            f"  FROM {staged} s"
            f"  LEFT JOIN (SELECT DISTINCT work_item_pk FROM {STAGED_MATCHES}) m"
            "    ON m.work_item_pk = s.id"
            " GROUP BY s.hash_type ORDER BY s.hash_type"
        )
        return {
            hash_type: {"items": int(items), "matched": int(matched)}
            for hash_type, items, matched in cursor.fetchall()
        }


# A new work item's state and amendment flag, for its status code (never reported yet).
_NEW_ITEM_FIELDS = (
    "dropportal_work_item_status_fields(p_state => NULL, p_code => {code}::integer,"
    " p_reported_at => NULL, p_reported_code => NULL, p_needs_amendment => false)"
)


def work_items_insert_staged(*, cycle: DropCycle, staged: str) -> int:
    """Insert the staged rows as the cycle's work items, each with its matching result.

    Matched: no status yet (state ``open``, outcomes pending). Not matched: status 5 at once
    (state ``reportable``). The state and amendment flag of each follow from its status by
    the one rule (``work_item_settle.sql``), worked out once for each of the two cases rather
    than once a row. Returns how many were inserted.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO integrations_workitem ("  # noqa: S608
            "  id, broker_id, cycle_id, work_item_id, hash_type, hash, file_name,"
            "  state, status_code, status_reason, needs_amendment)"
            " SELECT s.id, %(broker)s, %(cycle)s, s.work_item_id, s.hash_type,"
            "        decode(s.hash, 'base64'), s.file_name,"
            "        CASE WHEN m.work_item_pk IS NULL THEN unmatched.state ELSE matched.state END,"
            "        CASE WHEN m.work_item_pk IS NULL THEN %(not_found)s END,"
            "        '',"
            "        CASE WHEN m.work_item_pk IS NULL THEN unmatched.needs_amendment"
            "             ELSE matched.needs_amendment END"
            f"  FROM {staged} s"
            f"  LEFT JOIN (SELECT DISTINCT work_item_pk FROM {STAGED_MATCHES}) m"
            "    ON m.work_item_pk = s.id"
            f" CROSS JOIN {_NEW_ITEM_FIELDS.format(code='%(not_found)s')} unmatched"
            f" CROSS JOIN {_NEW_ITEM_FIELDS.format(code='NULL')} matched",
            {
                "broker": cycle.broker_id,
                "cycle": cycle.pk,
                "not_found": DropStatus.NOT_FOUND.value,
            },
        )
        return cursor.rowcount


def cycle_matches_collect() -> int:
    """Write the staged (work item, consumer) matches into ``drop_matches``; return the count."""
    matches_table_create()
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {MATCHES_TABLE} (work_item_id, consumer_id, late_match)"  # noqa: S608
            f" SELECT work_item_pk, consumer_id, false FROM {STAGED_MATCHES}"
        )
        count = cursor.rowcount
        cursor.execute(f"ANALYZE {MATCHES_TABLE}")
        return count


# The consumer hashes a registration added, for its late match: made here, filled by the
# registration's merge (an insert only: ``late_added_create``), read here only. The column
# types are those of integrations_consumerhash.
_LATE_ADDED: Final = sql.Identifier("late_match_added")
_LATE_ADDED_CREATE: Final = """
DROP TABLE IF EXISTS pg_temp.late_match_added;
CREATE TEMP TABLE late_match_added (
    consumer_id bigint NOT NULL,
    hash_type varchar(8) NOT NULL,
    hash bytea NOT NULL
) ON COMMIT DROP
"""
# Its statistics: a file import may list millions of hashes, and without them the planner
# takes a nested loop.
_LATE_ADDED_ANALYZE: Final = "ANALYZE late_match_added"
# A broker's first set: every hash the broker has is new (its fresh partition).
_FIRST_SET: Final = sql.SQL(
    "(SELECT consumer_id, hash_type, hash FROM integrations_consumerhash"
    " WHERE broker_id = %(broker)s)"
)
# Each (kept work item, consumer) pair the added hashes match that no request joins yet.
_LATE_MATCHES = sql.SQL("""
INSERT INTO {matches} (work_item_id, consumer_id, late_match)
SELECT DISTINCT w.id, n.consumer_id, true
  FROM {added} n
  JOIN integrations_workitem w ON w.hash = n.hash AND w.hash_type = n.hash_type
 WHERE w.broker_id = %(broker)s AND w.state <> %(removed)s
   AND NOT EXISTS (SELECT 1 FROM integrations_deletionrequest d
                    WHERE d.work_item_id = w.id AND d.consumer_id = n.consumer_id)
""")


@dataclass(frozen=True)
class RegistrationSource:
    """Where a registration's consumers came from, as a reappearance records it."""

    source: str  # as the ledger names it: "file:consumers.csv", "s3://bucket/key", "api"
    sha256: str = ""  # the file's, when the source is one file
    api_key_prefix: str = ""  # the key's, when the source is the API


# Each new (work item, consumer) match whose work item had a request before: the item was
# matched already, by a consumer registered earlier.
_REAPPEARANCES = sql.SQL("""
INSERT INTO integrations_reappearance (broker_id, work_item_id, consumer_id, remote_identifier,
                                       source, source_sha256, api_key_prefix, reappeared_at)
SELECT %(broker)s, m.work_item_id, m.consumer_id, c.remote_identifier,
       %(source)s, %(sha256)s, %(prefix)s, now()
  FROM {matches} m
  JOIN drop_late_items l ON l.work_item_id = m.work_item_id AND NOT l.first_match
  JOIN integrations_consumer c ON c.id = m.consumer_id
""")


def late_added_create() -> sql.Identifier:
    """Make (empty) the table ``consumer_hashes_match_late`` reads the added consumer hashes
    from, ``(consumer_id bigint, hash_type varchar(8), hash bytea)``, and return it.

    The caller has it filled by ``INSERT INTO`` only (the consumer load's merge inserts
    each hash it adds), in the transaction that then calls ``consumer_hashes_match_late``;
    nothing but this module reads it. A table left by an earlier call of the same
    transaction is dropped first."""
    with connection.cursor() as cursor:
        cursor.execute(_LATE_ADDED_CREATE)
    return _LATE_ADDED


@dataclass(frozen=True)
class LateMatches:
    """What ``consumer_hashes_match_late`` did."""

    work_items: int  # kept work items that matched a new consumer hash
    newly_matched: int  # of which had no match before (status 5; cycle counts stay as imported)
    flagged_for_amendment: int  # of which were already reported to DROP as 5
    requests: RequestsCreated
    reappearances: int = 0  # (work item, consumer) pairs of items matched before


def consumer_hashes_match_late(
    *,
    broker: Broker,
    first_set: bool = False,
    actor: str = SYSTEM_ACTOR,
    match_date: dt.date | None = None,
    source: RegistrationSource | None = None,
) -> LateMatches:
    """Match the consumer hashes just added against every kept hash.

    Call it inside the transaction that inserted the hashes and listed them in the table
    ``late_added_create`` made (this makes its statistics and reads it; it goes at commit), or,
    given ``first_set`` (the broker's first set: every hash it has is new), that
    inserted all the broker's hashes. Each (work item, new consumer) pair
    not matched before gets deletion requests marked ``late_match`` (removed work items
    get none). A matched work item whose status was known goes back to ``open`` until
    outcomes arrive; one already reported as 5 is flagged ``needs_amendment``. Given
    ``source``, the matches of work items matched before are recorded as reappearances.
    Takes the broker's matching lock (a caller that must not wait for it long takes it
    first, with its own bound).
    """
    matching_lock(broker=broker)
    matches_table_create()
    with connection.cursor() as cursor:
        if first_set:
            added: sql.Composable = _FIRST_SET
        else:
            cursor.execute(_LATE_ADDED_ANALYZE)
            added = _LATE_ADDED
        cursor.execute(
            _LATE_MATCHES.format(matches=sql.Identifier(MATCHES_TABLE), added=added),
            {"broker": broker.pk, "removed": WorkItemState.REMOVED},
        )
        if not cursor.rowcount:
            return LateMatches(0, 0, 0, RequestsCreated(0, 0, 0, 0, 0, 0))
        # Before the requests exist: which work items had no match at all until now.
        cursor.execute("DROP TABLE IF EXISTS drop_late_items")
        cursor.execute(
            "CREATE TEMP TABLE drop_late_items ON COMMIT DROP AS"  # noqa: S608
            " SELECT DISTINCT m.work_item_id,"
            "        NOT EXISTS (SELECT 1 FROM integrations_deletionrequest d"
            "                     WHERE d.work_item_id = m.work_item_id) AS first_match"
            f"  FROM {MATCHES_TABLE} m"
        )
        # Every matched item locked now, in id order (``matching_lock``): left to them, the
        # update below takes its rows in whatever order its plan reads them, and the foreign
        # key checks of the new requests, at commit, the rest in the order they were written,
        # while a delivery batch settling several of these items goes by id.
        work_items_lock(cursor, ids="SELECT work_item_id FROM drop_late_items")
        # Back to no status (waiting for the outcomes), with the state and flag that follow
        # (work_item_settle.sql): open, flagged for amendment if DROP holds a 5. One DROP
        # holds a 3 or 4 for (an amendment owed) keeps its recurring rounds meanwhile
        # (selectors.recurring ROUNDS_OWED).
        cursor.execute(
            "UPDATE integrations_workitem w"
            "   SET status_code = NULL, updated_at = now(),"
            "       (state, needs_amendment) = ("
            "           SELECT f.state, f.needs_amendment"
            "             FROM dropportal_work_item_status_fields("
            "                  p_state => w.state, p_code => NULL,"
            "                  p_reported_at => w.reported_at,"
            "                  p_reported_code => w.reported_status_code,"
            "                  p_needs_amendment => w.needs_amendment"
            "                      OR w.reported_status_code IS NOT DISTINCT FROM %(nf)s) f)"
            "  FROM drop_late_items l"
            " WHERE w.id = l.work_item_id AND w.state IN (%(reportable)s, %(reported)s)"
            "   AND (w.state = %(reportable)s OR w.reported_status_code = %(nf)s)"
            " RETURNING w.reported_status_code IS NOT DISTINCT FROM %(nf)s",
            {
                "reportable": WorkItemState.REPORTABLE,
                "reported": WorkItemState.REPORTED,
                "nf": DropStatus.NOT_FOUND.value,
            },
        )
        flagged = sum(1 for (was_reported_5,) in cursor.fetchall() if was_reported_5)
        cursor.execute("SELECT count(*), count(*) FILTER (WHERE first_match) FROM drop_late_items")
        work_items, newly_matched = (int(n) for n in cursor.fetchone())
        reappearances = 0
        if source is not None and newly_matched < work_items:
            cursor.execute(
                _REAPPEARANCES.format(matches=sql.Identifier(MATCHES_TABLE)),
                {
                    "broker": broker.pk,
                    "source": source.source,
                    "sha256": source.sha256,
                    "prefix": source.api_key_prefix,
                },
            )
            reappearances = cursor.rowcount
        cursor.execute("DROP TABLE drop_late_items")
    requests = requests_create_for_matches(
        broker=broker, match_date=match_date or drop_today(), actor=actor
    )
    directives_issue(
        broker=broker,
        work_items=sql.Identifier(MATCHES_TABLE),
        reason=DirectiveReason.LATE_MATCH,
        actor=actor,
    )
    ledger_event_append(
        kind=LedgerKind.DROP_LATE_MATCHED,
        broker_id=broker.broker_id,
        subject=broker.broker_id,
        actor=actor,
        data={
            "work_items": work_items,
            "newly_matched": newly_matched,
            "flagged_for_amendment": flagged,
            "deletion_requests": requests.deletion_requests,
        },
    )
    if reappearances:
        assert source is not None  # counted only with a source
        ledger_event_append(
            kind=LedgerKind.CONSUMERS_REAPPEARED,
            broker_id=broker.broker_id,
            subject=source.source,
            actor=actor,
            data={
                "source": source.source,
                "source_sha256": source.sha256,
                "api_key_prefix": source.api_key_prefix,
                "reappearances": reappearances,
                "work_items": work_items - newly_matched,
            },
        )
    return LateMatches(work_items, newly_matched, flagged, requests, reappearances)
