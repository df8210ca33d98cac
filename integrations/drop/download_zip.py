"""Reading a DROP download: the ZIP and its list CSVs (their formats are in ``files``).

Reading streams the package, validating every name, header and row, so a caller can
feed the good rows straight into PostgreSQL ``COPY`` inside one transaction. One odd part
never costs the rest: a member that is not a DROP list is skipped, a DROP list that cannot
be read (a type this version does not know, a header that is not ``ID,Hash``) is set aside
whole, and a malformed row is set aside alone, each with its reason. Only a package that is
not a readable ZIP, holds no DROP list, or is another broker's raises ``DropFileError``::

    reader = iter_download_zip("20260312_4821_DROP.zip", broker_id="4821")
    with transaction.atomic(), cursor.copy("COPY ... FROM STDIN") as copy:
        for row in reader:                  # WorkItemRow or RemovedRow, the good ones
            copy.write_row(...)
    reader.files                            # [ZipMember(name, size_bytes, rows), ...] read
    reader.skipped, reader.unread           # [SetAside(name, reason), ...]
    reader.unread_rows                      # {name of a list set aside whole: its rows}
    reader.unreadable                       # [UnreadableRow(file, line, id, text, reason)]
    escaped(row.text, 255)                  # a row's text as it can be stored and shown

Pure Python, no Django: the formats are those of docs/contracts.md §10.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import zipfile
import zlib
from collections.abc import Generator, Iterator
from types import TracebackType
from typing import IO

from integrations.drop.files import (
    DATA_TYPE_TO_HASH_TYPE,
    DATA_TYPES,
    HASH_TYPE_TO_DATA_TYPE,
    LIST_DATA_TYPES,
    LIST_HEADER,
    NAME_SHAPE,
    REMOVED,
    REMOVED_HEADER,
    WORK_ITEM_ID_MAX,
    WORK_ITEM_ID_RE,
    DropFileError,
    RemovedRow,
    SetAside,
    UnreadableRow,
    WorkItemRow,
    ZipMember,
    parse_file_name,
    shown,
)
from integrations.drop.standardize import HASH_RE, hash_is_canonical, not_utf8
from integrations.drop.work_item_ids import WorkItemIdSet

__all__ = [
    "MAX_LINE_CHARS",
    "MAX_UNREADABLE_KEPT",
    "DownloadZipReader",
    "escaped",
    "iter_download_zip",
    "zip_summary",
]

_BROKER_ID_RE = re.compile(r"[0-9]{4}")
# A member named like a DROP list (any letters as its type, any case of ".csv"): such a
# member is DROP's, read or set aside with a reason; any other member is not a DROP list.
_DROP_NAMED_RE = re.compile(
    r"[0-9]{8}_(?P<broker>[0-9]{4})_(?P<type>[A-Za-z]+)(?:_[A-Za-z0-9]+)?\.(?i:csv)"
)

# The Removed file's ListType column: DROP's list names are what DROP documents; our own
# hash_type spelling is accepted too, both case-insensitively, since the column's exact
# spelling is not pinned down by DROP's documentation.
_LIST_TYPE_TO_HASH_TYPE: dict[str, str] = {
    **{name.lower(): hash_type for name, hash_type in DATA_TYPE_TO_HASH_TYPE.items()},
    **{hash_type: hash_type for hash_type in HASH_TYPE_TO_DATA_TYPE},
}

# The smallest possible list row is "<12>,<44>\n": used to pre-size the duplicate check.
_MIN_ROW_BYTES = 58


def _source_label(source: str | os.PathLike[str] | IO[bytes]) -> str:
    if isinstance(source, str | os.PathLike):
        return os.path.basename(os.fspath(source)) or "download ZIP"
    name = getattr(source, "name", None)
    return os.path.basename(name) if isinstance(name, str) and name else "download ZIP"


# What zipfile raises for a damaged archive, beyond BadZipFile: a version or method it does
# not know (NotImplementedError), an encrypted member (RuntimeError), a name flagged UTF-8
# that is not (UnicodeDecodeError, a ValueError), a wrong offset seeking before the start
# (ValueError in memory, OSError EINVAL on disk), a cut stream (EOFError, zlib.error).
_ZIP_READ_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    EOFError,
    NotImplementedError,
    RuntimeError,
    ValueError,
    OSError,
)
# A DROP line is under 100 characters; a longer one is set aside as soon as this much of it
# is read, so a small ZIP inflating to one huge line never costs its size in memory.
MAX_LINE_CHARS = 4096
# Unreadable rows kept one by one per list; past this they are only counted, so a list gone
# wholly wrong costs a bounded amount of memory and rows.
MAX_UNREADABLE_KEPT = 1000
# Of a row set aside, this much of its first field and of its line is held: a bound on
# memory, not a stored length (what is stored is escaped to its column's length, and
# escaping only lengthens a text).
_UNREADABLE_HELD_CHARS = 1024
# Of a value quoted in a reason: enough for ``shown`` to cut.
_SHOWN_CHARS = 200
_LINE_ENDS = ("\n", "\r")


def _not_a_zip(exc: Exception) -> str:
    return f"not a readable ZIP file (truncated or not a ZIP): {exc or type(exc).__name__}"


def _member_lines(text: IO[str]) -> Iterator[tuple[str, bool]]:
    """Each line of ``text`` without its ending, and whether it was longer than
    ``MAX_LINE_CHARS`` (then only its start is given; the rest is read past, never held)."""
    while line := text.readline(MAX_LINE_CHARS + 1):
        if len(line) > MAX_LINE_CHARS and not line.endswith(_LINE_ENDS):
            while (rest := text.readline(MAX_LINE_CHARS + 1)) and not rest.endswith(_LINE_ENDS):
                pass
            yield line, True
        else:
            yield line.rstrip("\r\n"), False


@contextlib.contextmanager
def _opened_lines(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo
) -> Iterator[Iterator[tuple[str, bool]]]:
    """A member's lines as ``_member_lines`` gives them, read as UTF-8 (a BOM dropped)."""
    with (
        archive.open(info) as raw,
        # Bytes that are not UTF-8 become surrogates: their row alone is unreadable.
        io.TextIOWrapper(raw, encoding="utf-8-sig", errors="surrogateescape", newline="") as text,
    ):
        yield _member_lines(text)


def _fields(line: str) -> list[str]:
    """A CSV line's fields: split on commas, or read as CSV when it quotes a field."""
    if '"' not in line:
        return line.split(",")
    return next(csv.reader((line,), strict=True), [])


def escaped(text: str, limit: int) -> str:
    """``text`` with bytes that were not UTF-8 and control characters escaped (``\\xff``,
    ``\\x00``, ``\\u2028``), so it can be stored and shown as found, in at most ``limit``
    characters. Escaped first, then cut, and only between two characters of ``text``: an
    escape is never cut in half, and a text of bad bytes never outgrows its column."""
    pieces = []
    size = 0
    for char in text:
        piece = _escaped_char(char)
        size += len(piece)
        if size > limit:
            break
        pieces.append(piece)
    return "".join(pieces)


def _escaped_char(char: str) -> str:
    if char.isprintable():
        return char
    if "\udc80" <= char <= "\udcff":  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{ord(char) - 0xDC00:02x}"
    if ord(char) < 0x100:
        return f"\\x{ord(char):02x}"
    return f"\\u{ord(char):04x}" if ord(char) < 0x10000 else f"\\U{ord(char):08x}"


class DownloadZipReader(Iterator["WorkItemRow | RemovedRow"]):
    """Iterator over the good rows of a download ZIP; see ``iter_download_zip``.

    After iteration: ``files`` lists every DROP list read, header-only ones included, so a
    caller knows which lists the package held even when they were empty; ``skipped`` the
    members that are not DROP lists; ``unread`` the DROP lists set aside whole, and
    ``unread_rows`` their data rows (the non-blank lines after the first; a list whose
    member cannot be read to its end, as an encrypted one, is not in it);
    ``unreadable`` the rows set aside (at most ``MAX_UNREADABLE_KEPT`` a list; all of them
    are counted in ``unreadable_counts``).
    """

    def __init__(self, source: str | os.PathLike[str] | IO[bytes], *, broker_id: str) -> None:
        if not isinstance(broker_id, str) or not _BROKER_ID_RE.fullmatch(broker_id):
            raise ValueError("broker_id must be the broker's 4-digit DROP id")
        self.broker_id = broker_id
        self.label = _source_label(source)
        self.files: list[ZipMember] = []
        self.skipped: list[SetAside] = []
        self.unread: list[SetAside] = []
        self.unread_rows: dict[str, int] = {}
        self._unread_members: list[tuple[zipfile.ZipInfo, str]] = []
        self.unreadable: list[UnreadableRow] = []
        self.unreadable_counts: dict[str, int] = {}
        self._source = source
        self._rows = self._generate()

    def __iter__(self) -> DownloadZipReader:
        return self

    def __next__(self) -> WorkItemRow | RemovedRow:
        return next(self._rows)

    def close(self) -> None:
        """Stop early and release the ZIP (iterating to the end or to an error does this)."""
        self._rows.close()

    def __enter__(self) -> DownloadZipReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def complete(self) -> bool:
        """Every DROP list and row of the package was read (skipped members aside)."""
        return not self.unread and not self.unreadable_counts

    def _open(self) -> zipfile.ZipFile:
        try:
            return zipfile.ZipFile(self._source)
        except _ZIP_READ_ERRORS as exc:
            raise DropFileError(self.label, None, _not_a_zip(exc)) from None

    def _sort_members(self, archive: zipfile.ZipFile) -> list[tuple[zipfile.ZipInfo, str, str]]:
        """Sort every member before any row is read (fail fast, before COPY starts): the
        lists to read as (member, name, data type); the rest go to ``skipped`` or
        ``unread``. Raises when the package is another broker's or holds no DROP list."""
        members: list[tuple[zipfile.ZipInfo, str, str]] = []
        seen_names: set[str] = set()
        removed_name: str | None = None
        drop_named = 0
        for info in archive.infolist():
            if info.is_dir():
                self.skipped.append(SetAside(info.filename, "a folder entry"))
                continue
            # A list inside a folder is still the list: read under its own name.
            name = info.filename.replace("\\", "/").rsplit("/", 1)[-1]
            named = _DROP_NAMED_RE.fullmatch(name)
            if named is None:
                self.skipped.append(
                    SetAside(info.filename, f"not a DROP list (not named {NAME_SHAPE})")
                )
                continue
            if named["broker"] != self.broker_id:
                raise DropFileError(
                    info.filename,
                    None,
                    f"broker id {named['broker']} in the file name is not this broker's "
                    f"({self.broker_id})",
                )
            drop_named += 1
            reason = self._unreadable_member(info, name, seen_names, removed_name)
            seen_names.add(name)
            if reason is not None:
                self.unread.append(SetAside(name, reason))
                self._unread_members.append((info, name))
                continue
            data_type = parse_file_name(name).data_type
            if data_type == REMOVED:
                removed_name = name
            members.append((info, name, data_type))
        if not drop_named:
            raise DropFileError(self.label, None, "the ZIP holds no DROP list")
        return members

    @staticmethod
    def _unreadable_member(
        info: zipfile.ZipInfo, name: str, seen_names: set[str], removed_name: str | None
    ) -> str | None:
        """Why a DROP-named member cannot be read at all, or None."""
        try:
            parsed = parse_file_name(name)
        except DropFileError as exc:
            data_type = name.split("_")[2].split(".")[0]
            if data_type not in DATA_TYPES:
                return (
                    f"list type {shown(data_type)} is not one this version reads: kept with "
                    "the package, no status is reported for it"
                )
            return exc.reason
        if name in seen_names:
            return "the ZIP holds two members with this name"
        if info.flag_bits & 0x1:
            return "ZIP member is encrypted"
        if parsed.data_type == REMOVED and removed_name is not None:
            return f"a ZIP holds at most one Removed file, and {removed_name} is another"
        return None

    def _generate(self) -> Generator[WorkItemRow | RemovedRow, None, None]:
        archive = self._open()
        try:
            members = self._sort_members(archive)
            list_bytes = sum(info.file_size for info, _, t in members if t != REMOVED)
            removed_bytes = sum(info.file_size for info, _, t in members if t == REMOVED)
            # Ids are unique across lists; Removed refers to earlier downloads' ids, so it
            # is checked for duplicates on its own.
            list_ids = WorkItemIdSet(expected=list_bytes // _MIN_ROW_BYTES)
            removed_ids = WorkItemIdSet(expected=removed_bytes // _MIN_ROW_BYTES)
            for info, name, data_type in members:
                seen = removed_ids if data_type == REMOVED else list_ids
                yield from self._read_member(archive, info, name, data_type, seen)
            # DROP sent these rows all the same: counted, for the yearly figures.
            for info, name in self._unread_members:
                self._unread_rows_add(name, _member_data_rows(archive, info))
        finally:
            archive.close()

    def _read_member(
        self,
        archive: zipfile.ZipFile,
        info: zipfile.ZipInfo,
        name: str,
        data_type: str,
        seen: WorkItemIdSet,
    ) -> Iterator[WorkItemRow | RemovedRow]:
        removed = data_type == REMOVED
        expected_header = REMOVED_HEADER if removed else LIST_HEADER
        list_hash_type = DATA_TYPE_TO_HASH_TYPE.get(data_type, "")
        rows = 0
        try:
            with _opened_lines(archive, info) as lines:
                header_problem = _header_problem(next(lines, None), expected_header)
                if header_problem is not None:
                    self.unread.append(SetAside(name, header_problem))
                    self._unread_rows_add(name, _data_rows(lines))
                    return
                for line, (content, too_long) in enumerate(lines, start=2):
                    if not too_long and not content.strip():
                        continue  # a blank line carries nothing to lose
                    problem, fields = _row_problem(content, too_long, expected_header)
                    hash_type = ""
                    if problem is None:
                        hash_type, problem = _row_values(fields, removed, seen)
                    if problem is not None:
                        self._set_aside_row(name, line, content, fields, problem)
                        continue
                    rows += 1
                    if removed:
                        yield RemovedRow(name, fields[0], fields[1], hash_type, line)
                    else:
                        yield WorkItemRow(
                            name, data_type, list_hash_type, fields[0], fields[1], line
                        )
        except _ZIP_READ_ERRORS as exc:
            # The ZIP itself is damaged: the whole package is refused, as a truncated one.
            raise DropFileError(
                name, None, f"ZIP member is corrupt or truncated: {exc or type(exc).__name__}"
            ) from None
        self.files.append(ZipMember(name=name, size_bytes=info.file_size, rows=rows))

    def _unread_rows_add(self, name: str, rows: int | None) -> None:
        if rows is not None:  # two members of one name: both count
            self.unread_rows[name] = self.unread_rows.get(name, 0) + rows

    def _set_aside_row(
        self, name: str, line: int, content: str, fields: list[str], reason: str
    ) -> None:
        count = self.unreadable_counts.get(name, 0) + 1
        self.unreadable_counts[name] = count
        if count > MAX_UNREADABLE_KEPT:
            return
        # Held as found, bad bytes and all: escaped when stored, to its column's length.
        first = fields[0][:_UNREADABLE_HELD_CHARS] if fields else ""
        text = content[:_UNREADABLE_HELD_CHARS]
        self.unreadable.append(UnreadableRow(name, line, first, text, reason))


def _data_rows(lines: Iterator[tuple[str, bool]]) -> int | None:
    """How many of the ``lines`` left carry something (blank ones do not), read one at a
    time; None when the member cannot be read to its end (counting never refuses a package)."""
    try:
        return sum(1 for content, too_long in lines if too_long or content.strip())
    except _ZIP_READ_ERRORS:
        return None


def _member_data_rows(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> int | None:
    """The data rows of a member set aside unread: its non-blank lines after the first."""
    try:
        with _opened_lines(archive, info) as lines:
            next(lines, None)
            return _data_rows(lines)
    except _ZIP_READ_ERRORS:  # an encrypted or damaged member: its rows are unknown
        return None


def _quoted(value: str) -> str:
    """A value for ``shown`` in a reason: escaped, as much as it shows."""
    return escaped(value, _SHOWN_CHARS)


def _header_problem(first: tuple[str, bool] | None, expected: list[str]) -> str | None:
    """Why a member's first line is not ``expected`` (any case), or None."""
    shape = ",".join(expected)
    if first is None:
        return f"file is empty: expected the header {shape}"
    content, too_long = first
    try:
        header = [] if too_long else _fields(content)
    except csv.Error:
        header = []
    if [field.lower() for field in header] != [field.lower() for field in expected]:
        return f"header must be {shape} (any case), found {shown(_quoted(content))}"
    return None


def _row_problem(content: str, too_long: bool, header: list[str]) -> tuple[str | None, list[str]]:
    """A data row's fields, with why they are not a row of ``header`` (None: they are)."""
    if too_long:
        return f"line longer than {MAX_LINE_CHARS} characters", []
    try:
        fields = _fields(content)
    except csv.Error as exc:
        return f"malformed CSV: {exc}", []
    if len(fields) != len(header):
        return (
            f"expected {len(header)} fields ({','.join(header)}), found {len(fields)}",
            fields,
        )
    return None, fields


def _row_values(fields: list[str], removed: bool, seen: WorkItemIdSet) -> tuple[str, str | None]:
    """Check a row's values and record its work item id in ``seen``: the hash type of a
    Removed row's list ("" in a list's file), and why the row is unreadable (None: it is
    not)."""
    work_item_id, hash_value = fields[0], fields[1]
    if not WORK_ITEM_ID_RE.fullmatch(work_item_id):
        if not_utf8(work_item_id):
            return "", "not valid UTF-8 text"
        return "", (
            f"work item id must be 1 to {WORK_ITEM_ID_MAX} letters or digits, found "
            f"{shown(_quoted(work_item_id))}"
        )
    if not HASH_RE.fullmatch(hash_value):
        if not_utf8(hash_value):
            return "", "not valid UTF-8 text"
        return "", (
            "hash must be 44 characters of standard Base64 ending in '=', "
            f"found {shown(_quoted(hash_value))}"
        )
    if not hash_is_canonical(hash_value):
        return "", (
            "hash is not canonical Base64: its last character sets bits beyond the 32 bytes "
            f"of a SHA-256, found {shown(_quoted(hash_value))}"
        )
    hash_type = ""
    if removed:
        found = _LIST_TYPE_TO_HASH_TYPE.get(fields[2].lower())
        if found is None:
            return "", (
                f"list type {shown(_quoted(fields[2]))} is not a DROP list: expected one "
                f"of {', '.join(LIST_DATA_TYPES)}"
            )
        hash_type = found
    if not seen.add(work_item_id):
        where = "this Removed file" if removed else "this ZIP"
        return "", f"work item id {work_item_id} appears twice in {where} (ids are unique)"
    return hash_type, None


def iter_download_zip(
    path_or_fileobj: str | os.PathLike[str] | IO[bytes], *, broker_id: str
) -> DownloadZipReader:
    """Stream and validate a downloaded DROP ZIP, yielding its good ``WorkItemRow`` /
    ``RemovedRow``; the reader then says what was skipped, set aside and unreadable.

    Nothing is read until the first ``next()``; member names are all sorted before the
    first row comes out; each member is decoded and parsed as it is read, never held whole.
    Raises ``DropFileError`` only for the whole package: not a readable ZIP (or a damaged
    member), no DROP list in it, or a list named for another broker.
    A file object must be seekable (``zipfile`` needs it).
    """
    return DownloadZipReader(path_or_fileobj, broker_id=broker_id)


def zip_summary(path_or_fileobj: str | os.PathLike[str] | IO[bytes]) -> list[ZipMember]:
    """Each member's name, size and data row count (lines after the header), unvalidated.

    Cheap: it streams each member once counting newlines, without parsing any row.
    """
    label = _source_label(path_or_fileobj)
    try:
        with zipfile.ZipFile(path_or_fileobj) as archive:
            summary = []
            for info in archive.infolist():
                if info.is_dir():
                    continue
                lines = 0
                last = b"\n"
                try:
                    with archive.open(info) as member:
                        while chunk := member.read(1 << 16):
                            lines += chunk.count(b"\n")
                            last = chunk[-1:]
                except _ZIP_READ_ERRORS as exc:
                    raise DropFileError(
                        info.filename,
                        None,
                        f"ZIP member is corrupt or truncated: {exc or type(exc).__name__}",
                    ) from None
                if last != b"\n":
                    lines += 1
                summary.append(ZipMember(info.filename, info.file_size, max(lines - 1, 0)))
            return summary
    except DropFileError:
        raise  # a damaged member, named above (it is a ValueError too)
    except _ZIP_READ_ERRORS as exc:
        raise DropFileError(label, None, _not_a_zip(exc)) from None
