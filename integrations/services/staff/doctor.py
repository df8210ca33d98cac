"""The periodic check for work items no automatic path will bring to a DROP status.

``selectors.stuck.stuck_work_items`` finds them (``drop doctor`` prints it); this records what the
periodic job found, per broker, in the ledger, for the dashboard's broker card::

    groups = stuck_work_items_check(actor="system:doctor")

One ``drop.doctor_checked`` event per broker whose result changed since its last one (a
broker that stays healthy, or stuck the same way, writes nothing new).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction

from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, LedgerEvent
from integrations.selectors.ledger import ledger_last_by_broker
from integrations.selectors.stuck import StuckGroup, stuck_work_items
from integrations.services.ledger import SYSTEM_ACTOR, ledger_event_append

DOCTOR_EVENT = LedgerKind.DROP_DOCTOR_CHECKED


def _summary(groups: list[StuckGroup]) -> list[dict[str, Any]]:
    return [group.as_json() for group in groups]


def _same(one: list[dict[str, Any]], other: list[dict[str, Any]]) -> bool:
    # A link may carry the time it was made at (no callback for 7 days "before now").
    def key(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in g.items() if k != "admin_path"} for g in groups]

    return key(one) == key(other)


def stuck_work_items_check(
    *, actor: str = SYSTEM_ACTOR, now: dt.datetime | None = None
) -> list[StuckGroup]:
    """Run ``stuck_work_items`` for every broker; record each broker's changed result.

    Returns every group found (all brokers).
    """
    groups = stuck_work_items(now=now)
    by_broker: dict[str, list[StuckGroup]] = {}
    for group in groups:
        by_broker.setdefault(group.broker_id, []).append(group)
    last = {
        event.broker_id: event.data.get("groups", [])
        for event in ledger_last_by_broker(LedgerEvent.objects.filter(kind=DOCTOR_EVENT))
    }
    with transaction.atomic():
        for broker_id in Broker.objects.order_by("broker_id").values_list("broker_id", flat=True):
            summary = _summary(by_broker.get(broker_id, []))
            if _same(summary, last.get(broker_id, [])):
                continue
            ledger_event_append(
                kind=DOCTOR_EVENT,
                broker_id=broker_id,
                subject=broker_id,
                actor=actor,
                data={
                    "stuck_work_items": sum(g["work_items"] for g in summary),
                    "groups": summary,
                },
            )
    return groups
