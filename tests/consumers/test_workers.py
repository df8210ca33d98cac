"""Hashing on every core: ``encoded_batches`` gives, from any number of processes, the staging
rows a single process gives from the records, in the same order, rejected rows included."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from integrations.consumers import workers
from integrations.consumers.readers import ConsumerCsvReader, ConsumerRecord, RejectedRecord
from integrations.consumers.workers import EncodedBatch, encode_batch, encoded_batches
from tests.conftest import wait_until


def csv_text() -> str:
    rows = []
    for i in range(60):
        if i % 11 == 0:
            rows.append(f"C-{i},,no digits\n")  # rejected: the phone has no digits
        elif i % 13 == 0:
            rows.append(f"C-{i},x\n")  # rejected: one field short
        else:
            rows.append(f"C-{i},P{i}.Person@Example.com,+1 (415) 555-{i:04d}\n")
    return "remote_identifier,email,phone\n" + "".join(rows)


@pytest.mark.parametrize("processes", [1, 2])
def test_parallel_batches_equal_the_single_process_records_in_order(
    monkeypatch: pytest.MonkeyPatch, processes: int
) -> None:
    monkeypatch.setattr(workers, "PARALLEL_BATCH_ROWS", 7)  # 9 batches, 8 to the pool
    serial = list(ConsumerCsvReader(io.StringIO(csv_text())))
    batches = list(encoded_batches(ConsumerCsvReader(io.StringIO(csv_text())), processes=processes))
    assert len(batches) == 9
    accepted = [r for r in serial if isinstance(r, ConsumerRecord)]
    # The same rows, batch by batch, as one process encodes them (pointers numbered per batch).
    assert [b.copy_data for b in batches] == [
        encode_batch(serial[start : start + 7]).copy_data for start in range(0, 60, 7)
    ]
    assert sum(b.records for b in batches) == 60
    assert sum(b.hashes for b in batches) == 2 * len(accepted)
    rejected = [r for b in batches for r in b.rejected]
    assert rejected == [r for r in serial if isinstance(r, RejectedRecord)]
    assert [r.position for r in rejected] == [2, 13, 15, 24, 28, 35, 41, 46, 54, 57]


def test_the_pool_hashes_in_other_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "PARALLEL_BATCH_ROWS", 5)
    pools: list[set[int]] = []
    real_pool = workers._pool

    def watched_pool(*args: Any) -> Any:
        pool = real_pool(*args)
        seen: set[int] = set()
        pools.append(seen)
        submit = pool.submit

        def watched_submit(*submitted: Any) -> Any:
            future = submit(*submitted)
            seen.update(pool._processes or ())  # started on demand, one per busy submit
            return future

        pool.submit = watched_submit  # type: ignore[method-assign, assignment]
        return pool

    monkeypatch.setattr(workers, "_pool", watched_pool)
    list(encoded_batches(ConsumerCsvReader(io.StringIO(csv_text())), processes=2))
    assert len(pools) == 1 and len(pools[0]) == 2 and os.getpid() not in pools[0]
    # A file of one batch never starts the pool.
    small = "remote_identifier,email\nC-1,a@example.com\n"
    list(encoded_batches(ConsumerCsvReader(io.StringIO(small)), processes=2))
    assert len(pools) == 1


def record(position: int, key: str, *types: str, kind: str | None = None) -> ConsumerRecord:
    return ConsumerRecord(position, key, kind, tuple((t, bytes([position]) * 32) for t in types))


def staged(batch: EncodedBatch) -> list[tuple[str, str, str]]:
    """(remote_identifier, pointer_in_batch, first_row) of each staged row."""
    rows = [line.split("\t") for line in batch.copy_data.decode().splitlines()]
    return [(row[0], row[4], row[5]) for row in rows]


def test_a_batch_numbers_its_pointers_once_each_in_order() -> None:
    batch = encode_batch(
        [
            record(2, "A", "email", "phone"),
            record(3, "A", "email"),  # the same pointer again: no new number, no first row
            RejectedRecord(4, "A0", {"email": ["bad"]}),
            record(6, "C", "phone"),
        ]
    )
    assert staged(batch) == [
        ("A", "0", "t"),
        ("A", "0", "f"),
        ("A", "0", "f"),
        ("C", "1", "t"),
    ]
    assert (batch.first_remote_identifier, batch.last_remote_identifier, batch.ascending) == (
        "A",
        "C",
        True,
    )
    # Code point order is UTF-8's byte order: "Z" < "a" < "é".
    assert encode_batch(
        [record(2, "Z", "email"), record(3, "a", "email"), record(4, "é", "email")]
    ).ascending
    unsorted = encode_batch([record(2, "B", "email"), record(3, "A", "email")])
    assert not unsorted.ascending
    # A pointer that comes back after another is numbered again (the merge then stops
    # merging as it reads: the order checks, or the consumers' unique index).
    again = encode_batch(
        [record(2, "A", "email"), record(3, "B", "email"), record(4, "A", "email")]
    )
    assert [row[1] for row in staged(again)] == ["0", "1", "2"] and not again.ascending


def test_a_pointers_first_row_carries_the_last_kind_its_records_name() -> None:
    batch = encode_batch(
        [
            record(2, "A", "email"),
            record(3, "A", "email", kind="account_id"),  # named after A's first row: moves there
            record(4, "A", "email"),
            record(5, "B", "email", kind="device_id"),
            record(6, "B", "email", kind="account_id"),  # the last one named wins
            record(7, "C", "email", kind="vin"),
            record(8, "D", "email"),
        ]
    )
    rows = [line.split("\t") for line in batch.copy_data.decode().splitlines()]
    # (remote_identifier, remote_identifier_kind, first_row): later rows keep their own.
    assert [(row[0], row[1], row[5]) for row in rows] == [
        ("A", "account_id", "t"),
        ("A", "account_id", "f"),
        ("A", "\\N", "f"),
        ("B", "account_id", "t"),
        ("B", "account_id", "f"),
        ("C", "vin", "t"),
        ("D", "\\N", "t"),
    ]
    # The kind a pointer 0 that runs on from the previous batch gives its consumer.
    assert batch.first_pointer_kind == "account_id"
    unnamed = encode_batch([record(2, "A", "email"), record(3, "B", "email", kind="vin")])
    assert unnamed.first_pointer_kind is None


def test_a_row_of_another_width_than_the_header_is_refused_before_it_is_batched() -> None:
    # The readers never give one (rows() rejects it); a flat batch would misread the cells.
    rows = iter([(2, ["A", "a@example.com"]), (3, ["B", "b@example.com", "extra"])])
    with pytest.raises(ValueError, match="line 3 has 3 cells, not 2"):
        list(workers._batches(rows, 10, 2))


# The importing process, reduced to its pool: it starts the hashing workers, prints their
# process ids, and waits to be killed.
_IMPORTER = """
import sys
from integrations.consumers import workers

pool = workers._pool(2, ["remote_identifier", "email"], False)
for future in [pool.submit(workers._worker_encode, workers._Rows(2)) for _ in range(4)]:
    future.result()
print(" ".join(str(pid) for pid in pool._processes), flush=True)
sys.stdin.read()  # until killed
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (an exited one the test's init never reaped is a
    zombie: not running)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_the_hashing_workers_end_when_the_importing_process_is_killed() -> None:
    """An import killed halfway (the OOM killer, kill -9) cannot shut its pool down: its
    workers must not wait for a batch forever, each an orphan holding its memory."""
    importer = subprocess.Popen(  # noqa: S603 (this interpreter, the script above)
        [sys.executable, "-c", _IMPORTER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # the resource tracker's warning about the kill
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert importer.stdout is not None
        pids = [int(pid) for pid in importer.stdout.readline().split()]
        assert len(pids) == 2 and all(map(_running, pids))
    finally:
        importer.kill()
        importer.wait()
    try:
        wait_until(lambda: not any(map(_running, pids)), "the workers end with their importer")
    finally:
        for pid in filter(_running, pids):  # a failed test leaves no orphan behind
            os.kill(pid, signal.SIGKILL)
