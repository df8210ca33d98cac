"""Building the response files DROP gets back: their names, bytes and digest, and deadlines.

The reporting service picks the rows; this module only names and builds files, with no
database, so every rule here is a plain function::

    name = response_name("20260312_4821_Email.csv", kind="upload", taken=existing_names)
    built = build_response_file(name, rows)        # rows: (work_item_id, status) pairs
    built.content, built.rows, built.sha256

Naming (docs/contracts.md §10.3): the first upload for a list reuses the
downloaded file's name; a later upload for the same list in the same cycle (the list is
answered in parts) gets ``_part02``, ``_part03``...; amendments get ``_amend01``,
``_amend02``... DROP rejects a name already used for the current download, so a name is
never reused.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from integrations.drop.files import (
    RESPONSE_HEADER,
    DropFileError,
    parse_file_name,
    response_file_name,
    write_response_csv,
)
from integrations.drop_statuses import STATUS_CODES

__all__ = [
    "AMEND_SUFFIX",
    "PART_SUFFIX",
    "BuiltResponseFile",
    "build_response_file",
    "response_name",
    "response_rows",
    "response_status_counts",
    "responses_from_rows",
    "save_response_file",
]

PART_SUFFIX = "part"
AMEND_SUFFIX = "amend"
# A suffix is at most 10 letters or digits: "amend" + up to 5 digits, "part" + up to 6.
_MAX_NUMBER = {PART_SUFFIX: 999_999, AMEND_SUFFIX: 99_999}


@dataclass(frozen=True)
class BuiltResponseFile:
    name: str
    content: bytes
    rows: int
    sha256: str


def response_name(download_file_name: str, *, kind: str, taken: Collection[str]) -> str:
    """The first free response file name for a downloaded list.

    ``kind`` is ``upload`` or ``amend``; ``taken`` holds every response file name the broker
    already used (whatever DROP answered: a rejected name may still count as used).
    """
    if kind == "upload":
        bare = response_file_name(download_file_name)
        if bare not in taken:
            return bare
        prefix, first = PART_SUFFIX, 2
    elif kind == "amend":
        prefix, first = AMEND_SUFFIX, 1
    else:
        raise ValueError(f"unknown response file kind {kind!r}: expected upload or amend")
    for number in range(first, _MAX_NUMBER[prefix] + 1):
        name = response_file_name(download_file_name, suffix=f"{prefix}{number:02d}")
        if name not in taken:
            return name
    raise ValueError(f"no free {kind} file name left for {download_file_name}")


def build_response_file(name: str, rows: Iterable[tuple[str, int]]) -> BuiltResponseFile:
    """``Id,Status`` CSV bytes for ``rows``, checked row by row (``DropFileError`` names the
    line of a bad one), with their count and SHA-256."""
    parse_file_name(name)  # a bad name fails here, before any row is read
    buffer = io.BytesIO()
    buffer.name = name  # write_response_csv names the file in its errors
    written = write_response_csv(buffer, rows)
    return BuiltResponseFile(
        name=name, content=buffer.getvalue(), rows=written.row_count, sha256=written.sha256
    )


# A response file's rows: an id and one of DROP's codes (each a single digit).
_ROWS_RE = re.compile(
    rb"(?:[A-Za-z0-9]{1,64},[" + "".join(map(str, STATUS_CODES)).encode() + rb"]\r\n)*"
)


def responses_from_rows(data: bytes, names: dict[int, str]) -> dict[int, BuiltResponseFile]:
    """Response files from CSV lines ``<file key>,<work item id>,<status>\n`` sorted by key.

    The bulk path: PostgreSQL writes these lines (``COPY ... WITH (FORMAT csv)``) and this
    cuts them into one file per key with bytes operations only, giving exactly what
    ``build_response_file`` gives for the same rows (``Id,Status`` header, CRLF). Every
    file is checked whole against the row shape; ``DropFileError`` if one is off. Keys
    with no rows get no file.
    """
    files: dict[int, BuiltResponseFile] = {}
    keys = sorted(names)
    position = 0
    for index, key in enumerate(keys):
        prefix = b"%d," % key
        if not data.startswith(prefix, position):
            continue
        end = len(data)
        for later in keys[index + 1 :]:
            found = data.find(b"\n%d," % later, position)
            if found != -1:
                end = found + 1
                break
        body = (b"\n" + data[position:end]).replace(b"\n" + prefix, b"\n")[1:]
        body = body.replace(b"\n", b"\r\n")
        if not _ROWS_RE.fullmatch(body):
            raise DropFileError(names[key], None, "a row is not a work item id and a status")
        content = RESPONSE_HEADER + body
        files[key] = BuiltResponseFile(
            name=names[key],
            content=content,
            rows=body.count(b"\n"),
            sha256=hashlib.sha256(content).hexdigest(),
        )
        position = end
    if position != len(data):
        raise DropFileError(None, None, "rows for a file that was not asked for")
    return files


def response_rows(content: bytes) -> list[tuple[str, int]]:
    """The ``(work item id, status)`` rows of a response file built here (``Id,Status``, CRLF);
    ``DropFileError`` if the bytes are not one."""
    if not content.startswith(RESPONSE_HEADER):
        raise DropFileError(None, 1, "not a response file: the header is not Id,Status")
    rows = []
    for number, line in enumerate(content[len(RESPONSE_HEADER) :].split(b"\r\n"), start=2):
        if not line:
            continue
        work_item_id, _, status = line.partition(b",")
        if not work_item_id.isalnum() or status not in (b"2", b"3", b"4", b"5"):
            raise DropFileError(None, number, "a row is not a work item id and a status")
        rows.append((work_item_id.decode("ascii"), int(status)))
    return rows


def response_status_counts(content: bytes) -> dict[int, int]:
    """How many rows of a response file built here carry each status code (every code, 0
    when none): what an approver reviews. A row is ``<alphanumeric id>,<code>`` CRLF, so
    the only comma of a line ends its id and counting ``,<code>`` CRLF counts the rows."""
    return {code: content.count(b",%d\r\n" % code) for code in STATUS_CODES}


def save_response_file(directory: str | os.PathLike[str], name: str, content: bytes) -> Path:
    """Write ``content`` to ``directory/name`` whole or not at all (temp file, fsync, rename)."""
    parse_file_name(name)  # a plain, well-formed name: never a path
    target_dir = Path(directory)
    target_dir.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(prefix=f".{name}.", dir=target_dir)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        target = target_dir / name
        os.replace(temp_name, target)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    return target
