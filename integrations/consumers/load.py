"""One call's consumer rows, staged in rounds and merged into the broker's consumers.

A service of ``integrations.services.cycle.consumers`` drives it, inside its transaction and
under the broker's registration lock::

    added = late_added_create()                 # the late match's table of added hashes
    load = ConsumerLoad(cursor, broker_pk=..., added_into=added)  # the merge paths' tables
    batches = StagedBatches()
    for copy_data in rounds:                    # batches.add(batch) for each of its batches
        load.stage(batches.round(copy_data))    # a first set in key order: merged; else COPY
    merged = load.finish(replace=...)           # merged; a fresh partition indexed
    if merged.fresh_partition:                  # the broker's matching lock, then
        load.attach()                           # the partition is the broker's hashes
    consumer_hashes_match_late(broker=..., first_set=merged.fresh_partition)
    load.close()                                # the temp tables, dropped

It picks the merge path; each is its own module:

- ``merge_streamed``: a broker's first set whose pointers ascend (a file sorted by
  ``remote_identifier``), merged round by round as it is read, into the broker's fresh
  partition.
- ``merge_general``: everything else, staged and merged once all is read, in key order:
  into the fresh partition for a first set out of order (the rounds already streamed are
  consumers by then, and the join finds them), or with a probe per hash into the broker's
  partition when the broker has consumers, a partition or rows in the default one.
- ``fresh_partition``: the partition-to-be both first-set paths fill; indexed and
  attached at the end.

Consumer hashes are partitioned by broker (migration 0026): one broker's index is the size
of its own set. Memory stays flat for any file size. This module names no table of its
own: each merge module stages the rounds handed to it in its own temp tables, and reads
and drops only those. The hashes added are the late match's to read: ``merge_general``
inserts them into the table the caller hands ``ConsumerLoad`` (the late match's own), and
a first set's are its whole partition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from django.db import IntegrityError, transaction
from psycopg import sql

from integrations.consumers import fresh_partition, merge_general, merge_streamed
from integrations.consumers.readers import DEFAULT_KIND
from integrations.consumers.workers import EncodedBatch

# Sorts and hash joins of the merge, and the index builds of a fresh partition, in memory
# as far as this allows. The importing process's own 500 MB are not the server's.
MERGE_WORK_MEM: Final = "256MB"
MERGE_MAINTENANCE_WORK_MEM: Final = "512MB"


@dataclass(frozen=True)
class Merged:
    consumers_created: int
    kinds_changed: int
    hashes_added: int
    fresh_partition: bool
    rounds_streamed: int = 0  # merged as they were read: a first set, in key order
    rounds_at_end: int = 0  # staged, then merged once all were read
    # A replace: the listed consumers' hashes the source no longer gives them, removed,
    # and how many of the carried list types they held before (counted when some were).
    hashes_forgotten: int = 0
    hashes_before: int = 0


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


_SEQUENCES: Final = (
    "SELECT pg_get_serial_sequence('integrations_consumer', 'id'),"
    " pg_get_serial_sequence('integrations_consumerhash', 'id')"
)
_MEMORY: Final = (
    "SELECT set_config('work_mem', %s, true), set_config('maintenance_work_mem', %s, true)"
)
_BROKER_HAS_CONSUMERS: Final = (
    "SELECT EXISTS (SELECT 1 FROM integrations_consumer WHERE broker_id = %(broker)s)"
)


class ConsumerLoad:
    """One call's rows, staged round by round and merged into the broker's consumers.

    Made inside the call's transaction, under the broker's registration lock: the merge
    paths' temp tables, and for a broker's first set (no consumer, no hash anywhere) its
    partition-to-be. ``stage`` hands each round on: while a first set's pointers ascend,
    to ``merge_streamed``, which merges it there and then; from the first round that has
    to wait (out of order, or refused under its savepoint), to ``merge_general``'s
    staging. ``finish`` merges what is left (``merge_general``: everything, for any other
    call), indexes a fresh partition, and inserts the hashes the call added into
    ``added_into``, the caller's relation ``(consumer_id, hash_type, hash)``, written here,
    never read (unless a first set: its partition is what was added); ``attach`` then
    attaches the partition, under the broker's matching lock. ``close`` drops the temp
    tables (they would go at commit; a caller's enclosing transaction may make another
    call first).
    """

    def __init__(self, cursor: Any, *, broker_pk: int, added_into: sql.Composable) -> None:
        self.cursor = cursor
        self.broker_pk = broker_pk
        self.added_into = added_into
        self.indexed = self.attached = False  # a fresh partition's last two steps
        self.close()  # an earlier call's, in the same enclosing transaction
        merge_general.staging_create(cursor)
        cursor.execute(_SEQUENCES)
        consumer_ids, hash_ids = cursor.fetchone()  # looked up once, not per row
        self.params: dict[str, Any] = {
            "broker": broker_pk,
            "default_kind": DEFAULT_KIND,
            "consumer_ids": consumer_ids,
            "hash_ids": hash_ids,
        }
        cursor.execute(_MEMORY, [MERGE_WORK_MEM, MERGE_MAINTENANCE_WORK_MEM])
        cursor.execute(_BROKER_HAS_CONSUMERS, self.params)
        self.existing = bool(cursor.fetchone()[0])
        self.fresh = not self.existing and fresh_partition.partition_possible(
            cursor, broker_pk=broker_pk
        )
        if self.fresh:
            merge_streamed.tables_create(cursor)
        self.partition_made = False
        self.rounds_streamed = self.rounds_at_end = 0
        self.consumers_created = self.hashes_added = 0
        self.kinds_given = False  # of the rows left for the end

    @property
    def rounds_staged(self) -> int:
        return self.rounds_streamed + self.rounds_at_end

    def stage(self, round_: Round) -> None:
        # A first set merges as it reads until a round has to wait for the end.
        if self.fresh and not self.rounds_at_end and round_.ascending:
            self._partition_make()
            try:
                with transaction.atomic():  # a savepoint: nothing of the round if refused
                    consumers, hashes = merge_streamed.round_merge(
                        self.cursor,
                        copy_data=round_.copy_data,
                        params=self.params,
                        broker_pk=self.broker_pk,
                        starts=round_.starts,
                        skips=round_.skips,
                        kinds_named_later=round_.kinds,
                    )
            except IntegrityError:
                pass  # a pointer met again (the order checks missed it): staged for the end
            else:
                self.rounds_streamed += 1
                self.consumers_created += consumers
                self.hashes_added += hashes
                merge_streamed.round_clear(self.cursor)
                return
        # Out of order, or not a first set: this round and every later one wait for the end.
        merge_general.stage(self.cursor, round_.copy_data)
        self.rounds_at_end += 1
        self.kinds_given = self.kinds_given or round_.kinds_given

    def finish(self, *, replace: bool = False) -> Merged:
        """Merge what is staged and index a fresh partition; return the counts. A fresh
        partition is the broker's hashes once ``attach`` ran: the caller takes the broker's
        matching lock between the two (``fresh_partition``). Unless a first set (the whole
        partition is what the call added), each hash added is also inserted into
        ``added_into``. ``replace``: the listed consumers that existed lose the hashes of
        the carried list types the source does not give them (``merge_general.stale_forget``)."""
        cursor, params = self.cursor, self.params
        kinds_changed = hashes_forgotten = hashes_before = 0
        if self.rounds_at_end:
            # A first set's rounds merged already are consumers now: the join finds them.
            existing = self.existing or bool(self.rounds_streamed)
            merge_general.pointers_gather(
                cursor, params=params, kinds_given=self.kinds_given, existing=existing
            )
            if self.kinds_given and existing:
                changed = merge_general.kinds_update(cursor, params=params)
                if not self.fresh:  # a first set's consumers are all this call's own
                    kinds_changed = changed
            self.consumers_created += merge_general.consumers_insert(cursor, params=params)
            if self.fresh:
                self._partition_make()
                self.hashes_added += merge_general.partition_fill(
                    cursor, params=params, broker_pk=self.broker_pk
                )
            else:
                # Only merge_general serves a broker that had consumers: a first set's paths
                # write a broker with none, so no consumer of theirs held a hash before.
                if replace and self.existing:
                    hashes_forgotten, hashes_before = merge_general.stale_forget(
                        cursor, params=params
                    )
                self.hashes_added += merge_general.hashes_insert(
                    cursor, params=params, into=self.added_into
                )
        if self.fresh:
            self.hashes_added -= fresh_partition.partition_index(cursor, broker_pk=self.broker_pk)
            self.indexed = True
        return Merged(
            self.consumers_created,
            kinds_changed,
            self.hashes_added,
            self.fresh,
            self.rounds_streamed,
            self.rounds_at_end,
            hashes_forgotten,
            hashes_before,
        )

    def unlisted_count(self) -> tuple[int, int]:
        """A replace, once finished: the broker's consumers of the kinds the call listed
        that it did not list, and how many of those kinds there are now."""
        return merge_general.unlisted_count(self.cursor, broker_pk=self.broker_pk)

    def unlisted_forget(self) -> int:
        """Forget what ``unlisted_count`` found: the hashes removed."""
        return merge_general.unlisted_forget(self.cursor, broker_pk=self.broker_pk)

    def listed_kinds(self) -> list[str]:
        """A replace, once finished: the kinds of the consumers it listed."""
        return merge_general.listed_kinds(self.cursor)

    def attach(self) -> None:
        """Attach the fresh partition ``finish`` indexed."""
        assert self.indexed and not self.attached
        fresh_partition.partition_attach(self.cursor, broker_pk=self.broker_pk)
        self.attached = True

    def close(self) -> None:
        # A fresh partition left out would leave the call's hashes in no broker's set.
        assert self.attached or not self.indexed, "a fresh partition was not attached"
        merge_streamed.tables_drop(self.cursor)
        merge_general.tables_drop(self.cursor)

    def _partition_make(self) -> None:
        if not self.partition_made:
            fresh_partition.partition_make(self.cursor, broker_pk=self.broker_pk)
            self.partition_made = True
