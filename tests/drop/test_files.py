"""DROP file formats: the download ZIP reader and the response CSV writer."""

from __future__ import annotations

import datetime
import hashlib
import io
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from devtools.drop_simulator import build_drop_zip, work_items
from integrations.drop.files import (
    DATA_TYPE_TO_HASH_TYPE,
    HASH_TYPE_TO_DATA_TYPE,
    DropFileError,
    DropFileName,
    RemovedRow,
    WorkItemRow,
    ZipMember,
    _WorkItemIdSet,
    iter_download_zip,
    parse_file_name,
    response_file_name,
    write_response_csv,
    zip_summary,
)

BROKER = "4821"
DAY = "20260312"
ITEMS = list(work_items(8))
GOOD_HASH = ITEMS[0][1]


def raw_zip(members: dict[str, bytes | str]) -> bytes:
    """A ZIP with exactly these members, written as given (for bad packages)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def read_all(package: bytes, broker_id: str = BROKER) -> list[WorkItemRow | RemovedRow]:
    return list(iter_download_zip(io.BytesIO(package), broker_id=broker_id))


def error_of(package: bytes) -> DropFileError:
    with pytest.raises(DropFileError) as caught:
        read_all(package)
    return caught.value


def email_csv(*lines: str, header: str = "ID,Hash") -> str:
    return "\r\n".join([header, *lines]) + "\r\n"


# ------------------------------------------------------------------ file names


def test_parse_file_name_gives_every_part() -> None:
    parsed = parse_file_name("20260312_4821_NameVIN_part01.csv")

    assert parsed == DropFileName(datetime.date(2026, 3, 12), "4821", "NameVIN", "part01")
    assert parsed.hash_type == "name_vin"
    assert parsed.name == "20260312_4821_NameVIN_part01.csv"
    assert parse_file_name("20260312_4821_Removed.csv").hash_type is None


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("20261340_4821_Email.csv", "date 20261340 in the file name is not a valid date"),
        ("20260312_4821_Fax.csv", "unknown data type 'Fax'"),
        ("20260312_4821_email.csv", "unknown data type 'email'"),
        ("20260312_482_Email.csv", "file name must look like"),
        ("20260312_4821_Email_part_01.csv", "file name must look like"),
        ("20260312_4821_Email_abcdefghijk.csv", "suffix must be 1 to 10 letters or digits"),
        ("20260312_4821_Email.txt", "not a CSV file name"),
        ("../20260312_4821_Email.csv", "plain name, without folders"),
    ],
)
def test_parse_file_name_rejects_with_reason(name: str, reason: str) -> None:
    with pytest.raises(DropFileError) as caught:
        parse_file_name(name)

    assert caught.value.file == name
    assert reason in str(caught.value)
    assert str(caught.value).startswith(f"{name}: ")


def test_hash_type_mapping_is_the_spec_table_both_ways() -> None:
    assert DATA_TYPE_TO_HASH_TYPE == {
        "Email": "email",
        "Phone": "phone",
        "NDZ": "ndz",
        "NameVIN": "name_vin",
        "MAID": "maid",
        "CTVID": "ctvid",
    }
    assert {v: k for k, v in HASH_TYPE_TO_DATA_TYPE.items()} == DATA_TYPE_TO_HASH_TYPE


def test_error_message_names_file_line_and_reason() -> None:
    error = DropFileError("20260312_4821_Email.csv", 7, "work item id must be 12 letters or digits")

    assert isinstance(error, ValueError)
    assert str(error) == "20260312_4821_Email.csv line 7: work item id must be 12 letters or digits"
    assert str(DropFileError("x.zip", None, "broken")) == "x.zip: broken"


# ------------------------------------------------------------------ reading a download


def test_valid_zip_round_trip_yields_typed_rows_and_member_summary(tmp_path: Path) -> None:
    removed_id, removed_hash = ITEMS[7]
    package = build_drop_zip(
        BROKER,
        datetime.date(2026, 3, 12),
        {"Email": ITEMS[:3], "Phone": ITEMS[3:5], "NDZ": []},
        removed=[(removed_id, removed_hash, "Email")],
    )
    path = tmp_path / "20260312_4821_DROP.zip"
    path.write_bytes(package)

    reader = iter_download_zip(path, broker_id=BROKER)
    rows = list(reader)

    email = "20260312_4821_Email.csv"
    assert rows[:3] == [
        WorkItemRow(email, "Email", "email", wid, hash_value, line)
        for line, (wid, hash_value) in enumerate(ITEMS[:3], start=2)
    ]
    assert [
        (r.file_name, r.data_type, r.hash_type) for r in rows[3:5] if isinstance(r, WorkItemRow)
    ] == [("20260312_4821_Phone.csv", "Phone", "phone")] * 2
    assert rows[5] == RemovedRow("20260312_4821_Removed.csv", removed_id, removed_hash, "email", 2)
    assert len(rows) == 6
    assert [(m.name, m.rows) for m in reader.files] == [
        ("20260312_4821_Email.csv", 3),
        ("20260312_4821_Phone.csv", 2),
        ("20260312_4821_NDZ.csv", 0),
        ("20260312_4821_Removed.csv", 1),
    ]
    assert [(m.name, m.rows) for m in zip_summary(path)] == [(m.name, m.rows) for m in reader.files]
    assert all(isinstance(m, ZipMember) for m in zip_summary(io.BytesIO(package)))


def test_rows_stream_out_before_a_later_bad_row_raises() -> None:
    package = raw_zip(
        {f"{DAY}_{BROKER}_Email.csv": email_csv(*(f"{w},{h}" for w, h in ITEMS[:2]), "bad,row")}
    )
    reader = iter_download_zip(io.BytesIO(package), broker_id=BROKER)

    assert next(reader).work_item_id == ITEMS[0][0]
    assert next(reader).work_item_id == ITEMS[1][0]
    with pytest.raises(DropFileError) as caught:
        next(reader)
    assert caught.value.line == 4


def test_lf_line_endings_bom_and_blank_lines_are_read() -> None:
    body = "\ufeffID,Hash\n" + f"{ITEMS[0][0]},{ITEMS[0][1]}\n\n" + f"{ITEMS[1][0]},{ITEMS[1][1]}\n"
    rows = read_all(raw_zip({f"{DAY}_{BROKER}_Email.csv": body}))

    assert [(r.work_item_id, r.line) for r in rows] == [(ITEMS[0][0], 2), (ITEMS[1][0], 4)]


def test_header_only_files_are_fine() -> None:
    package = build_drop_zip(BROKER, DAY, {"Email": [], "MAID": []}, removed=[])
    reader = iter_download_zip(io.BytesIO(package), broker_id=BROKER)

    assert list(reader) == []
    assert [m.rows for m in reader.files] == [0, 0, 0]


@pytest.mark.parametrize(
    "list_type", ["Email", "email", "EMAIL", "NameVIN", "name_vin", "namevin", "CTVID"]
)
def test_removed_list_type_accepts_drop_names_and_hash_types(list_type: str) -> None:
    wid, hash_value = ITEMS[0]
    rows = read_all(build_drop_zip(BROKER, DAY, {}, removed=[(wid, hash_value, list_type)]))

    expected = {"email": "email", "namevin": "name_vin", "name_vin": "name_vin", "ctvid": "ctvid"}
    assert rows == [
        RemovedRow(f"{DAY}_{BROKER}_Removed.csv", wid, hash_value, expected[list_type.lower()], 2)
    ]


def test_non_zip_bytes_are_refused() -> None:
    error = error_of(b"<html>Service Unavailable</html>")

    assert str(error).startswith("download ZIP: not a readable ZIP file")


def test_truncated_zip_is_refused(tmp_path: Path) -> None:
    package = build_drop_zip(BROKER, DAY, {"Email": ITEMS})
    path = tmp_path / "20260312_4821_DROP.zip"
    path.write_bytes(package[: len(package) // 2])

    with pytest.raises(DropFileError) as caught:
        list(iter_download_zip(path, broker_id=BROKER))

    assert str(caught.value).startswith("20260312_4821_DROP.zip: not a readable ZIP file")


def test_corrupt_member_data_is_refused() -> None:
    name = f"{DAY}_{BROKER}_Email.csv"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(name, email_csv(*(f"{w},{h}" for w, h in ITEMS)))
    package = bytearray(buffer.getvalue())
    offset = package.index(ITEMS[3][0].encode())
    package[offset] ^= 0x01  # still valid-looking text, but the CRC no longer matches

    error = error_of(bytes(package))

    assert error.file == name
    assert "corrupt or truncated" in error.reason


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        ("20260312_1234_Email.csv", "broker id 1234 in the file name is not this broker's (4821)"),
        ("20261301_4821_Email.csv", "date 20261301 in the file name is not a valid date"),
        ("20260312_4821_Fax.csv", "unknown data type 'Fax'"),
        ("20260312_4821_Email.txt", "not a CSV file name"),
        ("readme.txt", "not a CSV file name"),
        ("../20260312_4821_Email.csv", "not a folder or a path"),
        ("/20260312_4821_Email.csv", "not a folder or a path"),
        ("lists/20260312_4821_Email.csv", "not a folder or a path"),
        ("lists/", "not a folder or a path"),
    ],
)
def test_bad_member_names_are_refused(member: str, reason: str) -> None:
    package = raw_zip({f"{DAY}_{BROKER}_Phone.csv": email_csv(), member: email_csv()})

    error = error_of(package)

    assert error.file == member
    assert reason in str(error)
    assert error.line is None


def test_member_names_are_all_checked_before_any_row() -> None:
    good = email_csv(f"{ITEMS[0][0]},{ITEMS[0][1]}")
    package = raw_zip({f"{DAY}_{BROKER}_Email.csv": good, f"{DAY}_9999_Phone.csv": good})
    reader = iter_download_zip(io.BytesIO(package), broker_id=BROKER)

    with pytest.raises(DropFileError, match="broker id 9999"):
        next(reader)


@pytest.mark.parametrize(
    ("header", "expected"),
    [("id,hash", "ID,Hash"), ("ID,Hash,ListType", "ID,Hash"), ("ID;Hash", "ID,Hash")],
)
def test_bad_list_header_is_refused_at_line_1(header: str, expected: str) -> None:
    error = error_of(raw_zip({f"{DAY}_{BROKER}_Email.csv": email_csv(header=header)}))

    assert error.file == f"{DAY}_{BROKER}_Email.csv"
    assert error.line == 1
    assert str(error).startswith(
        f"{DAY}_{BROKER}_Email.csv line 1: header must be {expected}, found "
    )


def test_bad_removed_header_is_refused() -> None:
    error = error_of(raw_zip({f"{DAY}_{BROKER}_Removed.csv": email_csv()}))

    assert (error.line, error.reason) == (1, "header must be ID,Hash,ListType, found 'ID,Hash'")


def test_empty_member_is_refused() -> None:
    error = error_of(raw_zip({f"{DAY}_{BROKER}_Email.csv": b""}))

    assert (
        str(error) == f"{DAY}_{BROKER}_Email.csv line 1: file is empty: expected the header ID,Hash"
    )


def test_zip_without_csv_members_is_refused() -> None:
    assert "holds no CSV file" in str(error_of(raw_zip({})))


@pytest.mark.parametrize(
    "bad_id", ["AbC123xyz09", "AbC123xyz09-", "AbC123 xyz09", "AbC123xyz0912", "ÀbC123xyz091"]
)
def test_bad_work_item_id_is_refused_with_line(bad_id: str) -> None:
    lines = [f"{w},{h}" for w, h in ITEMS[:5]] + [f"{bad_id},{GOOD_HASH}"]
    error = error_of(raw_zip({f"{DAY}_{BROKER}_Email.csv": email_csv(*lines)}))

    assert str(error).startswith(
        f"{DAY}_{BROKER}_Email.csv line 7: work item id must be 12 letters or digits, found "
    )
    assert repr(bad_id) in str(error)


@pytest.mark.parametrize(
    "bad_hash",
    [
        GOOD_HASH[:-1],  # no padding
        GOOD_HASH[:-2] + "==",  # 42 + "=="
        GOOD_HASH.replace(GOOD_HASH[5], "-", 1),  # URL-safe alphabet
        GOOD_HASH + "A",
        "",
    ],
)
def test_bad_hash_is_refused_with_line(bad_hash: str) -> None:
    error = error_of(raw_zip({f"{DAY}_{BROKER}_Phone.csv": email_csv(f"{ITEMS[0][0]},{bad_hash}")}))

    assert (error.file, error.line) == (f"{DAY}_{BROKER}_Phone.csv", 2)
    assert error.reason.startswith("hash must be 44 characters of standard Base64")


def test_wrong_field_count_is_refused() -> None:
    error = error_of(raw_zip({f"{DAY}_{BROKER}_Email.csv": email_csv(f"{ITEMS[0][0]}")}))

    assert str(error) == f"{DAY}_{BROKER}_Email.csv line 2: expected 2 fields (ID,Hash), found 1"


def test_invalid_utf8_is_refused() -> None:
    body = email_csv(f"{ITEMS[0][0]},{GOOD_HASH}").encode() + b"\xff\xfe,\x80\r\n"
    error = error_of(raw_zip({f"{DAY}_{BROKER}_Email.csv": body}))

    assert error.file == f"{DAY}_{BROKER}_Email.csv"
    assert error.reason == "not valid UTF-8 text"


def test_duplicate_id_within_a_list_is_refused() -> None:
    lines = [f"{w},{h}" for w, h in ITEMS[:3]] + [f"{ITEMS[1][0]},{GOOD_HASH}"]
    error = error_of(raw_zip({f"{DAY}_{BROKER}_Email.csv": email_csv(*lines)}))

    assert str(error) == (
        f"{DAY}_{BROKER}_Email.csv line 5: work item id {ITEMS[1][0]} appears twice in this ZIP "
        "(ids are unique across lists)"
    )


def test_duplicate_id_across_lists_is_refused() -> None:
    package = build_drop_zip(BROKER, DAY, {"Email": ITEMS[:3], "Phone": [ITEMS[4], ITEMS[2]]})

    error = error_of(package)

    assert (error.file, error.line) == (f"{DAY}_{BROKER}_Phone.csv", 3)
    assert f"work item id {ITEMS[2][0]} appears twice in this ZIP" in error.reason


def test_removed_id_may_repeat_a_list_id_but_not_itself() -> None:
    wid, hash_value = ITEMS[0]
    allowed = build_drop_zip(
        BROKER, DAY, {"Email": [ITEMS[0]]}, removed=[(wid, hash_value, "Email")]
    )
    assert len(read_all(allowed)) == 2

    twice = build_drop_zip(
        BROKER, DAY, {}, removed=[(wid, hash_value, "Email"), (wid, hash_value, "Phone")]
    )
    error = error_of(twice)
    assert (error.file, error.line) == (f"{DAY}_{BROKER}_Removed.csv", 3)
    assert "appears twice in this Removed file" in error.reason


def test_two_removed_files_are_refused() -> None:
    removed = email_csv(header="ID,Hash,ListType")
    package = raw_zip(
        {f"{DAY}_{BROKER}_Removed.csv": removed, f"{DAY}_{BROKER}_Removed_b.csv": removed}
    )

    error = error_of(package)

    assert error.file == f"{DAY}_{BROKER}_Removed_b.csv"
    assert "at most one Removed file" in error.reason


@pytest.mark.parametrize("list_type", ["Removed", "Fax", ""])
def test_unknown_removed_list_type_is_refused(list_type: str) -> None:
    wid, hash_value = ITEMS[0]
    error = error_of(build_drop_zip(BROKER, DAY, {}, removed=[(wid, hash_value, list_type)]))

    assert error.line == 2
    assert error.reason.startswith(f"list type {list_type!r} is not a DROP list")


def test_broker_id_argument_must_be_four_digits() -> None:
    with pytest.raises(ValueError, match="4-digit"):
        iter_download_zip(io.BytesIO(b""), broker_id="48210")


def test_duplicate_check_is_exact_and_compact() -> None:
    ids = [wid for wid, _ in work_items(5000, start=10**9)]
    seen = _WorkItemIdSet()  # starts small: this exercises growth too

    assert all(seen.add(wid) for wid in ids)
    assert not any(seen.add(wid) for wid in ids)
    assert len(seen) == 5000
    # One million ids fit in 2**21 slots of 9 bytes (~19 MB), not ~95 MB of str objects.
    assert _WorkItemIdSet(expected=1_000_000).nbytes == 9 * 2**21


# ------------------------------------------------------------------ response files


@pytest.mark.parametrize(
    ("downloaded", "suffix", "expected"),
    [
        ("20260312_4821_Email.csv", None, "20260312_4821_Email.csv"),
        ("20260312_4821_Email.csv", "part01", "20260312_4821_Email_part01.csv"),
        ("20260312_4821_NameVIN.csv", "A", "20260312_4821_NameVIN_A.csv"),
        ("20260312_4821_CTVID_x.csv", "2", "20260312_4821_CTVID_2.csv"),
    ],
)
def test_response_file_name_reuses_date_and_type(
    downloaded: str, suffix: str | None, expected: str
) -> None:
    assert response_file_name(downloaded, suffix) == expected


@pytest.mark.parametrize("suffix", ["", "part_01", "abcdefghijk", "ü"])
def test_response_file_name_refuses_bad_suffix(suffix: str) -> None:
    with pytest.raises(DropFileError, match="suffix must be 1 to 10 letters or digits"):
        response_file_name("20260312_4821_Email.csv", suffix)


def test_no_response_file_for_removed() -> None:
    with pytest.raises(DropFileError, match="no status is owed"):
        response_file_name("20260312_4821_Removed.csv", None)


def test_write_response_csv_writes_header_rows_and_digest() -> None:
    out = io.BytesIO()

    result = write_response_csv(out, [(ITEMS[0][0], 3), (ITEMS[1][0], 5), (ITEMS[2][0], 2)])

    expected = (f"Id,Status\r\n{ITEMS[0][0]},3\r\n{ITEMS[1][0]},5\r\n{ITEMS[2][0]},2\r\n").encode()
    assert out.getvalue() == expected
    assert result == (3, hashlib.sha256(expected).hexdigest())
    assert (result.row_count, result.sha256) == tuple(result)


def test_write_response_csv_with_no_rows_writes_the_header() -> None:
    out = io.BytesIO()

    assert write_response_csv(out, []).row_count == 0
    assert out.getvalue() == b"Id,Status\r\n"


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ((ITEMS[3][0], 1), "status must be 2, 3, 4 or 5"),
        ((ITEMS[3][0], 6), "status must be 2, 3, 4 or 5"),
        ((ITEMS[3][0], "3"), "status must be 2, 3, 4 or 5"),
        ((ITEMS[3][0], True), "status must be 2, 3, 4 or 5"),
        (("short", 3), "work item id must be 12 letters or digits"),
        ((ITEMS[0][0], 4), f"work item id {ITEMS[0][0]} has a status twice"),
    ],
)
def test_write_response_csv_refuses_bad_rows_with_line(row: tuple[str, int], reason: str) -> None:
    out = io.BytesIO()
    out.name = "20260312_4821_Email.csv"  # type: ignore[misc]

    with pytest.raises(DropFileError) as caught:
        write_response_csv(out, [(ITEMS[0][0], 3), (ITEMS[1][0], 3), row])

    assert caught.value.file == "20260312_4821_Email.csv"
    assert caught.value.line == 4
    assert reason in caught.value.reason


def test_a_single_huge_line_is_refused_before_it_costs_memory(tmp_path: Path) -> None:
    # 32 MiB of one line deflate to about 32 KiB: read whole, it would cost its size.
    package = tmp_path / "20260312_4821_DROP.zip"
    with (
        zipfile.ZipFile(package, "w", zipfile.ZIP_DEFLATED) as archive,
        archive.open("20260312_4821_Email.csv", "w") as member,
    ):
        member.write(b"ID,Hash\r\n")
        for _ in range(32):
            member.write(b"A" * (1 << 20))
    assert package.stat().st_size < 1 << 20

    tracemalloc.start()
    try:
        with pytest.raises(DropFileError) as caught:
            list(iter_download_zip(package, broker_id="4821"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert caught.value.line == 2
    assert "line longer than 4096 characters" in str(caught.value)
    assert peak < 16 << 20, f"reading the line cost {peak / (1 << 20):.0f} MiB"
