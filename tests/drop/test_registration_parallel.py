"""Hashing on every core: ``records_in_parallel`` gives the records a single process gives,
in the same order, rejected rows included."""

from __future__ import annotations

import io
import os
from typing import Any

import pytest

from integrations.drop import registration
from integrations.drop.registration import ConsumerCsvReader, records_in_parallel


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
def test_parallel_records_equal_the_single_process_ones_in_order(
    monkeypatch: pytest.MonkeyPatch, processes: int
) -> None:
    monkeypatch.setattr(registration, "PARALLEL_BATCH_ROWS", 7)  # 9 batches, 8 to the pool
    serial = list(ConsumerCsvReader(io.StringIO(csv_text())))
    parallel = list(
        records_in_parallel(ConsumerCsvReader(io.StringIO(csv_text())), processes=processes)
    )
    assert parallel == serial
    assert len(parallel) == 60
    rejected = [r.position for r in parallel if isinstance(r, registration.RejectedRecord)]
    assert rejected == [2, 13, 15, 24, 28, 35, 41, 46, 54, 57]


def test_the_pool_hashes_in_other_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registration, "PARALLEL_BATCH_ROWS", 5)
    workers: list[set[int]] = []
    real_pool = registration._pool

    def watched_pool(*args: Any) -> Any:
        pool = real_pool(*args)
        workers.append({process.pid for process in pool._pool})
        return pool

    monkeypatch.setattr(registration, "_pool", watched_pool)
    list(records_in_parallel(ConsumerCsvReader(io.StringIO(csv_text())), processes=2))
    assert len(workers) == 1 and len(workers[0]) == 2 and os.getpid() not in workers[0]
    # A file of one batch never starts the pool.
    small = "remote_identifier,email\nC-1,a@example.com\n"
    list(records_in_parallel(ConsumerCsvReader(io.StringIO(small)), processes=2))
    assert len(workers) == 1
