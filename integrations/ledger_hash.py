"""The ledger's hash rules, with no dependency beyond the standard library.

The one home of how an event's content is hashed and how events are chained: the service's
``ledger verify`` (``services.ledger``) and the offline evidence pack verifier
(``integrations.evidence.verify``, run by auditors without Django or a database) both
compute with these::

    content = event_hash(created_at=..., broker_id="4821", kind="broker.created",
                         subject="4821", actor="cli", data={"name": "Acme"})
    link = chain_hash(previous_link, event_id, content)

The database computes ``event_hash`` too when it stores an event
(``integrations/sql/ledger_append.sql``); the tests hold the two to agreeing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Any

GENESIS_HASH = "0" * 64


def canonical_json(value: Any) -> str:
    """Keys sorted, no whitespace, non-ASCII characters as they are."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def utc_text(moment: dt.datetime) -> str:
    """A time as the hash covers it: UTC, microseconds, ``+00:00``."""
    return moment.astimezone(dt.UTC).isoformat(timespec="microseconds")


def event_hash(
    *,
    created_at: dt.datetime,
    broker_id: str,
    kind: str,
    subject: str,
    actor: str,
    data: dict[str, Any],
) -> str:
    """SHA-256 (hex) over the canonical form of an event's content."""
    content = canonical_json(
        {
            "created_at": utc_text(created_at),
            "broker_id": broker_id,
            "kind": kind,
            "subject": subject,
            "actor": actor,
            "data": data,
        }
    )
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def chain_hash(previous: str, event_id: int, content_hash: str) -> str:
    """The chain link of an event: over the previous link, the event's id and its hash."""
    return hashlib.sha256(f"{previous}:{event_id}:{content_hash}".encode()).hexdigest()
