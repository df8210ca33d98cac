"""A broker's first set: a plain table filled without indexes, indexed after, then attached.

``load.ConsumerLoad`` makes it and finishes it; both ways of loading a first set fill it
from their own staged rows (``merge_streamed`` round by round, ``merge_general`` at the end),
naming it by ``partition``::

    if partition_possible(cursor, broker_pk=broker_pk):
        partition_make(cursor, broker_pk=broker_pk)
        ...                                        # the merge paths fill it
        removed = partition_index(cursor, broker_pk=broker_pk)
        ...                                        # the broker's matching lock (below)
        partition_attach(cursor, broker_pk=broker_pk)

Why (docs/benchmarks.md, consumer import): a sort and a bottom-up build of each index cost
far less than an insert per key. Attaching takes no lock that stops readers or writers of
the other partitions but the default one (two brokers' first loads attach one after the
other), and it is part of the transaction: an import that fails leaves no partition behind.
The default partition stays locked until the import commits, and the match of a broker
with no partition of its own reads it under the broker's matching lock: the caller takes
that lock between the two steps, or the two would deadlock. The partition's name
is made from the broker's integer primary key, never from input.
"""

from __future__ import annotations

from typing import Any, Final

from django.db import IntegrityError, transaction
from psycopg import sql

__all__ = [
    "PARTITION_PREFIX",
    "partition",
    "partition_attach",
    "partition_index",
    "partition_make",
    "partition_name",
    "partition_possible",
]

PARTITION_PREFIX: Final = "integrations_consumerhash_b"

_POSSIBLE: Final = """
SELECT to_regclass(%(partition)s) IS NULL
   AND NOT EXISTS (SELECT 1 FROM integrations_consumerhash_default WHERE broker_id = %(broker)s)
"""
# DDL takes no bind parameters: the name and the broker's key are composed (an identifier
# and an integer literal).
_CREATE: Final = sql.SQL("""
CREATE TABLE {partition} (
    id bigint NOT NULL,
    hash_type varchar(8) NOT NULL,
    hash bytea NOT NULL,
    broker_id bigint NOT NULL CHECK (broker_id = {broker}),
    consumer_id bigint NOT NULL
) WITH (autovacuum_enabled = false)
""")
# The indexes of the partitioned table, built once over the loaded rows; ATTACH finds
# them and adopts them as the partition's own (nothing is built twice). The unique one
# first: it is the one a repeated hash refuses.
_INDEXES: Final = (
    sql.SQL("ALTER TABLE {partition} ADD UNIQUE (hash, hash_type, consumer_id, broker_id)"),
    sql.SQL("ALTER TABLE {partition} ADD PRIMARY KEY (id, broker_id)"),
    sql.SQL("CREATE INDEX ON {partition} (consumer_id)"),
    sql.SQL("ALTER TABLE {partition} SET (autovacuum_enabled = true)"),
)
# ATTACH locks the default partition (ACCESS EXCLUSIVE) until the transaction ends: a
# match of a broker with no partition of its own reads that one.
_ATTACH: Final = (
    sql.SQL(
        "ALTER TABLE integrations_consumerhash ATTACH PARTITION {partition}"
        " FOR VALUES IN ({broker})"
    ),
    sql.SQL("ANALYZE {partition}"),
)
# A file that lists the same hash of a consumer twice: all but the first copy.
_DUPLICATES_DELETE: Final = sql.SQL("""
DELETE FROM {partition} d
 USING (SELECT id, row_number() OVER (PARTITION BY hash, hash_type, consumer_id ORDER BY id)
          FROM {partition}) r
 WHERE r.row_number > 1 AND d.id = r.id
""")


def partition_name(broker_pk: int) -> str:
    return f"{PARTITION_PREFIX}{int(broker_pk)}"


def partition(broker_pk: int) -> sql.Identifier:
    """The broker's partition, as an identifier to compose into a statement."""
    return sql.Identifier(partition_name(broker_pk))


def partition_possible(cursor: Any, *, broker_pk: int) -> bool:
    """The broker has no partition of its own yet, and no hash in the default one."""
    cursor.execute(_POSSIBLE, {"partition": partition_name(broker_pk), "broker": broker_pk})
    return bool(cursor.fetchone()[0])


def partition_make(cursor: Any, *, broker_pk: int) -> None:
    cursor.execute(
        _CREATE.format(partition=partition(broker_pk), broker=sql.Literal(int(broker_pk)))
    )


def partition_index(cursor: Any, *, broker_pk: int) -> int:
    """Index the filled partition; return the repeated rows removed (the unique index
    refuses them: rolled back, removed, built again)."""
    try:
        with transaction.atomic():  # a savepoint
            _run(cursor, broker_pk, _INDEXES)
            removed = 0
    except IntegrityError:
        cursor.execute(_DUPLICATES_DELETE.format(partition=partition(broker_pk)))
        removed = int(cursor.rowcount)
        _run(cursor, broker_pk, _INDEXES)
    return removed


def partition_attach(cursor: Any, *, broker_pk: int) -> None:
    """Attach the indexed partition: its rows are the broker's consumer hashes from here on.
    Locks the default partition until the transaction ends: take the broker's matching lock
    first."""
    _run(cursor, broker_pk, _ATTACH)


def _run(cursor: Any, broker_pk: int, statements: tuple[sql.SQL, ...]) -> None:
    names = {"partition": partition(broker_pk), "broker": sql.Literal(int(broker_pk))}
    for statement in statements:
        cursor.execute(statement.format(**names))
