"""A broker's first set, merged round by round as it is read, while its pointers ascend.

``load.ConsumerLoad`` calls it for a broker's first set (into its fresh partition) as long
as every pointer so far ascends in byte order, as in a file sorted by ``remote_identifier``
(``ORDER BY remote_identifier COLLATE "C"``, ``LC_ALL=C sort``)::

    round_pointers_create(cursor)                  # once
    consumers, hashes = round_merge(cursor, params=..., broker_pk=..., starts=...,
                                   skips=..., kinds_named_later=...)
    round_clear(cursor)                            # staging emptied, the last pointer kept

Such a file is already in key order: each round's new consumers are appended to the
consumers' indexes and its hashes to the fresh partition, each joined with the round's own
consumers only (``consumer_registration_round_pointers``, this module's), and the staging
table is emptied, so what is left at the end is the index builds. A round found out of
order stops this: it and every later round wait for ``merge_general``.
"""

from __future__ import annotations

from typing import Any, Final

from psycopg import sql

from integrations.consumers import fresh_partition

__all__ = ["round_clear", "round_merge", "round_pointers_create", "round_pointers_drop"]

# The consumers of the round being merged, and the last one of the round before.
_ROUND_POINTERS: Final = sql.Identifier("consumer_registration_round_pointers")
_ROUND_POINTERS_CREATE: Final = """
CREATE TEMP TABLE consumer_registration_round_pointers (
    consumer_id bigint NOT NULL,
    remote_identifier text NOT NULL
) ON COMMIT DROP
"""
_ROUND_POINTERS_DROP: Final = "DROP TABLE IF EXISTS consumer_registration_round_pointers"
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
              FROM consumer_registration_staging s
             WHERE s.first_row
               AND s.pointer_in_batch
                   >= (%(skips)s::int[])[width_bucket(s.line, %(starts)s::bigint[])]
            OFFSET 0) firsts
    RETURNING id, remote_identifier)
INSERT INTO consumer_registration_round_pointers (consumer_id, remote_identifier)
SELECT id, remote_identifier FROM inserted
"""
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
_ROUND_CLEAR: Final = "TRUNCATE consumer_registration_staging, consumer_registration_round_pointers"
_ROUND_LAST_KEEP: Final = "INSERT INTO consumer_registration_round_pointers VALUES (%s, %s)"


def round_pointers_create(cursor: Any) -> None:
    cursor.execute(_ROUND_POINTERS_CREATE)


def round_pointers_drop(cursor: Any) -> None:
    cursor.execute(_ROUND_POINTERS_DROP)


def round_merge(
    cursor: Any,
    *,
    params: dict[str, Any],
    broker_pk: int,
    starts: list[int],
    skips: list[int],
    kinds_named_later: dict[str, str],
) -> tuple[int, int]:
    """Merge the staged round; return the consumers and the hashes it added.

    ``starts`` and ``skips``: per batch of the round, the staging line of its first row,
    and 1 when its pointer 0 runs on from the batch before (``load.StagedBatches``);
    ``kinds_named_later``: the kind a batch names for such a pointer."""
    params = {**params, "starts": starts, "skips": skips}
    cursor.execute(_ROUND_CONSUMERS, params)
    consumers = int(cursor.rowcount)
    # Its hashes, each joined with the round's own consumers (a join in memory).
    hashes = fresh_partition.partition_fill(
        cursor, params=params, broker_pk=broker_pk, pointers=_ROUND_POINTERS
    )
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
