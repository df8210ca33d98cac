"""DROP's notifications to a broker (its webhook, API 1.2.0): the headers, the signature and
the event types, with no database write.

DROP signs each POST with the secret its portal shows the broker: ``X-Webhook-Signature`` is
``sha256=`` and the lowercase hex HMAC-SHA256 of ``<X-Webhook-Timestamp>.<raw body>``, the
timestamp being UTC ISO 8601 with 7 fractional digits (docs/contracts.md, DROP's
notifications)::

    notification_signature("whsec_test", "2026-07-02T18:30:00.0000000Z",
                           b'{"message":"download ready"}')
    # 'sha256=9027e79375800659b91a7f374b525fdeca489ba00e7b5bdbf2344a3a72a463df'
    sent_at = notification_verify(secret, timestamp, signature, body, now=now)  # raises

The body carries no ids (``{"message": "..."}``): the event type says what happened, and the
API says the rest.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Final, Literal

from django.conf import settings

EVENT_ID_HEADER: Final = "X-Webhook-Event-Id"
EVENT_TYPE_HEADER: Final = "X-Webhook-Event-Type"
DELIVERY_ID_HEADER: Final = "X-Webhook-Delivery-Id"
TIMESTAMP_HEADER: Final = "X-Webhook-Timestamp"
VERSION_HEADER: Final = "X-Webhook-Version"
SIGNATURE_HEADER: Final = "X-Webhook-Signature"

DOWNLOAD_READY: Final = "download.ready"
UPLOAD_RECEIVED: Final = "upload.received"
UPLOAD_PROCESSED: Final = "upload.processed"
AMENDMENT_RECEIVED: Final = "amendment.received"
AMENDMENT_PROCESSED: Final = "amendment.processed"
EVENT_TYPES: Final = (
    DOWNLOAD_READY,
    UPLOAD_RECEIVED,
    UPLOAD_PROCESSED,
    AMENDMENT_RECEIVED,
    AMENDMENT_PROCESSED,
)
# DROP's row-level results of these wait for review in its portal (no API returns them),
# each with what the staff alert calls the file when none of ours is attached.
RESULTS_IN_PORTAL: Final[Mapping[str, str]] = {
    UPLOAD_PROCESSED: "an upload",
    AMENDMENT_PROCESSED: "an amendment",
}

TOLERANCE: Final = dt.timedelta(minutes=5)
_PREFIX: Final = "sha256="
# Longest id or type kept: DROP's are GUID-like; anything longer is not DROP's.
HEADER_VALUE_MAX: Final = 200
MESSAGE_MAX: Final = 1000

NOTIFICATIONS_PATH: Final = "/api/v1/drop/notifications/{broker_id}"
# The key of the HMAC computed when there is no secret to check with (never accepted).
_NO_SECRET: Final = "no secret: " + "-" * 32

RejectionCode = Literal["signature_invalid", "timestamp_out_of_range"]


class NotificationRejected(Exception):
    """A notification not shown to come from DROP now; ``code`` is the API error code."""

    def __init__(self, code: RejectionCode, detail: str) -> None:
        super().__init__(detail)
        self.code = code


def notifications_url(broker_id: str) -> str:
    """The URL a broker enters in DROP's portal (Notification settings)."""
    return settings.DROPPORTAL_PUBLIC_URL + NOTIFICATIONS_PATH.format(broker_id=broker_id)


def notification_signature(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Webhook-Signature`` DROP sends for ``body`` at ``timestamp``."""
    message = timestamp.encode() + b"." + body
    return _PREFIX + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def notification_timestamp(moment: dt.datetime) -> str:
    """``moment`` as DROP writes ``X-Webhook-Timestamp``: UTC, 7 fractional digits."""
    utc = moment.astimezone(dt.UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond:06d}0Z"


def notification_verify(
    secret: str, timestamp: str | None, signature: str | None, body: bytes, *, now: dt.datetime
) -> dt.datetime:
    """Check that ``body`` was signed with ``secret`` within 5 minutes of ``now``; return
    when DROP sent it. Raises ``NotificationRejected``.

    The signature is checked first, in constant time, so a forger learns nothing from the
    answer about the clock; a timestamp that cannot be read is a bad signature.
    """
    if not timestamp or not signature:
        raise NotificationRejected(
            "signature_invalid",
            f"Sign the notification: {TIMESTAMP_HEADER} and {SIGNATURE_HEADER} are required.",
        )
    # No secret (no such broker, or none stored) answers as a wrong signature, after the same
    # work (one HMAC, one comparison): neither the answer nor its time tells which brokers
    # exist.
    expected = notification_signature(secret or _NO_SECRET, timestamp, body)
    matches = hmac.compare_digest(expected.encode(), notification_signature_key(signature).encode())
    if not matches or not secret:
        raise NotificationRejected(
            "signature_invalid",
            "The signature does not verify with the broker's DROP webhook secret.",
        )
    try:
        sent_at = dt.datetime.fromisoformat(timestamp)
    except ValueError:
        sent_at = None
    if sent_at is None or sent_at.tzinfo is None:
        raise NotificationRejected(
            "signature_invalid", f"{TIMESTAMP_HEADER} is not an ISO 8601 UTC time."
        )
    if abs(now - sent_at) > TOLERANCE:
        raise NotificationRejected(
            "timestamp_out_of_range",
            f"{TIMESTAMP_HEADER} is more than 5 minutes from the server's time.",
        )
    return sent_at


def notification_signature_key(signature: str) -> str:
    """A verified ``X-Webhook-Signature`` as kept to refuse its second use: the form it is
    compared in, so that case or spaces do not make a replay look new."""
    return signature.strip().lower()


def notification_message(body: bytes) -> str:
    """DROP's ``message``, or "" when the (signed) body holds none: a notification is
    recorded for its event type, whatever its body says."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return ""
    message = payload.get("message") if isinstance(payload, dict) else None
    # PostgreSQL text cannot hold a NUL.
    return message.replace("\x00", "")[:MESSAGE_MAX] if isinstance(message, str) else ""
