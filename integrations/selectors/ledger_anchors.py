"""The ledger's anchoring as staff see it: the authority set (``DROPPORTAL_TSA_URL``), the
last token kept (its ``ledger.anchored`` event), and a failure since::

    status = ledger_anchor_status()
    status.configured, status.last, status.failure
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.conf import settings

from integrations.ledger_kinds import LedgerKind
from integrations.models import LedgerEvent
from integrations.url_extras import without_url_extras

# Said wherever the chain's anchoring is shown while no authority is set.
ANCHORED_NOWHERE = "The ledger's chain is anchored nowhere outside this service."


@dataclass(frozen=True)
class LastAnchor:
    position: int
    event_id: int
    gen_time: dt.datetime
    tsa_url: str


@dataclass(frozen=True)
class AnchorStatus:
    tsa_url: str  # without its query: where tokens travel
    last: LastAnchor | None
    failure: str  # the last attempt's error, when it came after the last token

    @property
    def configured(self) -> bool:
        return bool(self.tsa_url)

    @property
    def anchored_nowhere(self) -> str:
        return "" if self.configured else ANCHORED_NOWHERE


def ledger_anchor_status() -> AnchorStatus:
    """From the ledger's own events (one query while the last attempt succeeded)."""
    kinds = [LedgerKind.LEDGER_ANCHORED, LedgerKind.LEDGER_ANCHOR_FAILED]
    events = LedgerEvent.objects.only("id", "kind", "data").order_by("-id")
    latest = events.filter(kind__in=kinds).first()
    failure = ""
    anchored = latest
    if latest is not None and latest.kind == LedgerKind.LEDGER_ANCHOR_FAILED:
        failure = str(latest.data.get("error", "no token"))
        anchored = events.filter(kind=LedgerKind.LEDGER_ANCHORED).first()
    last = None
    if anchored is not None:
        last = LastAnchor(
            position=int(anchored.data["position"]),
            event_id=int(anchored.data["event_id"]),
            gen_time=dt.datetime.fromisoformat(anchored.data["gen_time"]),
            tsa_url=str(anchored.data["tsa_url"]),
        )
    url = settings.DROPPORTAL_TSA_URL
    return AnchorStatus(tsa_url=without_url_extras(url) if url else "", last=last, failure=failure)
