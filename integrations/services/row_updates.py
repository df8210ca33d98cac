"""Update a row and record what changed: the one audited-edit path of the staff-facing
"edit" services (brokers, integrations webhook and ISI alike, SaaS connections)::

    row_update(integration, changes={"name": "Acme CRM"},
               audit=Audited(LedgerKind.INTEGRATION_UPDATED, broker_id="4821",
                             subject=str(integration.uuid), actor=actor))

The row is read again under a lock, so two edits at once cannot record a diff against a
state the other has already replaced; ``changes`` is applied to it, the columns are saved
(only those: a concurrent write to another column is not overwritten) and the ledger event
gets ``{"changes": {field: {"from": old, "to": new}}}`` for each field whose value changed.

A credential is never shown: the caller passes it in ``quiet`` (columns written without an
entry of their own: a secret, its date, a cache it voids) with its entry in ``entries``
(``{"changed": true}`` or ``{"cleared": true}``). When those depend on the row as it is (a
token kept only while its URL stays), the caller reads it first with ``row_locked``, in the
same transaction::

    with transaction.atomic():
        current = row_locked(connection)
        quiet, entries = token_follows_url(current, changes, token)   # the caller's rule
        row_update(connection, changes=changes, quiet=quiet, entries=entries, audit=...)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import models, transaction

from integrations.ledger_kinds import LedgerKind
from integrations.services.ledger import ledger_event_append

Row = TypeVar("Row", bound=models.Model)


@dataclass(frozen=True)
class Audited:
    """The ledger event an edit appends: its kind, whose row it is, and who edits it."""

    kind: LedgerKind
    broker_id: str
    subject: str
    actor: str


def row_locked(row: Row) -> Row:
    """``row`` read again, locked until the transaction ends (call it inside one)."""
    return type(row)._default_manager.select_for_update().get(pk=row.pk)


def row_update(
    row: Row,
    *,
    changes: Mapping[str, Any],
    audit: Audited,
    quiet: Mapping[str, Any] | None = None,
    entries: Mapping[str, Mapping[str, Any]] | None = None,
    record_unchanged: bool = False,
) -> Row:
    """Apply ``changes`` and ``quiet`` to ``row`` locked, save and append ``audit`` with the
    diff of ``changes`` and ``entries``; returns the locked row.

    Nothing is written when no value of ``changes`` changed and there is no entry, unless
    ``record_unchanged``.
    """
    quiet = quiet or {}
    with transaction.atomic():
        locked = row_locked(row)
        changed: dict[str, Any] = {
            name: {"from": getattr(locked, name), "to": value}
            for name, value in changes.items()
            if getattr(locked, name) != value
        }
        changed.update(entries or {})
        if not changed and not record_unchanged:
            return locked
        for name, value in {**changes, **quiet}.items():
            setattr(locked, name, value)
        locked.save(update_fields=list(dict.fromkeys([*changes, *quiet])))
        ledger_event_append(
            kind=audit.kind,
            broker_id=audit.broker_id,
            subject=audit.subject,
            actor=audit.actor,
            data={"changes": changed},
        )
    return locked
