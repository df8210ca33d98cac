"""The bulk path of ``consumers import``: hashed on every core, staged in rounds, all or
nothing even when the process is killed, idempotent, and late matches found at the end."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import logging
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from devtools.drop_simulator import work_items
from integrations.consumers import sources, workers
from integrations.consumers.load import Merged, StagedBatches
from integrations.models import Broker, Consumer, ConsumerHash, DeletionRequest, LedgerEvent
from integrations.services.cycle import consumers as consumer_services
from integrations.services.cycle.drop_import import drop_zip_import
from integrations.services.staff.brokers import broker_create
from tests.builders import (
    WebhookIntegrationFactory,
    drop_zip,
    work_item_of,
    write_zip,
)
from tests.conftest import subprocess_env

ITEMS = list(work_items(4))
OTHERS = list(work_items(300, start=1000))  # hashes DROP did not send


def run(*args: str, broker: str = "4821") -> dict[str, Any]:
    out = io.StringIO()
    call_command(
        "consumers", "import", "--broker", broker, *args, "--json", stdout=out,
        stderr=io.StringIO(),
    )  # fmt: skip
    return json.loads(out.getvalue())


def hashed_file(tmp_path: Path) -> Path:
    """300 consumers DROP does not know and, in the middle, two it sent (ITEMS 1 and 3)."""
    lines = [f"N-{i},email,{digest}\n" for i, (_, digest) in enumerate(OTHERS)]
    lines.insert(120, f"LATE-1,email,{ITEMS[1][1]}\n")
    lines.insert(250, f"LATE-3,phone,{ITEMS[3][1]}\n")
    path = tmp_path / "nightly.csv.gz"
    path.write_bytes(
        gzip.compress(("remote_identifier,hash_type,hash\n" + "".join(lines)).encode())
    )
    return path


@pytest.fixture
def many_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small rounds and batches: the pool starts, and rounds merge one after another."""
    monkeypatch.setattr(workers, "PARALLEL_BATCH_ROWS", 40)
    monkeypatch.setattr(consumer_services, "CHUNK_ROWS", 50)


@pytest.fixture
def other(broker: Broker) -> Broker:
    """A second broker, to import the same rows the other way."""
    return broker_create(broker_id="4822", name="Other", mode="test", actor="test")


def write_hashed(path: Path, lines: list[str], *, kinds: bool = False) -> Path:
    """A hashed file of ``lines``, with a ``remote_identifier_kind`` column if ``kinds``."""
    header = "remote_identifier,hash_type,hash" + (",remote_identifier_kind" if kinds else "")
    path.write_text(header + "\n" + "".join(lines), encoding="utf-8")
    return path


@pytest.mark.django_db
def test_a_bulk_import_finds_its_late_matches_in_one_join_at_the_end(
    broker: Broker, tmp_path: Path, many_rounds: None
) -> None:
    WebhookIntegrationFactory.create(broker=broker)
    package = drop_zip(broker, {"Email": [ITEMS[0], ITEMS[1]], "Phone": [ITEMS[2], ITEMS[3]]})
    drop_zip_import(broker=broker, path=write_zip(tmp_path, package), actor="test")
    assert not DeletionRequest.objects.exists()

    summary = run(str(hashed_file(tmp_path)), "--hashed")

    assert summary["hashes_added"] == 302
    late = DeletionRequest.objects.order_by("remote_identifier")
    assert [(r.remote_identifier, work_item_of(r).work_item_id, r.late_match) for r in late] == [
        ("LATE-1", ITEMS[1][0], True),
        ("LATE-3", ITEMS[3][0], True),
    ]
    assert LedgerEvent.objects.get(kind="drop.late_matched").data["deletion_requests"] == 2


@pytest.mark.django_db
def test_the_same_bulk_import_twice_changes_nothing(
    broker: Broker, tmp_path: Path, many_rounds: None
) -> None:
    path = str(hashed_file(tmp_path))
    first = run(path, "--hashed")
    before = list(ConsumerHash.objects.order_by("pk").values_list("pk", "consumer_id", "hash"))
    consumers = list(Consumer.objects.order_by("pk").values_list("pk", "remote_identifier"))
    again = run(path, "--hashed")
    assert (first["consumers_created"], first["hashes_added"]) == (302, 302)
    assert (again["consumers_created"], again["hashes_added"], again["hashes_unchanged"]) == (
        0,
        0,
        302,
    )
    assert list(ConsumerHash.objects.order_by("pk").values_list("pk", "consumer_id", "hash")) == (
        before
    )
    assert list(Consumer.objects.order_by("pk").values_list("pk", "remote_identifier")) == (
        consumers
    )


KILLED_IMPORT = """
import os, signal, sys
import django
from dropportal import setting_up
with setting_up.collector_paused():  # as manage.py sets up
    django.setup()
from django.core.management import call_command
from integrations.consumers import sources, workers
from integrations.consumers.load import ConsumerLoad
from integrations.services.cycle import consumers

workers.PARALLEL_BATCH_ROWS = 40
consumers.CHUNK_ROWS = 50
seam = getattr(ConsumerLoad, sys.argv[2])
calls = []

def then_die(*args, **kwargs):
    result = seam(*args, **kwargs)
    calls.append(1)
    if len(calls) == int(sys.argv[3]):  # written, uncommitted: killed here
        print("killing", flush=True)
        os.killpg(0, signal.SIGKILL)  # the hashing workers too, as a kill of the job would
    return result

setattr(ConsumerLoad, sys.argv[2], then_die)
call_command("consumers", "import", "--broker", "4821", sys.argv[1], "--hashed")
"""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("seam", "calls"),
    [
        ("stage", 3),  # three rounds staged
        ("finish", 1),  # merged: the consumers and a fresh partition of hashes written
    ],
)
def test_an_import_killed_midway_keeps_nothing(
    broker: Broker, tmp_path: Path, seam: str, calls: int
) -> None:
    path = str(hashed_file(tmp_path))
    killed = subprocess.run(  # noqa: S603
        [sys.executable, "-c", KILLED_IMPORT, path, seam, str(calls)],
        start_new_session=True,
        env={**subprocess_env(), "DJANGO_SETTINGS_MODULE": "dropportal.settings"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert "killing" in killed.stdout
    assert not Consumer.objects.exists()
    assert not ConsumerHash.objects.exists()
    assert not LedgerEvent.objects.filter(kind="consumers.registered").exists()
    with connection.cursor() as cursor:  # nor a partition
        cursor.execute("SELECT to_regclass(%s)", [f"integrations_consumerhash_b{broker.pk}"])
        assert cursor.fetchone()[0] is None
    # Nothing is left locked either: the same import now runs whole.
    assert run(path, "--hashed")["hashes_added"] == 302


def progress_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int, int]]:
    """The tenths logged: (file, percent read, rows hashed by then)."""
    found = []
    for record in caplog.records:
        if matched := re.fullmatch(
            r"(.+): (\d+) % read, ([\d,]+) rows hashed, [\d,]+ rows/s", record.getMessage()
        ):
            name, percent, rows = matched.groups()
            found.append((name, int(percent), int(rows.replace(",", ""))))
    return found


@pytest.mark.django_db
def test_progress_is_logged_with_the_rows_hashed_and_the_ledger_names_the_file_and_its_digest(
    broker: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = hashed_file(tmp_path)
    caplog.set_level(logging.INFO, logger="integrations.management.commands.consumers")
    run(str(path), "--hashed")  # stderr is not a terminal: no bar, log lines instead
    # A small file is read in one block: one line, once its rows are hashed (it said
    # "10 % read, 0 rows" to "100 % read, 0 rows", ten lines before any row was counted).
    assert progress_lines(caplog) == [("nightly.csv.gz", 100, 302)]
    event = LedgerEvent.objects.get(kind="consumers.registered")
    assert event.data["files"] == [
        {
            "name": "nightly.csv.gz",
            "size": path.stat().st_size,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        }
    ]


@pytest.mark.django_db
def test_a_long_import_logs_each_tenth_once_its_rows_are_hashed(
    broker: Broker,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    many_rounds: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sources, "_READ_BLOCK", 1024)  # the 20 kB file read as a long one
    lines = [f"N-{i},email,{digest}\n" for i, (_, digest) in enumerate(OTHERS)]
    path = write_hashed(tmp_path / "nightly.csv", lines)
    caplog.set_level(logging.INFO, logger="integrations.management.commands.consumers")
    run(str(path), "--hashed")
    logged = progress_lines(caplog)
    percents = [percent for _, percent, _ in logged]
    rows = [hashed for _, _, hashed in logged]
    assert len(logged) > 2 and percents == sorted(set(percents)) and percents[-1] == 100
    assert rows[0] > 0 and rows == sorted(rows) and rows[-1] <= len(OTHERS)


@pytest.mark.django_db(transaction=True)
def test_a_refused_import_ends_its_stderr_with_the_one_error_line(
    broker: Broker, tmp_path: Path
) -> None:
    # As an operator's job runs it: stderr is not a terminal, so progress is log lines.
    lines = [f"N-{i},email,{digest}\n" for i, (_, digest) in enumerate(OTHERS)]
    lines.insert(5, "N-bad,email,not-a-hash\n")
    path = write_hashed(tmp_path / "nightly.csv", lines)
    refused = subprocess.run(  # noqa: S603
        [
            sys.executable, "manage.py", "consumers", "import", "--broker", "4821", str(path),
            "--hashed", "--strict",
        ],
        cwd=settings.BASE_DIR,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    *before, last = refused.stderr.strip().splitlines()
    assert last == (
        "CommandError: nightly.csv: 1 of 301 rows rejected; --strict: nothing was imported"
    )
    assert any(" % read, 301 rows hashed" in line for line in before), refused.stderr
    assert "line 7: hash: " in refused.stderr
    assert not Consumer.objects.exists()


@pytest.mark.django_db
def test_replace_forgets_a_matched_consumer_and_its_request_keeps_the_pointer(
    broker: Broker, tmp_path: Path
) -> None:
    WebhookIntegrationFactory.create(broker=broker)
    package = drop_zip(broker, {"Email": [ITEMS[0], ITEMS[1]], "Phone": [ITEMS[2], ITEMS[3]]})
    drop_zip_import(broker=broker, path=write_zip(tmp_path, package), actor="test")
    run(str(hashed_file(tmp_path)), "--hashed")
    without_late_1 = write_hashed(
        tmp_path / "tonight.csv",
        [f"N-{i},email,{digest}\n" for i, (_, digest) in enumerate(OTHERS)]
        + [f"LATE-3,phone,{ITEMS[3][1]}\n"],
    )
    summary = run(str(without_late_1), "--hashed", "--replace")
    assert summary["consumers_forgotten"] == 1
    assert not Consumer.objects.filter(remote_identifier="LATE-1").exists()
    request = DeletionRequest.objects.get(remote_identifier="LATE-1")
    assert request.consumer_id is None  # its copy of the pointer stays
    assert DeletionRequest.objects.get(remote_identifier="LATE-3").consumer is not None


def partition_of(broker: Broker) -> str | None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT inhrelid::regclass::text FROM pg_inherits"
            " WHERE inhparent = 'integrations_consumerhash'::regclass"
            "   AND inhrelid = to_regclass(%s)",
            [f"integrations_consumerhash_b{broker.pk}"],
        )
        row = cursor.fetchone()
    return row[0] if row else None


@pytest.mark.django_db
def test_a_first_import_loads_the_brokers_own_partition_and_a_repeated_hash_counts_once(
    broker: Broker, tmp_path: Path, many_rounds: None
) -> None:
    lines = [f"N-{i},email,{digest}\n" for i, (_, digest) in enumerate(OTHERS)]
    lines += lines[:5]  # the same five hashes of the same five consumers, again
    path = write_hashed(tmp_path / "twice.csv", lines)
    assert partition_of(broker) is None

    summary = run(str(path), "--hashed")

    assert (summary["consumers_created"], summary["hashes_added"]) == (300, 300)
    assert summary["hashes_unchanged"] == 5
    assert partition_of(broker) == f"integrations_consumerhash_b{broker.pk}"
    assert ConsumerHash.objects.filter(broker=broker).count() == 300
    # The indexes built after the load are the partitioned table's own (none built twice).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), count(*) FILTER (WHERE EXISTS ("
            "  SELECT FROM pg_inherits WHERE inhrelid = indexrelid))"
            " FROM pg_index WHERE indrelid = to_regclass(%s)",
            [f"integrations_consumerhash_b{broker.pk}"],
        )
        assert cursor.fetchone() == (3, 3)
    # A later import goes into the same partition, and adds only what is new.
    more = write_hashed(tmp_path / "more.csv", [lines[0], f"N-0,phone,{ITEMS[0][1]}\n"])
    assert run(str(more), "--hashed")["hashes_added"] == 1
    assert ConsumerHash.objects.filter(broker=broker).count() == 301


# ---------------------------------------------------------------------------------------
# A first set in remote_identifier order: each round merged as it is read
# ---------------------------------------------------------------------------------------


def sorted_lines() -> list[str]:
    """Hashed rows in remote_identifier byte order: consumers of one to three rows, one of
    90 rows (it spans three batches of 40), a repeated row, a rejected one, and keys whose
    byte order is not their case-blind or numeric one."""
    lines: list[str] = []
    digests = iter(digest for _, digest in OTHERS)
    for i in range(60):
        key = f"K-{i:03d}"
        for hash_type in ("email", "phone", "email")[: 1 + i % 3]:
            lines.append(f"{key},{hash_type},{next(digests)}\n")
    lines.insert(31, lines[30])  # the same hash of the same consumer, twice
    lines.insert(50, "K-016x,email,not base64\n")  # rejected: out of order, not staged
    lines += [f"K-200,email,{digest}\n" for _, digest in work_items(90, start=5000)]
    lines += [f"{key},phone,{next(digests)}\n" for key in ("L-10", "L-9", "Z", "a", "é")]
    return lines


def registered(broker: Broker) -> set[tuple[str, str, bytes]]:
    return {
        (h.consumer.remote_identifier, h.hash_type, bytes(h.hash))
        for h in ConsumerHash.objects.filter(broker=broker).select_related("consumer")
    }


@pytest.mark.django_db
def streamed(merged: Merged) -> bool:
    """Every round was merged as it was read."""
    return merged.rounds_streamed > 0 and merged.rounds_at_end == 0


def test_a_sorted_file_is_merged_as_read_and_registers_what_the_same_rows_shuffled_do(
    broker: Broker, other: Broker, tmp_path: Path, many_rounds: None, merges: list[Merged]
) -> None:
    lines = sorted_lines()
    in_order = write_hashed(tmp_path / "sorted.csv", lines)
    shuffled = write_hashed(tmp_path / "shuffled.csv", random.Random(7).sample(lines, len(lines)))

    first = run(str(in_order), "--hashed")
    second = run(str(shuffled), "--hashed", broker="4822")

    assert streamed(merges[0]) and merges[0].rounds_streamed == 3
    assert (merges[1].rounds_streamed, merges[1].rounds_at_end) == (0, 3)
    assert first["rows_rejected"] == second["rows_rejected"] == 1
    for key in ("consumers_created", "hashes_added", "hashes_unchanged"):
        assert first[key] == second[key], key
    assert first["consumers_created"] == 66
    assert registered(broker) == registered(other)
    # One consumer per pointer, and every hash on its own pointer's consumer.
    assert Consumer.objects.filter(broker=broker).count() == 66
    k200 = Consumer.objects.get(broker=broker, remote_identifier="K-200")
    assert ConsumerHash.objects.filter(consumer=k200).count() == 90
    # Consumer ids ascend with the pointers, as the general merge draws them.
    by_id = Consumer.objects.filter(broker=broker).order_by("pk")
    keys = [c.remote_identifier for c in by_id]
    assert keys == sorted(keys)
    # Nothing is left to the general way: a repeated import changes nothing.
    again = run(str(in_order), "--hashed")
    assert (again["consumers_created"], again["hashes_added"]) == (0, 0)
    assert merges[-1].rounds_streamed == 0


@pytest.mark.django_db
def test_a_first_set_merged_as_read_finds_its_late_matches_and_may_replace(
    broker: Broker, tmp_path: Path, many_rounds: None, merges: list[Merged]
) -> None:
    WebhookIntegrationFactory.create(broker=broker)
    package = drop_zip(broker, {"Email": [ITEMS[0], ITEMS[1]], "Phone": [ITEMS[2], ITEMS[3]]})
    drop_zip_import(broker=broker, path=write_zip(tmp_path, package), actor="test")
    lines = [f"N-{i:04d},email,{digest}\n" for i, (_, digest) in enumerate(OTHERS)]
    lines.insert(120, f"N-0119a,email,{ITEMS[1][1]}\n")
    lines.insert(251, f"N-0249a,phone,{ITEMS[3][1]}\n")
    path = write_hashed(tmp_path / "sorted.csv", lines)

    # --replace: a first set has nothing to forget.
    summary = run(str(path), "--hashed", "--replace")

    assert (summary["hashes_added"], summary["consumers_forgotten"]) == (302, 0)
    assert streamed(merges[0])
    late = DeletionRequest.objects.order_by("remote_identifier")
    assert [(r.remote_identifier, work_item_of(r).work_item_id) for r in late] == [
        ("N-0119a", ITEMS[1][0]),
        ("N-0249a", ITEMS[3][0]),
    ]


@pytest.mark.django_db
def test_a_round_the_consumers_index_refuses_and_the_rest_are_merged_at_the_end(
    broker: Broker, other: Broker, tmp_path: Path, many_rounds: None, merges: list[Merged],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    lines = sorted_lines()
    path = write_hashed(tmp_path / "sorted.csv", lines)
    shuffled = write_hashed(tmp_path / "shuffled.csv", random.Random(7).sample(lines, len(lines)))
    reference = run(str(shuffled), "--hashed", broker="4822")
    add = StagedBatches.add

    def drawn_twice(self: StagedBatches, batch: Any) -> None:
        add(self, batch)
        if batch.first_remote_identifier == "K-200":
            self.skips[-1] = 0  # as if K-200 had not run on: its consumer inserted again

    monkeypatch.setattr(StagedBatches, "add", drawn_twice)

    summary = run(str(path), "--hashed")

    # Two rounds merged as read; the third, refused, rolled back to its savepoint.
    assert (merges[1].rounds_streamed, merges[1].rounds_at_end) == (2, 1)
    for key in ("consumers_created", "hashes_added", "hashes_unchanged", "kinds_changed"):
        assert summary[key] == reference[key], key
    assert summary["consumers_created"] == 66
    assert registered(broker) == registered(other)


def kinded_lines() -> list[str]:
    """Hashed rows in key order naming kinds: on a later row than the pointer's first, two
    on one pointer, and on a pointer that runs on across batches of 40 rows (K-200)."""
    digests = iter(digest for _, digest in OTHERS)
    kinds = ["", "account_id", "", "device_id", "vin"]
    lines: list[str] = []
    for i in range(30):
        for j in range(1 + i % 3):
            lines.append(f"K-{i:03d},email,{next(digests)},{kinds[(i + j) % 5]}\n")
    k200 = [f"K-200,email,{digest},\n" for _, digest in work_items(90, start=5000)]
    k200[10] = k200[10].replace(",\n", ",account_id\n")  # in its first batch
    k200[75] = k200[75].replace(",\n", ",device_id\n")  # named again, two batches on
    return lines + k200 + [f"K-300,phone,{next(digests)},\n"]


def last_kinds(lines: list[str]) -> dict[str, str]:
    """Each pointer's kind: the last its rows name, external_id when none does."""
    kinds: dict[str, str] = {}
    for line in lines:
        key, _, _, kind = line.strip("\n").split(",")
        if kind or key not in kinds:
            kinds[key] = kind or kinds.get(key) or "external_id"
    return kinds


@pytest.mark.django_db
def test_a_sorted_file_that_names_kinds_is_merged_as_read_giving_each_the_last_it_names(
    broker: Broker, other: Broker, tmp_path: Path, many_rounds: None, merges: list[Merged]
) -> None:
    lines = kinded_lines()
    path = write_hashed(tmp_path / "kinds.csv", lines, kinds=True)
    seed = write_hashed(tmp_path / "seed.csv", [f"Z-999,email,{OTHERS[-1][1]}\n"])
    run(str(seed), "--hashed", broker="4822")  # a consumer first: then the general merge

    first = run(str(path), "--hashed")
    run(str(path), "--hashed", broker="4822")

    assert [streamed(m) for m in merges] == [True, True, False]
    expected = last_kinds(lines)
    assert expected["K-200"] == "device_id" and expected["K-001"] == "account_id"
    assert first["consumers_created"] == len(expected) == 32
    for b, also in ((broker, {}), (other, {"Z-999": "external_id"})):
        kinds = Consumer.objects.filter(broker=b).values_list(
            "remote_identifier", "remote_identifier_kind"
        )
        assert dict(kinds) == expected | also, b.broker_id
    seeded = ("Z-999", "email", base64.b64decode(OTHERS[-1][1]))
    assert registered(broker) == registered(other) - {seeded}


@pytest.mark.django_db
def test_a_file_found_out_of_order_midway_keeps_what_was_merged_and_merges_the_rest(
    broker: Broker, other: Broker, tmp_path: Path, many_rounds: None, merges: list[Merged]
) -> None:
    lines = kinded_lines()
    digests = [digest for _, digest in work_items(3, start=9000)]
    lines += [  # in the second round: K-200 runs on into it from the first
        f"A-000,email,{digests[0]},vin\n",  # out of order from here
        f"K-001,phone,{digests[1]},device_id\n",  # merged as account_id: named again
        lines[0],  # a hash of K-000 again
        f"K-200,email,{digests[2]},\n",
    ]
    path = write_hashed(tmp_path / "kinds.csv", lines, kinds=True)
    seed = write_hashed(tmp_path / "seed.csv", [f"Z-999,email,{OTHERS[-1][1]}\n"])
    run(str(seed), "--hashed", broker="4822")  # a consumer first: then the general merge

    first = run(str(path), "--hashed")
    second = run(str(path), "--hashed", broker="4822")

    assert (merges[1].rounds_streamed, merges[1].rounds_at_end) == (1, 1)
    assert merges[2].rounds_streamed == 0
    expected = last_kinds(lines)
    assert expected["K-001"] == "device_id" and expected["K-200"] == "device_id"
    kinds = Consumer.objects.filter(broker=broker).values_list(
        "remote_identifier", "remote_identifier_kind"
    )
    assert dict(kinds) == expected
    assert (first["consumers_created"], first["hashes_unchanged"]) == (len(expected), 1)
    for key in ("consumers_created", "kinds_changed", "hashes_added", "hashes_unchanged"):
        assert first[key] == second[key], key
    seeded = ("Z-999", "email", base64.b64decode(OTHERS[-1][1]))
    assert registered(broker) == registered(other) - {seeded}
