"""Hashing on every core: a consumer file's rows as batches of staging rows (COPY text).

The importing process only splits rows (the ``csv`` module, in C); a pool of worker
processes standardizes, hashes and encodes them, using `integrations.consumers.readers`'s
rules, and sends each batch back as one block of COPY text. Pure Python, no Django.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
import multiprocessing.connection
import os
import re
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Final

from integrations.consumers.readers import (
    ConsumerCsvReader,
    ConsumerRecord,
    ConsumerTableReader,
    Record,
    RejectedRecord,
)

__all__ = ["PARALLEL_BATCH_ROWS", "EncodedBatch", "encode_batch", "encoded_batches", "staging_rows"]

PARALLEL_BATCH_ROWS: Final = 20_000  # rows a worker process parses and hashes at a time
_worker_parse: Callable[[int, list[str]], Record] | None = None

# COPY's text format: backslash, tab, newline and carriage return are escaped.
_COPY_ESCAPES: Final = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_NEEDS_ESCAPE: Final = re.compile(r"[\\\t\n\r]")
_COPY_NULL: Final = "\\N"


def _copy_text(value: str) -> str:
    return value.translate(_COPY_ESCAPES) if _NEEDS_ESCAPE.search(value) else value


def staging_rows(record: ConsumerRecord, pointer_in_batch: int = 0, first_row: bool = True) -> str:
    """The record's hashes as rows of the registration's staging table, in COPY text:
    ``remote_identifier, remote_identifier_kind, hash_type, hash`` (bytea, hex), then
    ``pointer_in_batch``, the number of the record's pointer in its batch, and
    ``first_row``, true on the pointer's first row only (``first_row=False``: an earlier
    record of the batch staged that row)."""
    kind = record.remote_identifier_kind
    prefix = f"{_copy_text(record.remote_identifier)}\t"
    prefix += f"{_COPY_NULL if kind is None else _copy_text(kind)}\t"
    rows = [
        f"{prefix}{list_type}\t\\\\x{digest.hex()}\t{pointer_in_batch}\tf\n"
        for list_type, digest in record.hashes
    ]
    if first_row:  # a record has at least one hash (the readers reject one without)
        rows[0] = f"{rows[0][:-2]}t\n"
    return "".join(rows)


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """A batch of rows, parsed, hashed and encoded as staging rows, in file order.

    What a hashing worker sends back: one bytes object and a few counts pass between
    processes far faster than a record object per row would.

    The batch numbers its pointers (0, 1, ...: each ``remote_identifier`` with staged
    rows, in order, the same one again on adjacent records) and marks each one's first
    row, so that a file sorted by ``remote_identifier`` can be merged round by round, each
    pointer drawn once (``consumers.load``); ``first_remote_identifier``,
    ``last_remote_identifier`` and ``ascending`` let the importer check that order between
    batches and tell a pointer that runs on from one batch into the next.

    A pointer's first row carries the last ``remote_identifier_kind`` its records in the
    batch name (the kind a consumer takes), and ``first_pointer_kind`` is pointer 0's, for
    a pointer whose records run on from the previous batch.
    """

    copy_data: bytes  # staging_rows of the accepted records, in order
    kinds_given: bool  # some accepted record names a remote_identifier_kind
    records: int  # rows read, accepted or rejected
    hashes: int  # hashes of the accepted records: one staged row each
    rejected: tuple[RejectedRecord, ...]
    first_remote_identifier: str | None = None  # the first and last numbered pointers
    last_remote_identifier: str | None = None
    ascending: bool = True  # the numbered pointers ascend in byte (code point) order
    first_pointer_kind: str | None = None  # the last kind pointer 0's records name


def encode_batch(records: Iterable[Record]) -> EncodedBatch:
    parts: list[str] = []
    rejected: list[RejectedRecord] = []
    count = hashes = pointers = 0
    kinds_given = False
    first: str | None = None  # remote_identifier of the first and last pointers
    last: str | None = None
    ascending = True
    # The current pointer's first record, where its staged rows start in parts, and the
    # last kind its records name so far: when a later record names another, the first
    # row is staged again with it once the pointer's records end.
    run_first: ConsumerRecord | None = None
    run_part = 0
    run_kind: str | None = None
    first_kind: str | None = None  # pointer 0's, once its records end
    for record in records:
        count += 1
        if isinstance(record, RejectedRecord):
            rejected.append(record)
            continue
        hashes += len(record.hashes)
        kind = record.remote_identifier_kind
        kinds_given = kinds_given or kind is not None
        pointer = record.remote_identifier
        if pointer == last:
            parts.append(staging_rows(record, pointers - 1, first_row=False))
            if kind is not None:
                run_kind = kind
            continue
        if run_first is not None and run_kind != run_first.remote_identifier_kind:
            parts[run_part] = _staging_rows_kind(run_first, run_kind, pointers - 1)
        if pointers == 1:
            first_kind = run_kind
        # Python compares code points: the byte order of UTF-8, which "C" sorts by.
        if last is not None and pointer < last:
            ascending = False
        if first is None:
            first = pointer
        run_first, run_part, run_kind = record, len(parts), kind
        parts.append(staging_rows(record, pointers))
        pointers += 1
        last = pointer
    if run_first is not None and run_kind != run_first.remote_identifier_kind:
        parts[run_part] = _staging_rows_kind(run_first, run_kind, pointers - 1)
    if pointers == 1:
        first_kind = run_kind
    return EncodedBatch(
        "".join(parts).encode(),
        kinds_given,
        count,
        hashes,
        tuple(rejected),
        first,
        last,
        ascending,
        first_kind,
    )


def _staging_rows_kind(record: ConsumerRecord, kind: str | None, pointer: int) -> str:
    """A pointer's first record staged with the kind a later record of it names."""
    return staging_rows(replace(record, remote_identifier_kind=kind), pointer)


def encoded_batches(
    reader: ConsumerCsvReader, *, processes: int | None = None
) -> Iterator[EncodedBatch]:
    """``reader``'s rows as encoded batches, in order, parsed and hashed on every core.

    This process only splits the rows (the CSV module, in C) and hands batches of
    ``PARALLEL_BATCH_ROWS`` to a pool of worker processes, which standardize, hash and
    encode them: most of the work. At most two batches per worker are in flight, so memory
    stays flat. The first batch is done here: a small file never starts the pool. One
    core: no pool.
    """
    processes = processes or os.cpu_count() or 1
    batches = _batches(reader.rows(), PARALLEL_BATCH_ROWS, len(reader.columns))
    first = next(batches, None)
    if first is None:
        return
    parse = reader.row_parser()
    yield _encode_rows(parse, first)
    if processes < 2:
        for batch in batches:
            yield _encode_rows(parse, batch)
        return
    second = next(batches, None)
    if second is None:
        return
    pool = _pool(processes, reader.columns, reader.hashed)
    pending: collections.deque[Future[EncodedBatch]] = collections.deque()
    try:
        for batch in itertools.chain([second], batches):
            pending.append(pool.submit(_worker_encode, batch))
            if len(pending) >= 2 * processes:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


def _pool(processes: int, columns: list[str], hashed: bool) -> ProcessPoolExecutor:
    # spawn: a fresh interpreter, without the caller's open database connections and
    # threads (a fork would copy them). An executor, not multiprocessing.Pool: a worker
    # that dies raises BrokenProcessPool here instead of being replaced again and again.
    return ProcessPoolExecutor(
        processes,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_start,
        initargs=(columns, hashed),
    )


@dataclass(slots=True)
class _Rows:
    """A batch of rows on its way to a worker, flat: every accepted row's cells in one
    list and the lines in one array. Unpickling a list per row took about a quarter of a
    worker's time (docs/benchmarks.md, consumer import)."""

    width: int  # cells per accepted row: the header's
    lines: array[int] = field(default_factory=lambda: array("q"))  # -1: the next rejected
    cells: list[str] = field(default_factory=list)
    rejected: list[RejectedRecord] = field(default_factory=list)

    def records(self, parse: Callable[[int, list[str]], Record]) -> Iterator[Record]:
        rejected = iter(self.rejected)
        cells, width, start = self.cells, self.width, 0
        for line in self.lines:
            if line < 0:
                yield next(rejected)
                continue
            yield parse(line, cells[start : start + width])
            start += width


def _batches(
    rows: Iterator[tuple[int, list[str]] | RejectedRecord], size: int, width: int
) -> Iterator[_Rows]:
    batch = _Rows(width)
    for row in rows:
        if isinstance(row, RejectedRecord):
            batch.lines.append(-1)
            batch.rejected.append(row)
        else:
            line, cells = row
            if len(cells) != width:  # the readers give every accepted row the header's width
                raise ValueError(f"line {line} has {len(cells)} cells, not {width}")
            batch.lines.append(line)
            batch.cells += cells
        if len(batch.lines) >= size:
            yield batch
            batch = _Rows(width)
    if batch.lines:
        yield batch


def _encode_rows(parse: Callable[[int, list[str]], Record], batch: _Rows) -> EncodedBatch:
    return encode_batch(batch.records(parse))


def _worker_start(columns: list[str], hashed: bool) -> None:
    global _worker_parse
    _worker_parse = ConsumerTableReader(columns, (), hashed=hashed).row_parser()
    _end_with_parent()


def _end_with_parent() -> None:
    """End this worker when the importing process ends, however it ended. Killed (the OOM
    killer, kill -9), it cannot shut its pool down, and the worker would wait for its next
    batch forever, an orphan holding its memory: its fellow workers keep the batch queue
    open, so the wait never sees the end of it. The parent's sentinel does."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _worker_encode(batch: _Rows) -> EncodedBatch:
    assert _worker_parse is not None
    return _encode_rows(_worker_parse, batch)
