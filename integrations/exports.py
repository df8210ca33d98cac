"""Streaming exports (CSV and JSONL) shared by the ledger and outcome-history exports.

Rows are written as they are read, so memory stays flat whatever the size::

    write_rows(stream, fmt="csv", columns=COLUMNS, rows=selector_iterator)

CSV cells that a spreadsheet would run as a formula are defused (OWASP's rule: a leading
``=``, ``+``, ``-``, ``@``, tab or carriage return gets a leading apostrophe); ``csv_cell_sql``
is the same rule for CSV that PostgreSQL writes with ``COPY``.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

FORMATS = ("csv", "jsonl")
_FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")


class _Echo:
    """A file-like sink for ``csv.writer`` that hands each line back instead of storing it."""

    def write(self, value: str) -> str:
        return value


def csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dict | list):
        value = json.dumps(value, sort_keys=True, ensure_ascii=False)
    text = str(value)
    if text.startswith(_FORMULA_TRIGGERS) and not _is_number(text):
        return "'" + text
    return text


# The same rule in SQL, for CSV that PostgreSQL writes itself (``COPY ... WITH (FORMAT csv)``,
# far faster than Python for millions of rows). Its number test is a plain decimal or
# exponent form, so the few spellings float() also takes ("-inf", "+1_000", " -1") are
# defused here and not there: never laxer than csv_cell.
_SQL_TRIGGERS = r"'=', '+', '-', '@', E'\t', E'\r'"
_SQL_NUMBER = r"^[-+]?([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][-+]?[0-9]+)?$"


def csv_cell_sql(column: str) -> str:
    """SQL defusing the text expression ``column`` as ``csv_cell`` does (NULL stays NULL)."""
    return (
        f"CASE WHEN left({column}, 1) IN ({_SQL_TRIGGERS}) AND {column} !~ '{_SQL_NUMBER}'"
        f" THEN '''' || {column} ELSE {column} END"
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    return value


def iter_lines(fmt: str, columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    """Yield the export line by line (header first for CSV)."""
    if fmt == "csv":
        writer = csv.writer(_Echo())
        yield writer.writerow(columns)
        for row in rows:
            yield writer.writerow([csv_cell(row.get(column)) for column in columns])
    elif fmt == "jsonl":
        for row in rows:
            yield (
                json.dumps(
                    {column: _json_value(row.get(column)) for column in columns},
                    ensure_ascii=False,
                )
                + "\n"
            )
    else:
        raise ValueError(f"unknown export format {fmt!r}; choose csv or jsonl")


def write_rows(
    stream: TextIO, *, fmt: str, columns: Sequence[str], rows: Iterable[dict[str, Any]]
) -> int:
    """Write the export to ``stream``; return the number of data rows."""
    count = -1 if fmt == "csv" else 0
    for line in iter_lines(fmt, columns, rows):
        stream.write(line)
        count += 1
    return max(count, 0)
