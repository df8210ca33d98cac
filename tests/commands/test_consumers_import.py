"""``manage.py consumers import``: the file as one transaction, bad rows by line, --strict."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from integrations.models import Broker, Consumer, ConsumerHash, LedgerEvent
from integrations.services.cycle import consumers as consumer_services

pytestmark = pytest.mark.django_db

ANNA = "KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE="  # Anna.Smith@Domain.com
PHONE = "vGM7y5n+hBXRSEAklhHDPCbysyNgYTmXdMcagGUOY8E="  # +1(415)555-9317
NDZ = "PQOfn1RffEKmqMmNAzDKKaoZCwxWbQZkQzPWmQo9REA="  # Danielle / Johnson / 1985-07-04 / 91790
NAME_VIN = "rtnDuXIe63jXYQQXW5r07GJ7lSsrib8+46QuKFwkOmk="  # Eve / Genesis / 1HGCM82633A004352

CLEAR = (
    "remote_identifier,remote_identifier_kind,email,phone,first_name,last_name,dob,zip,vin\n"
    "C-1,,Anna.Smith@Domain.com,+1(415)555-9317,Danielle,Johnson,1985-07-04,91790,\n"
    "C-2,crm_id,,,Eve,Genesis,,,1HGCM82633A004352\n"
    "C-1,,,(415) 555-9317,,,,,\n"  # C-1 again: the same phone, standardized alike
)


def write(tmp_path: Path, text: str | bytes, name: str = "consumers.csv") -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return str(path)


def run(*args: str) -> tuple[dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("consumers", "import", *args, "--json", stdout=out, stderr=err)
    return json.loads(out.getvalue()), err.getvalue()


def stored(broker: Broker) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for h in ConsumerHash.objects.filter(broker=broker).select_related("consumer"):
        out.setdefault(h.consumer.remote_identifier, []).append(
            (h.hash_type, base64.b64encode(bytes(h.hash)).decode())
        )
    return {k: sorted(v) for k, v in out.items()}


def test_import_registers_every_list_type_of_a_row_and_rows_sharing_a_pointer(
    broker: Broker, tmp_path: Path
) -> None:
    summary, err = run("--broker", "4821", write(tmp_path, CLEAR))
    assert err == ""
    assert stored(broker) == {
        "C-1": [("email", ANNA), ("ndz", NDZ), ("phone", PHONE)],
        "C-2": [("name_vin", NAME_VIN)],
    }
    assert Consumer.objects.get(remote_identifier="C-2").remote_identifier_kind == "crm_id"
    assert Consumer.objects.get(remote_identifier="C-1").remote_identifier_kind == "external_id"
    assert summary["seconds"] > 0 and summary["rows_per_second"] >= 0
    assert summary | {"rejected": None, "seconds": None, "rows_per_second": None} == {
        "file": "consumers.csv",
        "broker_id": "4821",
        "strict": False,
        "rows_read": 3,
        "rows_accepted": 3,
        "rows_rejected": 0,
        "consumers_created": 2,
        "kinds_changed": 0,
        "hashes_received": 5,
        "hashes_added": 4,
        "hashes_unchanged": 1,
        "consumers_forgotten": 0,
        "hashes_forgotten": 0,
        "rejected": None,
        "seconds": None,
        "rows_per_second": None,
        "skipped": [],  # marker objects skipped under an S3 prefix
        "unused_columns": [],
    }
    (event,) = LedgerEvent.objects.filter(kind="consumers.registered")
    assert event.subject == "file:consumers.csv"
    assert event.actor.startswith("cli")
    assert event.data["hashes_added"] == 4 and event.data["rows_read"] == 3


def test_importing_the_same_file_again_changes_nothing(broker: Broker, tmp_path: Path) -> None:
    path = write(tmp_path, CLEAR)
    run("--broker", "4821", path)
    before = list(ConsumerHash.objects.order_by("pk").values_list("pk", "consumer_id", "hash"))
    summary, _ = run("--broker", "4821", path)
    assert list(ConsumerHash.objects.order_by("pk").values_list("pk", "consumer_id", "hash")) == (
        before
    )
    assert Consumer.objects.count() == 2
    assert summary["consumers_created"] == 0
    assert summary["hashes_added"] == 0
    assert summary["hashes_unchanged"] == 5


def test_a_later_file_adds_identifiers_and_changes_a_kind(broker: Broker, tmp_path: Path) -> None:
    run("--broker", "4821", write(tmp_path, CLEAR))
    summary, _ = run(
        "--broker",
        "4821",
        write(
            tmp_path,
            "remote_identifier,remote_identifier_kind,email\n"
            "C-2,,Anna.Smith@Domain.com\nC-1,email_ref,Anna.Smith@Domain.com\n",
            "more.csv",
        ),
    )
    assert summary["consumers_created"] == 0
    assert summary["hashes_added"] == 1  # C-2's email; C-1 had it
    assert summary["kinds_changed"] == 1
    assert Consumer.objects.get(remote_identifier="C-1").remote_identifier_kind == "email_ref"
    assert Consumer.objects.get(remote_identifier="C-2").remote_identifier_kind == "crm_id"
    assert stored(broker)["C-2"] == [("email", ANNA), ("name_vin", NAME_VIN)]


BAD_ROWS = (
    "remote_identifier,email,phone,maid\n"
    "C-1,Anna.Smith@Domain.com,,\n"
    "C-2,,,not-a-maid\n"
    ",someone@example.com,,\n"
    "C-4,,+1(415)555-9317,\n"
    "C-5,,no digits here,\n"
)


def test_bad_rows_are_reported_with_line_and_reason_and_the_good_rows_kept(
    broker: Broker, tmp_path: Path
) -> None:
    summary, err = run("--broker", "4821", write(tmp_path, BAD_ROWS))
    assert err.splitlines() == [
        "line 3: maid: MAID must be 32 hex characters after standardizing",
        "line 4: remote_identifier: remote_identifier is required",
        "line 6: phone: phone has no digits",
    ]
    assert "someone@example.com" not in err and "not-a-maid" not in err
    assert summary["rows_read"] == 5
    assert summary["rows_rejected"] == 3
    assert [r["line"] for r in summary["rejected"]] == [3, 4, 6]
    assert stored(broker) == {"C-1": [("email", ANNA)], "C-4": [("phone", PHONE)]}


def test_the_plain_summary_says_how_many_were_rejected(broker: Broker, tmp_path: Path) -> None:
    out = io.StringIO()
    call_command(
        "consumers", "import", "--broker", "4821", write(tmp_path, BAD_ROWS), stdout=out,
        stderr=io.StringIO(),
    )  # fmt: skip
    assert re.fullmatch(
        r"consumers\.csv: 5 rows read, 2 imported, 3 rejected; 2 new consumers, "
        r"2 hashes added, 0 already registered; [0-9.,]+ s, [0-9,]+ rows/s\.",
        out.getvalue().strip(),
    )


def test_columns_that_give_no_hash_are_named_in_the_summary_and_the_file_imported(
    broker: Broker, tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        "remote_identifier,email,first_name,last_name\nC-1,Anna.Smith@Domain.com,Anna,Smith\n",
    )
    out = io.StringIO()
    call_command(
        "consumers", "import", "--broker", "4821", path, stdout=out, stderr=io.StringIO()
    )  # fmt: skip
    note, summary = out.getvalue().splitlines()
    assert note == (
        "consumers.csv: first_name, last_name not used: no NDZ without dob and zip, "
        "no NameVIN without vin."
    )
    assert summary.startswith("consumers.csv: 1 rows read, 1 imported, 0 rejected")
    assert stored(broker) == {"C-1": [("email", ANNA)]}
    as_json, _ = run("--broker", "4821", path)
    assert as_json["unused_columns"] == [note.removesuffix(".")]


def test_a_row_with_names_but_no_dob_zip_or_vin_registers_by_its_email(
    broker: Broker, tmp_path: Path
) -> None:
    text = (
        "remote_identifier,email,first_name,last_name,dob,zip\n"
        "C-1,Anna.Smith@Domain.com,Anna,Smith,,\n"
        "C-2,,Anna,Smith,1985-07-04,\n"  # dob without zip: still a bad row
    )
    summary, err = run("--broker", "4821", write(tmp_path, text))
    assert err.splitlines() == ["line 3: ndz: ndz needs zip in the row"]
    assert (summary["rows_accepted"], summary["rows_rejected"]) == (1, 1)
    assert stored(broker) == {"C-1": [("email", ANNA)]}


def test_two_files_joined_import_both_and_the_second_header_is_a_bad_row(
    broker: Broker, tmp_path: Path
) -> None:
    first = "remote_identifier,email\nC-1,Anna.Smith@Domain.com\n".encode("utf-8-sig")
    second = "remote_identifier,email\nC-2,someone@example.com\n".encode("utf-8-sig")
    summary, err = run("--broker", "4821", write(tmp_path, first + second))  # cat a.csv b.csv
    assert err.splitlines() == ["line 3: row: a header row again: two files joined?"]
    assert (summary["rows_accepted"], summary["rows_rejected"]) == (2, 1)
    assert sorted(Consumer.objects.values_list("remote_identifier", flat=True)) == ["C-1", "C-2"]


def test_strict_refuses_the_whole_file_and_writes_nothing(broker: Broker, tmp_path: Path) -> None:
    err = io.StringIO()
    with pytest.raises(CommandError, match="3 of 5 rows rejected; --strict: nothing was imported"):
        call_command(
            "consumers", "import", "--broker", "4821", write(tmp_path, BAD_ROWS), "--strict",
            stdout=io.StringIO(), stderr=err,
        )  # fmt: skip
    assert "line 3: maid" in err.getvalue() and "line 6: phone" in err.getvalue()
    assert not Consumer.objects.exists()
    assert not ConsumerHash.objects.exists()
    assert not LedgerEvent.objects.filter(kind="consumers.registered").exists()


def test_strict_with_a_good_file_imports_it(broker: Broker, tmp_path: Path) -> None:
    summary, _ = run("--broker", "4821", write(tmp_path, CLEAR), "--strict")
    assert summary["strict"] is True
    assert summary["hashes_added"] == 4


def test_strict_refusal_after_many_rounds_still_writes_nothing(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rounds of 2 hash rows: the good rows are merged round by round before the bad one.
    monkeypatch.setattr(consumer_services, "CHUNK_ROWS", 2)
    rows = "".join(f"C-{i},p{i}@example.com\n" for i in range(10)) + ",x@example.com\n"
    with pytest.raises(CommandError, match="1 of 11 rows rejected"):
        call_command(
            "consumers", "import", "--broker", "4821",
            write(tmp_path, "remote_identifier,email\n" + rows), "--strict",
            stdout=io.StringIO(), stderr=io.StringIO(),
        )  # fmt: skip
    assert not Consumer.objects.exists()


def test_a_file_larger_than_a_round_is_imported_whole(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consumer_services, "CHUNK_ROWS", 3)
    # 20 rows for 7 consumers (a pointer's rows fall in different rounds), 2 hashes each.
    rows = "".join(f"C-{i % 7},p{i}@example.com,+1 415 555 {i:04d}\n" for i in range(20))
    path = write(tmp_path, "remote_identifier,email,phone\n" + rows)
    summary, _ = run("--broker", "4821", path)
    assert (summary["consumers_created"], summary["hashes_added"]) == (7, 40)
    assert ConsumerHash.objects.count() == 40
    again, _ = run("--broker", "4821", path)
    assert (again["consumers_created"], again["hashes_added"]) == (0, 0)
    assert ConsumerHash.objects.count() == 40


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "the file is empty"),
        ("email,remote_identifier\na@b,C-1\n", "the first column must be remote_identifier"),
        ("remote_identifier,emial\nC-1,a@b\n", "unknown column 'emial' in column 2"),
        # No header line: the first row's cells are not echoed as column names.
        ("a@b.com,C-1\n", "the first line is not a header"),
        ("4155559317,C-1\n", "the first line is not a header"),
        ("remote_identifier,e-mail\nC-1,a@b\n", "unknown column name in column 2"),
        ("remote_identifier,first_name,last_name\nC-1,A,B\n", "no identifier column"),
    ],
)
def test_a_bad_header_is_refused_before_anything_is_written(
    broker: Broker, tmp_path: Path, content: str, message: str
) -> None:
    with pytest.raises(CommandError, match=message) as raised:
        run("--broker", "4821", write(tmp_path, content))
    assert "nothing was imported" in str(raised.value)
    assert not Consumer.objects.exists()
    assert not LedgerEvent.objects.filter(kind="consumers.registered").exists()


def test_hashed_file(broker: Broker, tmp_path: Path) -> None:
    text = (
        "remote_identifier,hash_type,hash\n"
        f"C-1,email,{ANNA}\nC-1,phone,{PHONE}\nC-2,ndz,{NDZ}\n"
        f"C-3,email,{ANNA[:-4]}====\nC-4,vin,{NAME_VIN}\n"
    )
    summary, err = run("--broker", "4821", write(tmp_path, text), "--hashed")
    assert err.splitlines() == [
        "line 5: hash: hash must be a SHA-256 hash in standard Base64 "
        "(44 characters, ending in '=')",
        "line 6: hash_type: hash_type must be one of email, phone, ndz, name_vin, maid, ctvid",
    ]
    assert summary["rows_rejected"] == 2
    assert stored(broker) == {"C-1": [("email", ANNA), ("phone", PHONE)], "C-2": [("ndz", NDZ)]}


def test_a_hashed_file_without_hashed_is_refused_with_a_hint(
    broker: Broker, tmp_path: Path
) -> None:
    with pytest.raises(CommandError, match="use --hashed"):
        run(
            "--broker",
            "4821",
            write(tmp_path, f"remote_identifier,hash_type,hash\nC-1,email,{ANNA}\n"),
        )


def test_the_database_never_holds_a_clear_identifier(broker: Broker, tmp_path: Path) -> None:
    text = (
        "remote_identifier,email,phone,first_name,last_name,dob,zip,maid\n"
        "C-1,Secret.Person@Example.com,+1 (415) 555-0123,Zebulon,Quintero,1971-02-03,94110,"
        "a3f1c2d4-5678-90ab-cdef-1234567890ab\n"
        "C-2,Other.Secret@Example.com,nope,,,,,\n"  # rejected: its email must not leak either
    )
    run("--broker", "4821", write(tmp_path, text))
    with connection.cursor() as cursor:
        texts = []
        for table in (
            "integrations_consumer",
            "integrations_consumerhash",
            "integrations_ledgerevent",
        ):
            # Every column of every row as text, bytea as its hex: a clear value shows.
            cursor.execute(f"SELECT coalesce(string_agg(t::text, ' '), '') FROM {table} t")  # noqa: S608
            texts.append(cursor.fetchone()[0])
        text_of_tables = " ".join(texts).lower()
    assert "c-1" in text_of_tables  # the pointer is kept
    for clear in (
        "secret.person",
        "other.secret",
        "4155550123",
        "zebulon",
        "quintero",
        "19710203",
        "a3f1c2d4",
    ):
        assert clear not in text_of_tables


def test_bytes_that_are_not_utf8_reject_their_row_only(broker: Broker, tmp_path: Path) -> None:
    raw = b"remote_identifier,email\nC-1,jos\xe9@example.com\nC-2,Anna.Smith@Domain.com\n"
    summary, err = run("--broker", "4821", write(tmp_path, raw))
    assert err.strip() == "line 2: email: email is not valid UTF-8"
    assert stored(broker) == {"C-2": [("email", ANNA)]}
    assert summary["rows_rejected"] == 1


def test_unknown_broker_and_missing_file_are_one_line_errors(
    broker: Broker, tmp_path: Path
) -> None:
    with pytest.raises(CommandError, match="no broker with id '9999'"):
        run("--broker", "9999", write(tmp_path, CLEAR))
    with pytest.raises(CommandError, match=r"cannot read .*missing\.csv: No such file"):
        run("--broker", "4821", str(tmp_path / "missing.csv"))
