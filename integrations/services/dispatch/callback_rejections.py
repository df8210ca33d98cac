"""What is kept of a refused broker callback: a ledger event, or a count and a rare log line.

A refusal of a request with a valid API key is a ledger event (``callback.rejected``: which
callback, status, code, the key's prefix, the request if known; never the body, a secret or
an identifier). A refusal without one (no key, an unknown or revoked key, a body refused
before the key was read, an address throttled) writes nothing: anyone can send those, and
the ledger is append-only. They are counted in this process (``UNAUTHENTICATED.count``) and
logged at most once a minute with the count::

    callback_rejection_record(api_key=key, callback="deletion", subject=uuid, data={...})
    callback_unauthenticated_count(address="203.0.113.7", status=401, code="...")
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from integrations.ledger_kinds import LedgerKind
from integrations.models import ApiKey
from integrations.services.ledger import ledger_event_append

log = logging.getLogger(__name__)

LOG_EVERY_SECONDS = 60.0


def callback_rejection_record(
    *, api_key: ApiKey, callback: str, subject: str, data: dict[str, Any]
) -> None:
    """The ``callback.rejected`` event of a callback refused with a valid API key."""
    ledger_event_append(
        kind=LedgerKind.CALLBACK_REJECTED,
        broker_id=api_key.broker.broker_id if api_key.broker else "",
        subject=subject,
        actor=f"apikey:{api_key.prefix}",
        data={"callback": callback, **data},
    )


class _Rejections:
    """How many unauthenticated callbacks this process refused; logged once a minute."""

    def __init__(self) -> None:
        self.count = 0
        self._unlogged = 0
        self._logged_at = float("-inf")
        self._lock = threading.Lock()

    def add(self, *, address: str, status: int, code: str) -> None:
        now = time.monotonic()
        with self._lock:
            self.count += 1
            self._unlogged += 1
            if now - self._logged_at < LOG_EVERY_SECONDS:
                return
            unlogged, self._unlogged, self._logged_at = self._unlogged, 0, now
        log.warning(
            "refused %d unauthenticated callback(s) since the last such line "
            "(%d in all); the latest from %s: %s %s",
            unlogged,
            self.count,
            address,
            status,
            code,
        )


UNAUTHENTICATED = _Rejections()


def callback_unauthenticated_count(*, address: str, status: int, code: str) -> None:
    """Count a callback refused without a valid API key (and log now and then)."""
    UNAUTHENTICATED.add(address=address, status=status, code=code)
