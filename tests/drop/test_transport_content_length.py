"""A DROP answer's Content-Length is read from ASCII digits only (``ascii_integers``)."""

from __future__ import annotations

import pytest
import requests

from integrations.drop import transport


@pytest.mark.parametrize(
    ("sent", "read"), [("1024", 1024), (" 12 ", 12), ("²", None), ("1e3", None)]
)
def test_a_content_length_is_read_from_ascii_digits_only(sent: str, read: int | None) -> None:
    # "²".isdigit() holds, yet int("²") raises: that was a traceback in a download.
    response = requests.Response()
    response.headers["Content-Length"] = sent
    assert transport._content_length(response) == read
