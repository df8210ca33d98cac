"""A file uploaded by hand in DROP's portal, marked uploaded later: DROP holds its statuses
from the upload staff give (in DROP's calendar), not from the marking.

The case that matters: the file uploaded on the cycle's due date in the evening and marked
the next morning. What a user sees: the rows' reported time (the days to respond), the
evidence pack's deadline verdict, the ledger event.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from integrations.drop.calendar import drop_midnight, drop_today
from integrations.models import (
    Broker,
    CycleState,
    DropCycle,
    LedgerEvent,
    ReportFile,
    ReportFileState,
    WorkItem,
)
from integrations.services.evidence.evidence_period import Period
from integrations.services.reporting.report_files import report_files_write
from integrations.services.reporting.report_manual import report_file_mark_uploaded
from tests.builders import DropCycleFactory, WorkItemFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def cycle(broker: Broker) -> DropCycle:
    """Downloaded 46 days ago in DROP's calendar: due yesterday, its 45th day."""
    cycle = DropCycleFactory.create(broker=broker, match_date=drop_today() - dt.timedelta(days=46))
    assert cycle.due_date == drop_today() - dt.timedelta(days=1)
    WorkItemFactory.create(cycle=cycle, status_code=3, work_item_id="EmailDeleted")
    WorkItemFactory.create(cycle=cycle, status_code=5, work_item_id="EmailNotFnd1")
    return cycle


@pytest.fixture
def email(cycle: DropCycle) -> ReportFile:
    """The cycle's one file, written three days ago."""
    (written,) = report_files_write(broker=cycle.broker, cycle=cycle)
    ReportFile.objects.filter(pk=written.pk).update(
        created_at=timezone.now() - dt.timedelta(days=3)
    )
    written.refresh_from_db()
    return written


def due_day_evening(cycle: DropCycle) -> dt.datetime:
    """21:30 on the cycle's due date, DROP's calendar: always before now (it was yesterday)."""
    return drop_midnight(cycle.due_date) + dt.timedelta(hours=21, minutes=30)


def verdict(cycle: DropCycle) -> tuple[str, dt.datetime | None]:
    (summary,) = Period(broker=cycle.broker, cycle=cycle, since=None, until=None).cycle_summaries(
        today=drop_today()
    )
    return summary["deadline"], summary["reported_at"]


def test_a_file_uploaded_on_the_due_date_and_marked_next_morning_met_it(
    cycle: DropCycle, email: ReportFile
) -> None:
    uploaded = due_day_evening(cycle)
    before = timezone.now()

    report_file_mark_uploaded(report_file=email, actor="staff:alice", uploaded_at=uploaded)

    assert set(WorkItem.objects.values_list("reported_at", flat=True)) == {uploaded}
    email.refresh_from_db()
    assert (email.state, email.uploaded_at) == (ReportFileState.MANUAL, uploaded)
    cycle.refresh_from_db()
    assert cycle.state == CycleState.REPORTED
    assert verdict(cycle) == ("met", uploaded)
    # The event says when DROP got it; its own time is the marking.
    event = LedgerEvent.objects.get(kind="report_file.marked_uploaded")
    assert dt.datetime.fromisoformat(event.data["uploaded_at"]) == uploaded
    assert event.created_at >= before
    reported = LedgerEvent.objects.get(kind="drop_cycle.reported")
    assert dt.datetime.fromisoformat(reported.data["reported_at"]) == uploaded
    assert reported.created_at >= before


def test_no_time_given_is_now_and_a_marking_after_the_due_date_missed_it(
    cycle: DropCycle, email: ReportFile
) -> None:
    before = timezone.now()

    report_file_mark_uploaded(report_file=email, actor="staff:alice")

    email.refresh_from_db()
    assert email.uploaded_at is not None and before <= email.uploaded_at <= timezone.now()
    assert set(WorkItem.objects.values_list("reported_at", flat=True)) == {email.uploaded_at}
    event = LedgerEvent.objects.get(kind="report_file.marked_uploaded")
    assert dt.datetime.fromisoformat(event.data["uploaded_at"]) == email.uploaded_at
    assert verdict(cycle)[0] == "missed"


def test_the_cycle_is_reported_when_its_last_file_reached_drop(
    cycle: DropCycle, email: ReportFile
) -> None:
    # A second list: its file uploaded (and marked) after the first's upload by hand.
    WorkItemFactory.create(
        cycle=cycle, list_type="Phone", status_code=4, work_item_id="PhoneOptdOut"
    )
    (phone,) = report_files_write(broker=cycle.broker, cycle=cycle)
    report_file_mark_uploaded(report_file=phone, actor="staff:alice")
    phone.refresh_from_db()

    report_file_mark_uploaded(
        report_file=email, actor="staff:alice", uploaded_at=due_day_evening(cycle)
    )

    assert verdict(cycle) == ("missed", phone.uploaded_at)


@pytest.mark.parametrize(
    ("when", "refusal"),
    [
        (lambda email: timezone.now() + dt.timedelta(minutes=5), "is in the future"),
        (
            lambda email: email.created_at - dt.timedelta(minutes=1),
            "is before the file was written",
        ),
    ],
    ids=["future", "before-written"],
)
def test_an_upload_time_that_cannot_be_is_refused(
    cycle: DropCycle,
    email: ReportFile,
    when: Callable[[ReportFile], dt.datetime],
    refusal: str,
) -> None:
    with pytest.raises(ValidationError, match=refusal) as refused:
        report_file_mark_uploaded(report_file=email, actor="staff:alice", uploaded_at=when(email))

    assert email.file_name in refused.value.messages[0]
    assert "give the time it was uploaded in DROP's portal" in refused.value.messages[0]
    assert ReportFile.objects.get(pk=email.pk).state == ReportFileState.WRITTEN
    assert not WorkItem.objects.filter(reported_at__isnull=False).exists()
    assert not LedgerEvent.objects.filter(kind="report_file.marked_uploaded").exists()
