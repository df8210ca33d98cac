"""What a superuser changes in the service's machinery from the admin (the login lockouts of
django-axes, the jobs of Procrastinate): their own admins change it, and this records it,
as every other change in the admin is recorded::

    machinery_change_record(model="axes.AccessAttempt", action="delete", ids=[4], actor=actor)
"""

from __future__ import annotations

from collections.abc import Sequence

from integrations.ledger_kinds import LedgerKind
from integrations.services.ledger import ledger_event_append

IDS_KEPT = 100  # a long selection is counted in full, its first ids named


def machinery_change_record(*, model: str, action: str, ids: Sequence[int], actor: str) -> None:
    """One ``machinery.changed`` event: which table, which action, on which rows, by whom."""
    ledger_event_append(
        kind=LedgerKind.MACHINERY_CHANGED,
        subject=model,
        actor=actor,
        data={"action": action, "rows": len(ids), "ids": sorted(ids)[:IDS_KEPT]},
    )
