"""Update a row and record what changed: the one audited-edit path of the staff-facing
"edit" services (brokers, integrations webhook and ISI alike, SaaS connections)::

    row_update(integration, changes={"name": "Acme CRM"},
               audit=Audited(LedgerKind.INTEGRATION_UPDATED, broker_id="4821",
                             subject=str(integration.uuid), actor=actor))

The row is read again under a lock, so two edits at once cannot record a diff against a
state the other has already replaced; ``changes`` is applied to it, the columns are saved
(only those: a concurrent write to another column is not overwritten) and the ledger event
gets ``{"changes": {field: {"from": old, "to": new}}}`` for each field whose value changed.
A credential is never shown: its entry says ``{"changed": true}`` or ``{"cleared": true}``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import models, transaction

from integrations.ledger_kinds import LedgerKind
from integrations.services.ledger import ledger_event_append

Row = TypeVar("Row", bound=models.Model)

Adjust = Callable[[Row, Row, dict[str, Any]], list[str]]
"""``adjust(before, after, changed)``: runs once ``changes`` is applied to ``after`` (the
locked row; ``before`` is a copy taken first); may set more attributes on ``after``, add their
entries to ``changed`` (e.g. ``{"changed": True}`` for a secret) and returns their columns.
It may raise ``ValidationError``: nothing is written then."""


@dataclass(frozen=True)
class Audited:
    """The ledger event an edit appends: its kind, whose row it is, and who edits it."""

    kind: LedgerKind
    broker_id: str
    subject: str
    actor: str


def row_update(
    row: Row,
    *,
    changes: Mapping[str, Any],
    audit: Audited,
    adjust: Adjust[Row] | None = None,
    record_unchanged: bool = False,
) -> Row:
    """Apply ``changes`` to ``row`` locked, save and append ``audit``; returns the locked row.

    Nothing is written when no value changed, unless ``record_unchanged``.
    """
    manager = type(row)._default_manager
    with transaction.atomic():
        locked = manager.select_for_update().get(pk=row.pk)
        before = copy.copy(locked)
        changed: dict[str, Any] = {
            name: {"from": getattr(locked, name), "to": value}
            for name, value in changes.items()
            if getattr(locked, name) != value
        }
        for name, value in changes.items():
            setattr(locked, name, value)
        extra = adjust(before, locked, changed) if adjust is not None else []
        if not changed and not record_unchanged:
            return locked
        locked.save(update_fields=list(dict.fromkeys([*changes, *extra])))
        ledger_event_append(
            kind=audit.kind,
            broker_id=audit.broker_id,
            subject=audit.subject,
            actor=audit.actor,
            data={"changes": changed},
        )
    return locked
