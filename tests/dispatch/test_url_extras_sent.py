"""Which of a target URL's query values an answer kept from it must not echo."""

from __future__ import annotations

import pytest

from integrations.url_extras import url_extras_sent

TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    "url",
    [
        "https://crm.example/drop?format=json&verbose=true",
        "https://crm.example/drop?v=2&lang=en-US&page=100",
        "https://crm.example/drop?order=descending&fields=status",
        # A credential's name over a value too short to be one: a digit blanks nothing.
        "https://crm.example/drop?code=1&key=ab",
    ],
)
def test_values_that_cannot_be_a_credential_are_not_taken_out(url: str) -> None:
    assert url_extras_sent(url) == []


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("https://crm.example/drop?code=abcd", "abcd"),
        ("https://crm.example/drop?format=json&API_Key=wxyz", "wxyz"),
        ("https://crm.example/drop?x-Signature=a1b2c3", "a1b2c3"),
        ("https://crm.example/drop?client_secret=s%2B3cr", "s+3cr"),
        ("https://crm.example/drop?password=hunter2", "hunter2"),
        # Long enough to be a token, whatever its name says.
        (f"https://crm.example/drop?format=json&id={TOKEN}", TOKEN),
        (f"https://crm.example/drop?{'x' * 4}={TOKEN}", TOKEN),
        ("https://user:p4ss@crm.example/drop?format=json", "p4ss"),
        # Shaped like a password or a key, under a name that does not say so.
        ("https://crm.example/drop?pw=hunter22", "hunter22"),
        ("https://crm.example/drop?p=Summer2026!", "Summer2026!"),
        ("https://crm.example/drop?k=5f2a91c0d3e7", "5f2a91c0d3e7"),
        ("https://crm.example/drop?pin=4821", "4821"),
    ],
)
def test_a_credential_in_the_query_is_taken_out(url: str, secret: str) -> None:
    sent = url_extras_sent(url)

    assert secret in sent
    assert "json" not in sent
