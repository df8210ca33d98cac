"""``drop suppression export``: every hash DROP sent and did not remove, ``hash_type,hash``,
as CSV or Parquet, to stdout, a file or an S3 object (moto's server on loopback)."""

from __future__ import annotations

import base64
import hashlib
import io
import tracemalloc
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from integrations import exports
from integrations.models import Broker, LedgerEvent, WorkItemState
from integrations.selectors import suppression
from integrations.services.staff.brokers import broker_create
from tests.builders import DropCycleFactory, WorkItemFactory

pytestmark = pytest.mark.django_db


def b64(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


@pytest.fixture
def suppressed(broker: Broker) -> list[tuple[str, str]]:
    """Three suppressed hashes (one sent twice, in two cycles), one removed by DROP, and
    another broker's: the export holds the three, each once, in order."""
    first = DropCycleFactory.create(broker=broker, drop_session_id="1")
    second = DropCycleFactory.create(broker=broker, drop_session_id="2")
    WorkItemFactory.create(cycle=first, hash=base64.b64decode(b64("anna")), reported=True)
    WorkItemFactory.create(cycle=second, hash=base64.b64decode(b64("anna")))
    WorkItemFactory.create(cycle=first, list_type="Phone", hash=base64.b64decode(b64("phone")))
    WorkItemFactory.create(cycle=second, list_type="MAID", hash=base64.b64decode(b64("maid")))
    WorkItemFactory.create(
        cycle=first, hash=base64.b64decode(b64("cancelled")), state=WorkItemState.REMOVED
    )
    other = broker_create(broker_id="1234", name="Other", mode="test", actor="test")
    WorkItemFactory.create(
        cycle=DropCycleFactory.create(broker=other), hash=base64.b64decode(b64("other"))
    )
    # In the order of the raw hash.
    rows = [("email", "anna"), ("maid", "maid"), ("phone", "phone")]
    return sorted(((t, b64(v)) for t, v in rows), key=lambda row: base64.b64decode(row[1]))


def export(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("drop", "suppression", "export", "--broker", "4821", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def csv_text(rows: list[tuple[str, str]]) -> str:
    return "hash_type,hash\n" + "".join(f"{t},{h}\n" for t, h in rows)


def test_csv_on_stdout_lists_each_suppressed_hash_once(
    suppressed: list[tuple[str, str]],
) -> None:
    out, _ = export()

    assert out == csv_text(suppressed)
    event = LedgerEvent.objects.get(kind="suppression.exported")
    assert event.data == {
        "format": "csv",
        "destination": "stdout",
        "hashes": 3,
        "sha256": hashlib.sha256(out.encode()).hexdigest(),
    }


def test_csv_to_a_file(suppressed: list[tuple[str, str]], tmp_path: Path) -> None:
    path = tmp_path / "suppressed.csv"

    out, err = export("--out", str(path))

    assert out == "" and path.read_text() == csv_text(suppressed)
    assert err.strip() == f"Wrote 3 suppressed hashes to {path} ({path.stat().st_size:,} bytes)."
    assert [p.name for p in tmp_path.iterdir()] == ["suppressed.csv"]  # nothing .partial


def test_parquet_is_written_in_row_groups(
    suppressed: list[tuple[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exports, "PARQUET_ROW_GROUP_BYTES", 60)  # about one row a group
    path = tmp_path / "suppressed.parquet"

    export("--format", "parquet", "--out", str(path))

    parquet = pq.ParquetFile(path)
    assert parquet.schema_arrow.names == ["hash_type", "hash"]
    assert parquet.metadata.num_row_groups == 3
    table = parquet.read()
    assert list(zip(*table.to_pydict().values(), strict=True)) == suppressed
    event = LedgerEvent.objects.get(kind="suppression.exported")
    assert event.data["hashes"] == 3 and event.data["format"] == "parquet"
    assert event.data["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_empty_list_is_a_header_or_an_empty_table(broker: Broker, tmp_path: Path) -> None:
    assert export() == ("hash_type,hash\n", "")
    path = tmp_path / "none.parquet"
    export("--format", "parquet", "--out", str(path))
    assert pq.read_table(path).num_rows == 0


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_to_an_s3_object(suppressed: list[tuple[str, str]], bucket: Any, fmt: str) -> None:
    _, err = export("--format", fmt, "--out", f"s3://exports/drop/suppressed.{fmt}")

    body = bucket.get_object(Bucket="exports", Key=f"drop/suppressed.{fmt}")["Body"].read()
    if fmt == "csv":
        assert body.decode() == csv_text(suppressed)
    else:
        table = pq.read_table(io.BytesIO(body))
        assert list(zip(*table.to_pydict().values(), strict=True)) == suppressed
    assert f"to s3://exports/drop/suppressed.{fmt}" in err
    event = LedgerEvent.objects.get(kind="suppression.exported")
    assert event.data["sha256"] == hashlib.sha256(body).hexdigest()


def test_errors_are_one_line_and_leave_nothing(
    suppressed: list[tuple[str, str]], bucket: Any, tmp_path: Path
) -> None:
    with pytest.raises(CommandError, match=r"^no broker with id '9999'$"):
        call_command("drop", "suppression", "export", "--broker", "9999")
    with pytest.raises(CommandError, match=r"^--out .*/missing/x\.csv: no such folder: "):
        export("--out", str(tmp_path / "missing" / "x.csv"))
    with pytest.raises(CommandError, match=r"^--out is empty"):  # not stdout, unasked
        export("--out", "")
    with pytest.raises(CommandError, match=r"^s3://no-such-bucket/x\.csv: NoSuchBucket"):
        export("--out", "s3://no-such-bucket/x.csv")
    with pytest.raises(CommandError, match=r"name an object"):
        export("--out", "s3://exports/folder/")
    assert not LedgerEvent.objects.filter(kind="suppression.exported").exists()
    assert "Contents" not in bucket.list_objects_v2(Bucket="exports")


def test_a_failure_midway_leaves_no_file_and_no_object(
    suppressed: list[tuple[str, str]],
    bucket: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(**kwargs: Any) -> Any:
        yield b"hash_type,hash\n"
        raise OSError("connection lost")

    monkeypatch.setattr("integrations.management.drop_suppression.suppressed_hashes_csv", broken)
    for out in (str(tmp_path / "s.csv"), "s3://exports/s.csv"):
        with pytest.raises(CommandError, match="connection lost"):
            export("--out", out)
    assert list(tmp_path.iterdir()) == []
    assert "Contents" not in bucket.list_objects_v2(Bucket="exports")
    assert bucket.list_multipart_uploads(Bucket="exports").get("Uploads", []) == []


def test_the_export_streams_at_flat_memory(broker: Broker, tmp_path: Path) -> None:
    cycle = DropCycleFactory.create(broker=broker)
    rows = 60_000
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO integrations_workitem (broker_id, cycle_id, work_item_id, hash_type,"
            " hash, file_name, state, status_reason, needs_amendment)"
            " SELECT %s, %s, 'W' || n, 'email', sha256(n::text::bytea), 'f.csv', 'open', '',"
            " false FROM generate_series(1, %s) n",
            [broker.pk, cycle.pk, rows],
        )
    chunks = list(suppression.suppressed_hashes_csv(broker=broker))
    assert len(chunks) > 10  # handed on as it comes, not built whole
    path = tmp_path / "big.csv"

    tracemalloc.start()
    try:
        export("--out", str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    size = path.stat().st_size
    assert size > 3_000_000 and path.read_text().count("\n") == rows + 1
    assert peak < size / 4, f"peak {peak:,} bytes for a {size:,}-byte export"
