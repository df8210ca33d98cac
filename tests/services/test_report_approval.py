"""A second pair of eyes before DROP hears anything: a broker's "approve uploads".

With it on, every response file waits (``awaiting_approval``) until a person other than its
writer approves it; only then is it uploaded, to the loopback DROP. What a user notices:
what DROP received, the file states, the work items still owed, the ledger, the alerts and
``drop doctor``'s groups.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import psycopg
import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob

from devtools.drop_simulator import DropSimulator
from integrations.drop.calendar import drop_midnight, drop_timezone, drop_today
from integrations.drop.client import DropClient, DropLimits
from integrations.models import (
    AlertState,
    Broker,
    CycleState,
    DropCycle,
    LedgerEvent,
    ReportFile,
    ReportFileState,
    WorkItem,
    WorkItemState,
)
from integrations.selectors.cycle_progress import cycle_progress
from integrations.selectors.dashboard import work_item_counts
from integrations.selectors.deadlines import cycle_deadlines
from integrations.selectors.report_reviews import report_file_review
from integrations.selectors.stuck import StuckReason, stuck_work_items
from integrations.services.cycle.work_items import work_item_status_set
from integrations.services.evidence.evidence_period import Period
from integrations.services.ledger import SYSTEM_ACTOR
from integrations.services.reporting import report_uploads
from integrations.services.reporting.report_approval import (
    actor_person,
    report_file_approve,
    report_file_reject,
)
from integrations.services.reporting.report_files import report_files_write
from integrations.services.reporting.report_manual import report_file_mark_uploaded
from integrations.services.reporting.report_uploads import report_files_upload
from integrations.services.reporting.reports import report_auto, report_run
from integrations.services.staff.alerts import alerts_evaluate
from integrations.services.staff.brokers import broker_update
from tests.builders import DropCycleFactory, WorkItemFactory, broker_reports_to
from tests.conftest import database_url

pytestmark = pytest.mark.django_db

EMAIL = "20260312_4821_Email.csv"
PHONE = "20260312_4821_Phone.csv"
REPORT_JOBS = "integrations.tasks.report_broker"


@pytest.fixture
def client(drop: DropSimulator) -> DropClient:
    return DropClient(
        drop.url,
        drop.api_key,
        sleep=lambda _: None,
        limits=DropLimits(max_retries=1, connect_timeout=1, read_timeout=2),
        allow_private=True,
    )


@pytest.fixture
def approving(broker: Broker, drop: DropSimulator) -> Broker:
    """A broker with a DROP key whose uploads wait for approval (set as staff set it)."""
    broker_reports_to(broker, drop)
    return broker_update(broker=broker, approve_uploads=True, actor="staff:carol")


@pytest.fixture
def cycle(approving: Broker) -> DropCycle:
    """Email: two statuses (3 and 5); Phone: one (4)."""
    cycle = DropCycleFactory.create(broker=approving)
    WorkItemFactory.create(cycle=cycle, status_code=3, work_item_id="EmailDeleted")
    WorkItemFactory.create(cycle=cycle, status_code=5, work_item_id="EmailNotFnd1")
    WorkItemFactory.create(
        cycle=cycle, list_type="Phone", status_code=4, work_item_id="PhoneOptdOut"
    )
    return cycle


def noon(day: dt.date) -> dt.datetime:
    """Noon of a DROP day: the alerts' "now" on that day whatever the machine's zone."""
    return dt.datetime.combine(day, dt.time(12), tzinfo=drop_timezone())


def files() -> dict[str, str]:
    return dict(ReportFile.objects.values_list("file_name", "state"))


def test_the_setting_is_a_broker_update_in_the_ledger(approving: Broker) -> None:
    event = LedgerEvent.objects.filter(kind="broker.updated").latest("id")
    assert event.actor == "staff:carol"
    assert event.data["changes"]["approve_uploads"] == {"from": False, "to": True}


def test_a_file_waits_for_approval_and_nothing_reaches_drop(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    run = report_run(broker=cycle.broker, upload=True, client=client, actor="cli:alice")

    assert files() == {
        EMAIL: ReportFileState.AWAITING_APPROVAL,
        PHONE: ReportFileState.AWAITING_APPROVAL,
    }
    assert run.accepted == [] and drop.uploaded == {}
    assert drop.calls("/data/upload") == []
    # Still owed: the deadline, the dashboard's counts and the cycle say so.
    (deadline,) = cycle_deadlines(today=dt.date(2026, 3, 20))
    assert deadline.owed == 3
    assert work_item_counts([cycle.pk])[1] == {cycle.pk: 3}
    progress = cycle_progress(cycle=cycle, start=cycle.match_date, today=dt.date(2026, 3, 20))
    assert (progress.owed, progress.reported) == (3, 0)
    cycle.refresh_from_db()
    assert cycle.state == CycleState.OPEN
    waiting = LedgerEvent.objects.get(kind="report_file.awaiting_approval", subject=EMAIL)
    assert waiting.actor == "cli:alice"
    assert waiting.data["list"] == "Email"
    assert waiting.data["statuses"] == {"2": 0, "3": 1, "4": 0, "5": 1}
    assert waiting.data["written_by"] == "cli:alice"


def test_a_waiting_files_rows_go_into_no_other_file(cycle: DropCycle) -> None:
    report_files_write(broker=cycle.broker, actor="cli:alice")
    assert report_files_write(broker=cycle.broker, actor="cli:alice") == []
    email = ReportFile.objects.get(file_name=EMAIL)
    with pytest.raises(ValidationError, match="only a written or refused file"):
        report_file_mark_uploaded(report_file=email, actor="staff:bob")


def test_the_review_counts_the_files_bytes(cycle: DropCycle) -> None:
    report_files_write(broker=cycle.broker, actor="cli:alice")

    review = report_file_review(ReportFile.objects.get(file_name=EMAIL))

    assert (review.list_type, review.rows, review.by_status) == (
        "Email",
        2,
        {2: 0, 3: 1, 4: 0, 5: 1},
    )
    assert review.text == "Email upload, 2 rows: 3 deleted 1, 5 not found 1"


def test_whoever_wrote_it_cannot_approve_or_reject_it(cycle: DropCycle) -> None:
    report_files_write(broker=cycle.broker, actor="staff:alice")
    email = ReportFile.objects.get(file_name=EMAIL)

    # The same person in the admin and on the command line.
    for actor in ("staff:alice", "cli:alice"):
        with pytest.raises(ValidationError, match="a second person must approve it"):
            report_file_approve(report_file=email, actor=actor)
        with pytest.raises(ValidationError, match="a second person must reject it"):
            report_file_reject(report_file=email, reason="looks wrong", actor=actor)
    with pytest.raises(ValidationError, match="only a named person"):
        report_file_approve(report_file=email, actor=SYSTEM_ACTOR)

    assert files()[EMAIL] == ReportFileState.AWAITING_APPROVAL
    assert not LedgerEvent.objects.filter(kind__startswith="report_file.appro").exists()


def test_a_person_is_the_name_behind_the_admin_or_the_command_line() -> None:
    assert actor_person("staff:alice") == actor_person("cli:alice") == "alice"
    assert actor_person(SYSTEM_ACTOR) is None
    assert actor_person("system:doctor") is None
    assert actor_person("cli") == "cli"


def test_another_person_approves_and_then_drop_gets_it(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    report_files_write(broker=cycle.broker, actor="staff:alice")
    email = ReportFile.objects.get(file_name=EMAIL)

    approved = report_file_approve(report_file=email, actor="staff:bob", reason="checked")

    assert (approved.state, approved.reviewed_by, approved.review_reason) == (
        ReportFileState.WRITTEN,
        "staff:bob",
        "checked",
    )
    # The broker's report job is queued: it uploads every written file.
    job = ProcrastinateJob.objects.get(task_name=REPORT_JOBS)
    assert job.args == {"broker_pk": cycle.broker.pk}
    event = LedgerEvent.objects.get(kind="report_file.approved")
    assert (event.actor, event.subject) == ("staff:bob", EMAIL)
    assert event.data["statuses"] == {"2": 0, "3": 1, "4": 0, "5": 1}
    assert (event.data["written_by"], event.data["reason"]) == ("staff:alice", "checked")

    run = report_files_upload(broker=cycle.broker, client=client)

    # The Phone file still waits: only the approved one went.
    assert [f.file_name for f in run.accepted] == [EMAIL]
    assert drop.uploaded == {EMAIL: b"Id,Status\r\nEmailDeleted,3\r\nEmailNotFnd1,5\r\n"}
    assert files() == {
        EMAIL: ReportFileState.ACCEPTED,
        PHONE: ReportFileState.AWAITING_APPROVAL,
    }
    assert WorkItem.objects.get(work_item_id="EmailDeleted").reported_status_code == 3


def test_a_file_the_job_wrote_anyone_may_approve(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    run = report_auto(broker=cycle.broker, client=client, today=dt.date(2026, 3, 20))
    assert run.accepted == [] and drop.uploaded == {}
    email = ReportFile.objects.get(file_name=EMAIL)
    assert email.written_by == SYSTEM_ACTOR

    report_file_approve(report_file=email, actor="cli:alice")
    again = report_auto(broker=cycle.broker, client=client, today=dt.date(2026, 3, 20))

    assert [f.file_name for f in again.accepted] == [EMAIL]
    assert set(drop.uploaded) == {EMAIL}


def test_a_decided_file_is_not_decided_again(cycle: DropCycle) -> None:
    report_files_write(broker=cycle.broker, actor="staff:alice")
    email = ReportFile.objects.get(file_name=EMAIL)
    report_file_approve(report_file=email, actor="staff:bob")

    with pytest.raises(ValidationError, match="only a file waiting for approval can be rejected"):
        report_file_reject(report_file=email, reason="second thoughts", actor="staff:carol")
    with pytest.raises(ValidationError, match="can be approved"):
        report_file_approve(report_file=email, actor="staff:carol")


def test_a_broker_without_a_drop_key_gets_no_job_its_file_is_uploaded_by_hand(
    broker: Broker,
) -> None:
    broker_update(broker=broker, approve_uploads=True, actor="staff:carol")
    cycle = DropCycleFactory.create(broker=broker)
    WorkItemFactory.create(cycle=cycle, status_code=3, work_item_id="EmailDeleted")
    (email,) = report_files_write(broker=broker, actor="staff:alice")

    report_file_approve(report_file=email, actor="staff:bob")

    assert not ProcrastinateJob.objects.filter(task_name=REPORT_JOBS).exists()
    assert report_file_mark_uploaded(report_file=email, actor="staff:bob").state == "manual"


def test_a_rejected_file_is_never_sent_and_its_statuses_go_into_a_new_file(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    report_files_write(broker=cycle.broker, actor="staff:alice")
    email = ReportFile.objects.get(file_name=EMAIL)

    with pytest.raises(ValidationError, match="write why"):
        report_file_reject(report_file=email, reason="  ", actor="staff:bob")
    rejected = report_file_reject(
        report_file=email, reason="EmailDeleted is still in the CRM", actor="staff:bob"
    )

    assert rejected.state == ReportFileState.NOT_APPROVED
    assert rejected.review_reason == "EmailDeleted is still in the CRM"
    item = WorkItem.objects.get(work_item_id="EmailDeleted")
    # Owed as before the file: reportable, DROP holding nothing, in no file.
    assert (item.state, item.reported_at, item.pending_report_file_id) == (
        WorkItemState.REPORTABLE,
        None,
        None,
    )
    event = LedgerEvent.objects.get(kind="report_file.approval_rejected")
    assert (event.actor, event.data["reason"], event.data["work_items_owed_again"]) == (
        "staff:bob",
        "EmailDeleted is still in the CRM",
        2,
    )
    assert not ProcrastinateJob.objects.filter(task_name=REPORT_JOBS).exists()

    # The next run (here the job's) writes them anew, and that file waits in turn.
    run = report_auto(broker=cycle.broker, client=client, today=dt.date(2026, 3, 20))

    assert drop.uploaded == {}
    assert [f.file_name for f in run.written] == ["20260312_4821_Email_part02.csv"]
    assert files() == {
        EMAIL: ReportFileState.NOT_APPROVED,
        PHONE: ReportFileState.AWAITING_APPROVAL,
        "20260312_4821_Email_part02.csv": ReportFileState.AWAITING_APPROVAL,
    }
    item = WorkItem.objects.select_related("pending_report_file").get(work_item_id="EmailDeleted")
    assert item.pending_report_file is not None
    assert item.pending_report_file.file_name == "20260312_4821_Email_part02.csv"


def test_an_amendment_waits_too(cycle: DropCycle, drop: DropSimulator, client: DropClient) -> None:
    for report_file in report_files_write(broker=cycle.broker, actor="staff:alice"):
        report_file_approve(report_file=report_file, actor="staff:bob")
    assert len(report_files_upload(broker=cycle.broker, client=client).accepted) == 2
    item = WorkItem.objects.get(work_item_id="EmailDeleted")
    work_item_status_set(work_item=item, status_code=2, reason="exempt after all", actor="t")

    written = report_files_write(broker=cycle.broker, amendments_only=True, actor="staff:alice")

    (amendment,) = written
    assert (amendment.kind, amendment.state) == ("amend", ReportFileState.AWAITING_APPROVAL)
    report_files_upload(broker=cycle.broker, client=client)
    assert drop.calls("/data/amend") == []

    report_file_approve(report_file=amendment, actor="staff:bob")
    run = report_files_upload(broker=cycle.broker, client=client)

    assert [f.file_name for f in run.accepted] == ["20260312_4821_Email_amend01.csv"]
    assert WorkItem.objects.get(pk=item.pk).reported_status_code == 2


def test_an_amendment_held_past_the_due_date_leaves_the_deadline_met(
    cycle: DropCycle, drop: DropSimulator, client: DropClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The law asks for each status within the cycle's days; an amendment owes none (DROP
    holds one). The evidence pack judges the cycle by when DROP held every status it owes,
    as the alerts and the cycles list count what is owed, not by when the amendment went."""
    (email, phone) = report_files_write(broker=cycle.broker, actor="staff:alice")
    assert (email.file_name, phone.file_name) == (EMAIL, PHONE)
    report_file_approve(report_file=email, actor="staff:bob")
    report_files_upload(broker=cycle.broker, client=client)
    item = WorkItem.objects.get(work_item_id="EmailNotFnd1")
    work_item_status_set(work_item=item, status_code=3, reason="late match", actor="t")
    (amendment,) = report_files_write(
        broker=cycle.broker, amendments_only=True, actor="staff:alice"
    )
    report_file_approve(report_file=phone, actor="staff:bob")
    report_files_upload(broker=cycle.broker, client=client)  # the last first status

    # Every status owed is DROP's: the cycle stays open for the amendment, and says when.
    assert DropCycle.objects.get(pk=cycle.pk).state == CycleState.OPEN
    assert cycle_deadlines(today=drop_today()) == []
    held = LedgerEvent.objects.filter(kind="drop_cycle.statuses_held", subject="1")
    assert held.count() == 1
    DropCycle.objects.filter(pk=cycle.pk).update(due_date=drop_today())
    cycle.refresh_from_db()
    period = Period(broker=cycle.broker, cycle=cycle, since=None, until=None)

    # The due date passes before the amendment is approved and sent.
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + dt.timedelta(days=3))
    later = drop_today()
    report_files_upload(broker=cycle.broker, client=client)  # refreshes: recorded once
    assert held.count() == 1
    assert [s["deadline"] for s in period.cycle_summaries(today=later)] == ["met"]
    report_file_approve(report_file=amendment, actor="staff:bob")
    report_files_upload(broker=cycle.broker, client=client)

    assert DropCycle.objects.get(pk=cycle.pk).state == CycleState.REPORTED
    (summary,) = period.cycle_summaries(today=later)
    assert summary["deadline"] == "met"
    assert summary["reported_at"] == held.get().created_at


def test_with_approval_off_files_are_written_as_before(broker: Broker) -> None:
    cycle = DropCycleFactory.create(broker=broker)
    WorkItemFactory.create(cycle=cycle, status_code=3, work_item_id="EmailDeleted")

    (email,) = report_files_write(broker=broker, actor="staff:alice")

    assert (email.state, email.written_by) == (ReportFileState.WRITTEN, "staff:alice")
    assert not LedgerEvent.objects.filter(kind="report_file.awaiting_approval").exists()


# The conditions the test reads the alerts of: only they are evaluated.
APPROVAL_DUE = ["approval_due_7_days", "approval_due_2_days"]


def test_a_waiting_file_alerts_as_its_cycles_due_date_nears(cycle: DropCycle) -> None:
    report_files_write(broker=cycle.broker, actor="staff:alice")
    due = cycle.due_date

    far = alerts_evaluate(conditions=APPROVAL_DUE, now=noon(due - dt.timedelta(days=10)))
    assert not [a for a in far.raised if a.condition.startswith("approval_due")]

    week = alerts_evaluate(conditions=APPROVAL_DUE, now=noon(due - dt.timedelta(days=6)))
    raised = sorted(a.key for a in week.raised if a.condition.startswith("approval_due"))
    email, phone = (ReportFile.objects.get(file_name=n).pk for n in (EMAIL, PHONE))
    assert raised == sorted(
        [f"approval_due_7_days:file:{email}", f"approval_due_7_days:file:{phone}"]
    )
    text = AlertState.objects.get(key=f"approval_due_7_days:file:{email}").text
    assert f"{EMAIL} (broker 4821) waits for approval" in text
    assert "is due in 6 day(s)" in text and "other than staff:alice" in text

    two = alerts_evaluate(conditions=APPROVAL_DUE, now=noon(due - dt.timedelta(days=2)))
    assert {a.condition for a in two.raised} >= {"approval_due_2_days"}

    # Decided, it no longer waits: its alerts clear.
    report_file_reject(
        report_file=ReportFile.objects.get(file_name=EMAIL), reason="wrong", actor="staff:bob"
    )
    cleared = alerts_evaluate(conditions=APPROVAL_DUE, now=noon(due - dt.timedelta(days=2))).cleared
    assert {a.key for a in cleared} >= {
        f"approval_due_7_days:file:{email}",
        f"approval_due_2_days:file:{email}",
    }


def test_drop_doctor_lists_the_work_items_of_a_waiting_file(cycle: DropCycle) -> None:
    report_files_write(broker=cycle.broker, actor="staff:alice")

    (group,) = [
        g for g in stuck_work_items() if g.reason == StuckReason.REPORT_FILE_AWAITING_APPROVAL
    ]

    assert (group.broker_id, group.work_items, group.nearest_due_date) == (
        "4821",
        3,
        cycle.due_date,
    )
    assert "state__exact=awaiting_approval" in group.admin_path
    report_file_approve(report_file=ReportFile.objects.get(file_name=EMAIL), actor="staff:bob")
    (group,) = [
        g for g in stuck_work_items() if g.reason == StuckReason.REPORT_FILE_AWAITING_APPROVAL
    ]
    assert group.work_items == 1  # the Phone file still waits


def test_turning_approval_on_holds_the_files_not_sent_yet(
    broker: Broker, drop: DropSimulator, client: DropClient
) -> None:
    """Written while approval was off, not sent yet (no key then, or refused by DROP and sent
    again each run): once approval is on, they too wait for a second person. One marked
    being sent goes its way while an upload runs (DROP may be taking it), and is held once
    none does (a failed call left it marked)."""
    cycle = DropCycleFactory.create(broker=broker)
    WorkItemFactory.create(cycle=cycle, status_code=3, work_item_id="EmailDeleted")
    WorkItemFactory.create(cycle=cycle, list_type="Phone", status_code=4, work_item_id="PhoneOpted")
    report_files_write(broker=broker, actor="staff:alice")
    email, phone = ReportFile.objects.order_by("file_name")
    ReportFile.objects.filter(pk=phone.pk).update(sending_since=dt.datetime.now(dt.UTC))
    broker_reports_to(broker, drop)

    uploading = psycopg.connect(database_url(), autocommit=True)  # an upload running
    try:
        uploading.execute(
            "SELECT pg_advisory_lock(%s, %s)", [report_uploads._UPLOAD_LOCK, broker.pk]
        )
        broker_update(broker=broker, approve_uploads=True, actor="staff:carol")
    finally:
        uploading.close()

    email.refresh_from_db()
    phone.refresh_from_db()
    assert (email.state, phone.state) == (
        ReportFileState.AWAITING_APPROVAL,
        ReportFileState.WRITTEN,
    )
    (held,) = LedgerEvent.objects.filter(kind="report_file.awaiting_approval")
    assert (held.subject, held.actor, held.data["written_by"]) == (
        EMAIL,
        "staff:carol",
        "staff:alice",
    )
    # Its writer still cannot approve it; the upload sends only the file already on its way.
    with pytest.raises(ValidationError, match="a second person must approve it"):
        report_file_approve(report_file=email, actor="staff:alice")
    report_files_upload(broker=broker, client=client, actor=SYSTEM_ACTOR)
    assert set(drop.uploaded) == {PHONE}
    report_file_approve(report_file=email, actor="staff:bob")
    report_files_upload(broker=broker, client=client, actor=SYSTEM_ACTOR)
    assert set(drop.uploaded) == {EMAIL, PHONE}


def test_a_file_a_failed_call_left_marked_is_held_when_no_upload_runs(broker: Broker) -> None:
    cycle = DropCycleFactory.create(broker=broker)
    WorkItemFactory.create(cycle=cycle, status_code=3, work_item_id="EmailDeleted")
    report_files_write(broker=broker, actor="staff:alice")
    ReportFile.objects.update(sending_since=dt.datetime.now(dt.UTC) - dt.timedelta(days=9))

    broker_update(broker=broker, approve_uploads=True, actor="staff:carol")

    held = ReportFile.objects.get()
    assert held.state == ReportFileState.AWAITING_APPROVAL
    # DROP may hold it: its rows must not go into a new file, so it can only be approved.
    with pytest.raises(ValidationError, match="may already be at DROP"):
        report_file_reject(report_file=held, reason="counts look wrong", actor="staff:bob")
    held.refresh_from_db()
    assert held.state == ReportFileState.AWAITING_APPROVAL
    assert WorkItem.objects.get().pending_report_file == held
    report_file_approve(report_file=held, actor="staff:bob")


def test_a_refused_rejection_names_the_failed_send_in_drops_zone(broker: Broker) -> None:
    """22:30 in California is the next day in UTC: staff read the time as DROP counts it."""
    cycle = DropCycleFactory.create(broker=broker)
    WorkItemFactory.create(cycle=cycle, status_code=3, work_item_id="EmailDeleted")
    report_files_write(broker=broker, actor="staff:alice")
    sent = drop_midnight(drop_today() - dt.timedelta(days=9)) + dt.timedelta(hours=22, minutes=30)
    ReportFile.objects.update(sending_since=sent)
    broker_update(broker=broker, approve_uploads=True, actor="staff:carol")

    with pytest.raises(ValidationError) as refused:
        report_file_reject(
            report_file=ReportFile.objects.get(), reason="counts look wrong", actor="staff:bob"
        )

    pacific = sent.astimezone(ZoneInfo("America/Los_Angeles"))
    assert f"a send of it at {pacific:%Y-%m-%d %H:%M %Z} got no answer" in str(refused.value)


def test_a_file_held_after_the_upload_read_it_is_not_sent(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    report_files_write(broker=cycle.broker, actor="staff:alice")
    report_file_approve(report_file=ReportFile.objects.get(file_name=EMAIL), actor="staff:bob")
    read = ReportFile.objects.get(file_name=EMAIL)  # what the run read: written
    ReportFile.objects.filter(pk=read.pk).update(state=ReportFileState.AWAITING_APPROVAL)

    stop = report_uploads._file_upload(
        client=client, report_file=read, run=report_uploads.ReportRun(), actor=SYSTEM_ACTOR
    )

    assert stop is None
    assert drop.uploaded == {}
    assert ReportFile.objects.get(pk=read.pk).sending_since is None
