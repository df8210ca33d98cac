"""A broker's targets: its integrations, of every kind, in one place.

Every list of a broker's integrations reads it (the integrations command, the dashboard, the
disabled-target alert, the refresh of ISI connections before matching)::

    broker_targets(broker, kind=IntegrationKind.ISI, enabled=True)   # what a cycle refreshes
    broker_targets(None, retired=False)                             # every broker's, not retired
"""

from __future__ import annotations

from django.db.models import QuerySet

from integrations.models import Broker, Integration


def broker_targets(
    broker: Broker | None,
    *,
    kind: str | None = None,
    enabled: bool | None = None,
    retired: bool | None = None,
) -> QuerySet[Integration]:
    """``broker``'s integrations (every broker's for ``None``), by broker id and name, their
    broker fetched with them; each filter applies when given (``retired``: retired or not)."""
    targets = Integration.objects.select_related("broker").order_by("broker__broker_id", "name")
    if broker is not None:
        targets = targets.filter(broker=broker)
    if kind is not None:
        targets = targets.filter(kind=kind)
    if enabled is not None:
        targets = targets.filter(enabled=enabled)
    if retired is not None:
        targets = targets.filter(retired_at__isnull=not retired)
    return targets
