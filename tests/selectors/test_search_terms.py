"""What an admin search may put in its URL: an id of ours, a clear email or phone as its
hash, nothing else (a name, a date of birth, a ZIP code, a VIN never reaches a log)."""

from __future__ import annotations

import pytest

from integrations.drop.standardize import email_hash, phone_hash
from integrations.selectors.search_terms import (
    ledger_search_token,
    named_search_token,
    search_token,
)

HASH = email_hash("x@y.z")


@pytest.mark.parametrize(
    "typed",
    [
        "WIEMAIL00113",  # a work item id
        "wiemail00113",
        "AbCdEfGhIjKl",  # one of letters alone, in mixed case
        "AAAAAAAAAAAC",  # or in capitals
        "CRM-0113",  # a broker's pointer
        "C-1",
        "CUST_000123456",
        "4821",  # a broker id
        "3f2c8a8e-6a4b-4c1e-9a57-0c5d2f1e9b10",
        HASH,
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "dpk_abc",
        "",
    ],
)
def test_an_id_travels_as_typed(typed: str) -> None:
    assert search_token(f" {typed} ") == typed


@pytest.mark.parametrize(
    ("typed", "hashed"),
    [(" Ann.Smith@Example.com ", email_hash("ann.smith@example.com")), ("415-555-0113", None)],
)
def test_a_clear_email_or_phone_travels_as_its_hash(typed: str, hashed: str | None) -> None:
    assert search_token(typed) == (hashed or phone_hash("4155550113"))


@pytest.mark.parametrize(
    "typed",
    [
        "Ann Smith",
        "Smith",
        "Smith,Ann,1985-07-04,91790",
        "1985-07-04",
        "4.7.1985",
        "91790",  # a ZIP code
        "1HGCM82633A004352",  # a VIN
        "O'Brien",
        "Christiansen",  # twelve letters, as a word is written
        "christiansen",
        "born1985-07-04",  # a date inside a word
        "ann07/04/85x",
        "ref4-Jul-1985",
        "0123456789abcdef0123456789abcdef",  # a mobile advertising ID
        "3F2504E0-4F89-11D3-9A0C-0305E82C3301",
    ],
)
def test_a_name_a_date_a_zip_code_or_a_vin_is_refused(typed: str) -> None:
    for token in (search_token, ledger_search_token):
        sent = token(typed)
        # Refused, or (a date of 8 digits reads as a phone number) sent as a hash only.
        assert sent is None or (sent == phone_hash(typed) and len(sent) == 44), sent


def test_a_list_of_names_of_ours_takes_words_and_still_hashes_an_email() -> None:
    assert named_search_token(" Acme CRM ") == "Acme CRM"
    assert named_search_token("ann@x.com") == email_hash("ann@x.com")


@pytest.mark.parametrize(
    "typed",
    [
        "deletion_request.outcome_recorded",
        "staff:ada",
        "apikey:dpk_abc",
        "system",
        "system:recurring",
        "oidc:ada@example.com",
        "cli:ada",
        "cli:uid 1000",
        "drop:notification",
    ],
)
def test_the_ledger_takes_its_kinds_and_actors(typed: str) -> None:
    assert search_token(typed) != typed  # another list's search: not sent, or hashed
    assert ledger_search_token(typed) == typed
