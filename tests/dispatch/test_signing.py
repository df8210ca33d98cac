"""Webhook signatures: the documented example, secret format, and every way verify says no."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

import pytest

from integrations.dispatch import signing

# The worked example of the broker integration guide. If this changes, the guide is wrong.
SECRET = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
TIMESTAMP = 1767225600
BODY = (
    b'{"schema_version":"1.0","status":"completed",'
    b'"request_uuid":"3f2c8a8e-6a4b-4c1e-9a57-0c5d2f1e9b10","drop_outcome":"deleted"}'
)
SIGNATURE = "4IgecbtdRNi31v95y4l+8CK4H5Xu+4BsO/XBKKExlLk="


def _check(
    secrets: list[str] | None = None,
    timestamp: str | None = str(TIMESTAMP),
    signature: str | None = SIGNATURE,
    body: bytes = BODY,
    now: float = TIMESTAMP,
) -> None:
    signing.verify(secrets or [SECRET], timestamp, signature, body, now=now)


def _code(**kwargs: object) -> str:
    with pytest.raises(signing.SignatureError) as caught:
        _check(**kwargs)  # type: ignore[arg-type]
    return caught.value.code


def test_worked_example_matches_an_independent_hmac() -> None:
    expected = base64.b64encode(
        hmac.new(SECRET.encode("utf-8"), f"{TIMESTAMP}:".encode() + BODY, hashlib.sha256).digest()
    ).decode()

    assert expected == SIGNATURE
    assert signing.sign(SECRET, TIMESTAMP, BODY) == SIGNATURE


def test_signed_headers_carry_unix_seconds_and_the_signature() -> None:
    headers = signing.signed_headers(SECRET, BODY, now=TIMESTAMP + 0.9)

    assert headers == {"X-Webhook-Timestamp": str(TIMESTAMP), "X-Webhook-Signature": SIGNATURE}


def test_generated_secrets_have_the_documented_format_and_differ() -> None:
    first, second = signing.generate_webhook_secret(), signing.generate_webhook_secret()

    assert re.fullmatch(r"^whsec_[A-Za-z0-9_-]{43}$", first)
    assert len(base64.urlsafe_b64decode(first.removeprefix("whsec_") + "=")) == 32
    assert first != second


def test_a_correct_signature_verifies() -> None:
    _check()


def test_signed_headers_verify_round_trip() -> None:
    headers = signing.signed_headers(SECRET, BODY)

    signing.verify([SECRET], headers["X-Webhook-Timestamp"], headers["X-Webhook-Signature"], BODY)


def test_wrong_secret_is_signature_invalid() -> None:
    assert _code(secrets=[signing.generate_webhook_secret()]) == "signature_invalid"


def test_previous_secret_during_rotation_is_accepted() -> None:
    _check(secrets=[signing.generate_webhook_secret(), SECRET])


def test_empty_secret_never_verifies() -> None:
    unkeyed = signing.sign("", TIMESTAMP, BODY)

    assert _code(secrets=["", SECRET], signature=unkeyed) == "signature_invalid"


def test_tampered_body_is_signature_invalid() -> None:
    tampered = BODY.replace(b"deleted", b"exempt")

    assert _code(body=tampered) == "signature_invalid"


def test_reserialised_body_is_signature_invalid() -> None:
    # Same JSON, other bytes: verification must run over the raw body as received.
    assert _code(body=BODY.replace(b",", b", ")) == "signature_invalid"


@pytest.mark.parametrize(
    "signature",
    [None, "", "not base64!", SIGNATURE[:-4], base64.b64encode(b"x" * 31).decode(), "é" * 44],
)
def test_missing_or_malformed_signature_is_signature_invalid(signature: str | None) -> None:
    assert _code(signature=signature) == "signature_invalid"


@pytest.mark.parametrize("timestamp", [None, "", "abc", "1767225600.5", "-1767225600", "１２３"])
def test_missing_or_malformed_timestamp_is_signature_invalid(timestamp: str | None) -> None:
    assert _code(timestamp=timestamp) == "signature_invalid"


@pytest.mark.parametrize("skew", [-300, 300])
def test_timestamp_300_seconds_away_is_accepted(skew: int) -> None:
    _check(now=TIMESTAMP + skew)


@pytest.mark.parametrize("skew", [301, -301], ids=["301s-old", "301s-ahead"])
def test_timestamp_301_seconds_away_is_out_of_range(skew: int) -> None:
    assert _code(now=TIMESTAMP + skew) == "timestamp_out_of_range"


# The server's clock is rarely on a whole second: between two ticks the window stays the
# same 300 s either way, as the timestamp counts them.
@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.5, 0.999])
@pytest.mark.parametrize("skew", [-300, 300], ids=["300s-ahead", "300s-old"])
def test_a_fractional_clock_accepts_300_seconds_either_way(skew: int, fraction: float) -> None:
    _check(now=TIMESTAMP + skew + fraction)


@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.5, 0.999])
@pytest.mark.parametrize("skew", [301, -301], ids=["301s-old", "301s-ahead"])
def test_a_fractional_clock_refuses_301_seconds_either_way(skew: int, fraction: float) -> None:
    assert _code(now=TIMESTAMP + skew + fraction) == "timestamp_out_of_range"


def test_a_signed_timestamp_in_milliseconds_is_out_of_range_not_malformed() -> None:
    milliseconds = TIMESTAMP * 1000
    signature = signing.sign(SECRET, milliseconds, BODY)

    assert _code(timestamp=str(milliseconds), signature=signature) == "timestamp_out_of_range"


def test_stale_timestamp_with_bad_signature_reports_the_signature() -> None:
    assert _code(now=TIMESTAMP + 3600, body=b"{}") == "signature_invalid"
