"""Hashing on every core: ``encoded_batches`` gives, from any number of processes, the staging
rows a single process gives from the records, in the same order, rejected rows included."""

from __future__ import annotations

import io
import os
from typing import Any

import pytest

from integrations.drop import registration_workers as registration
from integrations.drop.registration import ConsumerCsvReader, ConsumerRecord, RejectedRecord
from integrations.drop.registration_workers import encoded_batches, staging_rows


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
    monkeypatch.setattr(registration, "PARALLEL_BATCH_ROWS", 7)  # 9 batches, 8 to the pool
    serial = list(ConsumerCsvReader(io.StringIO(csv_text())))
    batches = list(encoded_batches(ConsumerCsvReader(io.StringIO(csv_text())), processes=processes))
    assert len(batches) == 9
    accepted = [r for r in serial if isinstance(r, ConsumerRecord)]
    assert (
        b"".join(b.copy_data for b in batches)
        == "".join(staging_rows(r) for r in accepted).encode()
    )
    assert sum(b.records for b in batches) == 60
    assert sum(b.hash_rows for b in batches) == 2 * len(accepted)
    rejected = [r for b in batches for r in b.rejected]
    assert rejected == [r for r in serial if isinstance(r, RejectedRecord)]
    assert [r.position for r in rejected] == [2, 13, 15, 24, 28, 35, 41, 46, 54, 57]


def test_the_pool_hashes_in_other_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registration, "PARALLEL_BATCH_ROWS", 5)
    workers: list[set[int]] = []
    real_pool = registration._pool

    def watched_pool(*args: Any) -> Any:
        pool = real_pool(*args)
        seen: set[int] = set()
        workers.append(seen)
        submit = pool.submit

        def watched_submit(*submitted: Any) -> Any:
            future = submit(*submitted)
            seen.update(pool._processes or ())  # started on demand, one per busy submit
            return future

        pool.submit = watched_submit  # type: ignore[method-assign, assignment]
        return pool

    monkeypatch.setattr(registration, "_pool", watched_pool)
    list(encoded_batches(ConsumerCsvReader(io.StringIO(csv_text())), processes=2))
    assert len(workers) == 1 and len(workers[0]) == 2 and os.getpid() not in workers[0]
    # A file of one batch never starts the pool.
    small = "remote_identifier,email\nC-1,a@example.com\n"
    list(encoded_batches(ConsumerCsvReader(io.StringIO(small)), processes=2))
    assert len(workers) == 1
