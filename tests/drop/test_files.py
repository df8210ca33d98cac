"""DROP file formats: the download ZIP reader and the response CSV writer."""

from __future__ import annotations

import datetime
import hashlib
import io
import random
import subprocess
import sys
import tracemalloc
import zipfile
from collections.abc import Mapping
from pathlib import Path

import pytest
from django.conf import settings

from devtools.drop_simulator import build_drop_zip, work_items
from integrations.drop.download_zip import (
    DownloadZipReader,
    escaped,
    iter_download_zip,
    zip_summary,
)
from integrations.drop.files import (
    DATA_TYPE_TO_HASH_TYPE,
    HASH_TYPE_TO_DATA_TYPE,
    DropFileError,
    DropFileName,
    RemovedRow,
    SetAside,
    UnreadableRow,
    WorkItemRow,
    ZipMember,
    parse_file_name,
    response_file_name,
    write_response_csv,
)
from integrations.drop.work_item_ids import WorkItemIdSet

BROKER = "4821"
DAY = "20260312"
ITEMS = list(work_items(8))
GOOD_HASH = ITEMS[0][1]


def raw_zip(members: Mapping[str, bytes | str]) -> bytes:
    """A ZIP with exactly these members, written as given (for bad packages)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def read_all(package: bytes, broker_id: str = BROKER) -> list[WorkItemRow | RemovedRow]:
    return list(iter_download_zip(io.BytesIO(package), broker_id=broker_id))


def read(package: bytes) -> tuple[list[WorkItemRow | RemovedRow], DownloadZipReader]:
    reader = iter_download_zip(io.BytesIO(package), broker_id=BROKER)
    return list(reader), reader


def unreadable_of(package: bytes) -> UnreadableRow:
    """The one unreadable row of ``package`` (whose other rows are read)."""
    _, reader = read(package)
    assert len(reader.unreadable) == 1, reader.unreadable
    return reader.unreadable[0]


def unread_of(package: bytes) -> SetAside:
    """The one DROP list of ``package`` set aside whole."""
    _, reader = read(package)
    assert len(reader.unread) == 1, reader.unread
    return reader.unread[0]


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


def test_a_malformed_row_is_set_aside_and_the_rest_of_its_list_is_read() -> None:
    # DROP's own example of a short row, "680,5", between good ones.
    lines = [f"{w},{h}" for w, h in ITEMS[:2]] + ["680,5"] + [f"{w},{h}" for w, h in ITEMS[2:4]]
    rows, reader = read(raw_zip({f"{DAY}_{BROKER}_Email.csv": email_csv(*lines)}))

    assert [(r.work_item_id, r.line) for r in rows] == [
        (ITEMS[0][0], 2),
        (ITEMS[1][0], 3),
        (ITEMS[2][0], 5),
        (ITEMS[3][0], 6),
    ]
    assert reader.unreadable == [
        UnreadableRow(
            f"{DAY}_{BROKER}_Email.csv",
            4,
            "680",
            "680,5",
            "hash must be 44 characters of standard Base64 ending in '=', found '5'",
        )
    ]
    assert reader.unreadable_counts == {f"{DAY}_{BROKER}_Email.csv": 1}
    assert [(m.name, m.rows) for m in reader.files] == [(f"{DAY}_{BROKER}_Email.csv", 4)]
    assert not reader.complete


@pytest.mark.parametrize("removed", [False, True], ids=["list", "Removed"])
def test_a_hash_with_stray_bits_in_its_last_character_is_set_aside(removed: bool) -> None:
    """Base64 of 32 bytes leaves the last character's 2 low bits 0; with them set, the text
    decodes to the same digest as another (DROP never writes it), so it is not read as the
    hash it would be kept, matched and sent on as, altered."""
    (w0, h0), (w1, h1) = ITEMS[:2]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    stray = h1[:42] + alphabet[alphabet.index(h1[42]) + 1] + "="
    name = f"{DAY}_{BROKER}_{'Removed' if removed else 'Email'}.csv"
    header, tail = ("ID,Hash,ListType", ",Email") if removed else ("ID,Hash", "")
    lines = [header, f"{w0},{h0}{tail}", f"{w1},{stray}{tail}"]
    # A list besides the Removed file: a package holding no list is refused whole.
    package = raw_zip({name: "\r\n".join(lines) + "\r\n", f"{DAY}_{BROKER}_Phone.csv": "ID,Hash"})

    rows, reader = read(package)

    assert [(r.work_item_id, r.hash) for r in rows] == [(w0, h0)]
    (unreadable,) = reader.unreadable
    assert (unreadable.line, unreadable.work_item_id) == (3, w1)
    assert unreadable.reason == (
        "hash is not canonical Base64: its last character sets bits beyond the 32 bytes of"
        f" a SHA-256, found '{stray}'"
    )


@pytest.mark.parametrize("ending", ["\r\n", "\n"])
def test_bom_line_endings_blank_lines_and_quoted_fields_are_read_as_drop_meant(
    ending: str,
) -> None:
    (w0, h0), (w1, h1), (w2, h2) = ITEMS[:3]
    body = ending.join(
        ["\ufeffID,Hash", f"{w0},{h0}", "", f'"{w1}","{h1}"', f'{w2},"{h2}"', "", ""]
    )
    rows, reader = read(raw_zip({f"{DAY}_{BROKER}_Email.csv": body}))

    assert [(r.work_item_id, r.hash, r.line) for r in rows] == [
        (w0, h0, 2),
        (w1, h1, 4),
        (w2, h2, 5),
    ]
    assert reader.complete


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


def _central_entry(package: bytearray) -> int:
    return package.index(b"PK\x01\x02")


def _zip_version_unknown(package: bytearray) -> None:
    package[_central_entry(package) + 6] = 78  # "version needed to extract": 7.8


def _name_flagged_utf8_that_is_not(package: bytearray) -> None:
    entry = _central_entry(package)
    package[entry + 9] |= 0x08  # bit 11: the name is UTF-8...
    package[entry + 46] = 0xFF  # ... and its first byte is not


def _central_directory_offset_wrong(package: bytearray) -> None:
    at = package.rindex(b"PK\x05\x06") + 16
    offset = int.from_bytes(package[at : at + 4], "little") + 100_000
    package[at : at + 4] = offset.to_bytes(4, "little")


@pytest.mark.parametrize(
    "spoil",
    [_zip_version_unknown, _name_flagged_utf8_that_is_not, _central_directory_offset_wrong],
)
@pytest.mark.parametrize("on_disk", [False, True], ids=["in memory", "on disk"])
def test_an_archive_zipfile_cannot_read_is_refused(spoil, on_disk: bool, tmp_path: Path) -> None:
    package = bytearray(build_drop_zip(BROKER, DAY, {"Email": ITEMS}))
    spoil(package)
    path = tmp_path / "20260312_4821_DROP.zip"
    path.write_bytes(package)
    source = path if on_disk else io.BytesIO(package)

    with pytest.raises(DropFileError) as caught:
        list(iter_download_zip(source, broker_id=BROKER))
    with pytest.raises(DropFileError):
        zip_summary(path if on_disk else io.BytesIO(package))

    assert "not a readable ZIP" in str(caught.value) or "corrupt or truncated" in str(caught.value)


def test_any_byte_of_a_package_changed_ends_in_its_rows_or_a_refusal(tmp_path: Path) -> None:
    # Every byte of a small package changed once, to a value drawn from a fixed seed (the
    # same run every time), read from disk and from memory: nothing but rows, rows set
    # aside or a DropFileError may come out.
    package = build_drop_zip(BROKER, DAY, {"Email": ITEMS[:2]}, [(ITEMS[2][0], GOOD_HASH, "Email")])
    draw = random.Random(20260312)
    path = tmp_path / "20260312_4821_DROP.zip"
    for position in range(len(package)):
        damaged = bytearray(package)
        damaged[position] ^= draw.randrange(1, 256)
        path.write_bytes(damaged)
        for source in (path, io.BytesIO(damaged)):
            for read in (lambda s: list(iter_download_zip(s, broker_id=BROKER)), zip_summary):
                if isinstance(source, io.BytesIO):
                    source.seek(0)
                try:
                    read(source)
                except DropFileError:
                    pass
                except Exception as exc:  # the failure names the byte
                    pytest.fail(f"byte {position} of {len(package)} changed: {exc!r}")


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        ("README.txt", "not a DROP list (not named <YYYYMMDD>_<DataBrokerId>_<DataType>"),
        ("20260312_4821_Email.txt", "not a DROP list"),
        ("notes/", "a folder entry"),
        ("__MACOSX/._x", "not a DROP list"),
    ],
)
def test_members_that_are_not_drop_lists_are_skipped(member: str, reason: str) -> None:
    good = email_csv(f"{ITEMS[0][0]},{ITEMS[0][1]}")
    rows, reader = read(raw_zip({member: "anything", f"{DAY}_{BROKER}_Email.csv": good}))

    assert [r.work_item_id for r in rows] == [ITEMS[0][0]]
    assert [m.name for m in reader.skipped] == [member]
    assert reason in reader.skipped[0].reason
    assert reader.complete  # nothing DROP sent was left unread


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        ("20260312_4821_Address.csv", "list type 'Address' is not one this version reads"),
        ("20261301_4821_Email.csv", "date 20261301 in the file name is not a valid date"),
        ("20260312_4821_Email.CSV", "not a CSV file name"),
        ("20260312_4821_Email_abcdefghijk.csv", "suffix must be 1 to 10 letters or digits"),
    ],
)
def test_a_drop_named_list_that_cannot_be_read_is_set_aside_whole(member: str, reason: str) -> None:
    good = email_csv(f"{ITEMS[0][0]},{ITEMS[0][1]}")
    other = email_csv(f"{ITEMS[1][0]},{ITEMS[1][1]}")
    rows, reader = read(raw_zip({f"{DAY}_{BROKER}_Phone.csv": good, member: other}))

    assert [r.work_item_id for r in rows] == [ITEMS[0][0]]
    assert [m.name for m in reader.unread] == [member]
    assert reason in reader.unread[0].reason
    assert [m.name for m in reader.files] == [f"{DAY}_{BROKER}_Phone.csv"]
    assert not reader.complete


def test_a_list_in_a_folder_is_read_under_its_own_name() -> None:
    good = email_csv(f"{ITEMS[0][0]},{ITEMS[0][1]}")
    rows, reader = read(raw_zip({f"lists/{DAY}_{BROKER}_Email.csv": good}))

    assert [(r.file_name, r.work_item_id) for r in rows] == [
        (f"{DAY}_{BROKER}_Email.csv", ITEMS[0][0])
    ]
    assert reader.complete


@pytest.mark.parametrize(
    "member", ["20260312_1234_Email.csv", "lists/20260312_1234_Phone.csv", "20260312_9999_Fax.csv"]
)
def test_another_brokers_package_is_refused_whole(member: str) -> None:
    package = raw_zip({f"{DAY}_{BROKER}_Phone.csv": email_csv(), member: email_csv()})

    error = error_of(package)

    assert error.file == member
    assert "in the file name is not this broker's (4821)" in str(error)
    assert error.line is None


def test_member_names_are_all_checked_before_any_row() -> None:
    good = email_csv(f"{ITEMS[0][0]},{ITEMS[0][1]}")
    package = raw_zip({f"{DAY}_{BROKER}_Email.csv": good, f"{DAY}_9999_Phone.csv": good})
    reader = iter_download_zip(io.BytesIO(package), broker_id=BROKER)

    with pytest.raises(DropFileError, match="broker id 9999"):
        next(reader)


@pytest.mark.parametrize("header", ["id,hash", "ID,HASH", '"ID","Hash"'])
def test_the_list_header_is_read_in_any_case(header: str) -> None:
    body = email_csv(f"{ITEMS[0][0]},{GOOD_HASH}", header=header)
    rows, reader = read(raw_zip({f"{DAY}_{BROKER}_Email.csv": body}))

    assert [r.work_item_id for r in rows] == [ITEMS[0][0]]
    assert reader.complete


@pytest.mark.parametrize(
    ("header", "found"),
    [
        ("ID,Hash,ListType", "'ID,Hash,ListType'"),
        ("ID;Hash", "'ID;Hash'"),
        ("Hash,ID", "'Hash,ID'"),
    ],
)
def test_a_list_with_another_header_is_not_read_at_all_and_is_named(
    header: str, found: str
) -> None:
    rows_csv = email_csv(f"{ITEMS[0][0]},{GOOD_HASH}", header=header)
    good = email_csv(f"{ITEMS[1][0]},{ITEMS[1][1]}")
    rows, reader = read(
        raw_zip({f"{DAY}_{BROKER}_Email.csv": rows_csv, f"{DAY}_{BROKER}_Phone.csv": good})
    )

    assert [r.work_item_id for r in rows] == [ITEMS[1][0]]
    assert reader.unread == [
        SetAside(f"{DAY}_{BROKER}_Email.csv", f"header must be ID,Hash (any case), found {found}")
    ]


def test_the_data_rows_of_a_list_set_aside_whole_are_counted() -> None:
    rows = [f"{w},{h}" for w, h in ITEMS[1:4]]
    members = {
        f"{DAY}_{BROKER}_Email.csv": email_csv(f"{ITEMS[0][0]},{GOOD_HASH}"),
        f"{DAY}_{BROKER}_Fax.csv": email_csv(*rows),  # a type this version does not know
        f"{DAY}_{BROKER}_Phone.csv": email_csv(*rows, "", "  ", "x" * 5000, header="Id;Hash"),
        f"{DAY}_{BROKER}_Address.csv": "ID,Hash",  # the header alone, no line end
        f"{DAY}_{BROKER}_Removed.csv": "ID,Hash\n" + "\n".join(rows),  # no end on the last
    }
    rows_read, reader = read(raw_zip(members))

    assert [r.work_item_id for r in rows_read] == [ITEMS[0][0]]
    assert reader.unread_rows == {
        f"{DAY}_{BROKER}_Fax.csv": 3,
        f"{DAY}_{BROKER}_Phone.csv": 4,  # blank lines are no rows; a long line is one
        f"{DAY}_{BROKER}_Address.csv": 0,
        f"{DAY}_{BROKER}_Removed.csv": 3,
    }


def test_a_removed_file_with_another_header_is_not_read() -> None:
    unread = unread_of(raw_zip({f"{DAY}_{BROKER}_Removed.csv": email_csv()}))

    assert unread.reason == "header must be ID,Hash,ListType (any case), found 'ID,Hash'"


def test_an_empty_member_is_not_read() -> None:
    unread = unread_of(raw_zip({f"{DAY}_{BROKER}_Email.csv": b""}))

    assert unread == SetAside(
        f"{DAY}_{BROKER}_Email.csv", "file is empty: expected the header ID,Hash"
    )


@pytest.mark.parametrize("members", [{}, {"README.txt": "hello"}, {"lists/": ""}])
def test_a_zip_without_any_drop_list_is_refused(members: dict[str, str]) -> None:
    assert "holds no DROP list" in str(error_of(raw_zip(members)))


@pytest.mark.parametrize("odd_id", ["AbC123xyz09", "AbC123xyz0912", "7", "a" * 64])
def test_work_item_ids_of_1_to_64_letters_and_digits_are_read_verbatim(odd_id: str) -> None:
    rows = read_all(raw_zip({f"{DAY}_{BROKER}_Email.csv": email_csv(f"{odd_id},{GOOD_HASH}")}))

    assert [r.work_item_id for r in rows] == [odd_id]


@pytest.mark.parametrize("bad_id", ["AbC123xyz09-", "AbC123 xyz09", "ÀbC123xyz091", "a" * 65, ""])
def test_a_bad_work_item_id_is_an_unreadable_row_with_its_line(bad_id: str) -> None:
    lines = [f"{w},{h}" for w, h in ITEMS[:5]] + [f"{bad_id},{GOOD_HASH}"]
    row = unreadable_of(raw_zip({f"{DAY}_{BROKER}_Email.csv": email_csv(*lines)}))

    assert (row.file_name, row.line) == (f"{DAY}_{BROKER}_Email.csv", 7)
    assert row.work_item_id == bad_id
    assert row.reason.startswith("work item id must be 1 to 64 letters or digits, found ")


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
def test_a_bad_hash_is_an_unreadable_row(bad_hash: str) -> None:
    body = email_csv(f"{ITEMS[0][0]},{bad_hash}")
    row = unreadable_of(raw_zip({f"{DAY}_{BROKER}_Phone.csv": body}))

    assert (row.file_name, row.line) == (f"{DAY}_{BROKER}_Phone.csv", 2)
    assert row.reason.startswith("hash must be 44 characters of standard Base64")


def test_a_wrong_field_count_is_an_unreadable_row() -> None:
    row = unreadable_of(raw_zip({f"{DAY}_{BROKER}_Email.csv": email_csv(f"{ITEMS[0][0]}")}))

    assert (row.line, row.reason) == (2, "expected 2 fields (ID,Hash), found 1")


def test_invalid_utf8_is_an_unreadable_row_shown_escaped() -> None:
    body = email_csv(f"{ITEMS[0][0]},{GOOD_HASH}").encode() + b"\xff\xfe,\x80\r\n"
    rows, reader = read(raw_zip({f"{DAY}_{BROKER}_Email.csv": body}))

    assert [r.work_item_id for r in rows] == [ITEMS[0][0]]
    [row] = reader.unreadable
    assert (row.line, row.reason) == (3, "not valid UTF-8 text")
    assert escaped(row.text, 255) == "\\xff\\xfe,\\x80"


def test_escaping_comes_before_the_cut_which_never_splits_an_escape() -> None:
    assert escaped("\x00" * 512, 64) == "\\x00" * 16
    assert escaped("ab\udcff", 5) == "ab"  # "\\xff" would not fit whole
    assert escaped("ab\udcffc", 6) == "ab\\xff"
    assert escaped("\u2028\U000e0001é", 20) == "\\u2028\\U000e0001é"
    assert escaped("plain text", 255) == "plain text"


def test_a_duplicate_id_within_a_list_is_an_unreadable_row() -> None:
    lines = [f"{w},{h}" for w, h in ITEMS[:3]] + [f"{ITEMS[1][0]},{GOOD_HASH}"]
    rows, reader = read(raw_zip({f"{DAY}_{BROKER}_Email.csv": email_csv(*lines)}))

    assert len(rows) == 3
    [row] = reader.unreadable
    assert (row.line, row.reason) == (
        5,
        f"work item id {ITEMS[1][0]} appears twice in this ZIP (ids are unique)",
    )


def test_a_duplicate_id_across_lists_is_an_unreadable_row() -> None:
    package = build_drop_zip(BROKER, DAY, {"Email": ITEMS[:3], "Phone": [ITEMS[4], ITEMS[2]]})

    row = unreadable_of(package)

    assert (row.file_name, row.line) == (f"{DAY}_{BROKER}_Phone.csv", 3)
    assert f"work item id {ITEMS[2][0]} appears twice in this ZIP" in row.reason


def test_removed_id_may_repeat_a_list_id_but_not_itself() -> None:
    wid, hash_value = ITEMS[0]
    allowed = build_drop_zip(
        BROKER, DAY, {"Email": [ITEMS[0]]}, removed=[(wid, hash_value, "Email")]
    )
    assert len(read_all(allowed)) == 2

    twice = build_drop_zip(
        BROKER, DAY, {}, removed=[(wid, hash_value, "Email"), (wid, hash_value, "Phone")]
    )
    row = unreadable_of(twice)
    assert (row.file_name, row.line) == (f"{DAY}_{BROKER}_Removed.csv", 3)
    assert "appears twice in this Removed file" in row.reason


def test_a_second_removed_file_is_not_read() -> None:
    removed = email_csv(header="ID,Hash,ListType")
    package = raw_zip(
        {f"{DAY}_{BROKER}_Removed.csv": removed, f"{DAY}_{BROKER}_Removed_b.csv": removed}
    )

    unread = unread_of(package)

    assert unread.name == f"{DAY}_{BROKER}_Removed_b.csv"
    assert "at most one Removed file" in unread.reason


@pytest.mark.parametrize("list_type", ["Removed", "Fax", ""])
def test_an_unknown_removed_list_type_is_an_unreadable_row(list_type: str) -> None:
    wid, hash_value = ITEMS[0]
    row = unreadable_of(build_drop_zip(BROKER, DAY, {}, removed=[(wid, hash_value, list_type)]))

    assert row.line == 2
    assert row.reason.startswith(f"list type {list_type!r} is not a DROP list")


def test_broker_id_argument_must_be_four_digits() -> None:
    with pytest.raises(ValueError, match="4-digit"):
        iter_download_zip(io.BytesIO(b""), broker_id="48210")


def test_duplicate_check_is_exact_and_compact() -> None:
    ids = [wid for wid, _ in work_items(5000, start=10**9)]
    seen = WorkItemIdSet()  # starts small: this exercises growth too

    assert all(seen.add(wid) for wid in ids)
    assert not any(seen.add(wid) for wid in ids)
    assert len(seen) == 5000
    # One million ids fit in 2**21 slots of 9 bytes (~19 MB), not ~95 MB of str objects.
    assert WorkItemIdSet(expected=1_000_000).nbytes == 9 * 2**21


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
        (("short-", 3), "work item id must be 1 to 64 letters or digits"),
        (("a" * 65, 3), "work item id must be 1 to 64 letters or digits"),
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


def test_a_single_huge_line_is_set_aside_before_it_costs_memory(tmp_path: Path) -> None:
    # 32 MiB of one line deflate to about 32 KiB: read whole, it would cost its size.
    package = tmp_path / "20260312_4821_DROP.zip"
    with (
        zipfile.ZipFile(package, "w", zipfile.ZIP_DEFLATED) as archive,
        archive.open("20260312_4821_Email.csv", "w") as member,
    ):
        member.write(b"ID,Hash\r\n")
        for _ in range(32):
            member.write(b"A" * (1 << 20))
        member.write(f"\r\n{ITEMS[0][0]},{ITEMS[0][1]}\r\n".encode())
    assert package.stat().st_size < 1 << 20

    tracemalloc.start()
    try:
        reader = iter_download_zip(package, broker_id="4821")
        rows = list(reader)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert [(r.work_item_id, r.line) for r in rows] == [(ITEMS[0][0], 3)]
    [row] = reader.unreadable
    assert (row.line, row.reason) == (2, "line longer than 4096 characters")
    assert len(escaped(row.text, 255)) == 255
    assert peak < 16 << 20, f"reading the line cost {peak / (1 << 20):.0f} MiB"


def test_the_protocol_code_takes_the_status_codes_without_django() -> None:
    # The response files take DROP's codes from their one home, a standard-library leaf.
    code = (
        "import sys, integrations.drop.files, integrations.drop.reporting; "
        "assert not [m for m in sys.modules if m.split('.')[0] == 'django'], 'django imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, check=True)  # noqa: S603
