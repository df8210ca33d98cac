"""Turn a broker's consumer records into hashed registration rows, or say why a row is bad.

Three sources, one result. Each record becomes a `ConsumerRecord` (the broker's pointer and
the SHA-256 digests of its identifiers, 32 raw bytes each) or a `RejectedRecord` (its line or
index, and the reason per field; never the clear value)::

    reader = ConsumerCsvReader(text_stream)            # checks the header at once
    reader = ConsumerCsvReader(text_stream, hashed=True)
    for record in reader:         # or api_reader.parse_api_consumers(body["consumers"])
        ...

- A clear CSV (docs/contracts.md §8): `remote_identifier` first, then any of
  `remote_identifier_kind, email, phone, first_name, last_name, dob, zip, vin, maid, ctvid`.
  One row may carry several list types: names with `dob` and `zip` give an NDZ hash, names
  with `vin` a NameVIN hash. Empty cells are skipped: names whose `dob`, `zip` and `vin` are
  empty give no hash (the row may have others), while a composite partly given (`dob`
  without `zip`, a `vin` without names) is a bad identifier. Columns of no complete
  composite (names alone, `dob` or `zip` alone) are ignored and named in the reader's
  `unused_columns`.
- A hashed CSV: `remote_identifier, hash_type, hash` (and optionally
  `remote_identifier_kind`), the hash in 44-character standard Base64.
- API objects (`POST /api/v1/drop/consumers`): `email`, `phone`, `maid`, `ctvid` arrays,
  `ndz` and `name_vin` arrays of objects, `hashes` as `{list type: [Base64, ...]}`.

A row is accepted whole or rejected whole: one bad identifier rejects its row, so the broker
fixes and re-sends it (registration is idempotent). A row that repeats the header's names
(two files joined) is rejected as such. A file whose header is wrong raises
`RegistrationFileError` before any row is read; one that stops being CSV part way (a line
too long, a field over the CSV module's limit, a stray quote) raises it at that line.
Clear identifiers live only in memory here; standardization and hashing are
`integrations.drop.standardize`'s.

API bodies are read by `integrations.consumers.api_reader` under the same rules; files
are hashed on every core and encoded as staging rows by
`integrations.consumers.workers`. Pure Python, no Django, so the command, the API
and the benchmark share it.
"""

from __future__ import annotations

import binascii
import csv
import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TextIO

from integrations.drop.standardize import (
    LIST_TYPES,
    InvalidIdentifier,
    is_valid_hash,
    name_standardizer,
    name_vin_hash,
    ndz_hash,
    not_utf8,
    standardize_ctvid,
    standardize_email,
    standardize_maid,
    standardize_name,
    standardize_phone,
)
from integrations.list_types import DATA_TYPE_OF

__all__ = [
    "CLEAR_COLUMNS",
    "CSV_LINE_MAX",
    "DEFAULT_KIND",
    "HASHED_COLUMNS",
    "ConsumerCsvReader",
    "ConsumerRecord",
    "ConsumerTableReader",
    "Record",
    "RegistrationFileError",
    "RejectedRecord",
]

DEFAULT_KIND: Final = "external_id"
# The longest physical line a CSV file may have, in characters (its line end included). A
# consumer row is a few hundred characters; without a cap, a file with no line ends (a
# binary file, a wrong export) would be read whole into memory as its first line.
CSV_LINE_MAX: Final = 1 << 20
REMOTE_IDENTIFIER_MAX: Final = 255  # Consumer.remote_identifier's length
KIND_RE: Final = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")
# An unknown column of a header (a first line with remote_identifier; one without is not
# shown at all) is named only when it looks like a column name, a typo such as "emial".
_SHOWN_COLUMN_RE: Final = re.compile(r"[A-Za-z0-9_]{1,32}\Z")
CLEAR_COLUMNS: Final = (
    "remote_identifier",
    "remote_identifier_kind",
    "email",
    "phone",
    "first_name",
    "last_name",
    "dob",
    "zip",
    "vin",
    "maid",
    "ctvid",
)
HASHED_COLUMNS: Final = ("remote_identifier", "hash_type", "hash", "remote_identifier_kind")
NO_IDENTIFIER: Final = (
    "no identifier: give at least one of email, phone, ndz, name_vin, maid, ctvid or hashes"
)
# Two files joined (`cat a.csv b.csv`): the second one's header is read as a row.
HEADER_AGAIN: Final = "a header row again: two files joined?"
# A row with names but neither dob and zip nor vin, and no other identifier.
NAMES_ALONE: Final = (
    "no identifier: first_name and last_name need dob and zip (NDZ) or vin (NameVIN)"
)
NOT_UTF8: Final = "is not valid UTF-8"
HASH_FORMAT: Final = "must be a SHA-256 hash in standard Base64 (44 characters, ending in '=')"
NDZ_PARTS: Final = ("first_name", "last_name", "dob", "zip")
NAME_VIN_PARTS: Final = ("first_name", "last_name", "vin")
_NAME_PARTS: Final = ("first_name", "last_name")
# The lists a row builds from several columns, by list type (DATA_TYPE_OF names them).
COMPOSITES: Final = (("ndz", NDZ_PARTS), ("name_vin", NAME_VIN_PARTS))
_COMPOSITE_COLUMNS: Final = frozenset(NDZ_PARTS + NAME_VIN_PARTS)
_sha256 = hashlib.sha256
_a2b = binascii.a2b_base64


class RegistrationFileError(ValueError):
    """The file as a whole cannot be read (its header, or a line that is not CSV); nothing of
    it may be written."""


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    """One accepted record: the broker's pointer and the digests of its identifiers.

    `position` is the CSV line (1 is the header) or the index in the API call.
    `remote_identifier_kind` is None when the record does not name one: a new consumer then
    gets `external_id`, an existing one keeps its kind.
    """

    position: int
    remote_identifier: str
    remote_identifier_kind: str | None
    hashes: tuple[tuple[str, bytes], ...]  # (list type, 32-byte SHA-256 digest)


@dataclass(frozen=True, slots=True)
class RejectedRecord:
    """A record that is not registered: where it is and, per field, what is wrong with it."""

    position: int
    remote_identifier: str | None
    errors: dict[str, list[str]] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        """The errors in one line, for a command's report."""
        return "; ".join(f"{key}: {' '.join(messages)}" for key, messages in self.errors.items())


Record = ConsumerRecord | RejectedRecord


# ---------------------------------------------------------------------------------------
# Digests: standardize.py's rules, ending in the raw digest instead of its Base64 text
# ---------------------------------------------------------------------------------------


def _email_digest(value: str) -> bytes:
    return _sha256(standardize_email(value).encode()).digest()


def _phone_digest(value: str) -> bytes:
    return _sha256(standardize_phone(value).encode()).digest()  # digits only: ASCII


def _maid_digest(value: str) -> bytes:
    return _sha256(standardize_maid(value).encode()).digest()


def _ctvid_digest(value: str) -> bytes:
    return _sha256(standardize_ctvid(value).encode()).digest()


SIMPLE_DIGESTS: Final[dict[str, Callable[[str], bytes]]] = {
    "email": _email_digest,
    "phone": _phone_digest,
    "maid": _maid_digest,
    "ctvid": _ctvid_digest,
}


def composite_digest(
    list_type: str, parts: Mapping[str, str], names: Callable[[str, str], str] = standardize_name
) -> bytes:
    if list_type == "ndz":
        text = ndz_hash(
            parts["first_name"], parts["last_name"], parts["dob"], parts["zip"], names=names
        )
    else:
        text = name_vin_hash(parts["first_name"], parts["last_name"], parts["vin"], names=names)
    return _a2b(text)


def hash_digest(text: str) -> bytes | None:
    """The 32 bytes of a DROP hash in canonical Base64, or None if it is not one."""
    # Non-canonical Base64 (stray bits in the last character) decodes too, but is not
    # what DROP sends or what a dispatch would echo back.
    if not is_valid_hash(text):
        return None
    return _a2b(text)


def _text_problem(value: str) -> str | None:
    """Why a pointer or kind cannot be stored as text, or None."""
    if not_utf8(value):
        return NOT_UTF8
    return "must not contain NUL characters" if "\x00" in value else None


def remote_identifier_problem(value: str) -> str | None:
    """The pointer is the broker's data, kept verbatim (spaces included): dispatches echo it
    exactly as it arrived. Only an empty or blank one is refused."""
    if not value.strip():
        return "is required" if not value else "must not be blank"
    if len(value) > REMOTE_IDENTIFIER_MAX:
        return f"must be at most {REMOTE_IDENTIFIER_MAX} characters"
    return _text_problem(value)


def kind_problem(value: str) -> str | None:
    if KIND_RE.match(value):
        return None
    return "must be 1 to 64 letters, digits or _ . : - (for example external_id)"


def _column_name(cell: str) -> str:
    return cell.strip().lstrip("\ufeff").lower()


def _and(words: Sequence[str]) -> str:
    """``a, b and c``."""
    return " and ".join(filter(None, (", ".join(words[:-1]), words[-1])))


def add_error(errors: dict[str, list[str]], key: str, message: str) -> None:
    errors.setdefault(key, []).append(message)


# ---------------------------------------------------------------------------------------
# CSV files
# ---------------------------------------------------------------------------------------


def _bounded_lines(text: TextIO) -> Iterator[str]:
    """``text``'s physical lines; one longer than ``CSV_LINE_MAX`` raises
    ``RegistrationFileError`` naming it, before more of it is read."""
    readline = text.readline
    number = 0
    while line := readline(CSV_LINE_MAX + 1):
        number += 1
        if len(line) > CSV_LINE_MAX:
            raise RegistrationFileError(
                f"line {number} is longer than {CSV_LINE_MAX:,} characters, the most a line "
                "may have (is this a CSV file?)"
            )
        yield line


class ConsumerCsvReader:
    """Reads a consumer CSV; the header is checked when the reader is made.

    `text` is a text stream opened with ``newline=""`` (UTF-8; ``errors="surrogateescape"``
    lets a row with bytes that are not UTF-8 be rejected alone instead of the whole file).
    Iterating yields one `ConsumerRecord` or `RejectedRecord` per data row, in file order,
    holding one row at a time. Blank lines are skipped. A physical line longer than
    ``CSV_LINE_MAX``, or a row the CSV module cannot parse (a field over its limit, a stray
    or unclosed quote), refuses the file (``RegistrationFileError``).
    """

    def __init__(self, text: TextIO, *, hashed: bool = False) -> None:
        self.hashed = hashed
        self._reader = csv.reader(_bounded_lines(text), strict=True)
        try:
            header = next(self._reader, None)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise RegistrationFileError(f"cannot read the header: {exc}") from None
        self._set_columns(header)

    def _set_columns(self, header: Sequence[str] | None) -> None:
        if not header or not any(cell.strip() for cell in header):
            raise RegistrationFileError("the file is empty: no header line")
        if any(not_utf8(cell) or "\x00" in cell for cell in header):
            raise RegistrationFileError(
                "the header is not UTF-8 text (a UTF-16 file? save it as UTF-8)"
            )
        self.columns = [_column_name(cell) for cell in header]
        if "remote_identifier" not in self.columns:
            # No header line, most likely: the cells are a consumer's (a phone, an email,
            # a name), so none is echoed, however much it looks like a column name.
            expected = "remote_identifier, hash_type, hash" if self.hashed else "remote_identifier"
            raise RegistrationFileError(
                "the first line is not a header: it has no remote_identifier column (its "
                f"cells are not shown; is the header line missing?); expected {expected} first"
            )
        # Columns of the header that can give no hash (names without dob and zip, or vin),
        # in one line for the command's summary; "" when every column is used.
        self.unused_columns = ""
        if self.hashed:
            self._check_hashed_header()
        else:
            self._check_clear_header()
        self._index = {name: i for i, name in enumerate(self.columns)}

    # -- header ---------------------------------------------------------------------------

    def _check_common(self, allowed: Sequence[str]) -> None:
        for i, name in enumerate(self.columns):
            if name not in allowed:
                if not _SHOWN_COLUMN_RE.match(name):
                    raise RegistrationFileError(
                        f"unknown column name in column {i + 1} (not shown: it looks like "
                        "data, not a column name); expected " + ", ".join(allowed)
                    )
                hint = " (a hashed file? use --hashed)" if name in ("hash", "hash_type") else ""
                raise RegistrationFileError(
                    f"unknown column {name!r} in column {i + 1}{hint}; "
                    f"expected {', '.join(allowed)}"
                )
            if name in self.columns[:i]:
                raise RegistrationFileError(f"column {name!r} appears twice")

    def _check_clear_header(self) -> None:
        self._check_common(CLEAR_COLUMNS)
        if self.columns[0] != "remote_identifier":
            raise RegistrationFileError(
                f"the first column must be remote_identifier, not {self.columns[0]!r}"
            )
        present = set(self.columns)
        if not present - {"remote_identifier", "remote_identifier_kind"}:
            raise RegistrationFileError(
                "no identifier column: add at least one of "
                + ", ".join(CLEAR_COLUMNS[2:])
                + (" (a hashed file? use --hashed)" if "hash" in present else "")
            )
        # Any subset is allowed, but a composite's columns give a hash only when all its
        # parts are there; the others are ignored, and the command says so.
        used = {part for _, parts in COMPOSITES if set(parts) <= present for part in parts}
        unused = [c for c in self.columns if c in _COMPOSITE_COLUMNS and c not in used]
        if unused:
            why = ", ".join(
                f"no {DATA_TYPE_OF[list_type]} without "
                f"{_and([p for p in parts if p not in present])}"
                for list_type, parts in COMPOSITES
                if set(unused) & set(parts)
            )
            self.unused_columns = f"{', '.join(unused)} not used: {why}"
        if not present - {"remote_identifier", "remote_identifier_kind", *unused}:
            # Every row would be rejected: refused whole, like a header with no identifier.
            raise RegistrationFileError(
                f"no identifier column that gives a hash: {self.unused_columns}"
            )

    def _check_hashed_header(self) -> None:
        self._check_common(HASHED_COLUMNS)
        missing = [c for c in HASHED_COLUMNS[:3] if c not in self.columns]
        if missing:
            raise RegistrationFileError(
                f"a hashed file needs the columns remote_identifier, hash_type, hash; "
                f"missing {', '.join(missing)}"
            )

    # -- rows -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Record]:
        parse = self.row_parser()
        for row in self.rows():
            yield row if isinstance(row, RejectedRecord) else parse(*row)

    def row_parser(self) -> Callable[[int, list[str]], Record]:
        """The function that turns one row's cells into its record (hashing included)."""
        return self._hashed_row if self.hashed else self._clear_row_parser()

    def rows(self) -> Iterator[tuple[int, list[str]] | RejectedRecord]:
        """Each data row as (line, cells) with the header's width, or why it is not one."""
        width = len(self.columns)
        pointer = self._index["remote_identifier"]  # first in a clear file, anywhere if hashed
        reader = self._reader
        line = reader.line_num  # the header's last physical line
        while True:
            start = line + 1
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                # Where the reader stopped (inside a quoted field, perhaps) is not where the
                # next row starts: reading on would make rows of a field's inner lines.
                raise RegistrationFileError(f"line {start} is not valid CSV: {exc}") from None
            line = reader.line_num
            if len(cells) != width:
                if not cells or (len(cells) == 1 and not cells[0].strip()):
                    continue  # a blank line
                fields = f"{len(cells)} field{'' if len(cells) == 1 else 's'}"
                message = f"has {fields}; the header has {width}"
                rid = cells[pointer].strip() if pointer < len(cells) else ""
                yield RejectedRecord(start, rid or None, {"row": [message]})
                continue
            yield start, cells

    def _kind(self, cells: list[str], errors: dict[str, list[str]]) -> str | None:
        position = self._index.get("remote_identifier_kind")
        if position is None:
            return None
        kind = cells[position].strip()
        if not kind:
            return None
        problem = kind_problem(kind)
        if problem:
            add_error(errors, "remote_identifier_kind", f"remote_identifier_kind {problem}")
        return kind

    def _pointer(self, cells: list[str], errors: dict[str, list[str]]) -> str:
        rid = cells[self._index["remote_identifier"]]
        problem = remote_identifier_problem(rid)
        if problem:
            add_error(errors, "remote_identifier", f"remote_identifier {problem}")
        return rid

    def _header_again(self, cells: list[str]) -> bool:
        """The row is the header's names again (a BOM before them included)."""
        pointer = cells[self._index["remote_identifier"]]
        if _column_name(pointer) != "remote_identifier":  # the usual case, decided at once
            return False
        return [_column_name(cell) for cell in cells] == self.columns

    def _clear_row_parser(self) -> Callable[[int, list[str]], Record]:
        simple = [
            (name, self._index[name], digest)
            for name, digest in SIMPLE_DIGESTS.items()
            if name in self._index
        ]
        composites = [
            (list_type, [(part, self._index[part]) for part in parts])
            for list_type, parts in COMPOSITES
            if all(part in self._index for part in parts)
        ]
        # A column of no complete composite is ignored (the header check named it).
        used = {name for name, _, _ in simple} | {p for _, parts in composites for p, _ in parts}
        name_positions = sorted({i for _, parts in composites for _, i in parts})
        name_only = sorted({i for _, parts in composites for p, i in parts if p in _NAME_PARTS})
        identifiers = [(name, self._index[name]) for name in CLEAR_COLUMNS[2:] if name in used]
        # The file's names, cached while its rows are parsed, and dropped with the parser.
        names = name_standardizer()

        def parse(line: int, cells: list[str]) -> Record:
            if self._header_again(cells):
                return RejectedRecord(line, None, {"row": [HEADER_AGAIN]})
            errors: dict[str, list[str]] = {}
            rid = self._pointer(cells, errors)
            kind = self._kind(cells, errors)
            undecodable = [name for name, i in identifiers if not_utf8(cells[i])]
            if undecodable:
                for name in undecodable:
                    add_error(errors, name, f"{name} {NOT_UTF8}")
                return RejectedRecord(line, rid or None, errors)
            hashes: list[tuple[str, bytes]] = []
            for list_type, position, digest in simple:
                value = cells[position]
                if value and not value.isspace():
                    try:
                        hashes.append((list_type, digest(value)))
                    except InvalidIdentifier as exc:
                        add_error(errors, exc.field, exc.reason)
            if name_positions and any(cells[i].strip() for i in name_positions):
                self._composites(cells, composites, hashes, errors, names)
            if errors:
                return RejectedRecord(line, rid or None, errors)
            if not hashes:
                alone = any(cells[i].strip() for i in name_only)
                return RejectedRecord(line, rid, {"row": [NAMES_ALONE if alone else NO_IDENTIFIER]})
            return ConsumerRecord(line, rid, kind, tuple(hashes))

        return parse

    @staticmethod
    def _composites(
        cells: list[str],
        composites: list[tuple[str, list[tuple[str, int]]]],
        hashes: list[tuple[str, bytes]],
        errors: dict[str, list[str]],
        names: Callable[[str, str], str],
    ) -> None:
        """NDZ and NameVIN from one row: each is built when any of its own parts is given.
        One whose own parts (dob and zip, or vin) are all empty is absent, not an error:
        the row may register by its other identifiers."""
        for list_type, parts in composites:
            given = [part for part, i in parts if cells[i].strip()]
            if not set(given) - set(_NAME_PARTS):
                continue
            missing = [part for part, _ in parts if part not in given]
            if missing:
                add_error(
                    errors, list_type, f"{list_type} needs {' and '.join(missing)} in the row"
                )
                continue
            try:
                hashes.append(
                    (list_type, composite_digest(list_type, {p: cells[i] for p, i in parts}, names))
                )
            except InvalidIdentifier as exc:
                add_error(errors, exc.field, exc.reason)

    def _hashed_row(self, line: int, cells: list[str]) -> Record:
        if self._header_again(cells):
            return RejectedRecord(line, None, {"row": [HEADER_AGAIN]})
        errors: dict[str, list[str]] = {}
        rid = self._pointer(cells, errors)
        kind = self._kind(cells, errors)
        list_type = cells[self._index["hash_type"]].strip()
        if list_type not in LIST_TYPES:
            add_error(errors, "hash_type", f"hash_type must be one of {', '.join(LIST_TYPES)}")
        digest = hash_digest(cells[self._index["hash"]].strip())
        if digest is None:
            add_error(errors, "hash", f"hash {HASH_FORMAT}")
        if errors or digest is None:
            return RejectedRecord(line, rid or None, errors)
        return ConsumerRecord(line, rid, kind, ((list_type, digest),))


class ConsumerTableReader(ConsumerCsvReader):
    """Rows that arrive as cells already (a Parquet file's record batches), under the same
    header and row rules as a CSV file. A record's position is its row number, from 1."""

    def __init__(
        self, columns: Sequence[str], rows: Iterable[Sequence[str]], *, hashed: bool = False
    ) -> None:
        self.hashed = hashed
        self._rows = rows
        self._set_columns(columns)

    def rows(self) -> Iterator[tuple[int, list[str]] | RejectedRecord]:
        for number, cells in enumerate(self._rows, start=1):
            yield number, list(cells)
