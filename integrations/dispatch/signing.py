"""Webhook signatures: the one scheme for our dispatches and the brokers' callbacks.

``X-Webhook-Timestamp`` is Unix seconds; ``X-Webhook-Signature`` is
Base64(HMAC-SHA256(key=<Webhook Secret as UTF-8>, msg=b"<timestamp>:" + <raw body>))
(docs/contracts.md §4.1)::

    body = json.dumps(payload).encode()
    headers = signed_headers(integration.webhook_secret, body)   # sending
    verify([current_secret, previous_secret], request.headers.get("X-Webhook-Timestamp"),
           request.headers.get("X-Webhook-Signature"), request.body)  # receiving; raises

Verification always works on the raw body bytes as received: re-serialising parsed JSON
would change the bytes and break signatures that were correct.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
from collections.abc import Sequence
from secrets import token_bytes
from typing import Literal

TIMESTAMP_HEADER = "X-Webhook-Timestamp"
SIGNATURE_HEADER = "X-Webhook-Signature"
SECRET_PREFIX = "whsec_"  # noqa: S105 (the format prefix, not a secret)
TOLERANCE_SECONDS = 300

SignatureErrorCode = Literal["signature_invalid", "timestamp_out_of_range"]

# Any whole number a 64-bit clock gives: one in milliseconds (13 digits) is a timestamp, whose
# sender, once the signature proves it authentic, learns it is out of range, not malformed.
_TIMESTAMP_RE = re.compile(r"[0-9]{1,19}")
_DIGEST_SIZE = hashlib.sha256().digest_size


class SignatureError(Exception):
    """A signed request was not accepted; ``code`` is the stable API error code."""

    def __init__(self, code: SignatureErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: SignatureErrorCode = code


def generate_webhook_secret() -> str:
    """A new Webhook Secret: ``whsec_`` and 43 URL-safe Base64 characters (32 random bytes)."""
    return SECRET_PREFIX + base64.urlsafe_b64encode(token_bytes(32)).rstrip(b"=").decode("ascii")


def _digest(secret: str, timestamp: int | str, body: bytes) -> bytes:
    message = f"{timestamp}:".encode("ascii") + body
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).digest()


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``X-Webhook-Signature`` value for ``body`` sent at ``timestamp`` (Unix seconds)."""
    return base64.b64encode(_digest(secret, timestamp, body)).decode("ascii")


def signed_headers(secret: str, body: bytes, *, now: float | None = None) -> dict[str, str]:
    """Both signature headers for ``body``, timestamped ``now`` (default: the current time)."""
    timestamp = int(time.time() if now is None else now)
    return {
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, timestamp, body),
    }


def verify(
    secrets: Sequence[str],
    timestamp_header: str | None,
    signature_header: str | None,
    body: bytes,
    *,
    now: float | None = None,
    tolerance: int = TOLERANCE_SECONDS,
) -> None:
    """Accept the request if any of ``secrets`` signed it within ``tolerance`` seconds of now.

    ``secrets`` holds the current Webhook Secret and, during a rotation, the previous one.
    Raises ``SignatureError`` (``signature_invalid`` or ``timestamp_out_of_range``).
    """
    if timestamp_header is None or not _TIMESTAMP_RE.fullmatch(timestamp_header):
        raise SignatureError("signature_invalid", f"{TIMESTAMP_HEADER} is missing or malformed.")
    if not signature_header:
        raise SignatureError("signature_invalid", f"{SIGNATURE_HEADER} is missing.")
    try:
        presented = base64.b64decode(signature_header.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error):
        presented = b""
    if len(presented) != _DIGEST_SIZE:
        raise SignatureError("signature_invalid", f"{SIGNATURE_HEADER} is malformed.")

    # An empty secret would make the HMAC key public, so it never verifies anything.
    # Every candidate is compared (no early exit) so timing does not reveal which one matched.
    matched = False
    for secret in secrets:
        if secret and hmac.compare_digest(_digest(secret, timestamp_header, body), presented):
            matched = True
    if not matched:
        raise SignatureError("signature_invalid", "The signature does not match the body.")

    # Checked after the signature so that only an authentic sender learns its clock is off.
    # In whole seconds, as the timestamp is: a fractional clock would refuse a timestamp
    # exactly ``tolerance`` seconds old yet accept one exactly ``tolerance`` seconds ahead.
    current = int(time.time() if now is None else now)
    if abs(current - int(timestamp_header)) > tolerance:
        raise SignatureError(
            "timestamp_out_of_range",
            f"{TIMESTAMP_HEADER} is more than {tolerance} seconds away from the server time.",
        )
