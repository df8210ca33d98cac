"""Everything staged, merged once all is read: the general merge, in key order.

``load.ConsumerLoad`` stages into it every round not merged as it was read (a broker that
has consumers, or a first set out of key order), and merges them at the end::

    staging_create(cursor)                         # once
    stage(cursor, copy_data)                       # each round left for the end
    pointers_gather(cursor, params=..., kinds_given=..., existing=...)
    kinds_update(cursor, params=...)               # when the rows name kinds
    consumers_insert(cursor, params=...)
    partition_fill(cursor, params=..., broker_pk=...)   # a first set: its fresh partition
    stale_forget(cursor, params=...)               # a replace: before hashes_insert
    hashes_insert(cursor, params=..., into=...)    # otherwise: each also into the caller's

Why this shape (docs/benchmarks.md, consumer import): the consumers go in in
``remote_identifier`` order and the hashes in hash order, so each B-tree is walked once
from left to right. Merging each round of a file in no key order as it came inserted its
keys all over indexes larger than memory: a 10 M import grew 14.7 times for 10 times the
rows. Consumer ids are drawn from the sequence while the pointers are gathered, so the
hashes name their consumer without reading the consumers back.

This module's temp tables, made, read and dropped here only: its staging table
(``consumer_registration_staging``: the rounds ``stage`` copies in), the pointers
(``consumer_registration_pointers``: each pointer the call listed, with its consumer)
and, for a replace, ``consumer_registration_forgotten``. The hashes the call added it
inserts into the relation the caller hands ``hashes_insert`` (``into``), and never reads
it: its reader (the late match) made it, and reads it itself.
"""

from __future__ import annotations

from typing import Any, Final

from psycopg import sql

from integrations.consumers import fresh_partition

__all__ = [
    "consumers_insert",
    "hashes_insert",
    "kinds_update",
    "listed_kinds",
    "partition_fill",
    "pointers_gather",
    "stage",
    "staging_create",
    "stale_forget",
    "tables_drop",
    "unlisted_count",
    "unlisted_forget",
]

_TABLES_DROP: Final = (
    "DROP TABLE IF EXISTS consumer_registration_staging, consumer_registration_pointers,"
    " consumer_registration_forgotten;"
    " DROP SEQUENCE IF EXISTS consumer_registration_line"
)
_STAGING_CREATE: Final = """
CREATE TEMP SEQUENCE consumer_registration_line;
CREATE TEMP TABLE consumer_registration_staging (
    -- The row's ordinal in the call (COPY takes rows in order): files restart their line
    -- numbers, and the last row naming a kind gives the pointer's kind.
    line bigint NOT NULL DEFAULT nextval('consumer_registration_line'),
    remote_identifier text NOT NULL,
    remote_identifier_kind text,
    hash_type text NOT NULL,
    hash bytea NOT NULL,
    -- workers.staging_rows writes them for merge_streamed; unread here.
    pointer_in_batch integer NOT NULL,
    first_row boolean NOT NULL
) ON COMMIT DROP
"""
_STAGE: Final = (
    "COPY consumer_registration_staging"
    " (remote_identifier, remote_identifier_kind, hash_type, hash, pointer_in_batch, first_row)"
    " FROM STDIN"
)
_STAGING_ANALYZE: Final = "ANALYZE consumer_registration_staging"
_POINTERS_ANALYZE: Final = "ANALYZE consumer_registration_pointers"
# Each pointer once, in remote_identifier order, with its consumer: the existing one (when
# %(existing)s: the broker may have some), or a new id from the consumers' sequence
# (coalesce draws it only when there is none). Byte order ("C") in the DISTINCT too: one
# sort then serves both, and a sort under C.UTF-8 goes through strcoll (24 s instead of 9
# for 20 M staged rows). OFFSET 0: ids are drawn in this order, after the sort. Each
# pointer's kind is the last one its rows name.
_POINTERS_CREATE_WITH_KINDS: Final = """
CREATE TEMP TABLE consumer_registration_pointers ON COMMIT DROP AS
SELECT remote_identifier, kind,
       coalesce(existing_id, nextval(%(consumer_ids)s::regclass)) AS consumer_id,
       existing_id IS NULL AS created, stored_kind
  FROM (SELECT p.remote_identifier, p.kind, c.id AS existing_id,
               c.remote_identifier_kind AS stored_kind
          FROM (SELECT DISTINCT ON (remote_identifier COLLATE "C") remote_identifier,
                       remote_identifier_kind AS kind
                  FROM consumer_registration_staging
                 ORDER BY remote_identifier COLLATE "C", remote_identifier_kind IS NULL,
                          line DESC) p
          LEFT JOIN integrations_consumer c
            ON %(existing)s AND c.broker_id = %(broker)s
           AND c.remote_identifier = p.remote_identifier
         ORDER BY p.remote_identifier COLLATE "C"
        OFFSET 0) ordered
"""
# The same when no row names a kind: no kind to sort for.
_POINTERS_CREATE: Final = """
CREATE TEMP TABLE consumer_registration_pointers ON COMMIT DROP AS
SELECT remote_identifier, kind,
       coalesce(existing_id, nextval(%(consumer_ids)s::regclass)) AS consumer_id,
       existing_id IS NULL AS created, stored_kind
  FROM (SELECT p.remote_identifier, p.kind, c.id AS existing_id,
               c.remote_identifier_kind AS stored_kind
          FROM (SELECT DISTINCT ON (remote_identifier COLLATE "C") remote_identifier,
                       NULL::text AS kind
                  FROM consumer_registration_staging
                 ORDER BY remote_identifier COLLATE "C") p
          LEFT JOIN integrations_consumer c
            ON %(existing)s AND c.broker_id = %(broker)s
           AND c.remote_identifier = p.remote_identifier
         ORDER BY p.remote_identifier COLLATE "C"
        OFFSET 0) ordered
"""
_KINDS_UPDATE: Final = """
UPDATE integrations_consumer c SET remote_identifier_kind = p.kind
  FROM consumer_registration_pointers p
 WHERE c.broker_id = %(broker)s AND c.id = p.consumer_id AND NOT p.created
   AND p.kind <> p.stored_kind
"""
# In remote_identifier order (the pointers' order): the unique index takes them page by
# page; the primary key's ids ascend with them. Byte order ("C"): a sort with abbreviated
# keys, and under a C or C.UTF-8 database collation the index's own order.
_CONSUMERS_INSERT: Final = """
INSERT INTO integrations_consumer (id, broker_id, remote_identifier, remote_identifier_kind)
SELECT consumer_id, %(broker)s, remote_identifier, coalesce(kind, %(default_kind)s)
  FROM consumer_registration_pointers
 WHERE created
"""
# A first set: every staged row into the fresh partition as it is, its consumer from every
# pointer (the unique index, built after, finds a repeated row). The partition's name is
# composed (fresh_partition.partition).
_PARTITION_FILL: Final = sql.SQL("""
INSERT INTO {partition} (id, hash_type, hash, broker_id, consumer_id)
SELECT nextval(%(hash_ids)s::regclass), s.hash_type, s.hash, %(broker)s, p.consumer_id
  FROM consumer_registration_staging s
  JOIN consumer_registration_pointers p USING (remote_identifier)
""")
# Otherwise each (hash, list type, consumer) once (a file may list the same identifier
# twice): a consumer created by this call has no hash to compare with; those of one that
# existed are anti-joined with the broker's partition (the planner picks index probes for
# an API call, one pass over the partition for a file). In hash order, so the index is
# walked once. Each one added also goes into the caller's relation ``into``, in the same
# statement (the RETURNING rows are not read again).
_HASHES_INSERT: Final = sql.SQL("""
WITH added AS (
    INSERT INTO integrations_consumerhash (broker_id, consumer_id, hash_type, hash)
    SELECT %(broker)s::bigint, h.consumer_id, h.hash_type, h.hash
      FROM (SELECT hash, hash_type, consumer_id
              FROM (SELECT DISTINCT s.hash, s.hash_type, p.consumer_id, p.created
                      FROM consumer_registration_staging s
                      JOIN consumer_registration_pointers p USING (remote_identifier)) n
             WHERE n.created
            UNION ALL
            SELECT hash, hash_type, consumer_id
              FROM (SELECT DISTINCT s.hash, s.hash_type, p.consumer_id, p.created
                      FROM consumer_registration_staging s
                      JOIN consumer_registration_pointers p USING (remote_identifier)) o
             WHERE NOT o.created
               AND NOT EXISTS (
                    SELECT FROM integrations_consumerhash r
                     WHERE r.broker_id = %(broker)s AND r.hash = o.hash
                       AND r.hash_type = o.hash_type AND r.consumer_id = o.consumer_id)) h
     ORDER BY h.hash, h.hash_type, h.consumer_id
    RETURNING consumer_id, hash_type, hash)
INSERT INTO {into} (consumer_id, hash_type, hash)
SELECT consumer_id, hash_type, hash FROM added
""")

# --- A replace: the hashes the source no longer gives a consumer it lists ---------------
# A listed consumer that existed keeps only the hashes the source gives it, of the list
# types the source carries anywhere (a file without a phone column says nothing of phones):
# a hash it kept would match someone else's DROP request, a recycled phone number. One pass
# over the broker's partition (no index leads with the consumer), anti-joined with the
# staged rows. Run before hashes_insert: what is left of those hashes is then what the
# consumers held before, less what this removed.
_STALE_DELETE: Final = """
DELETE FROM integrations_consumerhash h USING consumer_registration_pointers p
 WHERE h.broker_id = %(broker)s AND h.consumer_id = p.consumer_id AND NOT p.created
   AND h.hash_type IN (SELECT DISTINCT hash_type FROM consumer_registration_staging)
   AND NOT EXISTS (
        SELECT FROM consumer_registration_staging s
         WHERE s.remote_identifier = p.remote_identifier AND s.hash = h.hash
           AND s.hash_type = h.hash_type)
"""
_STALE_KEPT: Final = """
SELECT count(*) FROM integrations_consumerhash h
  JOIN consumer_registration_pointers p ON p.consumer_id = h.consumer_id AND NOT p.created
 WHERE h.broker_id = %(broker)s
   AND h.hash_type IN (SELECT DISTINCT hash_type FROM consumer_registration_staging)
"""

# --- A replace: the set's consumers the source did not list ----------------------------
# The kinds the source carries: those of the consumers it listed.
_LISTED_KINDS: Final = """
SELECT DISTINCT l.remote_identifier_kind FROM integrations_consumer l
  JOIN consumer_registration_pointers p ON p.consumer_id = l.id
 ORDER BY 1
"""
# The broker's consumers of those kinds that it did not list. One anti-join over the
# broker's consumers (its unique index starts with broker).
_FORGOTTEN_CREATE: Final = """
CREATE TEMP TABLE consumer_registration_forgotten ON COMMIT DROP AS
SELECT c.id FROM integrations_consumer c
 WHERE c.broker_id = %(broker)s
   AND c.remote_identifier_kind IN (
        SELECT DISTINCT l.remote_identifier_kind FROM integrations_consumer l
          JOIN consumer_registration_pointers p ON p.consumer_id = l.id)
   AND NOT EXISTS (SELECT 1 FROM consumer_registration_pointers p WHERE p.consumer_id = c.id)
"""
_SET_NOW: Final = """
SELECT count(*) FROM integrations_consumer c
 WHERE c.broker_id = %(broker)s
   AND c.remote_identifier_kind IN (
        SELECT DISTINCT l.remote_identifier_kind FROM integrations_consumer l
          JOIN consumer_registration_pointers p ON p.consumer_id = l.id)
"""
# Requests already made and reappearances keep their copy of the pointer (as
# consumer_forget does).
_FORGOTTEN_DELETION_REQUESTS: Final = """
UPDATE integrations_deletionrequest SET consumer_id = NULL
 WHERE consumer_id IN (SELECT id FROM consumer_registration_forgotten)
"""
_FORGOTTEN_RESOLUTION_REQUESTS: Final = """
UPDATE integrations_resolutionrequest SET consumer_id = NULL
 WHERE consumer_id IN (SELECT id FROM consumer_registration_forgotten)
"""
_FORGOTTEN_REAPPEARANCES: Final = """
UPDATE integrations_reappearance SET consumer_id = NULL
 WHERE consumer_id IN (SELECT id FROM consumer_registration_forgotten)
"""
_FORGOTTEN_HASHES_DELETE: Final = """
DELETE FROM integrations_consumerhash h USING consumer_registration_forgotten f
 WHERE h.broker_id = %(broker)s AND h.consumer_id = f.id
"""
_FORGOTTEN_CONSUMERS_DELETE: Final = """
DELETE FROM integrations_consumer c USING consumer_registration_forgotten f
 WHERE c.id = f.id
"""


def tables_drop(cursor: Any) -> None:
    cursor.execute(_TABLES_DROP)


def staging_create(cursor: Any) -> None:
    cursor.execute(_STAGING_CREATE)


def stage(cursor: Any, copy_data: bytes | bytearray) -> None:
    """Append one round of staging rows (COPY text, ``workers.staging_rows``)."""
    with cursor.copy(_STAGE) as copy:
        copy.write(copy_data)


def pointers_gather(
    cursor: Any, *, params: dict[str, Any], kinds_given: bool, existing: bool
) -> None:
    """Each staged pointer once, with its consumer id; ``existing``: look for the broker's
    consumers already there (none: every pointer is new)."""
    cursor.execute(_STAGING_ANALYZE)
    statement = _POINTERS_CREATE_WITH_KINDS if kinds_given else _POINTERS_CREATE
    cursor.execute(statement, {**params, "existing": existing})
    cursor.execute(_POINTERS_ANALYZE)


def kinds_update(cursor: Any, *, params: dict[str, Any]) -> int:
    """The kinds the rows name for consumers that existed; return how many changed."""
    cursor.execute(_KINDS_UPDATE, params)
    return int(cursor.rowcount)


def consumers_insert(cursor: Any, *, params: dict[str, Any]) -> int:
    cursor.execute(_CONSUMERS_INSERT, params)
    return int(cursor.rowcount)


def partition_fill(cursor: Any, *, params: dict[str, Any], broker_pk: int) -> int:
    """A first set: every staged row into the fresh partition (made by
    ``fresh_partition.partition_make``); return how many."""
    cursor.execute(_PARTITION_FILL.format(partition=fresh_partition.partition(broker_pk)), params)
    return int(cursor.rowcount)


def hashes_insert(cursor: Any, *, params: dict[str, Any], into: sql.Composable) -> int:
    """The new hashes, each also inserted into ``into`` (the caller's relation
    ``(consumer_id, hash_type, hash)``, written here, never read);
    return how many."""
    cursor.execute(_HASHES_INSERT.format(into=into), params)
    return int(cursor.rowcount)


def stale_forget(cursor: Any, *, params: dict[str, Any]) -> tuple[int, int]:
    """A replace, once the pointers are gathered and before ``hashes_insert``: delete the
    hashes of the carried list types that the listed consumers which existed hold and the
    source does not give them; return how many, and how many of those types they held.
    The second is counted only when the first is not 0 (0 otherwise: no guard to weigh)."""
    cursor.execute(_STALE_DELETE, params)
    removed = int(cursor.rowcount)
    if not removed:
        return 0, 0
    cursor.execute(_STALE_KEPT, params)
    return removed, removed + int(cursor.fetchone()[0])


def unlisted_count(cursor: Any, *, broker_pk: int) -> tuple[int, int]:
    """The broker's consumers of the listed kinds that the call did not list (kept aside
    for ``unlisted_forget``), and how many consumers of those kinds there are now."""
    params = {"broker": broker_pk}
    cursor.execute(_FORGOTTEN_CREATE, params)
    forgotten = int(cursor.rowcount)
    cursor.execute(_SET_NOW, params)
    return forgotten, int(cursor.fetchone()[0])


def unlisted_forget(cursor: Any, *, broker_pk: int) -> int:
    """Forget what ``unlisted_count`` found; return the hashes removed."""
    cursor.execute(_FORGOTTEN_DELETION_REQUESTS)
    cursor.execute(_FORGOTTEN_RESOLUTION_REQUESTS)
    cursor.execute(_FORGOTTEN_REAPPEARANCES)
    cursor.execute(_FORGOTTEN_HASHES_DELETE, {"broker": broker_pk})
    hashes_removed = int(cursor.rowcount)
    cursor.execute(_FORGOTTEN_CONSUMERS_DELETE)
    return hashes_removed


def listed_kinds(cursor: Any) -> list[str]:
    """A replace: the kinds of the consumers the call listed."""
    cursor.execute(_LISTED_KINDS)
    return [kind for (kind,) in cursor.fetchall()]
