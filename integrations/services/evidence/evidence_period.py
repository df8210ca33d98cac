"""What an evidence pack covers: a cycle's, or a period's, deletion requests, response files
and DROP cycles, read by ``services.evidence.evidence`` inside its one snapshot::

    period = Period(broker=broker, cycle=cycle, since=None, until=None)
    period.outcome_chunks()     # the outcome history, CSV bytes from PostgreSQL's COPY
    period.report_files()       # the response files DROP got, without their content
    report_file_content(pk)     # one file's bytes, in chunks
    period.ledger_since()       # where the pack's ledger range starts
    period.cycle_summaries(today=drop_date(exported_at))  # per cycle, its deadline's verdict
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from django.db import connection
from django.db.models import Case, CharField, Count, Q, Value, When
from django.db.models.functions import Cast

from integrations.drop.calendar import drop_date
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    CycleState,
    DeletionRequest,
    DropCycle,
    ReportFile,
    ReportFileState,
    ReportKind,
    RequestState,
    WorkItem,
    WorkItemState,
    no_status_held,
)
from integrations.selectors.drop_metrics import METRIC_STATUSES
from integrations.selectors.outcomes import deletion_outcomes_csv

_CONTENT_CHUNK = 8 << 20
_OPEN_REQUEST_STATES = (
    RequestState.PENDING,
    RequestState.QUEUED,
    RequestState.DISPATCHED,
    RequestState.FAILED,
    RequestState.UNDELIVERABLE,
)
# Every file DROP got, whatever it answered (a refused or discarded one too: what was
# tried, and why it was given up, is evidence).
_SENT_STATES = (
    ReportFileState.ACCEPTED,
    ReportFileState.REJECTED,
    ReportFileState.MANUAL,
    ReportFileState.REFUSED,
    ReportFileState.DISCARDED,
)


class Period:
    def __init__(
        self,
        *,
        broker: Broker,
        cycle: DropCycle | None,
        since: dt.datetime | None,
        until: dt.datetime | None,
    ) -> None:
        self.broker, self.cycle, self.since, self.until = broker, cycle, since, until

    def describe(self) -> dict[str, Any]:
        if self.cycle is not None:
            return {
                "cycle": self.cycle.drop_session_id,
                "downloaded_at": self.cycle.downloaded_at.isoformat(),
            }
        assert self.since is not None and self.until is not None
        return {"since": self.since.isoformat(), "until": self.until.isoformat()}

    def requests(self) -> Any:
        # DROP's requests: a canary round's are tests, in the actioning component's records.
        requests = DeletionRequest.objects.filter(broker=self.broker, canary_round__isnull=True)
        if self.cycle is not None:
            return requests.filter(drop_session_id=self.cycle.drop_session_id)
        return requests.filter(matched_at__gte=self.since, matched_at__lt=self.until)

    def requests_open(self) -> int:
        """The period's deletion requests with no final outcome yet."""
        return int(self.requests().filter(state__in=_OPEN_REQUEST_STATES).count())

    def outcome_chunks(self) -> Iterator[bytes]:
        return deletion_outcomes_csv(requests=self.requests())

    def report_files(self) -> Iterator[ReportFile]:
        files = ReportFile.objects.filter(broker=self.broker, state__in=_SENT_STATES)
        if self.cycle is not None:
            files = files.filter(cycle=self.cycle)
        else:
            files = files.filter(created_at__gte=self.since, created_at__lt=self.until)
        return (
            files.select_related("cycle")
            .defer("content")
            .order_by("cycle__downloaded_at", "created_at", "pk")
            .iterator(chunk_size=100)
        )

    def cycles(self) -> Any:
        if self.cycle is not None:
            return DropCycle.objects.filter(pk=self.cycle.pk)
        sessions = self.requests().values("drop_session_id").distinct()
        files = ReportFile.objects.filter(
            broker=self.broker,
            state__in=_SENT_STATES,
            created_at__gte=self.since,
            created_at__lt=self.until,
        ).values("cycle_id")
        downloaded = DropCycle.objects.filter(
            broker=self.broker, downloaded_at__gte=self.since, downloaded_at__lt=self.until
        ).values("pk")
        return DropCycle.objects.filter(broker=self.broker).filter(
            Q(drop_session_id__in=sessions) | Q(pk__in=files) | Q(pk__in=downloaded)
        )

    def ledger_since(self) -> dt.datetime:
        earliest = min(
            (c.downloaded_at for c in self.cycles().only("downloaded_at")),
            default=self.since or self.cycle.downloaded_at,  # type: ignore[union-attr]
        )
        return min(earliest, self.since) if self.since else earliest

    def cycle_summaries(self, *, today: dt.date) -> list[dict[str, Any]]:
        """Per cycle: its work items by the status DROP holds, its amendments, when DROP held
        every status it owes (``_CYCLE_REPORTED_AT``), and its deadline's verdict
        (``cycle_deadline``) on ``today``."""
        cycles = list(self.cycles().order_by("downloaded_at"))
        counts: dict[int, dict[str, int]] = {cycle.pk: {} for cycle in cycles}
        for cycle_id, key, count in _cycle_counts([cycle.pk for cycle in cycles]):
            counts[cycle_id][key] = count
        summaries = []
        for cycle in cycles:
            with connection.cursor() as cursor:
                cursor.execute(
                    _CYCLE_REPORTED_AT,
                    [self.broker.broker_id, _ALL_STATUSES_HELD, cycle.drop_session_id],
                )
                reported_at = cursor.fetchone()[0]
            amendments = ReportFile.objects.filter(
                cycle=cycle, kind=ReportKind.AMEND, state__in=_SENT_STATES
            ).count()
            summaries.append(
                {
                    "cycle": cycle,
                    "counts": [(label, counts[cycle.pk].get(k, 0)) for k, label in _STATUS_LABELS],
                    "open": counts[cycle.pk].get("open", 0),
                    "amendments": amendments,
                    "reported_at": reported_at,
                    "deadline": cycle_deadline(cycle, reported_at=reported_at, today=today),
                }
            )
        return summaries


# The verdicts of ``cycle_deadline`` that fail the status reporting component's test.
DEADLINE_FAILED = ("missed", "overdue")


def cycle_deadline(cycle: DropCycle, *, reported_at: dt.datetime | None, today: dt.date) -> str:
    """Whether every status ``cycle`` owes reached DROP by its due date (days of DROP's
    calendar), ``reported_at`` the moment DROP first held them all (an amendment after it
    owes none): "met", "missed" (reported after it), "open" (not yet, and not yet due),
    "overdue" (not yet, and past it), or "nothing owed": DROP's package held no work item,
    or only rows that owe nothing (``UnreadableWorkItem.objects.owed()``), and no status is
    owed for an empty file, so none is ever reported."""
    if cycle.state == CycleState.NOTHING_OWED:
        return "nothing owed"
    if reported_at is None:
        return "open" if today <= cycle.due_date else "overdue"
    return "met" if drop_date(reported_at) <= cycle.due_date else "missed"


# In the order of DROP's figures: complied with, denied, not found.
_STATUS_LABELS = (
    *(
        (str(status.value), f"{status.value} {status.label.lower()}")
        for statuses in METRIC_STATUSES.values()
        for status in statuses
    ),
    ("open", "no status yet"),
    ("removed", "removed by DROP"),
)


def _cycle_counts(cycle_pks: list[int]) -> Iterator[tuple[int, str, int]]:
    """The cycles' work items by the status DROP holds (the reported one, as text), with
    none held (``no_status_held``: "open") or removed: (cycle pk, key, count)."""
    held = Case(
        When(state=WorkItemState.REMOVED, then=Value("removed")),
        When(no_status_held(), then=Value("open")),
        default=Cast("reported_status_code", CharField()),
    )
    rows = (
        WorkItem.objects.filter(cycle_id__in=cycle_pks)
        .annotate(held=held)
        .values("cycle_id", "held")
        .annotate(n=Count("pk"))
        .order_by()
        .values_list("cycle_id", "held", "n")
    )
    yield from rows


# When DROP first held a status for everything the cycle owes: the cycle reported, or before
# that still open for an amendment (``cycle_state_refresh``). An amendment sent later changes
# no deadline: DROP held a status for its items all along (``owed_status``). Either event's
# own time, or the upload by hand staff marked later (its ``reported_at``).
_ALL_STATUSES_HELD = [
    kind.value for kind in (LedgerKind.DROP_CYCLE_STATUSES_HELD, LedgerKind.DROP_CYCLE_REPORTED)
]
_CYCLE_REPORTED_AT = """
SELECT min(coalesce((data->>'reported_at')::timestamptz, created_at))
FROM integrations_ledgerevent
WHERE broker_id = %s AND kind = ANY(%s) AND subject = %s
"""


def report_file_content(pk: int) -> Iterator[bytes]:
    offset = 1
    with connection.cursor() as cursor:
        while True:
            cursor.execute(
                "SELECT substring(content FROM %s FOR %s) FROM integrations_reportfile "
                "WHERE id = %s",
                [offset, _CONTENT_CHUNK, pk],
            )
            chunk = bytes(cursor.fetchone()[0])
            if not chunk:
                return
            yield chunk
            offset += len(chunk)


def report_file_answer(report_file: ReportFile) -> dict[str, Any]:
    discarded = (
        {
            "discard_reason": report_file.discard_reason,
            "discarded_by": report_file.discarded_by,
            "discarded_at": report_file.discarded_at.isoformat()
            if report_file.discarded_at
            else None,
        }
        if report_file.state == ReportFileState.DISCARDED
        else {}
    )
    return {
        "cycle": report_file.cycle.drop_session_id,
        "file_name": report_file.file_name,
        "kind": report_file.kind,
        "state": report_file.state,
        "rows": report_file.rows,
        "sha256": report_file.sha256,
        "created_at": report_file.created_at.isoformat(),
        "uploaded_at": report_file.uploaded_at.isoformat() if report_file.uploaded_at else None,
        "drop_response": report_file.drop_response,
        **discarded,
    }
