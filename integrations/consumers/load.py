"""Staging a registration's rows and merging them into the consumer tables, in key order.

``services.consumers.consumers_register`` drives it, inside its transaction and under the
broker's registration lock::

    load = ConsumerLoad(cursor, broker_pk=...)  # staging tables
    batches = StagedBatches()
    for copy_data in rounds:                    # batches.add(batch) for each of its batches
        load.stage(batches.round(copy_data))    # COPY; a first set in key order: merged
    merged = load.finish()
    # new_consumer_hashes(consumer_id, hash_type, hash): the hashes this call added

Why this shape (docs/benchmarks.md, consumer import):

- Every row is merged by set-based statements in key order: the consumers go in in
  ``remote_identifier`` order and the hashes in hash order, so each B-tree is walked once
  from left to right. Merging each round of a file in no key order as it came inserted its
  keys all over indexes larger than memory: a 10 M import grew 14.7 times for 10 times the
  rows. So such a call's rows are staged, then merged once.
- Consumer hashes are partitioned by broker (migration 0026): one broker's index is the
  size of its own set. A broker's first set goes into a **fresh partition**: a plain table
  filled without indexes, its indexes built after (a sort and a bottom-up build, far less
  than an insert per key), then attached. Attaching takes no lock that stops readers or
  writers of the other partitions (two brokers' first loads attach one after the other), and
  it is part of the transaction: an import that fails leaves no partition behind.
- A broker's first set from a file sorted by ``remote_identifier`` (byte order, as an
  export ``ORDER BY remote_identifier COLLATE "C"`` or ``LC_ALL=C sort`` gives) is already
  in key order: each round is merged as soon as it is staged, while the next one is read
  and hashed. Its new consumers are appended to the consumers' indexes, its hashes to the
  fresh partition, each joined with the round's own consumers only, and the staging table
  is emptied. What is left at the end is the index builds. A round found out of order
  stops this: it and every later round wait for the end, when the general merge finds the
  consumers already loaded and fills the same partition.
- Otherwise (the broker has consumers, a partition, or rows in the default one) the new
  hashes are inserted in hash order, each probed first: a repeated import adds nothing.
- Consumer ids are drawn from the sequence while the pointers are gathered, so the hashes
  name their consumer without reading the consumers back.

The SQL names its tables literally; statements are constants, never built from input
(the partition's name is made from the broker's integer primary key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction

from integrations.consumers.readers import DEFAULT_KIND
from integrations.consumers.workers import EncodedBatch

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
    rounds_streamed: int = 0  # merged as they were read: a first set, in key order
    rounds_at_end: int = 0  # staged, then merged once all were read


@dataclass(frozen=True)
class Round:
    """One round of staging rows (COPY text) and what merging it on its own needs."""

    copy_data: bytes | bytearray
    starts: list[int]  # the staging line of each of its batches' first row
    skips: list[int]  # per batch, 1 when the batch's pointer 0 runs on from the one before
    kinds: dict[str, str]  # a kind named here for a pointer that ran on into this round
    kinds_given: bool  # some staged row of the round names a kind
    ascending: bool  # every pointer so far, this round's included, in byte order


@dataclass
class StagedBatches:
    """The call's staged batches, in order, cut into rounds (``Round``).

    Each batch numbers its pointers from 0 and marks each one's first row
    (``EncodedBatch``); a pointer whose rows straddle two batches is pointer 0 of the
    second one too. Kept per batch: the staging line of its first row, and whether its
    pointer 0 runs on (it is then skipped when each pointer's first row is taken, so a
    pointer is drawn once). Kept for the whole call: whether every pointer ascends in byte
    order, as in a file sorted by ``remote_identifier``.

    A pointer's kind is on its first staged row, as far as its batch knows it; ``kinds``
    holds the kind a later batch names for a pointer that runs on into it.
    """

    ascending: bool = True
    starts: list[int] = field(default_factory=list)  # staging lines count from 1
    skips: list[int] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)  # remote_identifier: its last kind
    kinds_given: bool = False
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
        self.skips.append(int(runs_on))
        self.kinds_given = self.kinds_given or batch.kinds_given
        if runs_on and batch.first_pointer_kind is not None:
            self.kinds[first] = batch.first_pointer_kind
        self._next_line += batch.hashes
        self._last = batch.last_remote_identifier

    def round(self, copy_data: bytes | bytearray) -> Round:
        """The batches added since the last round, as one round of ``copy_data``."""
        round_ = Round(
            copy_data, self.starts, self.skips, self.kinds, self.kinds_given, self.ascending
        )
        self.starts, self.skips, self.kinds, self.kinds_given = [], [], {}, False
        return round_


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
    -- (workers.staging_rows): a round's pointers are drawn from them.
    pointer_in_batch integer NOT NULL,
    first_row boolean NOT NULL
) ON COMMIT DROP;
-- The consumers of the round being merged, and the last one of the round before.
CREATE TEMP TABLE consumer_registration_round_pointers (
    consumer_id bigint NOT NULL,
    remote_identifier text NOT NULL
) ON COMMIT DROP;
CREATE TEMP TABLE consumer_registration_seen (consumer_id bigint NOT NULL) ON COMMIT DROP;
"""
DROP_TABLES = (
    # new_consumer_hashes is a view over a fresh partition, a table otherwise.
    "DO $$ BEGIN IF EXISTS (SELECT FROM pg_class WHERE relkind = 'v'"
    " AND oid = to_regclass('pg_temp.new_consumer_hashes')) THEN"
    " DROP VIEW new_consumer_hashes; END IF; END $$;"
    " DROP TABLE IF EXISTS consumer_registration_staging, consumer_registration_pointers,"
    " consumer_registration_round_pointers, new_consumer_hashes, consumer_registration_seen,"
    " consumer_registration_forgotten;"
    " DROP SEQUENCE IF EXISTS consumer_registration_line"
)
_STAGE = (
    "COPY consumer_registration_staging"
    " (remote_identifier, remote_identifier_kind, hash_type, hash, pointer_in_batch, first_row)"
    " FROM STDIN"
)

# --- A round merged as it is read (a broker's first set, in key order) -----------------
# Each pointer's first row, once (a batch's pointer 0 that runs on is skipped:
# width_bucket finds a row's batch from its line, by binary search in the batches' first
# lines), in file order, so the consumers' unique index is appended to and the ids drawn
# ascend with the keys (OFFSET 0: drawn in the staged rows' order).
_ROUND_CONSUMERS = """
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
_KINDS_NAMED_LATER = """
UPDATE integrations_consumer c SET remote_identifier_kind = k.kind
  FROM unnest(%(keys)s::text[], %(kinds)s::text[]) AS k (remote_identifier, kind)
 WHERE c.broker_id = %(broker)s AND c.remote_identifier = k.remote_identifier
"""
_ROUND_LAST_POINTER = """
SELECT consumer_id, remote_identifier FROM consumer_registration_round_pointers
 ORDER BY consumer_id DESC LIMIT 1
"""

# --- Everything staged, merged at the end -----------------------------------------------
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
# Into a fresh partition, every staged row as it is, its consumer from {pointers}: the
# round's own (merged as read: a join in memory) or every pointer's (at the end). Its
# unique index, built after, finds a repeated row (_FRESH_DUPLICATES_DELETE).
_FRESH_HASHES = """
INSERT INTO {partition} (id, hash_type, hash, broker_id, consumer_id)
SELECT nextval(%(hash_ids)s::regclass), s.hash_type, s.hash, %(broker)s, p.consumer_id
  FROM consumer_registration_staging s
  JOIN {pointers} p USING (remote_identifier)
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

# --- A broker's first set: a plain table, the partition-to-be -------------------------
_FRESH_CREATE = """
CREATE TABLE {partition} (
    id bigint NOT NULL,
    hash_type varchar(8) NOT NULL,
    hash bytea NOT NULL,
    broker_id bigint NOT NULL CHECK (broker_id = {broker}),
    consumer_id bigint NOT NULL
) WITH (autovacuum_enabled = false)
"""
# The indexes of the partitioned table, built once over the loaded rows; ATTACH finds
# them and adopts them as the partition's own (nothing is built twice). The unique one
# first: it is the one a repeated hash refuses.
_FRESH_INDEXES = (
    "ALTER TABLE {partition} ADD UNIQUE (hash, hash_type, consumer_id, broker_id)",
    "ALTER TABLE {partition} ADD PRIMARY KEY (id, broker_id)",
    "CREATE INDEX ON {partition} (consumer_id)",
    "ALTER TABLE {partition} SET (autovacuum_enabled = true)",
    "ALTER TABLE integrations_consumerhash ATTACH PARTITION {partition} FOR VALUES IN ({broker})",
    "ANALYZE {partition}",
    # The late match reads what this call added: here, the whole new partition.
    "CREATE TEMP VIEW new_consumer_hashes AS SELECT consumer_id, hash_type, hash FROM {partition}",
)
# A file that lists the same hash of a consumer twice: all but the first copy.
_FRESH_DUPLICATES_DELETE = """
DELETE FROM {partition} d
 USING (SELECT id, row_number() OVER (PARTITION BY hash, hash_type, consumer_id ORDER BY id)
          FROM {partition}) r
 WHERE r.row_number > 1 AND d.id = r.id
"""


def staging_copy(cursor: Any, copy_data: bytes | bytearray) -> None:
    """Append one round of staging rows (COPY text) to the staging table."""
    with cursor.copy(_STAGE) as copy:
        copy.write(copy_data)


class ConsumerLoad:
    """One call's rows, staged round by round and merged into the broker's consumers.

    Made inside the call's transaction, under the broker's registration lock: the staging
    tables, and for a broker's first set (no consumer, no hash anywhere) its partition-to-be.
    ``stage`` copies each round in; while a first set's pointers ascend, it merges the
    round there and then, and empties the staging table. ``finish`` merges what is left
    (everything, for any other call), indexes a fresh partition and attaches it. It leaves
    ``new_consumer_hashes(consumer_id, hash_type, hash)`` until the transaction ends, and,
    when rounds were left for the end, ``consumer_registration_pointers`` (their
    pointers, each with its consumer id).
    """

    def __init__(self, cursor: Any, *, broker_pk: int) -> None:
        self.cursor = cursor
        self.broker_pk = broker_pk
        self.partition = partition_name(broker_pk)
        cursor.execute(DROP_TABLES)
        cursor.execute(_CREATE_TABLES)
        cursor.execute(
            "SELECT pg_get_serial_sequence('integrations_consumer', 'id'),"
            " pg_get_serial_sequence('integrations_consumerhash', 'id')"
        )
        consumer_ids, hash_ids = cursor.fetchone()  # looked up once, not per row
        self.params: dict[str, Any] = {
            "broker": broker_pk,
            "default_kind": DEFAULT_KIND,
            "consumer_ids": consumer_ids,
            "hash_ids": hash_ids,
        }
        cursor.execute(f"SET LOCAL work_mem = '{MERGE_WORK_MEM}'")
        cursor.execute(f"SET LOCAL maintenance_work_mem = '{MERGE_MAINTENANCE_WORK_MEM}'")
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM integrations_consumer WHERE broker_id = %(broker)s)",
            self.params,
        )
        self.existing = bool(cursor.fetchone()[0])
        self.fresh = not self.existing and _fresh_partition_possible(cursor, broker_pk)
        self.partition_made = False
        self.rounds_streamed = self.rounds_at_end = 0
        self.consumers_created = self.hashes_added = 0
        self.kinds_given = False  # of the rows left for the end

    @property
    def rounds_staged(self) -> int:
        return self.rounds_streamed + self.rounds_at_end

    def stage(self, round_: Round) -> None:
        staging_copy(self.cursor, round_.copy_data)
        # A first set merges as it reads until a round has to wait for the end.
        if self.fresh and not self.rounds_at_end and round_.ascending:
            self._partition_make()
            try:
                with transaction.atomic():  # a savepoint: the round stays staged if refused
                    consumers, hashes = self._round_merge(round_)
            except IntegrityError:
                pass  # a pointer met again (the order checks missed it): merged at the end
            else:
                self.rounds_streamed += 1
                self.consumers_created += consumers
                self.hashes_added += hashes
                self._round_clear()
                return
        # Out of order, or not a first set: this round and every later one wait for the end.
        self.rounds_at_end += 1
        self.kinds_given = self.kinds_given or round_.kinds_given

    def finish(self) -> Merged:
        """Merge what is staged; index and attach a fresh partition; return the counts."""
        cursor, params = self.cursor, self.params
        kinds_changed = 0
        if self.rounds_at_end:
            cursor.execute("ANALYZE consumer_registration_staging")
            # A first set's rounds merged already are consumers now: the join finds them.
            existing = "true" if self.existing or self.rounds_streamed else "false"
            pointers = _POINTERS_WITH_KINDS if self.kinds_given else _POINTERS
            cursor.execute(
                _POINTERS_CREATE.replace("{pointers}", pointers).replace("{existing}", existing),
                params,
            )
            cursor.execute("ANALYZE consumer_registration_pointers")
            if self.kinds_given and existing == "true":
                cursor.execute(_KINDS_UPDATE, params)
                if not self.fresh:  # a first set's consumers are all this call's own
                    kinds_changed = cursor.rowcount
            cursor.execute(_CONSUMERS_INSERT, params)
            self.consumers_created += cursor.rowcount
            if self.fresh:
                self._partition_make()
                cursor.execute(
                    _FRESH_HASHES.format(
                        partition=self.partition, pointers="consumer_registration_pointers"
                    ),
                    params,
                )
                self.hashes_added += cursor.rowcount
            else:
                cursor.execute(_HASHES_INSERT.replace("{hashes}", _HASHES), params)
                self.hashes_added += cursor.rowcount
                cursor.execute(f"ANALYZE {NEW_CONSUMER_HASHES}")
        if self.fresh:
            self.hashes_added -= self._partition_index()
        return Merged(
            self.consumers_created,
            kinds_changed,
            self.hashes_added,
            self.fresh,
            self.rounds_streamed,
            self.rounds_at_end,
        )

    def _round_merge(self, round_: Round) -> tuple[int, int]:
        """Merge the staged round; return the consumers and the hashes it added."""
        cursor = self.cursor
        params = {**self.params, "starts": round_.starts, "skips": round_.skips}
        cursor.execute(_ROUND_CONSUMERS, params)
        consumers = int(cursor.rowcount)
        cursor.execute(
            _FRESH_HASHES.format(
                partition=self.partition, pointers="consumer_registration_round_pointers"
            ),
            params,
        )
        hashes = int(cursor.rowcount)
        if round_.kinds:
            keys, kinds = zip(*round_.kinds.items(), strict=True)
            cursor.execute(
                _KINDS_NAMED_LATER, {**self.params, "keys": list(keys), "kinds": list(kinds)}
            )
        return consumers, hashes

    def _round_clear(self) -> None:
        """Empty the staging table, keeping the round's last consumer: the next round's
        first rows may be its own. Outside the round's savepoint, TRUNCATE of a table
        this transaction made frees its pages there and then."""
        cursor = self.cursor
        cursor.execute(_ROUND_LAST_POINTER)
        last = cursor.fetchone()
        cursor.execute(
            "TRUNCATE consumer_registration_staging, consumer_registration_round_pointers"
        )
        if last is not None:
            cursor.execute(
                "INSERT INTO consumer_registration_round_pointers VALUES (%s, %s)", list(last)
            )

    def _partition_make(self) -> None:
        if not self.partition_made:
            self.cursor.execute(
                _FRESH_CREATE.format(partition=self.partition, broker=int(self.broker_pk))
            )
            self.partition_made = True

    def _partition_index(self) -> int:
        """Index the fresh partition and attach it; return the repeated rows removed (the
        unique index refuses them: rolled back, removed, built again)."""
        try:
            with transaction.atomic():  # a savepoint
                self._partition_index_build()
                return 0
        except IntegrityError:
            self.cursor.execute(_FRESH_DUPLICATES_DELETE.format(partition=self.partition))
            removed = int(self.cursor.rowcount)
            self._partition_index_build()
            return removed

    def _partition_index_build(self) -> None:
        for statement in _FRESH_INDEXES:
            self.cursor.execute(
                statement.format(partition=self.partition, broker=int(self.broker_pk))
            )


def _fresh_partition_possible(cursor: Any, broker_pk: int) -> bool:
    """The broker has no partition of its own yet, and no hash in the default one."""
    cursor.execute(
        "SELECT to_regclass(%s) IS NULL"
        " AND NOT EXISTS (SELECT 1 FROM integrations_consumerhash_default"
        "                  WHERE broker_id = %s)",
        [partition_name(broker_pk), broker_pk],
    )
    return bool(cursor.fetchone()[0])
