"""One table of bad callbacks for every signed callback kind (the webhook deletion callback,
``deletion``, and the ISI completion callback, ``isi``): the key, signature, timestamp and
body faults every kind refuses alike, and the few only one kind has.

Each case starts from the kind's signed, accepted callback and breaks one thing: it returns
the changes to the call (``key``, ``secret``, ``now``, ``headers`` or ``payload``), given the
broker's side, the request the callback is about, and the kind's body builder::

    @pytest.mark.parametrize("case", cases_for("isi"))
    def test_bad_input_is_refused_with_its_code_and_changes_nothing(side, processing, case):
        bad = BAD_CALLBACKS[case]
        call = {"payload": body_for(processing), "key": side.key, "secret": side.secret}
        call.update(bad.variant(side, processing, body_for))
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from django.utils import timezone

from integrations.dispatch import signing
from integrations.models import DeletionRequest, Integration
from integrations.services.staff.brokers import broker_create
from integrations.services.staff.integrations import integration_secret_rotate
from integrations.services.staff.keys import api_key_create, api_key_revoke
from tests.builders import (
    DeletionRequestFactory,
    webhook_integration_created,
)
from tests.conftest import SIGNATURE_CLOCK

DELETION = "deletion"
ISI = "isi"
KINDS = frozenset({DELETION, ISI})


class Side(Protocol):
    """The broker's side of a callback: its key and its integration's Webhook Secret."""

    secret: str
    integration: Integration


BodyFor = Callable[..., dict[str, Any]]  # (request, outcome="deleted", **fields) -> body
Variant = Callable[[Side, DeletionRequest, BodyFor], dict[str, Any]]


@dataclass(frozen=True)
class BadCallback:
    variant: Variant
    status: int
    code: str
    kinds: frozenset[str] = KINDS


def cases_for(kind: str) -> list[str]:
    return [name for name, case in BAD_CALLBACKS.items() if kind in case.kinds]


def other_broker_key(side: Side) -> str:
    other = broker_create(broker_id="5930", name="Other", actor="test")
    return api_key_create(broker=other, scopes=["webhook_callback"], actor="test").key


def revoked_key(side: Side) -> str:
    created = api_key_create(broker=side.integration.broker, scopes=["webhook_callback"], actor="t")
    api_key_revoke(api_key=created.api_key, actor="test")
    return created.key


def _scopeless_key(side: Side) -> str:
    broker = side.integration.broker
    return api_key_create(broker=broker, scopes=["ingest", "audit"], actor="t").key


def _expired_rotation(side: Side) -> str:
    old = side.secret
    integration_secret_rotate(
        integration=side.integration,
        actor="test",
        now=timezone.now() - dt.timedelta(hours=24, seconds=1),
    )
    return old


def _webhook_secret(side: Side) -> str:
    """The secret of the broker's webhook integration: not the one that signs ISI callbacks."""
    created = webhook_integration_created(side.integration.broker, "https://crm.acme.example/drop")
    return created.webhook_secret


def _webhook_requests_token(side: Side) -> str:
    """A results_token on a webhook deletion request: not an ISI delete."""
    created = webhook_integration_created(side.integration.broker, "https://crm.acme.example/drop")
    request = DeletionRequestFactory.create(
        integration=created.integration, results_token="ab" * 32
    )
    return request.results_token or ""


# Other spellings Python's UUID() reads of a request_uuid.
UUID_SPELLINGS: dict[str, Callable[[uuid.UUID], str]] = {
    "as a URN": lambda u: u.urn,
    "in braces": lambda u: f"{{{u}}}",
    "without dashes": lambda u: u.hex,
}


def _request_uuid_spelt(spell: Callable[[uuid.UUID], str]) -> Variant:
    return lambda s, r, b: {"payload": b(r, request_uuid=spell(r.request_uuid))}


def _only(kind: str) -> frozenset[str]:
    return frozenset({kind})


BAD_CALLBACKS: dict[str, BadCallback] = {
    "missing key": BadCallback(lambda s, r, b: {"key": None}, 401, "authentication_failed"),
    "invalid key": BadCallback(
        lambda s, r, b: {"key": "dpk_not-a-key"}, 401, "authentication_failed"
    ),
    "revoked key": BadCallback(
        lambda s, r, b: {"key": revoked_key(s)}, 401, "authentication_failed"
    ),
    "key without the scope": BadCallback(
        lambda s, r, b: {"key": _scopeless_key(s)}, 403, "scope_missing"
    ),
    "key of another broker": BadCallback(
        lambda s, r, b: {"key": other_broker_key(s)}, 404, "not_found"
    ),
    "missing signature": BadCallback(lambda s, r, b: {"secret": None}, 401, "signature_invalid"),
    "malformed signature": BadCallback(
        lambda s, r, b: {"headers": {"HTTP_X_WEBHOOK_SIGNATURE": "not base64!"}},
        401,
        "signature_invalid",
    ),
    "wrong signature": BadCallback(
        lambda s, r, b: {"secret": signing.generate_webhook_secret()}, 401, "signature_invalid"
    ),
    "signed by the broker's webhook integration": BadCallback(
        lambda s, r, b: {"secret": _webhook_secret(s)}, 401, "signature_invalid", _only(ISI)
    ),
    "rotated-out secret after 24 h": BadCallback(
        lambda s, r, b: {"secret": _expired_rotation(s)}, 401, "signature_invalid"
    ),
    # Against the stopped signature clock: exactly one second outside the window.
    "timestamp 301 s old": BadCallback(
        lambda s, r, b: {"now": SIGNATURE_CLOCK - 301}, 401, "timestamp_out_of_range"
    ),
    "timestamp 301 s ahead": BadCallback(
        lambda s, r, b: {"now": SIGNATURE_CLOCK + 301}, 401, "timestamp_out_of_range"
    ),
    "timestamp an hour old": BadCallback(
        lambda s, r, b: {"now": SIGNATURE_CLOCK - 3600}, 401, "timestamp_out_of_range"
    ),
    "body not JSON": BadCallback(
        lambda s, r, b: {"payload": b"deleted, thanks"}, 400, "validation_failed"
    ),
    # JSON in UTF-8 only: json.loads would read these bytes as the JSON the broker meant.
    "body in UTF-16": BadCallback(
        lambda s, r, b: {"payload": json.dumps(b(r)).encode("utf-16")}, 400, "validation_failed"
    ),
    "body in UTF-16 without a BOM": BadCallback(
        lambda s, r, b: {"payload": json.dumps(b(r)).encode("utf-16-le")},
        400,
        "validation_failed",
    ),
    "body in UTF-32": BadCallback(
        lambda s, r, b: {"payload": json.dumps(b(r)).encode("utf-32")}, 400, "validation_failed"
    ),
    "body nested too deeply": BadCallback(
        lambda s, r, b: {"payload": b"[" * 20_000 + b"]" * 20_000},
        400,
        "validation_failed",
        _only(DELETION),
    ),
    "a NUL in error_message": BadCallback(
        lambda s, r, b: {"payload": b(r, "failed", error_message="CRM\u0000down")},
        400,
        "validation_failed",
        _only(DELETION),
    ),
    "an unpaired surrogate in error_message": BadCallback(
        lambda s, r, b: {"payload": b(r, "failed", error_message="CRM \ud800 down")},
        400,
        "validation_failed",
        _only(DELETION),
    ),
    # What gunicorn hands on for a chunked body: no Content-Length, so Django reads nothing.
    "body sent in chunks": BadCallback(
        lambda s, r, b: {"headers": {"HTTP_TRANSFER_ENCODING": "chunked", "CONTENT_LENGTH": ""}},
        400,
        "validation_failed",
    ),
    "body not an object": BadCallback(
        lambda s, r, b: {"payload": json.dumps([b(r)]).encode()}, 400, "validation_failed"
    ),
    "body over 64 KiB": BadCallback(
        lambda s, r, b: {"payload": b(r, error_message="x" * 65_536)}, 413, "payload_too_large"
    ),
    "unknown request_uuid": BadCallback(
        lambda s, r, b: {"payload": b(r, request_uuid="0" * 8 + "-0000-4000-8000-" + "0" * 12)},
        404,
        "not_found",
        _only(DELETION),
    ),
    # The same UUID spelt otherwise than the dispatch wrote it.
    **{
        f"request_uuid {name}": BadCallback(
            _request_uuid_spelt(spell), 400, "validation_failed", _only(DELETION)
        )
        for name, spell in UUID_SPELLINGS.items()
    },
    "wrong schema_version": BadCallback(
        lambda s, r, b: {"payload": b(r, schema_version="2.0")},
        400,
        "validation_failed",
        _only(DELETION),
    ),
    "schema_version as a number": BadCallback(
        lambda s, r, b: {"payload": b(r, schema_version=1.0)},
        400,
        "validation_failed",
        _only(DELETION),
    ),
    "no results_token": BadCallback(
        lambda s, r, b: {"payload": b(r, results_token=None)},
        400,
        "validation_failed",
        _only(ISI),
    ),
    "unknown results_token": BadCallback(
        lambda s, r, b: {"payload": b(r, results_token="cd" * 32)}, 404, "not_found", _only(ISI)
    ),
    "results_token of a webhook request": BadCallback(
        lambda s, r, b: {"payload": b(r, results_token=_webhook_requests_token(s))},
        404,
        "not_found",
        _only(ISI),
    ),
    "wrong status": BadCallback(
        lambda s, r, b: {"payload": b(r, status="processing")}, 400, "validation_failed"
    ),
    "unknown drop_outcome": BadCallback(
        lambda s, r, b: {"payload": b(r, "erased")}, 400, "validation_failed"
    ),
    # The deletion body sends error_message null; the ISI body leaves it out.
    "failed without error_message": BadCallback(
        lambda s, r, b: {"payload": b(r, "failed", error_message=None)}, 400, "validation_failed"
    ),
    "opted_out without the email": BadCallback(
        lambda s, r, b: {"payload": b(r, "opted_out", identifiers={"email": []})},
        400,
        "validation_failed",
    ),
    "no completed_at": BadCallback(
        lambda s, r, b: {"payload": b(r, completed_at=None)},
        400,
        "validation_failed",
        _only(ISI),
    ),
    "completed_at not UTC": BadCallback(
        lambda s, r, b: {"payload": b(r, completed_at="2026-11-21T12:04:00+02:00")},
        400,
        "validation_failed",
        _only(ISI),
    ),
    "completed_at without a zone": BadCallback(
        lambda s, r, b: {"payload": b(r, completed_at="2026-11-21T10:04:00")},
        400,
        "validation_failed",
        _only(ISI),
    ),
    "completed_at not a time": BadCallback(
        lambda s, r, b: {"payload": b(r, completed_at="yesterday")},
        400,
        "validation_failed",
        _only(ISI),
    ),
    "completed_at on a day that does not exist": BadCallback(
        lambda s, r, b: {"payload": b(r, completed_at="2026-02-30T10:00:00Z")},
        400,
        "validation_failed",
        _only(ISI),
    ),
    "completed_at at an hour that does not exist": BadCallback(
        lambda s, r, b: {"payload": b(r, completed_at="2026-11-21T25:00:00Z")},
        400,
        "validation_failed",
        _only(ISI),
    ),
}

# Anyone can send these: counted and logged, never a ledger row.
# Refused before a key is read, so no ``callback.rejected`` event names one.
WITHOUT_A_VALID_KEY = frozenset(
    {"missing key", "invalid key", "revoked key", "body over 64 KiB", "body sent in chunks"}
)
