"""``exports.csv_cell_sql`` defuses formulas in PostgreSQL-written CSV as ``csv_cell`` does."""

from __future__ import annotations

import pytest
from django.db import connection

from integrations.exports import csv_cell, csv_cell_sql

pytestmark = pytest.mark.django_db

AGREED = [
    '=HYPERLINK("http://evil.example")',
    "+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(A1)",
    "\tleading tab",
    "\rleading return",
    "-12",
    "+1.5",
    "-.5e3",
    "12=3",
    "plain text",
    "/abc+def=",
    "",
    "'already quoted",
    "Üñíçødé =x",
]
# float() also reads these as numbers; the SQL rule defuses them anyway (stricter, never laxer).
SQL_STRICTER = ["-inf", "+nan", "-1_000"]


def sql_cell(value: str | None) -> str | None:
    with connection.cursor() as cursor:
        sql = f"SELECT {csv_cell_sql('v')} FROM (SELECT %s::text AS v) t"  # noqa: S608
        cursor.execute(sql, [value])
        return cursor.fetchone()[0]


@pytest.mark.parametrize("value", AGREED)
def test_sql_and_python_agree(value: str) -> None:
    assert sql_cell(value) == csv_cell(value)


@pytest.mark.parametrize("value", SQL_STRICTER)
def test_sql_is_never_laxer(value: str) -> None:
    assert csv_cell(value) == value
    assert sql_cell(value) == "'" + value


def test_null_stays_empty() -> None:
    assert sql_cell(None) is None
