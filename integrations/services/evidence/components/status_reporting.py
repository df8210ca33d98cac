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

# The work items of the pack's cycles whose status DROP holds (reported_status_code, what the
# yearly figures count) is not the row of the file DROP holds it from (report_file): each
# file's rows read from its stored bytes (``Id,Status``, CRLF, a header line first).
_NOT_AS_FILED = """
WITH filed AS MATERIALIZED (
    SELECT f.id AS file_id, split_part(t.line, ',', 1) AS work_item_id,
           split_part(t.line, ',', 2) AS code
      FROM integrations_reportfile f
     CROSS JOIN LATERAL string_to_table(convert_from(f.content, 'UTF8'), E'\r\n')
           WITH ORDINALITY AS t(line, n)
     WHERE f.id IN (SELECT DISTINCT report_file_id FROM integrations_workitem
                     WHERE cycle_id = ANY(%(cycles)s) AND report_file_id IS NOT NULL)
       AND t.n > 1 AND t.line <> ''
), differing AS MATERIALIZED (
    SELECT w.work_item_id, w.reported_status_code, r.code
      FROM integrations_workitem w
      LEFT JOIN filed r ON r.file_id = w.report_file_id AND r.work_item_id = w.work_item_id
     WHERE w.cycle_id = ANY(%(cycles)s) AND w.report_file_id IS NOT NULL
       AND r.code IS DISTINCT FROM w.reported_status_code::text
)
SELECT count(*) OVER (), work_item_id, reported_status_code, code
  FROM differing
 ORDER BY work_item_id
 LIMIT 5
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
            "portal, and when, is as staff recorded it."
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
    with connection.cursor() as cursor:
        cursor.execute(
            _NOT_AS_FILED, {"cycles": [summary["cycle"].pk for summary in context.cycle_summaries]}
        )
        not_as_filed = cursor.fetchall()
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
    component.test(
        "every status DROP holds is the one in the file DROP accepted",
        passed=not not_as_filed,
        detail=(
            f"{not_as_filed[0][0]} work item(s) whose status DROP holds is not their file's: "
            + ", ".join(
                f"work item {item}: {held} held, "
                + (f"{filed} in its file" if filed is not None else "not in its file")
                for _, item, held, filed in not_as_filed
            )
            if not_as_filed
            else "each status DROP holds is its work item's row in the file DROP accepted"
        ),
    )
    return component
