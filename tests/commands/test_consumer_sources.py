"""``consumers import`` from every kind of source: CSV, gzip CSV, Parquet, standard input and
an S3 bucket (a real S3-compatible server on loopback, moto's, started here)."""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import http.server
import io
import json
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from integrations.consumers import sources, workers
from integrations.consumers.load import Merged
from integrations.models import Broker, Consumer, ConsumerHash, LedgerEvent
from tests.conftest import s3_reached_at

pytestmark = pytest.mark.django_db

ANNA_CLEAR = "Anna.Smith@Domain.com"
ANNA = "KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE="  # Anna.Smith@Domain.com
PHONE = "vGM7y5n+hBXRSEAklhHDPCbysyNgYTmXdMcagGUOY8E="  # +1(415)555-9317
NDZ = "PQOfn1RffEKmqMmNAzDKKaoZCwxWbQZkQzPWmQo9REA="  # Danielle / Johnson / 1985-07-04 / 91790

CLEAR = (
    "remote_identifier,email,phone,first_name,last_name,dob,zip\n"
    "C-1,Anna.Smith@Domain.com,+1(415)555-9317,,,,\n"
    "C-2,,,Danielle,Johnson,1985-07-04,91790\n"
    "C-3,,no digits,,,,\n"
)
EXPECTED = {"C-1": [("email", ANNA), ("phone", PHONE)], "C-2": [("ndz", NDZ)]}


def run(*args: str, stdin: Any = None) -> tuple[dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("consumers", "import", "--broker", "4821", *args, "--json", stdout=out, stderr=err)
    return json.loads(out.getvalue()), err.getvalue()


def stored(broker: Broker) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for h in ConsumerHash.objects.filter(broker=broker).select_related("consumer"):
        out.setdefault(h.consumer.remote_identifier, []).append(
            (h.hash_type, base64.b64encode(bytes(h.hash)).decode())
        )
    return {k: sorted(v) for k, v in out.items()}


def parquet_bytes(row_group_size: int = 1) -> bytes:
    """CLEAR as Parquet, with the types a warehouse export has: a date and an integer zip,
    nulls for missing values, one row group per row (several record batches)."""
    import datetime as dt

    table = pa.table(
        {
            "remote_identifier": ["C-1", "C-2", "C-3"],
            "email": ["Anna.Smith@Domain.com", None, None],
            "phone": ["+1(415)555-9317", None, "no digits"],
            "first_name": [None, "Danielle", None],
            "last_name": [None, "Johnson", None],
            "dob": pa.array([None, dt.date(1985, 7, 4), None], pa.date32()),
            "zip": pa.array([None, 91790, None], pa.int64()),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group_size)
    return sink.getvalue()


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("consumers.csv", CLEAR.encode()),
        ("consumers.csv.gz", gzip.compress(CLEAR.encode())),
        ("consumers.parquet", parquet_bytes()),
    ],
)
def test_each_format_is_found_from_the_name_and_imported_alike(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, content: bytes
) -> None:
    monkeypatch.setattr(sources, "PARQUET_BATCH_ROWS", 2)  # two record batches
    path = tmp_path / name
    path.write_bytes(content)
    summary, err = run(str(path))
    where = "row 3" if name.endswith("parquet") else "line 4"
    assert err.splitlines() == [f"{where}: phone: phone has no digits"]
    assert stored(broker) == EXPECTED
    assert (summary["rows_read"], summary["rows_rejected"], summary["hashes_added"]) == (3, 1, 3)
    assert LedgerEvent.objects.get(kind="consumers.registered").subject == f"file:{name}"


@pytest.mark.parametrize("name", ["c.csv", "c.parquet"])
def test_a_column_that_gives_no_hash_is_named_for_csv_and_parquet_alike(
    broker: Broker, tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    if name.endswith(".csv"):
        path.write_text(f"remote_identifier,email,zip\nC-1,{ANNA_CLEAR},91790\n")
    else:
        table = {"remote_identifier": ["C-1"], "email": [ANNA_CLEAR], "zip": pa.array([91790])}
        pq.write_table(pa.table(table), path)
    summary, err = run(str(path))
    assert err == ""
    assert summary["unused_columns"] == [
        f"{name}: zip not used: no NDZ without first_name, last_name and dob"
    ]
    assert stored(broker) == {"C-1": [("email", ANNA)]}


def test_format_option_overrides_the_name(broker: Broker, tmp_path: Path) -> None:
    path = tmp_path / "export.bin"
    path.write_bytes(gzip.compress(CLEAR.encode()))
    with pytest.raises(CommandError, match=r"cannot tell the format of .*use --format"):
        run(str(path))
    run(str(path), "--format", "csv.gz")
    assert stored(broker) == EXPECTED


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "c.csv.gz",
            gzip.compress(CLEAR.encode()),
            r"not CSV text: the file is gzip-compressed: read it with --format csv\.gz",
        ),
        (
            "c.parquet",
            parquet_bytes(),
            r"the file is a Parquet file: read it with --format parquet",
        ),
        ("c.zip", b"PK\x03\x04" + bytes(40), r"the file is a ZIP archive, which no format reads"),
    ],
)
def test_a_file_read_as_csv_that_is_not_says_what_it_is(
    broker: Broker, tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    events = LedgerEvent.objects.count()

    with pytest.raises(CommandError, match=message) as refused:
        run(str(path), "--format", "csv")

    assert "UTF-16" not in str(refused.value)
    assert "\n" not in str(refused.value)
    assert stored(broker) == {}
    assert LedgerEvent.objects.count() == events


def test_standard_input_in_each_format(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "in.parquet"
    path.write_bytes(parquet_bytes())
    with path.open("rb") as stdin:
        monkeypatch.setattr("sys.stdin", stdin)
        summary, _ = run("-", "--format", "parquet")
    assert stored(broker) == EXPECTED
    assert summary["file"] == "stdin"


def damaged_gzip(text: str) -> bytes:
    """A gzip file whose header is intact and whose deflate stream holds ``text``, then a
    block of the type no deflate writer makes (3): zlib's own error, not an OSError."""
    deflate = zlib.compressobj(wbits=31)  # 31: with the gzip header and trailer
    return deflate.compress(text.encode()) + deflate.flush(zlib.Z_FULL_FLUSH) + b"\x07" + bytes(8)


# 1.2 MB, more than a read block, in few wide rows (each one is hashed before the damage).
MANY_ROWS = "".join(f"C-{i},a{i}{'x' * 280}@example.com\n" for i in range(4_000))


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.csv.gz", b"not gzip at all", "bad.csv.gz: read failed: .*gzip"),
        ("cut.csv.gz", gzip.compress(CLEAR.encode())[:-12], "cut.csv.gz: read failed"),
        # Damaged before the header is read, and after rows were read (more than a read block).
        ("head.csv.gz", damaged_gzip(""), "head.csv.gz: read failed: .*damaged.*invalid block"),
        (
            "rows.csv.gz",
            damaged_gzip(f"remote_identifier,email\n{MANY_ROWS}"),
            "rows.csv.gz: read failed: .*damaged.*invalid block",
        ),
        ("bad.parquet", b"PAR1 not really", "bad.parquet: not a Parquet file"),
        ("bad.csv", b"email,remote_identifier\nx,y\n", "first column must be remote_identifier"),
    ],
)
def test_a_bad_file_is_one_line_and_nothing_is_written(
    broker: Broker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    content: bytes,
    message: str,
) -> None:
    # Rows past the first thousand go to the worker pool, as a long file's do.
    monkeypatch.setattr(workers, "PARALLEL_BATCH_ROWS", 1_000)
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CommandError, match=message) as raised:
        run(str(path))
    assert "\n" not in str(raised.value) and "nothing was imported" in str(raised.value)
    assert not Consumer.objects.exists()
    assert not LedgerEvent.objects.filter(kind="consumers.registered").exists()


# ---------------------------------------------------------------------------------------
# S3, against a real S3-compatible server on loopback
# ---------------------------------------------------------------------------------------


def test_one_s3_object_in_each_format(
    broker: Broker, bucket: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sources, "PARQUET_BATCH_ROWS", 1)  # a ranged read per row group
    bucket.put_object(Bucket="exports", Key="nightly/c.parquet", Body=parquet_bytes())
    summary, err = run("s3://exports/nightly/c.parquet")
    assert stored(broker) == EXPECTED
    assert err.splitlines() == ["row 3: phone: phone has no digits"]
    assert summary["file"] == "s3://exports/nightly/c.parquet"
    event = LedgerEvent.objects.get(kind="consumers.registered")
    assert event.subject == "s3://exports/nightly/c.parquet"


def test_an_s3_prefix_imports_every_object_in_name_order_as_one_import(
    broker: Broker, bucket: Any
) -> None:
    header = "remote_identifier,remote_identifier_kind,email\n"
    # Name order decides which kind C-1 ends with: part-2 is read after part-1.
    bucket.put_object(
        Bucket="exports",
        Key="nightly/part-2.csv.gz",
        Body=gzip.compress(f"{header}C-1,crm_id,Anna.Smith@Domain.com\n".encode()),
    )
    bucket.put_object(
        Bucket="exports",
        Key="nightly/part-1.csv",
        Body=f"{header}C-1,old_kind,Anna.Smith@Domain.com\n,,x@example.com\n".encode(),
    )
    bucket.put_object(Bucket="exports", Key="other/ignored.csv", Body=b"junk")
    summary, err = run("s3://exports/nightly/")
    assert err.splitlines() == [
        "s3://exports/nightly/part-1.csv line 3: remote_identifier: remote_identifier is required"
    ]
    assert summary["file"] == "s3://exports/nightly/"
    assert (summary["rows_read"], summary["consumers_created"]) == (3, 1)
    assert Consumer.objects.get().remote_identifier_kind == "crm_id"
    assert stored(broker) == {"C-1": [("email", ANNA)]}


def test_a_bad_object_under_a_prefix_keeps_nothing_of_the_others(
    broker: Broker, bucket: Any
) -> None:
    bucket.put_object(Bucket="exports", Key="n/a.csv", Body=CLEAR.encode())
    bucket.put_object(Bucket="exports", Key="n/b.csv", Body=b"remote_identifier,emial\nx,y\n")
    with pytest.raises(CommandError, match=r"^s3://exports/n/b.csv: unknown column 'emial'"):
        run("s3://exports/n/")
    assert not Consumer.objects.exists()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("s3://exports/missing.csv", r"s3://exports/missing.csv: 404"),
        ("s3://exports/empty/", r"s3://exports/empty/: no objects under this prefix"),
        ("s3://no-such-bucket/x/", r"s3://no-such-bucket/x/: NoSuchBucket"),
        # botocore refuses the name before asking, in several lines.
        ("s3://bad bucket/x.csv", r"s3://bad bucket/x.csv: Parameter validation failed: Inv"),
    ],
)
def test_a_missing_s3_source_is_one_line(
    broker: Broker, bucket: Any, source: str, message: str
) -> None:
    with pytest.raises(CommandError, match=message) as raised:
        run(source)
    assert "nothing was imported" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert not Consumer.objects.exists()


def test_a_credential_chain_boto3_refuses_is_one_line(
    broker: Broker, bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """boto3 refuses to make the client itself (``AWS_PROFILE`` names no profile)."""
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_PROFILE", "warehouse")
    with pytest.raises(CommandError) as raised:
        run("s3://exports/c.csv")
    message = str(raised.value)
    assert "\n" not in message and message.endswith("nothing was imported")
    assert "s3://exports/c.csv" in message and "(warehouse) could not be found" in message


def test_objects_in_key_order_are_merged_as_one_file_a_key_running_on_across_two(
    broker: Broker, bucket: Any, merges: list[Merged]
) -> None:
    # C-1's email ends part-1, its phone starts part-2: one consumer.
    bucket.put_object(
        Bucket="exports",
        Key="nightly/part-1.csv",
        Body=b"remote_identifier,email,phone\nC-0,x@example.com,\nC-1,Anna.Smith@Domain.com,\n",
    )
    bucket.put_object(
        Bucket="exports",
        Key="nightly/part-2.csv.gz",
        Body=gzip.compress(b"remote_identifier,phone\nC-1,+1(415)555-9317\nC-2,+1(415)555-0100\n"),
    )

    summary, _ = run("s3://exports/nightly/")

    assert [(m.rounds_streamed, m.rounds_at_end) for m in merges] == [(1, 0)]
    assert (summary["consumers_created"], summary["hashes_added"]) == (3, 4)
    assert stored(broker)["C-1"] == EXPECTED["C-1"]
    ids = list(Consumer.objects.order_by("remote_identifier").values_list("pk", flat=True))
    assert ids == sorted(ids) and len(set(ids)) == 3


# ---------------------------------------------------------------------------------------
# The file's digest, timestamp dates, caps on a line and on a batch
# ---------------------------------------------------------------------------------------


@functools.cache
def big_parquet_bytes() -> bytes:
    """CLEAR's rows after 2,000 wide filler rows (about 1.6 MB): the reader seeks to the
    footer first, past more than the gap it reads through, then back to the row groups.
    Few rows, each wide: the size is what the reads are about, and every row is hashed
    and stored."""
    filler = pa.table(
        {
            "remote_identifier": [f"F-{i}" for i in range(2_000)],
            "email": [f"{i:08d}-{'x' * 760}@example.com" for i in range(2_000)],
        }
    )
    rows = pa.table({"remote_identifier": ["C-1"], "email": ["Anna.Smith@Domain.com"]})
    sink = io.BytesIO()
    pq.write_table(pa.concat_tables([filler, rows]), sink, row_group_size=500, compression="none")
    return sink.getvalue()


def ledger_files() -> list[dict[str, Any]]:
    return LedgerEvent.objects.get(kind="consumers.registered").data["files"]


@pytest.mark.parametrize("gap", [0, 16, None], ids=["no-gap-read", "small-gap", "default"])
@pytest.mark.parametrize("where", ["file", "stdin", "s3"])
def test_a_parquet_files_sha256_reaches_the_ledger_like_a_csvs(
    broker: Broker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    where: str,
    gap: int | None,
) -> None:
    if gap is not None:
        monkeypatch.setattr(sources, "_DIGEST_GAP", gap)
    # As a long file is read: the rows after the first batch are hashed by the worker pool.
    monkeypatch.setattr(workers, "PARALLEL_BATCH_ROWS", 1_500)
    monkeypatch.setattr(sources, "PARQUET_BATCH_ROWS", 400)  # more than one read per row group
    content = big_parquet_bytes()
    path = tmp_path / "c.parquet"
    path.write_bytes(content)
    if where == "s3":
        request.getfixturevalue("bucket").put_object(
            Bucket="exports", Key="c.parquet", Body=content
        )
        summary, _ = run("s3://exports/c.parquet")
        name = "s3://exports/c.parquet"
    elif where == "stdin":
        with path.open("rb") as stdin:
            monkeypatch.setattr("sys.stdin", stdin)
            summary, _ = run("-", "--format", "parquet")
        name = "stdin"
    else:
        summary, _ = run(str(path))
        name = "c.parquet"
    assert summary["rows_read"] == 2_001
    assert ledger_files() == [
        {"name": name, "size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    ]


@pytest.mark.parametrize("unit", ["ms", "us", "ns"])
@pytest.mark.parametrize("tz", [None, "UTC", "America/Los_Angeles", "Asia/Tokyo"])
def test_a_timestamp_date_of_birth_hashes_like_the_date(
    broker: Broker, tmp_path: Path, unit: str, tz: str | None
) -> None:
    import datetime as dt

    import pyarrow.compute as pc

    dob = pa.array([dt.datetime(1985, 7, 4)], pa.timestamp(unit))
    if tz is not None:  # midnight where the export was made
        dob = pc.assume_timezone(dob, tz)
    table = pa.table(
        {
            "remote_identifier": ["C-2"],
            "first_name": ["Danielle"],
            "last_name": ["Johnson"],
            "dob": dob,
            "zip": ["91790"],
        }
    )
    path = tmp_path / "c.parquet"
    pq.write_table(table, path)
    summary, err = run(str(path))
    assert (summary["rows_rejected"], err) == (0, "")
    assert stored(broker) == {"C-2": [("ndz", NDZ)]}


# Declared UTF-8, holding Latin-1 (a writer that does not check): "José" and "Müller".
NOT_UTF8_ROWS = [
    (b"C-1", b"Jos\xe9@example.com"),
    (b"C-2", b"Anna.Smith@Domain.com"),
    (b"M\xfcller-3", b"m@example.com"),
]


def not_utf8_file(path: Path) -> None:
    if path.suffix == ".csv":
        lines = [b"remote_identifier,email", *(b",".join(row) for row in NOT_UTF8_ROWS)]
        path.write_bytes(b"\n".join(lines) + b"\n")
        return
    pointers, emails = (
        pa.array([row[i] for row in NOT_UTF8_ROWS], pa.binary()).view(pa.string()) for i in (0, 1)
    )
    pq.write_table(pa.table({"remote_identifier": pointers, "email": emails}), path)


@pytest.mark.parametrize(("name", "first"), [("c.csv", "line 2"), ("c.parquet", "row 1")])
def test_a_cell_not_utf8_rejects_its_row_alone_in_csv_and_parquet_alike(
    broker: Broker, tmp_path: Path, name: str, first: str
) -> None:
    not_utf8_file(tmp_path / name)
    summary, err = run(str(tmp_path / name))
    where, number = first.split()
    assert err.splitlines() == [
        f"{where} {int(number)}: email: email is not valid UTF-8",
        f"{where} {int(number) + 2}: remote_identifier: remote_identifier is not valid UTF-8",
    ]
    assert (summary["rows_read"], summary["rows_rejected"]) == (3, 2)
    assert stored(broker) == {"C-2": [("email", ANNA)]}


def test_a_binary_parquet_column_not_utf8_rejects_its_row_alone(
    broker: Broker, tmp_path: Path
) -> None:
    """Strings written as plain binary, with no UTF-8 annotation (as Impala and older Hive
    write them), are read as text cell by cell too: a cell that is not UTF-8 rejects its
    row, not the file."""
    path = tmp_path / "c.parquet"
    columns = {
        name: pa.array([row[i] for row in NOT_UTF8_ROWS], pa.binary())
        for i, name in enumerate(("remote_identifier", "email"))
    }
    pq.write_table(pa.table(columns), path)
    summary, err = run(str(path))
    assert err.splitlines() == [
        "row 1: email: email is not valid UTF-8",
        "row 3: remote_identifier: remote_identifier is not valid UTF-8",
    ]
    assert (summary["rows_read"], summary["rows_rejected"]) == (3, 2)
    assert stored(broker) == {"C-2": [("email", ANNA)]}


@pytest.mark.parametrize(
    ("column", "values", "type_name"),
    [
        # As text, 14155551234.0 is "1.4155551234e+10": a wrong hash, stored.
        ("phone", pa.array([14155551234.0]), "double"),
        ("remote_identifier", pa.array([12345678901.0]), "double"),
        ("zip", pa.array([91790.0], pa.float32()), "float"),
        ("phone", pa.array([14155551234], pa.decimal128(11, 0)), "decimal128(11, 0)"),
    ],
)
def test_a_float_or_decimal_parquet_column_refuses_the_file_naming_it(
    broker: Broker, tmp_path: Path, column: str, values: Any, type_name: str
) -> None:
    table = {
        "remote_identifier": ["E-1"],
        "phone": ["+1(415)555-9317"],
        "first_name": ["Danielle"],
        "last_name": ["Johnson"],
        "dob": ["1985-07-04"],
        "zip": ["91790"],
        column: values,
    }
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table(table), path)
    with pytest.raises(CommandError) as raised:
        run(str(path))
    assert str(raised.value) == (
        f"f.parquet: column {column!r} is of type {type_name}, which does not read back as "
        "the digits written; write it as text or integer (pandas writes an integer column "
        "with empty cells as float64: make it Int64 or text); nothing was imported"
    )
    assert not Consumer.objects.exists()


def test_a_csv_line_longer_than_the_cap_refuses_the_file_naming_the_line(
    broker: Broker, tmp_path: Path
) -> None:
    long = "C-2," + "x" * sources.CSV_LINE_MAX  # no line end: a file read as one line
    for name, content in (
        ("long.csv", f"remote_identifier,email\nC-1,Anna.Smith@Domain.com\n{long}"),
        ("long.csv.gz", gzip.compress(f"remote_identifier,email\n{long}\n".encode())),
    ):
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        line = 3 if name == "long.csv" else 2
        with pytest.raises(CommandError) as raised:
            run(str(path))
        assert str(raised.value) == (
            f"{name}: line {line} is longer than 1,048,576 characters, the most a line may "
            "have (is this a CSV file?); nothing was imported"
        )
    assert not Consumer.objects.exists()
    # A line of exactly the cap, its line end included, is read (and refused by the CSV
    # module's own limit on a field, naming its line).
    fits = "C-1,Anna.Smith@Domain.com"
    fits += " " * (sources.CSV_LINE_MAX - len(fits) - 1) + "\n"
    (tmp_path / "fits.csv").write_text(f"remote_identifier,email\n{fits}C-2,{ANNA_CLEAR}\n")
    with pytest.raises(CommandError) as raised:
        run(str(tmp_path / "fits.csv"))
    assert str(raised.value) == (
        "fits.csv: line 2 is not valid CSV: field larger than field limit (131072); "
        "nothing was imported"
    )
    assert not Consumer.objects.exists()


def test_an_oversized_quoted_field_refuses_the_file_not_making_rows_of_its_lines(
    broker: Broker, tmp_path: Path
) -> None:
    note = "x" * 140_000 + f"\nPHANTOM-1,{ANNA_CLEAR}\nmore"
    path = tmp_path / "note.csv"
    path.write_text(f'remote_identifier,email\nC-1,{ANNA_CLEAR}\nR-1,"{note}"\n')
    with pytest.raises(CommandError) as raised:
        run(str(path))
    assert str(raised.value) == (
        "note.csv: line 3 is not valid CSV: field larger than field limit (131072); "
        "nothing was imported"
    )
    assert not Consumer.objects.exists()


def wide_parquet(path: Path, widths: list[int]) -> None:
    table = pa.table(
        {
            "remote_identifier": [f"C-{i}" for i in range(len(widths))],
            "email": [f"{i}{'x' * width}@example.com" for i, width in enumerate(widths)],
        }
    )
    pq.write_table(table, path, compression="none")


def test_parquet_batches_are_sized_by_bytes(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []
    iter_batches = pq.ParquetFile.iter_batches

    def watched(self: pq.ParquetFile, *args: Any, **kwargs: Any) -> Any:
        for batch in iter_batches(self, *args, **kwargs):
            sizes.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", watched)
    monkeypatch.setattr(sources, "PARQUET_BATCH_BYTES", 25_000)
    path = tmp_path / "wide.parquet"
    wide_parquet(path, [10_000] * 10)  # about 10 KB a row (distinct: no dictionary): 2 a batch
    summary, _ = run(str(path))
    assert summary["hashes_added"] == 10
    assert sizes == [2] * 5


def test_a_parquet_batch_over_the_cap_is_refused_naming_its_rows(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sources, "PARQUET_BATCH_MAX_BYTES", 50_000)
    path = tmp_path / "wide.parquet"
    wide_parquet(path, [10] * 100 + [100_000])  # one row far wider than the rest
    with pytest.raises(CommandError) as raised:
        run(str(path))
    assert str(raised.value).startswith("wide.parquet: rows 1-101 decode to ")
    assert str(raised.value).endswith(
        "more than the 50,000 a batch may take; rows this wide are not consumer records; "
        "nothing was imported"
    )
    assert not Consumer.objects.exists()


# ---------------------------------------------------------------------------------------
# S3: marker objects, plain http, an object replaced mid-read
# ---------------------------------------------------------------------------------------


def test_marker_objects_under_a_prefix_are_skipped_and_named(broker: Broker, bucket: Any) -> None:
    markers = {
        "out/_SUCCESS": b"",
        "out/_committed_1234": b"{}",
        "out/.part-0.parquet.crc": b"crc bytes",
        "out/empty.csv": b"",
        # A job's files in progress, in its hidden folders: not the set yet.
        "out/_temporary/0/part-1.parquet": b"half a file",
        "out/.hive-staging_1/000000_0": b"staged",
    }
    for key, body in {**markers, "out/part-0.parquet": parquet_bytes()}.items():
        bucket.put_object(Bucket="exports", Key=key, Body=body)
    skipped = [f"s3://exports/{key}" for key in sorted(markers)]

    summary, _ = run("s3://exports/out/")
    assert summary["skipped"] == skipped
    assert stored(broker) == EXPECTED
    assert ledger_files()[0]["name"] == "s3://exports/out/part-0.parquet"
    assert len(ledger_files()) == 1

    out = io.StringIO()
    call_command("consumers", "import", "--broker", "4821", "s3://exports/out/", stdout=out)
    assert (
        out.getvalue()
        .rstrip()
        .endswith(
            "Skipped 6 marker objects (empty, or named _… or .…, or in a folder so named): "
            f"{', '.join(skipped)}."
        )
    )


def test_a_real_file_of_unknown_type_under_a_prefix_still_refuses_it(
    broker: Broker, bucket: Any
) -> None:
    bucket.put_object(Bucket="exports", Key="out/_SUCCESS", Body=b"")
    bucket.put_object(Bucket="exports", Key="out/part-0.csv", Body=CLEAR.encode())
    bucket.put_object(Bucket="exports", Key="out/part-0.json", Body=b"{}")
    with pytest.raises(CommandError, match=r"cannot tell the format of 'out/part-0.json'"):
        run("s3://exports/out/")
    bucket.delete_object(Bucket="exports", Key="out/part-0.csv")
    bucket.delete_object(Bucket="exports", Key="out/part-0.json")
    with pytest.raises(CommandError) as raised:
        run("s3://exports/out/")
    assert str(raised.value) == (
        "s3://exports/out/: no objects under this prefix (skipped 1 marker objects); "
        "nothing was imported"
    )
    assert not Consumer.objects.exists()


@pytest.mark.parametrize(
    ("endpoint", "shown"),
    [
        ("http://s3.internal:9000", "S3 endpoint http://s3.internal:9000: plain http"),
        ("http://key:secret@10.0.0.5", "S3 endpoint http://10.0.0.5: plain http"),
        ("ftp://127.0.0.1:21", "S3 endpoint ftp://127.0.0.1:21: use an https:// URL"),
        ("minio:9000", "S3 endpoint: not a URL with a host"),
    ],
)
def test_a_plain_http_endpoint_off_loopback_is_refused(
    broker: Broker, bucket: Any, settings: Any, endpoint: str, shown: str
) -> None:
    bucket.put_object(Bucket="exports", Key="c.csv", Body=CLEAR.encode())
    settings.DROPPORTAL_S3_ENDPOINT_URL = endpoint
    with pytest.raises(CommandError) as raised:
        run("s3://exports/c.csv")
    message = str(raised.value)
    assert "\n" not in message and message.endswith("nothing was imported")
    assert message.startswith(shown)
    assert "https://" in message and "secret" not in message
    assert not Consumer.objects.exists()


def test_a_plain_http_endpoint_on_loopback_by_name_is_read(
    broker: Broker, bucket: Any, settings: Any, s3_server: str
) -> None:
    bucket.put_object(Bucket="exports", Key="c.csv", Body=CLEAR.encode())
    settings.DROPPORTAL_S3_ENDPOINT_URL = s3_server.replace("127.0.0.1", "localhost")
    run("s3://exports/c.csv")
    assert stored(broker) == EXPECTED


def test_an_s3_object_replaced_between_two_ranged_reads_fails_the_import(
    broker: Broker, bucket: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sources, "_DIGEST_GAP", 0)  # read only what the Parquet reader asks
    content = big_parquet_bytes()
    bucket.put_object(Bucket="exports", Key="c.parquet", Body=content)
    reads = 0
    readinto = sources._S3Object.readinto

    def replaced_after_the_first_read(self: Any, buffer: Any) -> int:
        nonlocal reads
        reads += 1
        if reads == 2:  # another version, the same size, in place of the one being read
            bucket.put_object(Bucket="exports", Key="c.parquet", Body=content[::-1])
        return readinto(self, buffer)

    monkeypatch.setattr(sources._S3Object, "readinto", replaced_after_the_first_read)
    with pytest.raises(CommandError) as raised:
        run("s3://exports/c.parquet")
    message = str(raised.value)
    assert message.startswith("s3://exports/c.parquet: ")
    assert "s3://exports/c.parquet changed while it was being read (its ETag is no longer" in (
        message
    )
    assert message.endswith("import it again; nothing was imported")
    assert not Consumer.objects.exists()


class CutObject(http.server.BaseHTTPRequestHandler):
    """An S3 store whose one object, ``CLEAR`` as CSV, is cut short: HEAD gives its whole
    size, GET sends its first 40 bytes and hangs up (a connection lost mid-object; moto's
    server always sends the whole body)."""

    protocol_version = "HTTP/1.1"
    body = CLEAR.encode()

    def log_message(self, *args: Any) -> None:
        pass

    def _headers(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(self.body)))
        self.send_header("ETag", '"0123456789abcdef"')
        self.send_header("Content-Type", "text/csv")

    def do_HEAD(self) -> None:
        self._headers(200)
        self.end_headers()

    def do_GET(self) -> None:
        self._headers(206)
        self.send_header("Content-Range", f"bytes 0-{len(self.body) - 1}/{len(self.body)}")
        self.end_headers()
        self.wfile.write(self.body[:40])
        self.close_connection = True


@pytest.fixture
def cut_object(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CutObject)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    s3_reached_at(
        f"http://127.0.0.1:{server.server_address[1]}", settings=settings, monkeypatch=monkeypatch
    )
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def test_an_s3_object_cut_short_mid_read_is_one_line(broker: Broker, cut_object: None) -> None:
    with pytest.raises(CommandError) as raised:
        run("s3://exports/c.csv")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("s3://exports/c.csv: read failed: s3://exports/c.csv: ")
    assert message.endswith("nothing was imported")
    assert not Consumer.objects.exists()
