"""A broker's first set, merged round by round as it is read, while its pointers ascend.

``load.ConsumerLoad`` calls it for a broker's first set (into its fresh partition) as long
as every pointer so far ascends in byte order, as in a file sorted by ``remote_identifier``
(``ORDER BY remote_identifier COLLATE "C"``, ``LC_ALL=C sort``)::

    tables_create(cursor)                          # once
    with transaction.atomic():                     # a savepoint per round
        consumers, hashes = round_merge(cursor, copy_data=..., params=..., broker_pk=...,
                                       starts=..., skips=..., kinds_named_later=...)
    round_clear(cursor)                            # staging emptied, the last pointer kept

Such a file is already in key order: each round is copied into this module's staging
table, its new consumers are appended to the consumers' indexes and its hashes to the
fresh partition, each joined with the round's own consumers only, and the staging table is
emptied, so what is left at the end is the index builds. A round found out of order stops
this: ``load`` hands it and every later round to ``merge_general``, with its own staging.

Why a path of its own (docs/benchmarks.md, the streamed first load against the general
merge at 10 M): the general merge, forced on the same 10 M first set, took 1.28 and 1.41
times as long. The database does the same work either way; here it merges while the
hashing workers read the next round instead of after the last one.

This module's temp tables, made, read and dropped here only: the round's staging rows
(``consumer_registration_round_staging``) and its consumers
(``consumer_registration_round_pointers``, with the last one of the round before).
"""

from __future__ import annotations

from typing import Any, Final

from psycopg import sql

from integrations.consumers import fresh_partition

__all__ = ["round_clear", "round_merge", "tables_create", "tables_drop"]

_TABLES_CREATE: Final = """
CREATE TEMP SEQUENCE consumer_registration_round_line;
CREATE TEMP TABLE consumer_registration_round_staging (
    -- The row's ordinal in the call (COPY takes rows in order): a row's batch is found
    -- from it (load.StagedBatches counts the same lines).
    line bigint NOT NULL DEFAULT nextval('consumer_registration_round_line'),
    remote_identifier text NOT NULL,
    remote_identifier_kind text,
    hash_type text NOT NULL,
    hash bytea NOT NULL,
    -- The pointer's number in its batch of the file, and true on its first row
    -- (workers.staging_rows): a round's pointers are drawn from them.
    pointer_in_batch integer NOT NULL,
    first_row boolean NOT NULL
) ON COMMIT DROP;
-- The consumers of the round being merged, and the last one of the round before.
CREATE TEMP TABLE consumer_registration_round_pointers (
    consumer_id bigint NOT NULL,
    remote_identifier text NOT NULL
) ON COMMIT DROP
"""
_TABLES_DROP: Final = (
    "DROP TABLE IF EXISTS consumer_registration_round_staging,"
    " consumer_registration_round_pointers;"
    " DROP SEQUENCE IF EXISTS consumer_registration_round_line"
)
_STAGE: Final = (
    "COPY consumer_registration_round_staging"
    " (remote_identifier, remote_identifier_kind, hash_type, hash, pointer_in_batch, first_row)"
    " FROM STDIN"
)
# Each pointer's first row, once (a batch's pointer 0 that runs on is skipped:
# width_bucket finds a row's batch from its line, by binary search in the batches' first
# lines), in file order, so the consumers' unique index is appended to and the ids drawn
# ascend with the keys (OFFSET 0: drawn in the staged rows' order).
_ROUND_CONSUMERS: Final = """
WITH inserted AS (
    INSERT INTO integrations_consumer (id, broker_id, remote_identifier, remote_identifier_kind)
    SELECT nextval(%(consumer_ids)s::regclass), %(broker)s, remote_identifier,
           coalesce(remote_identifier_kind, %(default_kind)s)
      FROM (SELECT s.remote_identifier, s.remote_identifier_kind
              FROM consumer_registration_round_staging s
             WHERE s.first_row
               AND s.pointer_in_batch
                   >= (%(skips)s::int[])[width_bucket(s.line, %(starts)s::bigint[])]
            OFFSET 0) firsts
    RETURNING id, remote_identifier)
INSERT INTO consumer_registration_round_pointers (consumer_id, remote_identifier)
SELECT id, remote_identifier FROM inserted
"""
# The round's hashes into the fresh partition, each joined with the round's own consumers
# (a join in memory); the unique index, built after, finds a repeated row. The partition's
# name is composed (fresh_partition.partition).
_PARTITION_FILL: Final = sql.SQL("""
INSERT INTO {partition} (id, hash_type, hash, broker_id, consumer_id)
SELECT nextval(%(hash_ids)s::regclass), s.hash_type, s.hash, %(broker)s, p.consumer_id
  FROM consumer_registration_round_staging s
  JOIN consumer_registration_round_pointers p USING (remote_identifier)
""")
# The kind a later batch names for a pointer that ran on into it (StagedBatches.kinds).
_KINDS_NAMED_LATER: Final = """
UPDATE integrations_consumer c SET remote_identifier_kind = k.kind
  FROM unnest(%(keys)s::text[], %(kinds)s::text[]) AS k (remote_identifier, kind)
 WHERE c.broker_id = %(broker)s AND c.remote_identifier = k.remote_identifier
"""
_ROUND_LAST_POINTER: Final = """
SELECT consumer_id, remote_identifier FROM consumer_registration_round_pointers
 ORDER BY consumer_id DESC LIMIT 1
"""
_ROUND_CLEAR: Final = (
    "TRUNCATE consumer_registration_round_staging, consumer_registration_round_pointers"
)
_ROUND_LAST_KEEP: Final = "INSERT INTO consumer_registration_round_pointers VALUES (%s, %s)"


def tables_create(cursor: Any) -> None:
    cursor.execute(_TABLES_CREATE)


def tables_drop(cursor: Any) -> None:
    cursor.execute(_TABLES_DROP)


def round_merge(
    cursor: Any,
    *,
    copy_data: bytes | bytearray,
    params: dict[str, Any],
    broker_pk: int,
    starts: list[int],
    skips: list[int],
    kinds_named_later: dict[str, str],
) -> tuple[int, int]:
    """Stage one round (COPY text, ``workers.staging_rows``) and merge it into the
    consumers and the fresh partition (made by ``fresh_partition.partition_make``); return
    the consumers and the hashes it added.

    ``starts`` and ``skips``: per batch of the round, the staging line of its first row,
    and 1 when its pointer 0 runs on from the batch before (``load.StagedBatches``);
    ``kinds_named_later``: the kind a batch names for such a pointer."""
    with cursor.copy(_STAGE) as copy:
        copy.write(copy_data)
    params = {**params, "starts": starts, "skips": skips}
    cursor.execute(_ROUND_CONSUMERS, params)
    consumers = int(cursor.rowcount)
    cursor.execute(_PARTITION_FILL.format(partition=fresh_partition.partition(broker_pk)), params)
    hashes = int(cursor.rowcount)
    if kinds_named_later:
        keys, kinds = zip(*kinds_named_later.items(), strict=True)
        cursor.execute(_KINDS_NAMED_LATER, {**params, "keys": list(keys), "kinds": list(kinds)})
    return consumers, hashes


def round_clear(cursor: Any) -> None:
    """Empty the staging table, keeping the round's last consumer: the next round's first
    rows may be its own. Outside the round's savepoint, TRUNCATE of a table this
    transaction made frees its pages there and then."""
    cursor.execute(_ROUND_LAST_POINTER)
    last = cursor.fetchone()
    cursor.execute(_ROUND_CLEAR)
    if last is not None:
        cursor.execute(_ROUND_LAST_KEEP, list(last))
