"""Status reporting: the response files of the pack and DROP's answers (``drop/``), and per
cycle whether every status reached DROP by the cycle's due date."""

from __future__ import annotations

from collections import Counter

from django.db import connection

from integrations.evidence import pack
from integrations.ledger_kinds import LedgerKind
from integrations.services.evidence.components.base import Component, PackContext
from integrations.services.evidence.evidence_period import DEADLINE_FAILED
from integrations.services.ledger import actor_person

APPROVAL_KINDS = (
    LedgerKind.REPORT_FILE_AWAITING_APPROVAL.value,
    LedgerKind.REPORT_FILE_APPROVED.value,
    LedgerKind.REPORT_FILE_APPROVAL_REJECTED.value,
)
_KINDS = sorted(k.value for k in LedgerKind if k.value.startswith("report_file."))
_DECISIONS = """
SELECT subject, actor, data->>'written_by' FROM integrations_ledgerevent
WHERE broker_id = %(broker_id)s
  AND kind = ANY(%(kinds)s)
  AND created_at >= %(start)s AND created_at < %(end)s
ORDER BY id
"""
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
    cycles = []
    late = []
    for summary in context.cycle_summaries:
        cycle = summary["cycle"]
        reported_at = summary["reported_at"]
        verdict = summary["deadline"]
        if verdict in DEADLINE_FAILED:
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
        cursor.execute(
            _DECISIONS,
            {
                "broker_id": context.broker.broker_id,
                "kinds": [
                    LedgerKind.REPORT_FILE_APPROVED.value,
                    LedgerKind.REPORT_FILE_APPROVAL_REJECTED.value,
                ],
                "start": start,
                "end": end,
            },
        )
        self_approved = [
            file_name
            for file_name, actor, written_by in cursor.fetchall()
            if (person := actor_person(actor)) is not None
            and person == actor_person(written_by or "")
        ]
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
    decided = (
        events[LedgerKind.REPORT_FILE_APPROVED] + events[LedgerKind.REPORT_FILE_APPROVAL_REJECTED]
    )
    component.test(
        "every file held for approval was decided by someone other than its writer",
        passed=not self_approved,
        detail=(
            "decided by their own writer: " + ", ".join(self_approved)
            if self_approved
            else f"{decided} decision(s) on files held for approval"
        ),
    )
    return component
