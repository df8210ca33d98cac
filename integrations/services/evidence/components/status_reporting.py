"""Status reporting: the response files of the pack and DROP's answers (``drop/``), and per
cycle whether every status reached DROP by the cycle's due date."""

from __future__ import annotations

from collections import Counter

from django.db import connection

from integrations.drop.calendar import drop_date
from integrations.evidence import pack
from integrations.ledger_kinds import LedgerKind
from integrations.services.evidence.components.base import Component, PackContext

# Counted by their plain names: the upload approval's kinds may not be in every version.
APPROVAL_KINDS = ("report_file.awaiting_approval", "report_file.approved", "report_file.rejected")
_KINDS = sorted(
    {k.value for k in LedgerKind if k.value.startswith("report_file.")} | {*APPROVAL_KINDS}
)
_EVENT_COUNTS = """
SELECT kind, count(*) FROM integrations_ledgerevent
WHERE broker_id = %(broker_id)s AND kind = ANY(%(kinds)s)
  AND created_at >= %(start)s AND created_at < %(end)s
GROUP BY kind ORDER BY kind
"""


def build(context: PackContext) -> Component:
    start, end = context.window
    component = Component(
        key="status_reporting",
        proves=(
            "Every response file the service sent DROP for the pack's cycles, byte for byte, "
            "and what DROP answered (drop/), each with its ledger events and each status in "
            "it with its work item's event; when each cycle had every status reported, "
            "against its due date."
        ),
        cannot_prove=(
            "That DROP received or kept a file: DROP's answer is as the service recorded it, "
            "and DROP's own records are the counterpart. A file uploaded by hand in DROP's "
            "portal is as staff recorded it."
        ),
    )
    today = drop_date(context.exported_at)
    cycles = []
    late = []
    for summary in context.cycle_summaries:
        cycle = summary["cycle"]
        reported_at = summary["reported_at"]
        if summary["met"]:
            verdict = "met"
        elif reported_at is not None:
            verdict = "missed"
        else:
            verdict = "open" if today <= cycle.due_date else "overdue"
        if verdict in ("missed", "overdue"):
            late.append(f"cycle {cycle.drop_session_id} due {cycle.due_date}: {verdict}")
        cycles.append(
            {
                "cycle": cycle.drop_session_id,
                "downloaded_at": cycle.downloaded_at.isoformat(),
                "due_date": cycle.due_date.isoformat(),
                "all_reported_at": reported_at.isoformat() if reported_at else None,
                "deadline": verdict,
                "without_status": summary["open"],
                "amendments": summary["amendments"],
            }
        )
    by_state = dict(sorted(Counter(f.state for f in context.period.report_files()).items()))
    with connection.cursor() as cursor:
        cursor.execute(
            _EVENT_COUNTS,
            {"broker_id": context.broker.broker_id, "kinds": _KINDS, "start": start, "end": end},
        )
        events = {kind: 0 for kind in APPROVAL_KINDS} | dict(cursor.fetchall())
    component.records = {
        "cycles": cycles,
        "files_by_state": by_state,
        "report_file_events": events,
    }
    component.files = [
        entry["name"]
        for entry in context.writer.entries
        if str(entry["name"]).startswith(pack.DROP_DIR)
    ]
    component.test(
        "every cycle's statuses reported to DROP by its due date",
        passed=not late,
        detail="; ".join(late)
        or f"{len(cycles)} cycle(s): " + ", ".join(f"{c['cycle']} {c['deadline']}" for c in cycles),
    )
    return component
