"""DROP access: the obligations a long outage created that still await their notice, for the
dashboard, ``drop doctor`` and the alerts::

    for obligation in drop_access_obligations_open(broker=broker):
        obligation.failure_started_at, obligation.due_date
"""

from __future__ import annotations

from django.db.models import QuerySet

from integrations.models import Broker, DropAccessObligation


def drop_access_obligations_open(*, broker: Broker | None = None) -> QuerySet[DropAccessObligation]:
    """Obligations awaiting the written notice to CalPrivacy, nearest due first (with their
    broker and outage)."""
    rows = DropAccessObligation.objects.awaiting_notice().select_related("broker", "outage")
    if broker is not None:
        rows = rows.filter(broker=broker)
    return rows.order_by("due_date", "pk")
