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


# Rows per Parquet row group: the rows of one group are held in memory while it is encoded,
# so a list of any length is written at flat memory (docs/benchmarks.md, suppression export).
PARQUET_ROW_GROUP_BYTES = 8 << 20


def csv_to_parquet(chunks: Iterable[bytes], sink: Any, *, columns: Sequence[str]) -> int:
    """Write headerless UTF-8 CSV ``chunks`` (plain cells: no quotes, no line break in a
    cell, as PostgreSQL writes hashes) to ``sink`` as Parquet, every column a string, one
    row group per ``PARQUET_ROW_GROUP_BYTES`` of CSV; return the number of rows."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    schema = pa.schema([(column, pa.string()) for column in columns])
    read_options = pa_csv.ReadOptions(column_names=list(columns))
    convert_options = pa_csv.ConvertOptions(
        column_types=dict.fromkeys(columns, pa.string()), strings_can_be_null=False
    )
    rows = 0
    # A dictionary only for the first column (a list type): the hashes are all different,
    # and a dictionary of them would be built, then dropped, for every row group.
    with pq.ParquetWriter(sink, schema, use_dictionary=[columns[0]]) as writer:

        def flush(data: bytes) -> int:
            table = pa_csv.read_csv(
                pa.py_buffer(data), read_options=read_options, convert_options=convert_options
            )
            writer.write_table(table, row_group_size=max(table.num_rows, 1))
            return int(table.num_rows)

        pending = bytearray()
        for chunk in chunks:
            pending += chunk
            while len(pending) >= PARQUET_ROW_GROUP_BYTES:
                # Whole lines only, up to the group's size (a longer line alone); the rest
                # waits for the next chunk.
                cut = pending.rfind(b"\n", 0, PARQUET_ROW_GROUP_BYTES) + 1
                cut = cut or pending.find(b"\n", PARQUET_ROW_GROUP_BYTES) + 1
                if not cut:
                    break
                rows += flush(bytes(pending[:cut]))
                del pending[:cut]
        if pending.strip():
            rows += flush(bytes(pending))
    return rows


def rechunk(blocks: Iterable[Any], size: int = 1 << 16) -> Iterator[bytes]:
    """``blocks`` (a ``COPY ... TO STDOUT``'s, which come a row or so at a time) joined into
    chunks of about ``size`` bytes: what a streamed response or a file is written in."""
    chunk = bytearray()
    for block in blocks:
        chunk += block
        if len(chunk) >= size:
            yield bytes(chunk)
            chunk.clear()
    if chunk:
        yield bytes(chunk)
