"""A broker's free text as it is kept: what looks like an identifier masked, the rest as sent."""

from __future__ import annotations

import uuid

import pytest

from integrations.dispatch.masking import free_text_masked


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        (
            "cannot delete Ann.Smith@Example.com: record locked",
            "cannot delete <email>: record locked",
        ),
        ("no user ann%40x.com or bob@localhost.", "no user <email> or <email>."),
        ("call (415) 555-1234 or +1 415.555.9317", "call <number> or <number>"),
        ("SSN 123-45-6789, account 12345678", "SSN <number>, account <number>"),
        ("Smith,Ann,1985-07-04,91790", "Smith,Ann,<date>,91790"),
        ("born 07/04/1985 or 4.7.85", "born <date> or <date>"),
        ("VIN 1HGCM82633A004352 not found", "VIN <vin> not found"),
        # A date of birth with its month's name, as the standardizer reads one.
        ("Ann Smith (July 4, 1985)", "Ann Smith (<date>)"),
        ("born July 4 1985, Sept. 9, 1970", "born <date>, <date>"),
        ("born 4 July 1985 or 04-Jul-1985", "born <date> or <date>"),
        # An ISO date-time is one date: a date of birth serialized as a timestamp.
        ("dob 1985-07-04T00:00:00.000Z", "dob <date>"),
        ("dob 1985-07-04T0000Z, 1985-07-04T00", "dob <date>, <date>"),
        (
            "July  4, 1985; July\t4, 1985; July 4,\n1985; July\xa04, 1985",
            "<date>; <date>; <date>; <date>",
        ),
        ("at 2026-03-12T10:04:00+02:00.", "at <date>."),
        # A mobile advertising ID: without dashes, or in a case we never write a UUID in.
        ("maid a3f1c2d4567890abcdef1234567890ab", "maid <maid>"),
        ("maid A3F1C2D4-5678-90AB-CDEF-1234567890AB", "maid <maid>"),
        # Google's advertising ID is written as our request UUIDs are: one not ours is one.
        ("gaid 38400000-8cf0-11bd-b23e-10b96e40000d locked", "gaid <maid> locked"),
        ("device (38400000-8cf0-11bd-b23e-10b96e40000d)", "device (<maid>)"),
        ("account 12345678-1234-5678", "account <number>"),
        # A phone number with slashes or spaced dashes between its groups.
        ("call 415/555/1234 or 415 - 555 - 1234", "call <number> or <number>"),
        ("call 415 / 555 / 1234, +1 415-555 - 1234", "call <number>, <number>"),
        # A date of birth with an ordinal day, or "of" before its month.
        ("born July 4th, 1985; July 4th 1985", "born <date>; <date>"),
        ("born 4th of July 1985, 4th of July, 1985", "born <date>, <date>"),
        ("born 1st Jan 1990, 22nd of Feb. 1970, 3rd March 1985", "born <date>, <date>, <date>"),
        # An email spelt to hide: a zero-width character in it, a full-width "@".
        ("no user ann\u200b@example.com", "no user <email>"),
        ("no user ann@\u200dexample.com or a\u00adnn@example.com", "no user <email> or <email>"),
        ("no user ann\uff20example.com", "no user <email>"),
        ("no user ａｎｎ＠ｅｘａｍｐｌｅ．ｃｏｍ", "no user <email>"),
        ("call ４１５ ５５５ １２３４", "call <number>"),
        # A URL keeps its path, not its query or credentials; an email ending a path goes.
        (
            "see HTTPS://u:pw@crm.example/case?email=ann%40x.com",
            "see https://crm.example/case",
        ),
        ("no https://crm.example/users/ann@x.com", "no https://crm.example/users/<email>"),
        # What is not an identifier stays, a request's UUID included.
        ("glba", "glba"),
        (
            "HTTP 503 after 3 retries in 30000 ms, v1.2.3",
            "HTTP 503 after 3 retries in 30000 ms, v1.2.3",
        ),
        # A month's name without a year, an ordinal day without one, a hex digest longer
        # than an ID's.
        ("may 2 retries; due July 4", "may 2 retries; due July 4"),
        (
            "due July 4th; the 4th of July; 2nd try of 3",
            "due July 4th; the 4th of July; 2nd try of 3",
        ),
        ("HTTP 503 - retry 2/3 - 30 s", "HTTP 503 - retry 2/3 - 30 s"),
        ("status: processing (HTTP 202)", "status: processing (HTTP 202)"),
        # An IPv4 address (a refused target's) is not a phone number; a dotted phone is.
        (
            "target address not allowed: 203.0.113.250 is private",
            "target address not allowed: 203.0.113.250 is private",
        ),
        ("call 1.415.555.1234", "call <number>"),
        # Text that is not ASCII is kept as it reads.
        ("échec : déjà supprimé", "échec : déjà supprimé"),
        (
            "sha1 da39a3ee5e6b4b0d3255bfef95601890afd80709",
            "sha1 da39a3ee5e6b4b0d3255bfef95601890afd80709",
        ),
    ],
)
def test_identifiers_are_masked_and_the_rest_kept(sent: str, kept: str) -> None:
    assert free_text_masked(sent, limit=2000) == kept


def test_an_email_across_the_limit_is_masked_before_the_text_is_cut() -> None:
    sent = "x" * 1990 + " ann.smith@example.com"

    assert free_text_masked(sent, limit=2000) == "x" * 1990 + " <email>"[:10]


def test_an_email_is_masked_whole_however_far_past_the_limit_the_text_runs() -> None:
    # Earlier emails shrink to "<email>": what was past the limit moves inside it.
    long_emails = " ".join(["x" * 240 + "@example.com"] * 8)
    sent = long_emails + " " + "y" * 200 + " ann.smith@example.com: record locked"

    kept = free_text_masked(sent, limit=2000)

    assert "ann.smith" not in kept
    assert kept.endswith(" <email>: record locked")


@pytest.mark.parametrize(
    "sent",
    [
        "1" * 100_000 + "a",
        "a." * 50_000,
        "1-" * 50_000 + "x",
        "July 4, " * 12_500,
        "4 Jul " * 16_000,
        "1985-07-04T00:00:00." + "1" * 100_000 + "a",
        "a" * 100_000,
    ],
)
def test_a_long_text_is_read_once(sent: str) -> None:
    # Linear: a text of the API's size is masked at once (a quadratic search would not end).
    assert len(free_text_masked(sent, limit=200_000)) <= len(sent)


REQUEST_UUID = "123e4567-e89b-12d3-a456-426614174000"


@pytest.mark.parametrize(
    "written",
    [REQUEST_UUID, REQUEST_UUID.upper(), REQUEST_UUID.replace("-", "")],
)
def test_the_rows_own_request_uuid_is_kept_however_written(written: str) -> None:
    sent = f"request {written} failed"

    assert free_text_masked(sent, limit=2000, own_uuids=[uuid.UUID(REQUEST_UUID)]) == sent


def test_a_uuid_not_issued_for_the_row_is_masked_as_an_advertising_id() -> None:
    other = "38400000-8cf0-11bd-b23e-10b96e40000d"
    sent = f"request {REQUEST_UUID}: device {other} not found"

    kept = free_text_masked(sent, limit=2000, own_uuids=[REQUEST_UUID])

    assert kept == f"request {REQUEST_UUID}: device <maid> not found"
    # Without the row's own, no UUID can be told from an advertising ID.
    assert free_text_masked(sent, limit=2000) == "request <maid>: device <maid> not found"


def test_masking_twice_keeps_what_masking_once_kept() -> None:
    # A repeat callback is compared on what is kept; stored rows are masked again as is.
    sent = "ａｎｎ＠x.com 415 - 555 - 1234, 4th of July 1985, " + REQUEST_UUID
    once = free_text_masked(sent, limit=2000, own_uuids=[REQUEST_UUID])

    assert free_text_masked(once, limit=2000, own_uuids=[REQUEST_UUID]) == once


@pytest.mark.parametrize(
    "sent",
    ["1 - " * 25_000 + "x", "1/" * 50_000 + "x", "4th of " * 14_000, "a\u200b" * 50_000],
)
def test_a_long_text_of_the_wider_patterns_is_read_once(sent: str) -> None:
    assert len(free_text_masked(sent, limit=200_000)) <= len(sent)


# Texts where one identifier ends right where another starts, or a mask's ">" would let a
# pattern start that the character it replaced did not.
TRICKY = [
    "email=ann@x.com&alt=bob@y.com",
    "ann@x.com+bob@y.com=carl@z.com",
    "July 4, 1985+bob@y.com",
    "415 555 1234+bob@y.com",
    "call 4155551234=38400000-8cf0-11bd-b23e-10b96e40000d",
    "1HGCM82633A004352&bob@y.com",
    "a@x.co&" * 50,
    "ann@x.com.bob@y.com 07/04/1985-07/04/1985",
    f"see https://crm.example/c/{REQUEST_UUID}?email=ann@x.com&alt=bob@y.com done",
    "ann%40x.com&bob%40y.com; 1985-07-04T00:00Z+bob@y.com",
    "ｂｏｂ＠y.com&ann@x.com (415) 555-1234.5",
    "10.0.0.1+bob@y.com 38400000-8cf0-11bd-b23e-10b96e40000d-ann@x.com",
]


def test_an_email_right_after_another_is_masked_too() -> None:
    # The first email ends where "&alt=bob@y.com" starts: it is one of its own.
    assert free_text_masked("email=ann@x.com&alt=bob@y.com", limit=2000) == "<email><email>"
    assert free_text_masked("415 555 1234+bob@y.com", limit=2000) == "<number><email>"


@pytest.mark.parametrize("sent", TRICKY)
def test_masked_text_masks_to_itself(sent: str) -> None:
    once = free_text_masked(sent, limit=2000, own_uuids=[REQUEST_UUID])

    assert free_text_masked(once, limit=2000, own_uuids=[REQUEST_UUID]) == once


@pytest.mark.parametrize("sent", ["ann@x.com&" * 10_000, "ann@x.com&" + "b&" * 50_000])
def test_emails_one_after_another_are_read_once(sent: str) -> None:
    assert len(free_text_masked(sent, limit=200_000)) <= len(sent)
