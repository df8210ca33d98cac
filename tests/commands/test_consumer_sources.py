"""``consumers import`` from every kind of source: CSV, gzip CSV, Parquet, standard input and
an S3 bucket (a real S3-compatible server on loopback, moto's, started here)."""

from __future__ import annotations

import base64
import gzip
import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from moto.server import ThreadedMotoServer

from integrations.drop import sources
from integrations.models import Broker, Consumer, ConsumerHash, LedgerEvent
from integrations.services.consumer_merge import Merged

pytestmark = pytest.mark.django_db

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


def test_format_option_overrides_the_name(broker: Broker, tmp_path: Path) -> None:
    path = tmp_path / "export.bin"
    path.write_bytes(gzip.compress(CLEAR.encode()))
    with pytest.raises(CommandError, match=r"cannot tell the format of .*use --format"):
        run(str(path))
    run(str(path), "--format", "csv.gz")
    assert stored(broker) == EXPECTED


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


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.csv.gz", b"not gzip at all", "bad.csv.gz: read failed: .*gzip"),
        ("cut.csv.gz", gzip.compress(CLEAR.encode())[:-12], "cut.csv.gz: read failed"),
        ("bad.parquet", b"PAR1 not really", "bad.parquet: not a Parquet file"),
        ("bad.csv", b"email,remote_identifier\nx,y\n", "first column must be remote_identifier"),
    ],
)
def test_a_bad_file_is_one_line_and_nothing_is_written(
    broker: Broker, tmp_path: Path, name: str, content: bytes, message: str
) -> None:
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


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    with socket.socket() as probe:  # a free port on loopback
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def bucket(s3_server: str, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An empty bucket ``exports`` (the server is reset per test), reached the way a
    deployment reaches it: boto3's credential chain and DROPPORTAL_S3_ENDPOINT_URL."""
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    settings.DROPPORTAL_S3_ENDPOINT_URL = s3_server
    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.create_bucket(Bucket="exports")
    yield s3
    listed = s3.list_objects_v2(Bucket="exports").get("Contents", [])
    for item in listed:
        s3.delete_object(Bucket="exports", Key=item["Key"])
    s3.delete_bucket(Bucket="exports")


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
    bucket.put_object(Bucket="exports", Key="n/b.csv", Body=b"remote_identifier,e-mail\nx,y\n")
    with pytest.raises(CommandError, match=r"^s3://exports/n/b.csv: unknown column 'e-mail'"):
        run("s3://exports/n/")
    assert not Consumer.objects.exists()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("s3://exports/missing.csv", r"s3://exports/missing.csv: 404"),
        ("s3://exports/empty/", r"s3://exports/empty/: no objects under this prefix"),
        ("s3://no-such-bucket/x/", r"s3://no-such-bucket/x/: NoSuchBucket"),
    ],
)
def test_a_missing_s3_source_is_one_line(
    broker: Broker, bucket: Any, source: str, message: str
) -> None:
    with pytest.raises(CommandError, match=message) as raised:
        run(source)
    assert "nothing was imported" in str(raised.value)
    assert not Consumer.objects.exists()


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
