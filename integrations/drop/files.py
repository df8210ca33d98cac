"""DROP's file formats: the list files' names and the rows they hold, and the response CSVs
we send back. Reading a download ZIP is ``download_zip``'s.

Writing a response::

    name = response_file_name("20260312_4821_Email.csv", suffix="part01")
    with open(name, "wb") as out:
        row_count, sha256 = write_response_csv(out, [("A1b2C3d4E5f6", 3)])

Pure Python, no Django: the formats are those of docs/contracts.md §10.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO, NamedTuple

from integrations.drop.work_item_ids import WorkItemIdSet
from integrations.drop_statuses import STATUS_CODES, STATUS_CODES_TEXT
from integrations.list_types import DATA_TYPE_OF, REMOVED, file_name_pattern

__all__ = [
    "DATA_TYPES",
    "DATA_TYPE_TO_HASH_TYPE",
    "HASH_TYPE_TO_DATA_TYPE",
    "LIST_DATA_TYPES",
    "LIST_HEADER",
    "NAME_SHAPE",
    "REMOVED",
    "REMOVED_HEADER",
    "RESPONSE_HEADER",
    "WORK_ITEM_ID_MAX",
    "WORK_ITEM_ID_RE",
    "DropFileError",
    "DropFileName",
    "RemovedRow",
    "ResponseCsv",
    "SetAside",
    "UnreadableRow",
    "WorkItemRow",
    "ZipMember",
    "parse_file_name",
    "response_file_name",
    "shown",
    "write_response_csv",
]

# integrations/list_types.py
HASH_TYPE_TO_DATA_TYPE: dict[str, str] = dict(DATA_TYPE_OF)
DATA_TYPE_TO_HASH_TYPE: dict[str, str] = {v: k for k, v in HASH_TYPE_TO_DATA_TYPE.items()}
LIST_DATA_TYPES: tuple[str, ...] = tuple(DATA_TYPE_OF.values())
DATA_TYPES: tuple[str, ...] = (*LIST_DATA_TYPES, REMOVED)

LIST_HEADER = ["ID", "Hash"]
REMOVED_HEADER = ["ID", "Hash", "ListType"]
RESPONSE_HEADER = b"Id,Status\r\n"

_NAME_RE = re.compile(file_name_pattern())  # groups: date, broker, data type, suffix
NAME_SHAPE = "<YYYYMMDD>_<DataBrokerId>_<DataType>[_<Suffix>].csv"
# DROP documents 12 characters; a longer or shorter id of letters and digits is still
# DROP's id, kept and echoed back exactly as sent.
WORK_ITEM_ID_RE = re.compile(r"[A-Za-z0-9]{1,64}")
WORK_ITEM_ID_MAX = 64
_SUFFIX_RE = re.compile(r"[A-Za-z0-9]{1,10}")


class DropFileError(ValueError):
    """A DROP file (or a member of a DROP ZIP) is not what DROP's format says, at a given line."""

    def __init__(self, file: str | None, line: int | None, reason: str) -> None:
        super().__init__(file, line, reason)
        self.file = file
        self.line = line
        self.reason = reason

    def __str__(self) -> str:
        where = self.file or ""
        if self.line is not None:
            where = f"{where} line {self.line}" if where else f"line {self.line}"
        return f"{where}: {self.reason}" if where else self.reason


@dataclass(frozen=True, slots=True)
class DropFileName:
    """The parts of ``<YYYYMMDD>_<DataBrokerId>_<DataType>[_<Suffix>].csv``."""

    date: datetime.date
    broker_id: str
    data_type: str
    suffix: str | None = None

    @property
    def hash_type(self) -> str | None:
        """The ``hash_type`` of this list (docs/contracts.md §10.1); None for ``Removed``."""
        return DATA_TYPE_TO_HASH_TYPE.get(self.data_type)

    @property
    def name(self) -> str:
        suffix = f"_{self.suffix}" if self.suffix else ""
        return f"{self.date:%Y%m%d}_{self.broker_id}_{self.data_type}{suffix}.csv"

    def __str__(self) -> str:
        return self.name


class WorkItemRow(NamedTuple):
    """One row of a downloaded list CSV: a work item DROP expects a status for."""

    file_name: str
    data_type: str
    hash_type: str
    work_item_id: str
    hash: str
    line: int


class RemovedRow(NamedTuple):
    """One row of the Removed CSV: an identifier whose consumer cancelled; no status owed."""

    file_name: str
    work_item_id: str
    hash: str
    hash_type: str
    line: int


class UnreadableRow(NamedTuple):
    """A row of a DROP list that is not a work item we can answer: kept, never reported."""

    file_name: str
    line: int
    # As found, bytes that were not UTF-8 included (as surrogates), cut to a bound on memory;
    # ``download_zip.escaped`` makes them text to store and show.
    work_item_id: str  # the first field ("" when none)
    text: str  # the line
    reason: str


class SetAside(NamedTuple):
    """A member of the ZIP that was not read, and why."""

    name: str
    reason: str


class ZipMember(NamedTuple):
    """A CSV member of a download ZIP: its name, uncompressed size and data row count."""

    name: str
    size_bytes: int
    rows: int


class ResponseCsv(NamedTuple):
    """What ``write_response_csv`` wrote: the row count and the SHA-256 of the bytes."""

    row_count: int
    sha256: str


def shown(value: str, limit: int = 60) -> str:
    """A value quoted for an error message, cut short so a hostile row cannot flood a log."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def parse_file_name(name: str) -> DropFileName:
    """Split a DROP CSV file name into its parts, or raise ``DropFileError`` saying why not."""
    if not isinstance(name, str) or not name:
        raise DropFileError(None, None, "file name is empty")
    if "/" in name or "\\" in name or "\x00" in name:
        raise DropFileError(name, None, "file name must be a plain name, without folders")
    if not name.endswith(".csv"):
        raise DropFileError(name, None, f"not a CSV file name: expected {NAME_SHAPE}")
    match = _NAME_RE.fullmatch(name)
    if match is None:
        raise DropFileError(name, None, f"file name must look like {NAME_SHAPE}")
    raw_date = match[1]
    try:
        date = datetime.date(int(raw_date[:4]), int(raw_date[4:6]), int(raw_date[6:]))
    except ValueError:
        raise DropFileError(
            name, None, f"date {raw_date} in the file name is not a valid date"
        ) from None
    data_type = match[3]
    if data_type not in DATA_TYPES:
        raise DropFileError(
            name,
            None,
            f"unknown data type {shown(data_type)}: expected one of {', '.join(DATA_TYPES)}",
        )
    suffix = match[4]
    if suffix is not None and len(suffix) > 10:
        raise DropFileError(name, None, "suffix must be 1 to 10 letters or digits")
    return DropFileName(date=date, broker_id=match[2], data_type=data_type, suffix=suffix)


def response_file_name(download_file_name: str, suffix: str | None = None) -> str:
    """The response CSV's name for a downloaded list: same date, broker and type.

    ``suffix`` (1 to 10 letters or digits) tells apart several files answering one list.
    """
    parsed = parse_file_name(download_file_name)
    if parsed.data_type == REMOVED:
        raise DropFileError(download_file_name, None, "no status is owed for Removed identifiers")
    if suffix is not None and not _SUFFIX_RE.fullmatch(suffix):
        raise DropFileError(
            download_file_name,
            None,
            f"response file suffix must be 1 to 10 letters or digits, found {shown(suffix)}",
        )
    return DropFileName(parsed.date, parsed.broker_id, parsed.data_type, suffix or None).name


def write_response_csv(fileobj: BinaryIO, rows: Iterable[tuple[str, int]]) -> ResponseCsv:
    """Write ``Id,Status`` and one CRLF-ended row per work item to a binary file.

    Each row is checked before it is written (id shape, status 2 to 5, no id twice); on a
    bad row ``DropFileError`` names the line, and what was written so far is incomplete:
    write to a temporary file or buffer and keep it only when this returns.
    """
    label = getattr(fileobj, "name", None)
    label = os.path.basename(label) if isinstance(label, str) and label else None
    digest = hashlib.sha256(RESPONSE_HEADER)
    fileobj.write(RESPONSE_HEADER)
    seen = WorkItemIdSet()
    pending: list[bytes] = []
    count = 0
    for count, (work_item_id, status) in enumerate(rows, start=1):
        line = count + 1
        if not isinstance(work_item_id, str) or not WORK_ITEM_ID_RE.fullmatch(work_item_id):
            raise DropFileError(
                label,
                line,
                f"work item id must be 1 to {WORK_ITEM_ID_MAX} letters or digits, found "
                f"{shown(str(work_item_id))}",
            )
        if type(status) is not int or status not in STATUS_CODES:
            raise DropFileError(
                label, line, f"status must be {STATUS_CODES_TEXT}, found {shown(repr(status))}"
            )
        if not seen.add(work_item_id):
            raise DropFileError(
                label, line, f"work item id {work_item_id} has a status twice in this file"
            )
        pending.append(f"{work_item_id},{status}\r\n".encode("ascii"))
        if len(pending) >= 4096:
            chunk = b"".join(pending)
            digest.update(chunk)
            fileobj.write(chunk)
            pending.clear()
    if pending:
        chunk = b"".join(pending)
        digest.update(chunk)
        fileobj.write(chunk)
    return ResponseCsv(row_count=count, sha256=digest.hexdigest())
