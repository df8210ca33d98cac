"""A number we are sent is read from ASCII digits only (``integrations/ascii_integers.py``)."""

from __future__ import annotations

import pytest

from integrations.ascii_integers import ascii_integer


@pytest.mark.parametrize(("text", "number"), [("0", 0), ("2027", 2027), ("007", 7)])
def test_ascii_digits_read_as_their_number(text: str, number: int) -> None:
    assert ascii_integer(text) == number


@pytest.mark.parametrize(
    "text",
    [
        "",
        "²",  # isdigit() holds, int() refuses it
        "٣",  # int() reads it as 3
        "３",  # full-width
        " 12",
        "12 ",
        "-1",
        "+1",
        "1_000",
        "1.0",
    ],
)
def test_anything_else_is_no_number(text: str) -> None:
    assert ascii_integer(text) is None


def test_more_digits_than_int_reads_is_no_number() -> None:
    # int() refuses over 4,300 digits (ValueError): a header or query string may hold them.
    assert ascii_integer("1" * 5000) is None
