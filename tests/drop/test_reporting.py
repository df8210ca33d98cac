"""Response file names, bytes and digests, and the due date, without a database."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from integrations.drop.files import DropFileError
from integrations.drop.reporting import (
    build_response_file,
    response_name,
    response_status_counts,
    responses_from_rows,
    save_response_file,
)

LIST = "20260312_4821_Email.csv"


def test_the_first_upload_reuses_the_downloaded_name_then_parts_follow() -> None:
    taken: set[str] = set()
    names = []
    for _ in range(3):
        names.append(response_name(LIST, kind="upload", taken=taken))
        taken.add(names[-1])
    assert names == [
        "20260312_4821_Email.csv",
        "20260312_4821_Email_part02.csv",
        "20260312_4821_Email_part03.csv",
    ]


def test_amendments_get_a_fresh_suffix_each() -> None:
    taken = {LIST, "20260312_4821_Email_amend01.csv"}
    assert response_name(LIST, kind="amend", taken=taken) == "20260312_4821_Email_amend02.csv"


def test_no_name_is_made_for_removed_or_a_bad_kind() -> None:
    with pytest.raises(DropFileError, match="no status is owed"):
        response_name("20260312_4821_Removed.csv", kind="upload", taken=())
    with pytest.raises(ValueError, match="unknown response file kind"):
        response_name(LIST, kind="replace", taken=())


def test_a_file_holds_the_header_and_one_crlf_row_per_item_with_its_digest() -> None:
    built = build_response_file(LIST, [("A1b2C3d4E5f6", 3), ("Z9y8X7w6V5u4", 5)])
    assert built.content == b"Id,Status\r\nA1b2C3d4E5f6,3\r\nZ9y8X7w6V5u4,5\r\n"
    assert built.rows == 2
    assert built.sha256 == hashlib.sha256(built.content).hexdigest()


def test_the_rows_per_status_are_counted_from_the_bytes() -> None:
    built = build_response_file(
        "20260312_4821_Email.csv", [("A5", 3), ("B35", 5), ("C3", 3), ("D2", 4)]
    )

    # An id ending in a status digit is not a status: only the code after the comma counts.
    assert response_status_counts(built.content) == {2: 0, 3: 2, 4: 1, 5: 1}
    assert response_status_counts(b"Id,Status\r\n") == {2: 0, 3: 0, 4: 0, 5: 0}


def test_a_bad_row_names_the_file_and_line() -> None:
    with pytest.raises(DropFileError) as error:
        build_response_file(LIST, [("A1b2C3d4E5f6", 3), ("A1b2C3d4E5f6", 1)])
    assert str(error.value).startswith(f"{LIST} line 3: status must be 2, 3, 4 or 5")


def test_saving_writes_the_whole_file_and_refuses_a_path(tmp_path: Path) -> None:
    target = save_response_file(tmp_path / "out", LIST, b"Id,Status\r\n")
    assert target.read_bytes() == b"Id,Status\r\n"
    assert [p.name for p in (tmp_path / "out").iterdir()] == [LIST]
    with pytest.raises(DropFileError):
        save_response_file(tmp_path, "../20260312_4821_Email.csv", b"x")


def test_files_cut_from_sorted_rows_equal_files_built_row_by_row() -> None:
    data = (
        b"7,A1b2C3d4E5f6,3\n7,Z9y8X7w6V5u4,5\n"
        b"12,Q1w2E3r4T5y6,4\n"  # key 9 has no rows; 12 follows 7 numerically
    )
    names = {7: LIST, 9: "20260312_4821_Phone.csv", 12: "20260312_4821_MAID.csv"}

    files = responses_from_rows(data, names)

    assert sorted(files) == [7, 12]
    assert files[7] == build_response_file(LIST, [("A1b2C3d4E5f6", 3), ("Z9y8X7w6V5u4", 5)])
    assert files[12].content == b"Id,Status\r\nQ1w2E3r4T5y6,4\r\n"
    assert responses_from_rows(b"", names) == {}


def test_ids_of_another_length_are_echoed_verbatim() -> None:
    data = b"7,680,5\n7," + b"a" * 64 + b",3\n"

    files = responses_from_rows(data, {7: LIST})

    assert files[7].content == b"Id,Status\r\n680,5\r\n" + b"a" * 64 + b",3\r\n"
    assert files[7] == build_response_file(LIST, [("680", 5), ("a" * 64, 3)])


def test_cut_files_refuse_a_bad_row_or_an_unknown_key() -> None:
    with pytest.raises(DropFileError, match="not a work item id and a status"):
        responses_from_rows(b"7,short-,3\n", {7: LIST})
    with pytest.raises(DropFileError, match="not a work item id and a status"):
        responses_from_rows(b"7," + b"a" * 65 + b",3\n", {7: LIST})
    with pytest.raises(DropFileError, match="not asked for"):
        responses_from_rows(b"8,A1b2C3d4E5f6,3\n", {7: LIST})
