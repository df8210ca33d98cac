"""Recording who exported the outcome history: an export is an auditable access.

Called before the rows stream (their number is not known yet), with the filters used::

    outcome_export_record(actor="staff:alice", via="admin", broker_id="", filters={"requests": 12})
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from integrations.ledger_kinds import LedgerKind
from integrations.services.ledger import ledger_event_append


def outcome_export_record(
    *, actor: str, via: str, broker_id: str = "", filters: dict[str, Any], fmt: str = "csv"
) -> None:
    """One ``outcomes.exported`` event: who, through what (command, api, admin), which rows."""
    with transaction.atomic():
        ledger_event_append(
            kind=LedgerKind.OUTCOMES_EXPORTED,
            broker_id=broker_id,
            subject=via,
            actor=actor,
            data={"via": via, "format": fmt, "filters": filters},
        )


def ledger_export_record(*, actor: str, via: str, filters: dict[str, Any], fmt: str) -> None:
    """One ``ledger.exported`` event, written before the export it announces (so it is in it)."""
    with transaction.atomic():
        ledger_event_append(
            kind=LedgerKind.LEDGER_EXPORTED,
            subject=via,
            actor=actor,
            data={"via": via, "format": fmt, "filters": filters},
        )


def report_files_export_record(
    *, actor: str, broker_id: str, cycle: str, files: int, file_name: str | None = None
) -> None:
    """One ``report_files.exported`` event: who took a cycle's response files as a ZIP, or
    one of them (``file_name``) from its row."""
    one = {} if file_name is None else {"file_name": file_name}
    with transaction.atomic():
        ledger_event_append(
            kind=LedgerKind.REPORT_FILES_EXPORTED,
            broker_id=broker_id,
            subject=f"cycle {cycle}",
            actor=actor,
            data={"via": "admin", "cycle": cycle, "files": files, **one},
        )
