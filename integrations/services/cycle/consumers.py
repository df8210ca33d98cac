"""Registering, importing and forgetting a broker's consumers: the consumer hashes' writes.

Three ways in, each one transaction, all or nothing, under the broker's registration lock::

    consumers_register(broker=broker, records=parse_api_consumers(body["consumers"]),
                       actor="apikey:ab12", source="api", lock_timeout=10.0)
    consumers_import(broker=broker, files=found.files, hashed=False, actor="cli:ana",
                     source="file:consumers.csv", progress=progress)
    consumers_replace(broker=broker, files=found.files, hashed=False, actor="cli:ana",
                      source="file:consumers.csv", max_forget=0.05)
    result.consumers_created, result.hashes_added, result.rejected, result.hashes_forgotten

``consumers_register`` takes records (``integrations.consumers.api_reader`` makes them
from an API body); ``consumers_import`` and ``consumers_replace`` take the files
(``integrations.consumers.sources``), read and hashed on every core. ``consumers_replace``
also forgets the set's consumers the files do not list, and the hashes of the list types
they carry that they no longer give a consumer they list.

How, and why so:

- Records are streamed with ``COPY`` into a temp staging table in rounds of
  ``CHUNK_ROWS`` hash rows (a thread reads and hashes the next round meanwhile: two cores,
  both busy); ``consumers.load`` merges them in key order into the consumers and
  the broker's partition of the consumer hashes: once all are staged, in one pass, or, for
  a broker's first set in key order, round by round as they come (a first set goes into a
  fresh partition whose indexes are built after the load). Memory stays flat for any
  file size.
- Idempotent: a consumer is inserted only when ``(broker, remote_identifier)`` is new, a
  hash only when ``(broker, hash, hash_type, consumer)`` is; re-sending changes nothing.
  Not ``ON CONFLICT DO NOTHING``: a speculative insertion per row is costly
  (docs/benchmarks.md, consumer import), and the per-broker lock below already rules out a
  concurrent writer of the same keys (the unique constraints stay as the last guard).
- One registration (or forget) per broker at a time: a transaction-level advisory lock.
  An API call gives up after ``lock_timeout`` seconds (``RegistrationBusy``) rather than
  hold a web worker behind a million-row import; so it does for the matching lock below,
  which a DROP import holds through its matching, and for each lock the merge waits for
  (a first set's attach waits for every reader of the default partition). A file import
  waits for all of them.
- The hashes a call added are matched late against the DROP hashes already received, in
  the same transaction (``services.cycle.matching.consumer_hashes_match_late``).
- Forgetting a consumer (``consumer_forget``, a replace's unlisted ones) also takes the
  matching lock, after the registration lock and before it deletes any row: a DROP import, a late
  match and a recurring round read consumers and insert requests naming them under it
  (their foreign key checked at commit): a consumer deleted beside them would fail one of
  the two at commit, or leave a match it had read with no request.
- One ledger event per call, with its counts; rejected rows are counted, not listed.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Generator, Iterable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.db import connection, transaction
from django.db.models import Count

from integrations.consumers.load import ConsumerLoad, Merged, Round, StagedBatches
from integrations.consumers.readers import Record, RejectedRecord
from integrations.consumers.sources import ConsumerSource
from integrations.consumers.workers import EncodedBatch, encode_batch
from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, Consumer, ConsumerHash
from integrations.services.cycle.matching import (
    RegistrationSource,
    consumer_hashes_match_late,
    late_added_create,
)
from integrations.services.ledger import ledger_event_append
from integrations.services.locks import (
    LockBusy,
    advisory_xact_lock,
    lock_wait_bounded,
    matching_lock,
)

CHUNK_ROWS = 250_000  # hash rows staged per COPY
DEFAULT_MAX_FORGET = 0.05  # replace refuses to forget more of the set than this, unforced
REJECTED_KEPT = 10_000  # rejected records kept in the result (an API call has at most 10,000)
# pg_advisory_xact_lock(int, int): the first key names the lock's purpose ("cons"), the
# second is the broker's primary key.
_REGISTRATION_LOCK = 0x636F6E73


class RegistrationBusy(Exception):
    """Another registration for the same broker held the lock past ``lock_timeout``."""


class ReplaceRefused(Exception):
    """``replace`` would forget more than ``max_forget`` of the set, or of its listed
    consumers' hashes, without ``force``."""

    def __init__(
        self, *, forgotten: int, before: int, max_forget: float, what: str = "consumers"
    ) -> None:
        super().__init__(
            f"--replace would forget {forgotten:,} of {before:,} {what} "
            f"({forgotten / before:.1%}), more than --max-forget {max_forget:.1%}"
        )
        self.forgotten = forgotten
        self.before = before


class RegistrationRefused(Exception):
    """``strict`` and at least one record was rejected: nothing was written."""

    def __init__(self, result: ConsumerRegistration) -> None:
        super().__init__(f"{result.rows_rejected} of {result.rows_read} rows rejected")
        self.result = result


@dataclass
class ConsumerRegistration:
    """What one registration call read, wrote and rejected."""

    source: str
    strict: bool = False
    rows_read: int = 0
    rows_rejected: int = 0
    consumers_created: int = 0
    kinds_changed: int = 0
    hashes_received: int = 0
    hashes_added: int = 0
    consumers_forgotten: int = 0  # by replace: the set's consumers the source did not list
    # by replace: the hashes of the carried list types the source no longer gives a consumer
    # it lists
    hashes_forgotten: int = 0
    rejected: list[RejectedRecord] = field(default_factory=list)  # the first REJECTED_KEPT
    # Per file read, "name: zip not used: why": header columns that can give no hash.
    unused_columns: list[str] = field(default_factory=list)

    @property
    def rows_accepted(self) -> int:
        return self.rows_read - self.rows_rejected

    @property
    def hashes_unchanged(self) -> int:
        """Hashes received that were already registered (re-sent, or repeated in the call)."""
        return self.hashes_received - self.hashes_added

    def counts(self) -> dict[str, int]:
        return {
            "rows_read": self.rows_read,
            "rows_accepted": self.rows_accepted,
            "rows_rejected": self.rows_rejected,
            "consumers_created": self.consumers_created,
            "kinds_changed": self.kinds_changed,
            "hashes_received": self.hashes_received,
            "hashes_added": self.hashes_added,
            "hashes_unchanged": self.hashes_unchanged,
            "consumers_forgotten": self.consumers_forgotten,
            "hashes_forgotten": self.hashes_forgotten,
        }


class ImportProgress(Protocol):
    """What a file import reports while it reads (the command's progress bar)."""

    def file_started(self, source: ConsumerSource) -> None: ...

    def bytes_read(self, count: int) -> None: ...

    def batch_read(self, source: ConsumerSource, batch: EncodedBatch) -> None: ...


# ---------------------------------------------------------------------------------------
# Registration, import, replace
# ---------------------------------------------------------------------------------------


def consumers_register(
    *,
    broker: Broker,
    records: Iterable[Record],
    actor: str,
    source: str,
    strict: bool = False,
    lock_timeout: float | None = None,
    api_key_prefix: str = "",
) -> ConsumerRegistration:
    """Register ``records`` (an API body's) for ``broker`` in one transaction; return the
    counts.

    Rejected records are counted (and the first ``REJECTED_KEPT`` kept); the accepted ones
    are written unless ``strict``, where one rejected record refuses the whole call
    (``RegistrationRefused``, nothing written). ``source`` names the input in the ledger
    (``api``), and ``api_key_prefix`` the key that sent them, for reappearances. Raises
    ``RegistrationBusy`` when ``lock_timeout`` seconds pass while another registration for
    the broker runs, or, for the late match, while the broker's matching lock is held (a
    DROP download being imported).
    """
    batches = (encode_batch((record,)) for record in records)
    return _register(
        broker=broker,
        batches=batches,
        actor=actor,
        source=source,
        strict=strict,
        lock_timeout=lock_timeout,
        api_key_prefix=api_key_prefix,
    )


def consumers_import(
    *,
    broker: Broker,
    files: Sequence[ConsumerSource],
    hashed: bool,
    actor: str,
    source: str,
    strict: bool = False,
    progress: ImportProgress | None = None,
) -> ConsumerRegistration:
    """Import the consumers of ``files``, in order, as one registration (``consumers_register``'s
    rules); the ledger event names each file (name, size, SHA-256). ``hashed``: the files
    hold Base64 hashes, not clear identifiers. A file that cannot be read raises
    (``RegistrationFileError``, ``SourceError``, ``OSError``...) and nothing is written."""
    return _register(
        broker=broker,
        batches=_file_batches(files, hashed, progress),
        actor=actor,
        source=source,
        strict=strict,
        files=files,
    )


def consumers_replace(
    *,
    broker: Broker,
    files: Sequence[ConsumerSource],
    hashed: bool,
    actor: str,
    source: str,
    max_forget: float = DEFAULT_MAX_FORGET,
    force: bool = False,
    progress: ImportProgress | None = None,
) -> ConsumerRegistration:
    """Import ``files`` as the broker's whole set of the kinds they carry: the broker's
    consumers of those kinds that the files do not list are forgotten (hashes deleted,
    requests keep their copy of the pointer), and a listed consumer that existed loses its
    hashes of the list types the files carry that they do not give it. A full set must be
    whole, so one rejected row refuses it (``RegistrationRefused``); and unless ``force``,
    it is refused (``ReplaceRefused``, nothing written) when it would forget more than
    ``max_forget`` (a fraction) of the consumers of those kinds that existed before, or of
    the hashes of those list types the listed consumers held."""
    return _register(
        broker=broker,
        batches=_file_batches(files, hashed, progress),
        actor=actor,
        source=source,
        strict=True,
        files=files,
        replace=_Replace(max_forget=max_forget, force=force),
    )


@dataclass(frozen=True)
class _Replace:
    max_forget: float
    force: bool


def _file_batches(
    files: Sequence[ConsumerSource], hashed: bool, progress: ImportProgress | None
) -> Iterator[EncodedBatch]:
    """Every file's rows in turn, hashed in batches, reported as they are read."""
    for source in files:
        if progress is not None:
            progress.file_started(source)
        on_read = progress.bytes_read if progress is not None else None
        with source.open_records(hashed=hashed, on_read=on_read) as batches:
            for batch in batches:
                if progress is not None:
                    progress.batch_read(source, batch)
                yield batch


def _register(
    *,
    broker: Broker,
    batches: Iterable[EncodedBatch],
    actor: str,
    source: str,
    strict: bool,
    lock_timeout: float | None = None,
    files: Sequence[ConsumerSource] | None = None,
    replace: _Replace | None = None,
    api_key_prefix: str = "",
) -> ConsumerRegistration:
    result = ConsumerRegistration(source=source, strict=strict)
    with transaction.atomic(), connection.cursor() as cursor:
        registration_lock(cursor, broker=broker, timeout=lock_timeout)
        # The late match's own table of the hashes added: the merge inserts each into it.
        load = ConsumerLoad(cursor, broker_pk=broker.pk, added_into=late_added_create())
        merged: Merged | None = None
        with closing(_read_ahead(_rounds(batches, result))) as rounds:
            for round_ in rounds:
                load.stage(round_)
        result.unused_columns = [
            f"{source.name}: {source.unused_columns}"
            for source in files or ()
            if source.unused_columns
        ]
        if strict and result.rows_rejected:
            raise RegistrationRefused(result)  # rolls the transaction back
        if load.rounds_staged:
            with _locks_bounded(cursor, broker=broker, timeout=lock_timeout):
                merged = load.finish(replace=replace is not None)
                if merged.fresh_partition:
                    # Attaching locks the default partition until this commits, and a DROP
                    # import matching a broker with no partition of its own reads it under
                    # that broker's matching lock: that lock first (``matching_lock``).
                    _matching_lock(broker=broker, timeout=lock_timeout)
                    load.attach()
            result.consumers_created = merged.consumers_created
            result.kinds_changed = merged.kinds_changed
            result.hashes_added = merged.hashes_added
        # A broker's first set forgets nothing: every consumer it has came from the source;
        # nor does a source with no row.
        if replace is not None and merged is not None and not merged.fresh_partition:
            _forget_unlisted(
                load, merged, broker=broker, result=result, actor=actor, replace=replace
            )

        # Late matching: the hashes added by this call against every DROP hash the broker
        # has received, inside this transaction and under the broker's matching lock.
        # Every file is read by now, so each one's SHA-256 is known for reappearances.
        # An API call waits for the matching lock no longer than for the registration lock:
        # a DROP import holds it through its whole matching.
        if result.hashes_added:
            assert merged is not None  # hashes were added: rounds were staged and merged
            _matching_lock(broker=broker, timeout=lock_timeout)
            consumer_hashes_match_late(
                broker=broker,
                first_set=merged.fresh_partition,  # all the broker's hashes are new
                actor=actor,
                source=_registration_source(source, files, api_key_prefix),
            )

        ledger_event_append(
            kind=LedgerKind.CONSUMERS_REGISTERED,
            broker_id=broker.broker_id,
            subject=source,
            actor=actor,
            data={
                "source": source,
                "strict": strict,
                **result.counts(),
                **({"files": _files_described(files)} if files is not None else {}),
            },
        )
        load.close()
    return result


def _matching_lock(*, broker: Broker, timeout: float | None) -> None:
    """The broker's matching lock, for the late match and, before it, for a first set's
    partition: attaching it locks the default partition, which a DROP import holding the
    matching lock may be about to read (the lock order: matching lock first)."""
    try:
        matching_lock(broker=broker, timeout=timeout)
    except LockBusy:
        raise RegistrationBusy(
            f"broker {broker.broker_id}'s consumers are being matched "
            "(a DROP download being imported)"
        ) from None


@contextmanager
def _locks_bounded(cursor: Any, *, broker: Broker, timeout: float | None) -> Iterator[None]:
    """Each lock the merge waits for, at most ``timeout`` seconds (none: as long as it
    takes). Another first set's attach locks the consumer hashes' default partition, which
    a broker's hashes there and a DROP import of a broker with no consumers yet read."""
    if timeout is None:
        yield
        return
    try:
        with lock_wait_bounded(cursor, timeout):
            yield
    except LockBusy:
        raise RegistrationBusy(
            f"broker {broker.broker_id}'s consumers wait for another import to end "
            "(a broker's first set being attached)"
        ) from None


def _registration_source(
    source: str, files: Sequence[ConsumerSource] | None, api_key_prefix: str
) -> RegistrationSource:
    """The source a reappearance names: the file's SHA-256 when it is one file (an S3
    prefix of several files names each one's in the ledger event, not here)."""
    sha256 = files[0].finish_digest() if files is not None and len(files) == 1 else ""
    return RegistrationSource(source=source, sha256=sha256, api_key_prefix=api_key_prefix)


def _files_described(files: Sequence[ConsumerSource]) -> list[dict[str, Any]]:
    """The files read, for the ledger: once all are read, each one's size and SHA-256."""
    return [
        {
            "name": source.name,
            # Standard input has no size but what was read from it.
            "size": source.bytes_read if source.size is None else source.size,
            "sha256": source.finish_digest(),
        }
        for source in files
    ]


def registration_lock(cursor: Any, *, broker: Broker, timeout: float | None = None) -> None:
    """Serialize consumer registration for ``broker`` until the transaction ends."""
    try:
        advisory_xact_lock(cursor, purpose=_REGISTRATION_LOCK, key=broker.pk, timeout=timeout)
    except LockBusy:
        raise RegistrationBusy(
            f"another consumer registration for broker {broker.broker_id} is running"
        ) from None


def _forget_lock(*, broker: Broker, timeout: float | None) -> None:
    """The matching lock, before a consumer is deleted: whoever reads consumers and inserts
    requests naming them (a DROP import's match, a late match, a recurring round) holds it
    until its commit, when the foreign key is checked; a consumer deleted meanwhile would
    fail that commit or this one, or leave a match read before with no request. Under it,
    the deletion waits for their requests and clears their pointer as it does every
    other's, or comes first and they never read it."""
    try:
        matching_lock(broker=broker, timeout=timeout)
    except LockBusy:
        raise RegistrationBusy(
            f"broker {broker.broker_id}'s consumers are being matched "
            "(a DROP download being imported, or a recurring round sent)"
        ) from None


def _rounds(batches_in: Iterable[EncodedBatch], result: ConsumerRegistration) -> Iterator[Round]:
    """Yield the batches' staging rows in rounds of about ``CHUNK_ROWS`` rows.

    Counts every record into ``result``. Under ``strict``, staging stops at the first
    rejected record (the call will be refused) but reading goes on, to report them all.
    """
    batches = StagedBatches()
    # One growing buffer of encoded rows per round: the round's memory is its COPY data.
    data = bytearray()
    rows = 0
    staging = True
    for batch in batches_in:
        result.rows_read += batch.records
        result.hashes_received += batch.hashes
        if batch.rejected:
            result.rows_rejected += len(batch.rejected)
            room = REJECTED_KEPT - len(result.rejected)
            if room > 0:
                result.rejected.extend(batch.rejected[:room])
            if result.strict:
                staging = False
                data, rows = bytearray(), 0
        if not staging:
            continue
        data += batch.copy_data
        rows += batch.hashes
        batches.add(batch)
        if rows >= CHUNK_ROWS:
            yield batches.round(data)
            data, rows = bytearray(), 0
    if rows and staging:
        yield batches.round(data)


def _read_ahead(rounds: Iterator[Round]) -> Generator[Round, None, None]:
    """Yield ``rounds``, reading, hashing and encoding the next one in a thread meanwhile.

    The database merges a round while Python prepares the next: the two overlap on two
    cores. At most one round waits in the queue, so memory stays flat.
    """
    handoff: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in rounds:
                while not stop.is_set():
                    try:
                        handoff.put(("round", item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            handoff.put(("end", None))
        except BaseException as exc:  # handed to the caller's thread, raised there
            handoff.put(("error", exc))

    reader = threading.Thread(target=produce, name="consumer-registration-reader", daemon=True)
    reader.start()
    try:
        while True:
            kind, value = handoff.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stop.set()
        while reader.is_alive():  # unblock a reader waiting to hand over a round
            try:
                handoff.get(timeout=0.1)
            except queue.Empty:
                continue
        reader.join()


def _past_guard(forgotten: int, before: int, max_forget: float) -> bool:
    # More than the share allowed, not as much: 29 % of 100 is 28.999999999999996 in
    # floating point, and forgetting exactly 29 was refused.
    limit = max_forget * before
    return forgotten > limit and not math.isclose(forgotten, limit)


def _forget_unlisted(
    load: ConsumerLoad,
    merged: Merged,
    *,
    broker: Broker,
    result: ConsumerRegistration,
    actor: str,
    replace: _Replace,
) -> None:
    """replace: forget the set's consumers the source did not list, within the guard; the
    listed consumers' hashes it no longer gives them are gone already (``finish``), and
    weighed here against the same guard (refused, the transaction undoes them)."""
    forgotten, now = load.unlisted_count()
    # The set as it was: what is there now, less what this import created.
    before = now - result.consumers_created
    max_forget = replace.max_forget
    past_guard = _past_guard(forgotten, before, max_forget)
    if past_guard and not replace.force:
        raise ReplaceRefused(forgotten=forgotten, before=before, max_forget=max_forget)
    hashes_forgotten = merged.hashes_forgotten
    hashes_past_guard = _past_guard(hashes_forgotten, merged.hashes_before, max_forget)
    if hashes_past_guard and not replace.force:
        raise ReplaceRefused(
            forgotten=hashes_forgotten,
            before=merged.hashes_before,
            max_forget=max_forget,
            what="hashes of the consumers it lists",
        )
    result.hashes_forgotten = hashes_forgotten
    if not forgotten and not hashes_forgotten:
        return
    hashes_removed = 0
    if forgotten:
        _forget_lock(broker=broker, timeout=None)  # a replace is a file import: it waits
        hashes_removed = load.unlisted_forget()
    result.consumers_forgotten = forgotten
    ledger_event_append(
        kind=LedgerKind.CONSUMERS_REPLACED,
        broker_id=broker.broker_id,
        subject=result.source,
        actor=actor,
        data={
            "source": result.source,
            "remote_identifier_kinds": load.listed_kinds(),
            "consumers_before": before,
            "consumers_forgotten": forgotten,
            "hashes_removed": hashes_removed,
            "hashes_forgotten": hashes_forgotten,
            "max_forget": max_forget,
            "forced": replace.force and (past_guard or hashes_past_guard),
        },
    )


# ---------------------------------------------------------------------------------------
# Forgetting
# ---------------------------------------------------------------------------------------


def consumer_forget(
    *, broker: Broker, remote_identifier: str, actor: str, lock_timeout: float | None = None
) -> dict[str, int]:
    """Delete the broker's consumer ``remote_identifier`` and its hashes.

    Returns the number of hashes removed per list type. Raises ``Consumer.DoesNotExist``
    when the broker has no such consumer (another broker's consumer included).
    Deletion requests already made for it keep their copy of the pointer.
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            registration_lock(cursor, broker=broker, timeout=lock_timeout)
        _forget_lock(broker=broker, timeout=lock_timeout)
        consumer = Consumer.objects.filter(
            broker=broker, remote_identifier=remote_identifier
        ).first()
        if consumer is None:
            raise Consumer.DoesNotExist(
                f"broker {broker.broker_id} has no consumer {remote_identifier!r}"
            )
        removed = {
            row["hash_type"]: row["n"]
            # broker: the partition key, so one partition is read
            for row in ConsumerHash.objects.filter(broker=broker, consumer=consumer)
            .order_by("hash_type")
            .values("hash_type")
            .annotate(n=Count("id"))
        }
        consumer.delete()  # its hashes go in one DELETE (nothing refers to a hash)
        ledger_event_append(
            kind=LedgerKind.CONSUMER_FORGOTTEN,
            broker_id=broker.broker_id,
            subject=remote_identifier,
            actor=actor,
            data={
                "remote_identifier": remote_identifier,
                "remote_identifier_kind": consumer.remote_identifier_kind,
                "hashes_removed": removed,
            },
        )
    return removed
