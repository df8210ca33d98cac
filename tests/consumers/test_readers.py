"""Consumer records to hashed rows: CSV (clear and hashed) and API objects, every bad input.

Hashes are checked against DROP's examples (docs/contracts.md §12.3); a rejected record must
name its line (or index) and field, and must never repeat the clear value.
"""

from __future__ import annotations

import base64
import io
import sys
from typing import Any

import pytest

from integrations.consumers.api_reader import parse_api_consumers
from integrations.consumers.readers import (
    ConsumerCsvReader,
    ConsumerRecord,
    RegistrationFileError,
    RejectedRecord,
)

ANNA = "KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE="  # Anna.Smith@Domain.com
PHONE = "vGM7y5n+hBXRSEAklhHDPCbysyNgYTmXdMcagGUOY8E="  # +1(415)555-9317
NDZ = "PQOfn1RffEKmqMmNAzDKKaoZCwxWbQZkQzPWmQo9REA="  # Danielle / Johnson / 1985-07-04 / 91790
NAME_VIN = "rtnDuXIe63jXYQQXW5r07GJ7lSsrib8+46QuKFwkOmk="  # Eve / Genesis / 1HGCM82633A004352
MAID = "250KY6lOgzYUB3EHrkbDCE2kMEZQE69SF38muhoDudI="
CTVID = "d9fxuTIrKksBXYDlaWsvQbcyUUfCbUx7v78gd+KP+tc="
NDZ_HEADER = "remote_identifier,first_name,last_name,dob,zip"
FULL_HEADER = (
    "remote_identifier,remote_identifier_kind,email,phone,first_name,last_name,dob,zip,vin,"
    "maid,ctvid"
)


def read(text: str, *, hashed: bool = False) -> list[ConsumerRecord | RejectedRecord]:
    return list(ConsumerCsvReader(io.StringIO(text, newline=""), hashed=hashed))


def b64(record: ConsumerRecord | RejectedRecord) -> list[tuple[str, str]]:
    assert isinstance(record, ConsumerRecord), record
    return [(t, base64.b64encode(digest).decode()) for t, digest in record.hashes]


def accepted(record: ConsumerRecord | RejectedRecord) -> ConsumerRecord:
    assert isinstance(record, ConsumerRecord), record
    return record


def only_rejection(text: str, *, hashed: bool = False) -> RejectedRecord:
    (record,) = read(text, hashed=hashed)
    assert isinstance(record, RejectedRecord), record
    return record


# --- Clear CSV -------------------------------------------------------------------------


def test_one_row_with_every_list_type_gives_the_official_hashes() -> None:
    row = (
        "C-1,crm_id,Anna.Smith@Domain.com,+1(415)555-9317,Danielle,Johnson,1985-07-04,91790,,"
        "a3f1c2d4-5678-90ab-cdef-1234567890ab,SmartTV_9F8E7D6C"
    )
    (record,) = read(f"{FULL_HEADER}\n{row}\n")
    assert isinstance(record, ConsumerRecord)
    assert (record.position, record.remote_identifier) == (2, "C-1")
    assert record.remote_identifier_kind == "crm_id"
    assert b64(record) == [
        ("email", ANNA),
        ("phone", PHONE),
        ("maid", MAID),
        ("ctvid", CTVID),
        ("ndz", NDZ),
    ]
    assert all(len(digest) == 32 for _, digest in record.hashes)


def test_names_with_a_vin_give_name_vin_and_with_dob_and_zip_ndz_both_in_one_row() -> None:
    (nv,) = read(f"{FULL_HEADER}\nC-2,,,,Eve,Genesis,,,1HGCM82633A004352,,\n")
    assert b64(nv) == [("name_vin", NAME_VIN)]
    (both,) = read(
        "remote_identifier,first_name,last_name,dob,zip,vin\n"
        "C-3,Danielle,Johnson,1985-07-04,91790,1HGCM82633A004352\n"
    )
    assert [t for t, _ in b64(both)] == ["ndz", "name_vin"]


def test_any_subset_of_columns_after_remote_identifier_and_any_order() -> None:
    (record,) = read("remote_identifier,phone,email\nC-1,+1(415)555-9317,Anna.Smith@Domain.com\n")
    assert b64(record) == [("email", ANNA), ("phone", PHONE)]
    assert accepted(record).remote_identifier_kind is None  # the stored kind is kept / external_id


def test_header_names_are_trimmed_and_case_insensitive_and_a_bom_is_ignored() -> None:
    (record,) = read("\ufeffRemote_Identifier , EMAIL\nC-1,Anna.Smith@Domain.com\n")
    assert b64(record) == [("email", ANNA)]


def test_empty_and_blank_cells_are_skipped_and_blank_lines_too() -> None:
    records = read("remote_identifier,email,phone\n\nC-1,,  \nC-2,Anna.Smith@Domain.com,\n\n")
    assert isinstance(records[0], RejectedRecord)  # C-1 has no identifier at all
    assert records[0].position == 3
    assert b64(records[1]) == [("email", ANNA)]
    assert records[1].position == 4


def test_quoted_fields_and_a_multi_line_record_keep_line_numbers_right() -> None:
    records = read(
        'remote_identifier,email\n"C,1","Anna.Smith@Domain.com"\n"C-2","a\nb"\nC-3,x@y\n'
    )
    assert records[0].remote_identifier == "C,1"
    assert [r.position for r in records] == [2, 3, 5]


def test_remote_identifier_is_kept_verbatim_and_a_blank_one_refused() -> None:
    records = read(
        "remote_identifier,email\n  C-1  ,Anna.Smith@Domain.com\n   ,Anna.Smith@Domain.com\n"
    )
    assert records[0].remote_identifier == "  C-1  "  # the broker's data, spaces included
    assert isinstance(records[1], RejectedRecord)
    assert records[1].errors == {"remote_identifier": ["remote_identifier must not be blank"]}


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("", "the file is empty"),
        (" , \n", "the file is empty"),
        ("email,remote_identifier", "the first column must be remote_identifier"),
        ("remote_identifier,emial", "unknown column 'emial' in column 2"),
        ("remote_identifier,hash_type,hash", "use --hashed"),
        ("remote_identifier,email,email", "column 'email' appears twice"),
        ("remote_identifier", "no identifier column"),
        ("remote_identifier,remote_identifier_kind", "no identifier column"),
        # Columns that can give no hash are no identifier column.
        (
            "remote_identifier,first_name,last_name",
            "no identifier column that gives a hash: first_name, last_name not used: "
            "no NDZ without dob and zip, no NameVIN without vin",
        ),
        ("remote_identifier,remote_identifier_kind,dob", "dob not used"),
    ],
)
def test_a_bad_header_is_refused_before_any_row_is_read(header: str, message: str) -> None:
    with pytest.raises(
        RegistrationFileError, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        ConsumerCsvReader(io.StringIO(f"{header}\nC-1,a@b\n" if header else ""))


@pytest.mark.parametrize(
    ("header", "row", "hashes", "unused"),
    [
        # The contract's "any subset": columns that give no hash here are named, not refused.
        (
            "remote_identifier,email,first_name,last_name",
            "C-1,Anna.Smith@Domain.com,Anna,Smith",
            ["email"],
            "first_name, last_name not used: no NDZ without dob and zip, no NameVIN without vin",
        ),
        (
            "remote_identifier,email,zip",
            "C-1,Anna.Smith@Domain.com,94107",
            ["email"],
            "zip not used: no NDZ without first_name, last_name and dob",
        ),
        (
            "remote_identifier,phone,dob",
            "C-1,+1(415)555-9317,1990-01-01",
            ["phone"],
            "dob not used: no NDZ without first_name, last_name and zip",
        ),
        (
            "remote_identifier,email,first_name,dob,zip,vin",
            "C-1,Anna.Smith@Domain.com,Anna,1990-01-01,94107,1HGCM826",
            ["email"],
            "first_name, dob, zip, vin not used: no NDZ without last_name, "
            "no NameVIN without last_name",
        ),
        (
            "remote_identifier,first_name,last_name,vin,zip",
            "C-1,Eve,Genesis,1HGCM82633A004352,not a zip",
            ["name_vin"],
            "zip not used: no NDZ without dob",
        ),
        (
            "remote_identifier,first_name,last_name,dob,zip,vin",
            "C-1,Danielle,Johnson,1985-07-04,91790,",
            ["ndz"],
            "",
        ),
    ],
)
def test_columns_that_give_no_hash_are_named_and_their_cells_ignored(
    header: str, row: str, hashes: list[str], unused: str
) -> None:
    reader = ConsumerCsvReader(io.StringIO(f"{header}\n{row}\n", newline=""))
    assert reader.unused_columns == unused
    (record,) = reader
    assert [t for t, _ in b64(record)] == hashes


def test_cells_of_an_unused_column_that_are_not_utf8_are_ignored_too() -> None:
    raw = b"remote_identifier,email,zip\nC-1,Anna.Smith@Domain.com,9\xff107\n"
    text = io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", errors="surrogateescape")
    (record,) = ConsumerCsvReader(text)
    assert b64(record) == [("email", ANNA)]


SECRET = "Secret.Person@Example.com"


@pytest.mark.parametrize(
    "first",
    [
        SECRET,  # no header line: the first row's cells read as column names
        "+1 (415) 555-9317",
        "4155559317",  # a phone that looks like a column name
        "Danielle Johnson",
        "danielle",
        "91790",
        "a3f1c2d4-5678-90ab-cdef-1234567890ab",
        "x" * 33,
        "smith.anna",
    ],
)
@pytest.mark.parametrize("hashed", [False, True])
def test_a_first_line_without_remote_identifier_is_not_a_header_and_not_echoed(
    first: str, hashed: bool
) -> None:
    with pytest.raises(RegistrationFileError) as raised:
        ConsumerCsvReader(io.StringIO(f"C-1,{first},anna\n"), hashed=hashed)
    message = str(raised.value)
    assert first.lower() not in message.lower() and "anna" not in message
    expected = "remote_identifier, hash_type, hash" if hashed else "remote_identifier"
    assert message == (
        "the first line is not a header: it has no remote_identifier column (its cells are "
        f"not shown; is the header line missing?); expected {expected} first"
    )


@pytest.mark.parametrize("column", [SECRET, "+1 (415) 555-9317", "x" * 33])
def test_an_unknown_column_of_a_header_that_looks_like_data_is_not_echoed(column: str) -> None:
    with pytest.raises(RegistrationFileError) as raised:
        ConsumerCsvReader(io.StringIO(f"remote_identifier,{column}\n"))
    message = str(raised.value)
    assert column.lower() not in message.lower()
    assert message.startswith("unknown column name in column 2 (not shown: it looks like data")
    assert message.endswith("; expected " + FULL_HEADER.replace(",", ", "))


def test_a_utf16_file_is_refused_as_not_utf8() -> None:
    raw = f"remote_identifier,email\nC-1,{SECRET}\n".encode("utf-16")
    text = io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8-sig", errors="surrogateescape")
    with pytest.raises(RegistrationFileError) as raised:
        ConsumerCsvReader(text)
    assert str(raised.value) == "the header is not UTF-8 text (a UTF-16 file? save it as UTF-8)"


@pytest.mark.parametrize(
    ("header", "row", "field", "reason"),
    [
        ("remote_identifier,email", ",x@y", "remote_identifier", "remote_identifier is required"),
        ("remote_identifier,email", f"{'C' * 256},x@y", "remote_identifier", "at most 255"),
        ("remote_identifier,email", "C\x00,x@y", "remote_identifier", "NUL"),
        ("remote_identifier,email", "C-1,  ", "row", "no identifier"),
        ("remote_identifier,phone", "C-1,no digits", "phone", "phone has no digits"),
        ("remote_identifier,maid", "C-1,abc", "maid", "MAID must be 32 hex"),
        ("remote_identifier,ctvid", "C-1,short", "ctvid", "CTVID must be 8 to 32"),
        (
            "remote_identifier,first_name,last_name,vin",
            "C-1,Eve,Genesis,1HGCM826",
            "vin",
            "VIN must be 17",
        ),
        (
            "remote_identifier,first_name,last_name,dob,zip",
            "C-1,Eve,Genesis,2023-02-30,91790",
            "dob",
            "not a real calendar date",
        ),
        (
            "remote_identifier,first_name,last_name,dob,zip",
            "C-1,Eve,Genesis,30.02.2023,91790",
            "dob",
            "not in a known format",
        ),
        (
            "remote_identifier,first_name,last_name,dob,zip",
            "C-1,Eve,Genesis,1985-07-04,",
            "ndz",
            "ndz needs zip",
        ),
        (
            "remote_identifier,first_name,last_name,dob,zip",
            "C-1,Eve,,1985-07-04,91790",
            "ndz",
            "ndz needs last_name",
        ),
        (
            "remote_identifier,first_name,last_name,dob,zip",
            "C-1,'-',Genesis,1985-07-04,91790",
            "first_name",
            "first_name has no letters or digits",
        ),
        (
            "remote_identifier,first_name,last_name,dob,zip",
            "C-1,Eve,Genesis,,",
            "row",
            "need dob and zip (NDZ) or vin",
        ),
        (
            "remote_identifier,remote_identifier_kind,email",
            "C-1,not a kind!,x@y",
            "remote_identifier_kind",
            "1 to 64 letters",
        ),
        ("remote_identifier,email", "C-1,x@y,extra", "row", "has 3 fields; the header has 2"),
        ("remote_identifier,email,phone", "C-1", "row", "has 1 field; the header has 3"),
    ],
)
def test_each_bad_row_is_rejected_with_its_line_field_and_reason(
    header: str, row: str, field: str, reason: str
) -> None:
    rejected = only_rejection(f"{header}\n{row}\n")
    assert rejected.position == 2
    assert field in rejected.errors
    assert reason in " ".join(rejected.errors[field])
    assert reason in rejected.reason


NAMES_HEADER = "remote_identifier,email,first_name,last_name,dob,zip,vin"


@pytest.mark.parametrize(
    ("row", "hashes"),
    [
        ("C-1,Anna.Smith@Domain.com,Anna,Smith,,,", ["email"]),  # names, no dob/zip/vin
        ("C-1,Anna.Smith@Domain.com,Anna,,,,", ["email"]),
        ("C-1,,Eve,Genesis,,,1HGCM82633A004352", ["name_vin"]),  # no NDZ: dob and zip empty
    ],
)
def test_a_composite_whose_own_parts_are_all_empty_is_absent_not_an_error(
    row: str, hashes: list[str]
) -> None:
    (record,) = read(f"{NAMES_HEADER}\n{row}\n")
    assert [t for t, _ in b64(record)] == hashes


@pytest.mark.parametrize(
    ("row", "field", "reason"),
    [
        ("C-1,Anna.Smith@Domain.com,Anna,Smith,1985-07-04,,", "ndz", "ndz needs zip"),
        (
            "C-1,Anna.Smith@Domain.com,,,1985-07-04,91790,",
            "ndz",
            "ndz needs first_name and last_name",
        ),
        (
            "C-1,Anna.Smith@Domain.com,,,,,1HGCM82633A004352",
            "name_vin",
            "name_vin needs first_name and last_name",
        ),
        ("C-1,,Anna,Smith,,,", "row", "no identifier: first_name and last_name need dob and zip"),
    ],
)
def test_a_composite_partly_filled_still_rejects_its_row(row: str, field: str, reason: str) -> None:
    rejected = only_rejection(f"{NAMES_HEADER}\n{row}\n")
    assert reason in " ".join(rejected.errors[field])


@pytest.mark.parametrize("again", ["remote_identifier,email", "\ufeffRemote_Identifier , EMAIL"])
def test_a_header_row_again_is_rejected_not_registered(again: str) -> None:
    # Two files joined with cat: the second file's header (its BOM too) is a row.
    records = read(f"remote_identifier,email\nC-1,{SECRET}\n{again}\nC-2,Anna.Smith@Domain.com\n")
    assert [type(r).__name__ for r in records] == [
        "ConsumerRecord",
        "RejectedRecord",
        "ConsumerRecord",
    ]
    assert records[1] == RejectedRecord(3, None, {"row": ["a header row again: two files joined?"]})


def test_a_pointer_named_remote_identifier_with_real_identifiers_is_still_a_row() -> None:
    (record,) = read("remote_identifier,email\nremote_identifier,Anna.Smith@Domain.com\n")
    assert b64(record) == [("email", ANNA)]


def test_a_rejection_never_repeats_the_clear_values() -> None:
    rejected = only_rejection(
        f"remote_identifier,email,phone,maid\nC-1,{SECRET},+1 (415) 555-0000,{SECRET}\n"
    )
    assert "maid" in rejected.errors
    text = repr(rejected) + rejected.reason
    for clear in (SECRET, SECRET.lower(), "4155550000", "555"):
        assert clear not in text


def test_bytes_that_are_not_utf8_reject_only_their_row() -> None:
    raw = b"remote_identifier,email\nC-1,jos\xe9@example.com\nC-2,Anna.Smith@Domain.com\n"
    text = io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", errors="surrogateescape", newline="")
    first, second = ConsumerCsvReader(text)
    assert isinstance(first, RejectedRecord)
    assert first.errors == {"email": ["email is not valid UTF-8"]}
    assert b64(second) == [("email", ANNA)]


@pytest.mark.parametrize(
    ("header", "row", "field"),
    [
        ("remote_identifier,phone", b"C-1,+1 415 555 9317\xa0", "phone"),
        ("remote_identifier,maid", b"C-1,a3f1c2d4-5678-90ab-cdef-1234567890ab\xff", "maid"),
        ("remote_identifier,ctvid", b"C-1,SmartTV_9F8E7D6C\xff", "ctvid"),
        (NDZ_HEADER, b"C-1,Jos\xe9,Johnson,1985-07-04,91790", "first_name"),
        (NDZ_HEADER, b"C-1,Danielle,Garc\xeda,1985-07-04,91790", "last_name"),
        (NDZ_HEADER, b"C-1,Danielle,Johnson,1985-07-04\xff,91790", "dob"),
        (NDZ_HEADER, b"C-1,Danielle,Johnson,1985-07-04,91790\xa0", "zip"),
        (
            "remote_identifier,first_name,last_name,vin",
            b"C-1,Eve,Genesis,1HGCM82633A004352\xff",
            "vin",
        ),
    ],
)
def test_bytes_that_are_not_utf8_in_any_clear_field_reject_the_row(
    header: str, row: bytes, field: str
) -> None:
    # Standardizing drops what is not a letter or digit: "Jos\xe9" must not be hashed as "Jos".
    raw = header.encode() + b"\n" + row + b"\n"
    text = io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", errors="surrogateescape", newline="")
    (rejected,) = ConsumerCsvReader(text)
    assert isinstance(rejected, RejectedRecord), rejected
    assert rejected.remote_identifier == "C-1"
    assert rejected.errors == {field: [f"{field} is not valid UTF-8"]}


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        # The reader stops inside the quoted field: read on, its inner lines became rows.
        (f'C-2,"{"x" * 140_000}\nPHANTOM-1,{SECRET}\nmore"', "field larger than field limit"),
        (f'C-2,"{SECRET}"x', "',' expected after '\"'"),
        (f'C-2,"{SECRET}\nPHANTOM-1,x@y.com\n', "unexpected end of data"),
    ],
)
def test_a_row_that_is_not_valid_csv_refuses_the_file_naming_its_line(
    row: str, reason: str
) -> None:
    reader = ConsumerCsvReader(io.StringIO(f"remote_identifier,email\nC-1,x@y.com\n{row}\n"))
    with pytest.raises(RegistrationFileError) as raised:
        list(reader)
    assert str(raised.value).startswith(f"line 3 is not valid CSV: {reason}")
    assert SECRET not in str(raised.value) and "PHANTOM" not in str(raised.value)


def test_a_good_row_after_bad_rows_is_still_read() -> None:
    records = read("remote_identifier,email\nC-1,\nC-2,Anna.Smith@Domain.com\n,x@y\n")
    assert [type(r).__name__ for r in records] == [
        "RejectedRecord",
        "ConsumerRecord",
        "RejectedRecord",
    ]
    assert [r.position for r in records] == [2, 3, 4]


# --- Hashed CSV ------------------------------------------------------------------------


def test_hashed_rows_decode_to_the_32_byte_digest() -> None:
    records = read(
        "remote_identifier,hash_type,hash,remote_identifier_kind\n"
        f"C-1,email,{ANNA},\nC-1,ndz,{NDZ},crm_id\n",
        hashed=True,
    )
    assert b64(records[0]) == [("email", ANNA)]
    assert b64(records[1]) == [("ndz", NDZ)]
    assert accepted(records[1]).remote_identifier_kind == "crm_id"


@pytest.mark.parametrize(
    ("row", "field", "reason"),
    [
        (f"C-1,mail,{ANNA}", "hash_type", "hash_type must be one of email, phone"),
        ("C-1,email,not-a-hash", "hash", "standard Base64 (44 characters"),
        (f"C-1,email,{ANNA[:-1]}", "hash", "standard Base64"),
        (f"C-1,email,{ANNA[:-2]}F=", "hash", "standard Base64"),  # non-canonical last char
        (f"C-1,email,{ANNA.replace('/', '_')}", "hash", "standard Base64"),  # URL-safe
        ("C-1,email," + "ab" * 32, "hash", "standard Base64"),  # hex
        (f",email,{ANNA}", "remote_identifier", "required"),
    ],
)
def test_a_bad_hashed_row_is_rejected(row: str, field: str, reason: str) -> None:
    rejected = only_rejection(f"remote_identifier,hash_type,hash\n{row}\n", hashed=True)
    assert reason in " ".join(rejected.errors[field])


def test_a_hashed_header_row_again_is_rejected_as_such() -> None:
    header = "hash_type,remote_identifier,hash"
    records = read(f"{header}\nemail,C-1,{ANNA}\n\ufeff{header}\n", hashed=True)
    assert records[1] == RejectedRecord(3, None, {"row": ["a header row again: two files joined?"]})


@pytest.mark.parametrize(
    ("row", "pointer", "fields"),
    [
        (f"email,{ANNA}", None, "has 2 fields"),  # the pointer's cell is missing
        (f"email,{ANNA},C-1,crm", "C-1", "has 4 fields"),
        (f"email,{ANNA},C-1", "C-1", None),
    ],
)
def test_a_hashed_row_of_the_wrong_width_names_its_pointer_not_its_first_cell(
    row: str, pointer: str | None, fields: str | None
) -> None:
    # A hashed file may put its columns in any order: here the pointer is the third.
    (record,) = read(f"hash_type,hash,remote_identifier\n{row}\n", hashed=True)
    assert record.remote_identifier == pointer
    if fields is None:
        assert b64(record) == [("email", ANNA)]
    else:
        assert isinstance(record, RejectedRecord)
        assert record.errors == {"row": [f"{fields}; the header has 3"]}


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("remote_identifier,hash", "missing hash_type"),
        ("remote_identifier,hash_type,hash,email", "unknown column 'email'"),
    ],
)
def test_a_bad_hashed_header_is_refused(header: str, message: str) -> None:
    with pytest.raises(RegistrationFileError, match=message):
        ConsumerCsvReader(io.StringIO(f"{header}\n"), hashed=True)


# --- API objects -----------------------------------------------------------------------


def api(*consumers: Any) -> list[ConsumerRecord | RejectedRecord]:
    return list(parse_api_consumers(list(consumers)))


def test_api_objects_with_every_list_type_and_hashes() -> None:
    (record,) = api(
        {
            "remote_identifier": "C-1",
            "remote_identifier_kind": "crm_id",
            "email": ["Anna.Smith@Domain.com"],
            "phone": ["+1(415)555-9317"],
            "ndz": [
                {
                    "first_name": "Danielle",
                    "last_name": "Johnson",
                    "dob": "1985-07-04",
                    "zip": "91790",
                }
            ],
            "name_vin": [{"first_name": "Eve", "last_name": "Genesis", "vin": "1HGCM82633A004352"}],
            "maid": ["a3f1c2d4-5678-90ab-cdef-1234567890ab"],
            "ctvid": ["SmartTV_9F8E7D6C"],
            "hashes": {"email": [ANNA], "phone": [PHONE]},
        }
    )
    assert record.position == 0 and accepted(record).remote_identifier_kind == "crm_id"
    assert sorted(b64(record)) == sorted(
        [
            ("email", ANNA),
            ("phone", PHONE),
            ("maid", MAID),
            ("ctvid", CTVID),
            ("ndz", NDZ),
            ("name_vin", NAME_VIN),
            ("email", ANNA),
            ("phone", PHONE),
        ]
    )


@pytest.mark.parametrize(
    ("consumer", "key", "reason"),
    [
        ("C-1", "non_field_errors", "must be a JSON object"),
        ({"email": ["a@b"]}, "remote_identifier", "this field is required"),
        ({"remote_identifier": 7, "email": ["a@b"]}, "remote_identifier", "must be a string"),
        ({"remote_identifier": " ", "email": ["a@b"]}, "remote_identifier", "must not be blank"),
        ({"remote_identifier": "C-1"}, "non_field_errors", "no identifier"),
        ({"remote_identifier": "C-1", "emails": ["a@b"]}, "emails", "unknown field"),
        ({"remote_identifier": "C-1", "email": "a@b"}, "email", "must be a list"),
        ({"remote_identifier": "C-1", "email": ["a@b", 5]}, "email[1]", "must be a string"),
        ({"remote_identifier": "C-1", "email": ["a@b", " "]}, "email[1]", "empty"),
        ({"remote_identifier": "C-1", "maid": ["xyz"]}, "maid[0]", "32 hex"),
        ({"remote_identifier": "C-1", "ctvid": ["abc"]}, "ctvid[0]", "8 to 32"),
        (
            {"remote_identifier": "C-1", "ndz": [{"first_name": "A", "last_name": "B"}]},
            "ndz[0].dob",
            "this field is required",
        ),
        (
            {
                "remote_identifier": "C-1",
                "ndz": [{"first_name": "A", "last_name": "B", "dob": "1990-13-01", "zip": "1"}],
            },
            "ndz[0].dob",
            "not a real calendar date",
        ),
        ({"remote_identifier": "C-1", "ndz": ["A B"]}, "ndz[0]", "must be an object"),
        (
            {
                "remote_identifier": "C-1",
                "name_vin": [{"first_name": "A", "last_name": "B", "vin": "1", "x": "y"}],
            },
            "name_vin[0].x",
            "unknown field",
        ),
        (
            {
                "remote_identifier": "C-1",
                "name_vin": [{"first_name": "A", "last_name": "B", "vin": "1"}],
            },
            "name_vin[0].vin",
            "VIN must be 17",
        ),
        ({"remote_identifier": "C-1", "hashes": [ANNA]}, "hashes", "must be an object"),
        ({"remote_identifier": "C-1", "hashes": {"mail": [ANNA]}}, "hashes.mail", "unknown list"),
        ({"remote_identifier": "C-1", "hashes": {"email": ANNA}}, "hashes.email", "must be a list"),
        (
            {"remote_identifier": "C-1", "hashes": {"email": [ANNA, "nope"]}},
            "hashes.email[1]",
            "standard Base64",
        ),
        (
            {"remote_identifier": "C-1", "remote_identifier_kind": "a b", "email": ["a@b"]},
            "remote_identifier_kind",
            "1 to 64 letters",
        ),
    ],
)
def test_each_bad_api_consumer_is_rejected_with_its_index_and_field(
    consumer: Any, key: str, reason: str
) -> None:
    good = {"remote_identifier": "C-0", "email": ["Anna.Smith@Domain.com"]}
    accepted, rejected = api(good, consumer)
    assert isinstance(accepted, ConsumerRecord)
    assert isinstance(rejected, RejectedRecord)
    assert rejected.position == 1
    assert reason in " ".join(rejected.errors[key])


def test_an_api_rejection_keeps_the_pointer_and_never_the_clear_values() -> None:
    (rejected,) = api({"remote_identifier": "C-9", "email": [SECRET], "maid": [SECRET]})
    assert isinstance(rejected, RejectedRecord)
    assert rejected.remote_identifier == "C-9"
    assert SECRET not in repr(rejected) and SECRET.lower() not in repr(rejected)


def test_an_api_consumer_s_clear_names_are_not_kept_once_hashed() -> None:
    # The web process reads API bodies for its whole life: nothing may hold a name after.
    first = "Jos" + "é" * 1_000_000  # made at run time, so no constant holds it too
    last = "".join(["Mül", "ler"])
    ndz = {"first_name": first, "last_name": last, "dob": "1985-07-04", "zip": "91790"}
    before = sys.getrefcount(first), sys.getrefcount(last)
    (record,) = api({"remote_identifier": "C-1", "ndz": [ndz], "name_vin": []})
    assert accepted(record).hashes[0][0] == "ndz"
    assert (sys.getrefcount(first), sys.getrefcount(last)) == before
