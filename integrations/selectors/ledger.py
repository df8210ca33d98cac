"""The ledger, in order, as export rows (the ledger command and the admin's export), and
each broker's latest of a set of events (the alerts, and the stuck check's record)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from integrations.models import LedgerEvent

LEDGER_COLUMNS = (
    "id",
    "created_at",
    "broker_id",
    "kind",
    "subject",
    "actor",
    "data",
    "event_hash",
    "chain_hash",
)


def ledger_events(
    *,
    broker_id: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    events: QuerySet[LedgerEvent] | None = None,
    chunk_size: int = 5000,
) -> Iterator[dict[str, Any]]:
    """Ledger events in order, as export rows (``chain_hash`` empty until sealed).

    ``events`` narrows them further (the admin's filtered list); default: all of them.
    """
    base = LedgerEvent.objects.all() if events is None else events
    events = base.order_by("id").select_related("chain_link")
    if broker_id:
        events = events.filter(broker_id=broker_id)
    if since:
        events = events.filter(created_at__gte=since)
    if until:
        events = events.filter(created_at__lt=until)
    # Inside a transaction the server-side cursor streams; outside one (autocommit) it is
    # WITH HOLD and PostgreSQL copies the whole result (for an unfiltered export, the whole
    # ledger) before the first row.
    with transaction.atomic():
        for event in events.iterator(chunk_size=chunk_size):
            link = getattr(event, "chain_link", None)
            yield {
                "id": event.id,
                "created_at": event.created_at,
                "broker_id": event.broker_id,
                "kind": event.kind,
                "subject": event.subject,
                "actor": event.actor,
                "data": event.data,
                "event_hash": event.event_hash,
                "chain_hash": link.chain_hash if link else "",
            }


def ledger_last_by_broker(events: QuerySet[LedgerEvent]) -> QuerySet[LedgerEvent]:
    """Each broker's latest of ``events``, in one query (``DISTINCT ON``)."""
    return events.order_by("broker_id", "-id").distinct("broker_id")
