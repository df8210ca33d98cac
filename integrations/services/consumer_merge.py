"""Staging a registration's rows and merging them into the consumer tables, in key order.

``services.consumers.consumers_register`` drives it, inside its transaction and under the
broker's registration lock::

    staging_create(cursor)
    numbering = PointerNumbering()
    for round in rounds:                                            # COPY, round by round
        staging_copy(cursor, round.copy_data)   # (numbering.add(batch) for its batches)
    merged = staging_merge(cursor, broker_pk=..., numbering=numbering)
    # new_consumer_hashes(consumer_id, hash_type, hash): the hashes this call added

Why this shape (docs/benchmarks.md, consumer import):

- Every row is staged first and merged once, by set-based statements that sort: the
  consumers go in in ``remote_identifier`` order and the hashes in hash order, so each
  B-tree is walked once from left to right. Merging round by round inserted each round's
  keys all over indexes larger than memory: a 10 M import grew 14.7 times for 10 times the
  rows.
- Consumer hashes are partitioned by broker (migration 0026): one broker's index is the
  size of its own set. A broker's first set goes into a **fresh partition**: a plain table
  filled without indexes, its indexes built after (a sort and a bottom-up build, far less
  than an insert per key), then attached. Attaching takes no lock that stops readers or
  writers of the other partitions (two brokers' first loads attach one after the other), and
  it is part of the transaction: an import that fails leaves no partition behind.
- Otherwise (the broker has a partition, or rows in the default one) the new hashes are
  inserted in hash order, each probed first: a repeated import adds nothing.
- Consumer ids are drawn from the sequence while the pointers are gathered, so the hashes
  name their consumer without reading the consumers back.
- A broker's first set from a file sorted by ``remote_identifier`` (byte order, as an
  export ``ORDER BY remote_identifier COLLATE "C"`` or ``LC_ALL=C sort`` gives) skips even
  that: the hashing workers number the pointers, and every staged row gets its consumer id
  from its number, with no sort of the staged rows and no join with the pointers (about a
  tenth of a 10 M load). Each pointer's kind comes with its first staged row. Checked, and
  rolled back to the general merge if the numbers do not hold.

The SQL names its tables literally; statements are constants, never built from input
(the partition's name is made from the broker's integer primary key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction

from integrations.drop.registration import DEFAULT_KIND
from integrations.drop.registration_workers import EncodedBatch

NEW_CONSUMER_HASHES = "new_consumer_hashes"
PARTITION_PREFIX = "integrations_consumerhash_b"
# Sorts and hash joins of the merge, and the index builds of a fresh partition, in memory
# as far as this allows. The importing process's own 500 MB are not the server's.
MERGE_WORK_MEM = "256MB"
MERGE_MAINTENANCE_WORK_MEM = "512MB"


@dataclass(frozen=True)
class Merged:
    consumers_created: int
    kinds_changed: int
    hashes_added: int
    fresh_partition: bool
    numbered: bool = False  # consumer ids from the file's own order, without a join


@dataclass
class PointerNumbering:
    """The call's pointers numbered 0, 1, ... in file order, from the batches' own numbers.

    Each batch numbers its pointers from 0 (``EncodedBatch``); fed the batches in staging
    order, this keeps, per batch, the staging line of its first row, the offset that makes
    its numbers the call's, and whether its pointer 0 runs on from the previous batch (a
    pointer whose rows straddle two batches). When every pointer ascends in byte order,
    each appears once, so number ``n`` can be consumer id ``n + shift``: the merge then
    gives every staged row its consumer without a join.

    A pointer's kind is on its first staged row, as far as its batch knows it; ``kinds``
    holds the kind a later batch names for a pointer that runs on into it, and
    ``kinds_given`` whether any staged row names one.
    """

    starts: list[int] = field(default_factory=list)  # staging lines count from 1
    offsets: list[int] = field(default_factory=list)
    skips: list[int] = field(default_factory=list)  # 1: pointer 0 is the previous one
    kinds: dict[int, str] = field(default_factory=dict)  # pointer number: its last kind
    kinds_given: bool = False
    pointers: int = 0  # numbered in all
    ascending: bool = True
    _next_line: int = 1
    _last: str | None = None  # the last batch's last pointer

    def add(self, batch: EncodedBatch) -> None:
        if not batch.hashes:
            return
        first = batch.first_remote_identifier or ""  # a batch with rows has pointers
        runs_on = first == self._last
        if not batch.ascending or (self._last is not None and first < self._last):
            self.ascending = False
        self.starts.append(self._next_line)
        self.offsets.append(self.pointers - runs_on)
        self.skips.append(int(runs_on))
        self.kinds_given = self.kinds_given or batch.kinds_given
        if runs_on and batch.first_pointer_kind is not None:
            self.kinds[self.pointers - 1] = batch.first_pointer_kind
        self._next_line += batch.hashes
        self.pointers += batch.pointers - runs_on
        self._last = batch.last_remote_identifier


def partition_name(broker_pk: int) -> str:
    return f"{PARTITION_PREFIX}{int(broker_pk)}"


_CREATE_TABLES = """
CREATE TEMP SEQUENCE consumer_registration_line;
CREATE TEMP TABLE consumer_registration_staging (
    -- The row's ordinal in the call (COPY takes rows in order): files restart their line
    -- numbers, and the last row naming a kind gives the pointer's kind.
    line bigint NOT NULL DEFAULT nextval('consumer_registration_line'),
    remote_identifier text NOT NULL,
    remote_identifier_kind text,
    hash_type text NOT NULL,
    hash bytea NOT NULL,
    -- The pointer's number in its batch of the file, and true on its first row
    -- (registration_workers.staging_rows): PointerNumbering makes them the call's.
    pointer_in_batch integer NOT NULL,
    first_row boolean NOT NULL
) ON COMMIT DROP;
CREATE TEMP TABLE consumer_registration_seen (consumer_id bigint NOT NULL) ON COMMIT DROP;
"""
DROP_TABLES = (
    # new_consumer_hashes is a view over a fresh partition, a table otherwise.
    "DO $$ BEGIN IF EXISTS (SELECT FROM pg_class WHERE relkind = 'v'"
    " AND oid = to_regclass('pg_temp.new_consumer_hashes')) THEN"
    " DROP VIEW new_consumer_hashes; END IF; END $$;"
    " DROP TABLE IF EXISTS consumer_registration_staging, consumer_registration_pointers,"
    " new_consumer_hashes, consumer_registration_seen, consumer_registration_forgotten;"
    " DROP SEQUENCE IF EXISTS consumer_registration_line"
)
_STAGE = (
    "COPY consumer_registration_staging"
    " (remote_identifier, remote_identifier_kind, hash_type, hash, pointer_in_batch, first_row)"
    " FROM STDIN"
)
# Each pointer once, in remote_identifier order, with its consumer: the existing one, or
# a new id from the consumers' sequence (coalesce draws it only when there is none). Byte
# order ("C") in the DISTINCT too: one sort then serves both, and a sort under C.UTF-8 goes
# through strcoll (24 s instead of 9 for 20 M staged rows).
_POINTERS_WITH_KINDS = """
SELECT DISTINCT ON (remote_identifier COLLATE "C") remote_identifier,
       remote_identifier_kind AS kind
  FROM consumer_registration_staging
 ORDER BY remote_identifier COLLATE "C", remote_identifier_kind IS NULL, line DESC
"""
_POINTERS = """
SELECT DISTINCT ON (remote_identifier COLLATE "C") remote_identifier, NULL::text AS kind
  FROM consumer_registration_staging
 ORDER BY remote_identifier COLLATE "C"
"""
_POINTERS_CREATE = """
CREATE TEMP TABLE consumer_registration_pointers ON COMMIT DROP AS
SELECT remote_identifier, kind,
       coalesce(existing_id, nextval(%(consumer_ids)s::regclass))
           AS consumer_id,
       existing_id IS NULL AS created, stored_kind
  FROM (SELECT p.remote_identifier, p.kind, c.id AS existing_id,
               c.remote_identifier_kind AS stored_kind
          FROM ({pointers}) p
          LEFT JOIN integrations_consumer c
            ON {existing} AND c.broker_id = %(broker)s
           AND c.remote_identifier = p.remote_identifier
         ORDER BY p.remote_identifier COLLATE "C"
        OFFSET 0) ordered  -- OFFSET 0: ids are drawn in this order, after the sort
"""
_KINDS_UPDATE = """
UPDATE integrations_consumer c SET remote_identifier_kind = p.kind
  FROM consumer_registration_pointers p
 WHERE c.broker_id = %(broker)s AND c.id = p.consumer_id AND NOT p.created
   AND p.kind <> p.stored_kind
"""
# In remote_identifier order (the pointers' order): the unique index takes them page by
# page; the primary key's ids ascend with them. Byte order ("C"): a sort with abbreviated
# keys, and under a C or C.UTF-8 database collation the index's own order.
_CONSUMERS_INSERT = """
INSERT INTO integrations_consumer (id, broker_id, remote_identifier, remote_identifier_kind)
SELECT consumer_id, %(broker)s, remote_identifier, coalesce(kind, %(default_kind)s)
  FROM consumer_registration_pointers
 WHERE created
"""
# Each (hash, list type, consumer) once: a file may list the same identifier twice.
_HASHES = """
SELECT DISTINCT s.hash, s.hash_type, p.consumer_id, p.created
  FROM consumer_registration_staging s
  JOIN consumer_registration_pointers p USING (remote_identifier)
"""
# A fresh partition's first try (_fresh_partition_fill): every staged row as it is.
_HASHES_AS_STAGED = """
SELECT s.hash, s.hash_type, p.consumer_id
  FROM consumer_registration_staging s
  JOIN consumer_registration_pointers p USING (remote_identifier)
"""
# A broker's first set: a plain table, the partition-to-be, filled in hash order.
_FRESH_CREATE = """
CREATE TABLE {partition} (
    id bigint NOT NULL,
    hash_type varchar(8) NOT NULL,
    hash bytea NOT NULL,
    broker_id bigint NOT NULL CHECK (broker_id = {broker}),
    consumer_id bigint NOT NULL
) WITH (autovacuum_enabled = false)
"""
_FRESH_INSERT = """
INSERT INTO {partition} (id, hash_type, hash, broker_id, consumer_id)
SELECT nextval(%(hash_ids)s::regclass), h.hash_type, h.hash,
       %(broker)s, h.consumer_id
  FROM ({hashes}) h
"""
# The indexes of the partitioned table, built once over the loaded rows; ATTACH finds
# them and adopts them as the partition's own (nothing is built twice).
_FRESH_INDEXES = (
    "ALTER TABLE {partition} ADD PRIMARY KEY (broker_id, id)",
    "ALTER TABLE {partition} ADD UNIQUE (broker_id, hash, hash_type, consumer_id)",
    "CREATE INDEX ON {partition} (consumer_id)",
    "ALTER TABLE {partition} SET (autovacuum_enabled = true)",
    "ALTER TABLE integrations_consumerhash ATTACH PARTITION {partition} FOR VALUES IN ({broker})",
    "ANALYZE {partition}",
    # The late match reads what this call added: here, the whole new partition.
    "CREATE TEMP VIEW new_consumer_hashes AS SELECT consumer_id, hash_type, hash FROM {partition}",
)
# A file sorted by remote_identifier, for a broker with no consumers (PointerNumbering):
# each pointer's first row gives its kind and draws its consumer id, in file order, and
# the id must then be the pointer's number plus one shift (checked); every staged row's
# consumer is its number plus that shift, with no join of the staged rows with the
# pointers. width_bucket finds a row's batch from its line by binary search in the
# batches' first lines.
_NUMBERED_POINTERS_CREATE = """
CREATE TEMP TABLE consumer_registration_pointers ON COMMIT DROP AS
SELECT remote_identifier, kind,
       nextval(%(consumer_ids)s::regclass) AS consumer_id,
       true AS created, NULL::text AS stored_kind, pointer_number
  FROM (SELECT s.remote_identifier, s.remote_identifier_kind AS kind,
               (%(offsets)s::bigint[])[width_bucket(s.line, %(starts)s::bigint[])]
                   + s.pointer_in_batch AS pointer_number
          FROM consumer_registration_staging s
         WHERE s.first_row
           AND s.pointer_in_batch >= (%(skips)s::int[])[width_bucket(s.line, %(starts)s::bigint[])]
        OFFSET 0) numbered  -- OFFSET 0: ids are drawn in the staged rows' order
"""
# The kind a later batch names for a pointer that ran on into it (PointerNumbering.kinds).
_NUMBERED_KINDS_UPDATE = """
UPDATE consumer_registration_pointers p SET kind = k.kind
  FROM unnest(%(numbers)s::bigint[], %(kinds)s::text[]) AS k (pointer_number, kind)
 WHERE p.pointer_number = k.pointer_number
"""
_NUMBERED_CHECK = """
SELECT count(*), min(pointer_number), max(pointer_number),
       min(consumer_id - pointer_number), max(consumer_id - pointer_number)
  FROM consumer_registration_pointers
"""
_NUMBERED_HASHES_AS_STAGED = """
SELECT s.hash, s.hash_type,
       (%(offsets)s::bigint[])[width_bucket(s.line, %(starts)s::bigint[])]
           + s.pointer_in_batch + %(shift)s AS consumer_id
  FROM consumer_registration_staging s
"""
_NUMBERED_HASHES = """
SELECT DISTINCT h.hash, h.hash_type, h.consumer_id FROM ({hashes}) h
"""
# Otherwise: a consumer created by this call has no hash to compare with; those of one
# that existed are anti-joined with the broker's partition (the planner picks index probes
# for an API call, one pass over the partition for a file). In hash order, so the index is
# walked once.
_HASHES_INSERT = """
CREATE TEMP TABLE new_consumer_hashes ON COMMIT DROP AS
WITH added AS (
    INSERT INTO integrations_consumerhash (broker_id, consumer_id, hash_type, hash)
    SELECT %(broker)s::bigint, h.consumer_id, h.hash_type, h.hash
      FROM (SELECT hash, hash_type, consumer_id FROM ({hashes}) n WHERE n.created
            UNION ALL
            SELECT hash, hash_type, consumer_id FROM ({hashes}) o
             WHERE NOT o.created
               AND NOT EXISTS (
                    SELECT FROM integrations_consumerhash r
                     WHERE r.broker_id = %(broker)s AND r.hash = o.hash
                       AND r.hash_type = o.hash_type AND r.consumer_id = o.consumer_id)) h
     ORDER BY h.hash, h.hash_type, h.consumer_id
    RETURNING consumer_id, hash_type, hash)
SELECT consumer_id, hash_type, hash FROM added
"""


def staging_create(cursor: Any) -> None:
    cursor.execute(DROP_TABLES)
    cursor.execute(_CREATE_TABLES)


def staging_copy(cursor: Any, copy_data: bytes | bytearray) -> None:
    """Append one round of staging rows (COPY text) to the staging table."""
    with cursor.copy(_STAGE) as copy:
        copy.write(copy_data)


class _NotInFileOrder(Exception):
    """The consumer ids drawn do not follow the pointers' numbers (another session drew
    from the sequence meanwhile, say): the numbered load is rolled back."""


def staging_merge(
    cursor: Any,
    *,
    broker_pk: int,
    numbering: PointerNumbering,
) -> Merged:
    """Merge everything staged into the broker's consumers and consumer hashes.

    ``numbering``: the staged batches' pointer numbers; when they ascend and the broker has
    no consumer, the merge takes the numbered load, else (or when that fails) the general
    one. Either way it leaves ``consumer_registration_pointers`` (every pointer staged,
    with its consumer id) and ``new_consumer_hashes(consumer_id, hash_type, hash)`` until
    the transaction ends.
    """
    cursor.execute(
        "SELECT pg_get_serial_sequence('integrations_consumer', 'id'),"
        " pg_get_serial_sequence('integrations_consumerhash', 'id')"
    )
    consumer_ids, hash_ids = cursor.fetchone()  # looked up once, not per row
    params = {
        "broker": broker_pk,
        "default_kind": DEFAULT_KIND,
        "consumer_ids": consumer_ids,
        "hash_ids": hash_ids,
    }
    cursor.execute(f"SET LOCAL work_mem = '{MERGE_WORK_MEM}'")
    cursor.execute(f"SET LOCAL maintenance_work_mem = '{MERGE_MAINTENANCE_WORK_MEM}'")
    cursor.execute("ANALYZE consumer_registration_staging")
    cursor.execute(
        "SELECT EXISTS (SELECT 1 FROM integrations_consumer WHERE broker_id = %(broker)s)", params
    )
    # No consumer yet: every pointer is new, nothing to look up.
    existing = "true" if cursor.fetchone()[0] else "false"
    fresh = _fresh_partition_possible(cursor, broker_pk)
    if numbering.ascending and existing == "false" and fresh:
        try:
            with transaction.atomic():  # a savepoint: a failure leaves the general way open
                return _numbered_load(cursor, broker_pk, params, numbering)
        except (IntegrityError, _NotInFileOrder):
            pass
    kinds_given = numbering.kinds_given
    pointers = _POINTERS_WITH_KINDS if kinds_given else _POINTERS
    cursor.execute(
        _POINTERS_CREATE.replace("{pointers}", pointers).replace("{existing}", existing), params
    )
    cursor.execute("ANALYZE consumer_registration_pointers")
    kinds_changed = 0
    if kinds_given and existing == "true":
        cursor.execute(_KINDS_UPDATE, params)
        kinds_changed = cursor.rowcount
    cursor.execute(_CONSUMERS_INSERT, params)
    consumers_created = cursor.rowcount
    if fresh:
        hashes_added = _fresh_partition_fill(cursor, broker_pk, params, _HASHES_AS_STAGED, _HASHES)
    else:
        cursor.execute(_HASHES_INSERT.replace("{hashes}", _HASHES), params)
        hashes_added = cursor.rowcount
        cursor.execute(f"ANALYZE {NEW_CONSUMER_HASHES}")
    return Merged(consumers_created, kinds_changed, hashes_added, fresh)


def _numbered_load(
    cursor: Any, broker_pk: int, params: dict[str, Any], numbering: PointerNumbering
) -> Merged:
    """A broker's first set, from a file in remote_identifier order: no join, no sort of
    the staged rows (``_NUMBERED_POINTERS_CREATE``)."""
    params = {
        **params,
        "starts": numbering.starts,
        "offsets": numbering.offsets,
        "skips": numbering.skips,
    }
    cursor.execute(_NUMBERED_POINTERS_CREATE, params)
    cursor.execute(_NUMBERED_CHECK)
    count, low, high, shift, other_shift = cursor.fetchone()
    # Every number once (count and range), each consumer id its number plus one shift.
    if (count, low, high) != (numbering.pointers, 0, numbering.pointers - 1) or (
        shift != other_shift
    ):
        raise _NotInFileOrder
    if numbering.kinds:
        numbers, kinds = zip(*numbering.kinds.items(), strict=True)
        cursor.execute(_NUMBERED_KINDS_UPDATE, {"numbers": list(numbers), "kinds": list(kinds)})
    cursor.execute(_CONSUMERS_INSERT, params)
    consumers_created = cursor.rowcount
    params["shift"] = shift
    hashes_added = _fresh_partition_fill(
        cursor,
        broker_pk,
        params,
        _NUMBERED_HASHES_AS_STAGED,
        _NUMBERED_HASHES.replace("{hashes}", _NUMBERED_HASHES_AS_STAGED),
    )
    return Merged(consumers_created, 0, hashes_added, fresh_partition=True, numbered=True)


def _fresh_partition_fill(
    cursor: Any, broker_pk: int, params: dict[str, Any], as_staged: str, distinct: str
) -> int:
    """The fresh partition from every staged row as it is; when its unique index refuses
    them (the file repeats a hash of a consumer), rolled back and made again from the rows
    de-duplicated (a DISTINCT costs about a third of the load, so only then)."""
    try:
        with transaction.atomic():  # a savepoint
            return _fresh_partition_load(cursor, broker_pk, params, as_staged)
    except IntegrityError:
        return _fresh_partition_load(cursor, broker_pk, params, distinct)


def _fresh_partition_load(cursor: Any, broker_pk: int, params: dict[str, Any], hashes: str) -> int:
    """Load the broker's hashes into a new table, index it, attach it; return the rows."""
    partition = partition_name(broker_pk)
    cursor.execute(_FRESH_CREATE.format(partition=partition, broker=int(broker_pk)))
    cursor.execute(_FRESH_INSERT.format(partition=partition, hashes=hashes), params)
    loaded = int(cursor.rowcount)
    for statement in _FRESH_INDEXES:
        cursor.execute(statement.format(partition=partition, broker=int(broker_pk)))
    return loaded


def _fresh_partition_possible(cursor: Any, broker_pk: int) -> bool:
    """The broker has no partition of its own yet, and no hash in the default one."""
    cursor.execute(
        "SELECT to_regclass(%s) IS NULL"
        " AND NOT EXISTS (SELECT 1 FROM integrations_consumerhash_default"
        "                  WHERE broker_id = %s)",
        [partition_name(broker_pk), broker_pk],
    )
    return bool(cursor.fetchone()[0])
