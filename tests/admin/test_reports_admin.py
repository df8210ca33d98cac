"""Reporting in the admin: files listed, downloaded, generated and marked uploaded; the
status-by-hand and outcome-export actions the work item and request admins use."""

from __future__ import annotations

import csv
import datetime as dt
import io

import pytest
from django.contrib.auth.models import Group, User
from django.db import connections
from django.test import Client
from django.utils import timezone

from integrations.drop.calendar import drop_midnight, drop_today
from integrations.models import (
    Broker,
    DeletionRequest,
    DropCycle,
    LedgerEvent,
    ReportFile,
    ReportFileState,
    WorkItem,
    WorkItemState,
)
from integrations.services.reporting.report_files import report_files_write
from integrations.services.reporting.report_uploads import _UPLOAD_LOCK
from integrations.services.staff.brokers import broker_create
from tests.builders import (
    DeletionRequestFactory,
    DropCycleFactory,
    WorkItemFactory,
    items_reported,
    outcome_history,
)

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/integrations/reportfile/"


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("alice", "a@example.com", "pw-alice-123"))
    return client


@pytest.fixture
def auditor(client: Client) -> Client:
    user = User.objects.create_user("bob", "b@example.com", "pw-bob-123", is_staff=True)
    user.groups.add(Group.objects.get(name="Auditors"))
    client.force_login(user)
    return client


@pytest.fixture
def cycle(broker: Broker) -> DropCycle:
    cycle = DropCycleFactory.create(broker=broker)
    WorkItemFactory.create(cycle=cycle, status_code=3, work_item_id="EmailDeleted")
    WorkItemFactory.create(
        cycle=cycle, list_type="Phone", status_code=5, work_item_id="PhoneNotFnd1"
    )
    return cycle


def test_generate_then_download_then_mark_uploaded(staff: Client, cycle: DropCycle) -> None:
    page = staff.get(CHANGELIST + "generate/")
    assert b"4821 cycle 1, due 2026-04-26" in page.content
    # A written file leaves its statuses owed: only DROP taking it makes them reported.
    assert b"stay owed until DROP takes the file" in page.content

    response = staff.post(CHANGELIST + "generate/", {"cycle": cycle.pk}, follow=True)

    assert b"Wrote 20260312_4821_Email.csv (1 rows)" in response.content
    email = ReportFile.objects.get(file_name="20260312_4821_Email.csv")
    assert LedgerEvent.objects.get(kind="report_file.written", subject=email.file_name).actor == (
        "staff:alice"
    )
    listing = staff.get(CHANGELIST).content.decode()
    assert f"{CHANGELIST}{email.pk}/download/" in listing

    download = staff.post(f"{CHANGELIST}{email.pk}/download/")
    assert download.content == b"Id,Status\r\nEmailDeleted,3\r\n"
    assert download["Content-Disposition"] == 'attachment; filename="20260312_4821_Email.csv"'
    taken = LedgerEvent.objects.get(kind="report_files.exported")
    assert (taken.actor, taken.data["file_name"], taken.data["files"]) == (
        "staff:alice",
        email.file_name,
        1,
    )

    chosen = {
        "action": "mark_uploaded",
        "_selected_action": list(ReportFile.objects.values_list("pk", flat=True)),
    }
    asked = staff.post(CHANGELIST, chosen)
    assert b"Mark uploaded by hand in DROP&#x27;s portal" in asked.content
    assert b"America/Los_Angeles" in asked.content
    assert set(ReportFile.objects.values_list("state", flat=True)) == {ReportFileState.WRITTEN}
    staff.post(CHANGELIST, {**chosen, "apply": "1", "uploaded_at": ""})
    assert set(ReportFile.objects.values_list("state", flat=True)) == {ReportFileState.MANUAL}
    event = LedgerEvent.objects.filter(kind="report_file.marked_uploaded").first()
    assert event is not None and event.actor == "staff:alice"
    cycle.refresh_from_db()
    assert cycle.state == "reported"


def test_mark_uploaded_takes_the_upload_time_in_drops_calendar(
    staff: Client, cycle: DropCycle
) -> None:
    (email, _phone) = sorted(report_files_write(broker=cycle.broker), key=lambda f: f.file_name)
    ReportFile.objects.filter(pk=email.pk).update(created_at=timezone.now() - dt.timedelta(days=3))
    yesterday = drop_today() - dt.timedelta(days=1)
    chosen = {"action": "mark_uploaded", "_selected_action": [email.pk], "apply": "1"}

    staff.post(CHANGELIST, {**chosen, "uploaded_at": f"{yesterday.isoformat()} 21:30"})

    # 21:30 of DROP's day (Pacific), whatever the server's zone.
    uploaded = drop_midnight(yesterday) + dt.timedelta(hours=21, minutes=30)
    email.refresh_from_db()
    assert (email.state, email.uploaded_at) == (ReportFileState.MANUAL, uploaded)
    assert set(
        WorkItem.objects.filter(reported_at__isnull=False).values_list("reported_at", flat=True)
    ) == {uploaded}
    event = LedgerEvent.objects.get(kind="report_file.marked_uploaded")
    assert (event.actor, dt.datetime.fromisoformat(event.data["uploaded_at"])) == (
        "staff:alice",
        uploaded,
    )


def test_mark_uploaded_refuses_a_time_that_cannot_be(staff: Client, cycle: DropCycle) -> None:
    (email, _phone) = sorted(report_files_write(broker=cycle.broker), key=lambda f: f.file_name)
    chosen = {"action": "mark_uploaded", "_selected_action": [email.pk], "apply": "1"}
    tomorrow = drop_today() + dt.timedelta(days=1)

    unreadable = staff.post(CHANGELIST, {**chosen, "uploaded_at": "yesterday evening"})
    assert b"not a date and time" in unreadable.content  # the form again, with the error
    future = staff.post(
        CHANGELIST, {**chosen, "uploaded_at": f"{tomorrow.isoformat()} 09:00"}, follow=True
    )
    assert b"is in the future; give the time it was uploaded" in future.content
    two_days_ago = drop_today() - dt.timedelta(days=2)  # the file was written today
    before = staff.post(
        CHANGELIST, {**chosen, "uploaded_at": f"{two_days_ago.isoformat()} 09:00"}, follow=True
    )
    assert b"is before the file was written" in before.content

    assert ReportFile.objects.get(pk=email.pk).state == ReportFileState.WRITTEN
    assert not LedgerEvent.objects.filter(kind="report_file.marked_uploaded").exists()


def test_a_file_is_marked_uploaded_once(staff: Client, cycle: DropCycle) -> None:
    (email, _phone) = sorted(report_files_write(broker=cycle.broker), key=lambda f: f.file_name)
    staff.post(
        CHANGELIST, {"action": "mark_uploaded", "_selected_action": [email.pk], "apply": "1"}
    )

    response = staff.post(
        CHANGELIST,
        {"action": "mark_uploaded", "_selected_action": [email.pk], "apply": "1"},
        follow=True,
    )

    assert b"only a written or refused file can be marked uploaded" in response.content
    assert LedgerEvent.objects.filter(kind="report_file.marked_uploaded").count() == 1


def test_a_file_is_not_marked_uploaded_while_the_uploader_sends_it(
    staff: Client, cycle: DropCycle
) -> None:
    (email, _phone) = sorted(report_files_write(broker=cycle.broker), key=lambda f: f.file_name)
    uploader = connections.create_connection("default")  # the report job's session
    try:
        with uploader.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", [_UPLOAD_LOCK, cycle.broker.pk])
        response = staff.post(
            CHANGELIST,
            {"action": "mark_uploaded", "_selected_action": [email.pk], "apply": "1"},
            follow=True,
        )
        with uploader.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_UPLOAD_LOCK, cycle.broker.pk])
    finally:
        uploader.close()

    assert response.status_code == 200
    assert "another process is uploading broker 4821&#x27;s response files" in (
        response.content.decode()
    )
    assert ReportFile.objects.get(pk=email.pk).state == ReportFileState.WRITTEN
    assert not LedgerEvent.objects.filter(kind="report_file.marked_uploaded").exists()


def test_auditors_download_but_do_not_generate_or_mark(auditor: Client, cycle: DropCycle) -> None:
    (report_file, _) = report_files_write(broker=cycle.broker)

    assert auditor.post(f"{CHANGELIST}{report_file.pk}/download/").status_code == 200
    assert auditor.get(CHANGELIST + "generate/").status_code == 403
    assert b"Generate response files" not in auditor.get(CHANGELIST).content
    auditor.post(
        CHANGELIST,
        {"action": "mark_uploaded", "_selected_action": [report_file.pk], "apply": "1"},
    )
    assert ReportFile.objects.get(pk=report_file.pk).state == ReportFileState.WRITTEN


def test_set_status_asks_for_a_reason_then_sets_it(staff: Client, cycle: DropCycle) -> None:
    item = WorkItemFactory.create(cycle=cycle, work_item_id="EmailFailed1")
    DeletionRequestFactory.create(work_item=item, drop_outcome="failed", error_message="CRM down")
    url = "/admin/integrations/workitem/"
    chosen = {"action": "set_work_item_status", "_selected_action": [item.pk]}

    form_page = staff.post(url, chosen)
    assert b"EmailFailed1" in form_page.content
    assert b"Set the DROP status by hand" in form_page.content

    no_reason = staff.post(url, {**chosen, "apply": "1", "status_code": "5", "reason": ""})
    assert b"This field is required" in no_reason.content
    assert WorkItem.objects.get(pk=item.pk).status_code is None

    staff.post(url, {**chosen, "apply": "1", "status_code": "5", "reason": "No record left"})
    item.refresh_from_db()
    assert (item.status_code, item.state, item.status_reason) == (
        5,
        WorkItemState.REPORTABLE,
        "No record left",
    )
    assert LedgerEvent.objects.get(kind="work_item.status_set").actor == "staff:alice"


def test_auditors_cannot_set_a_status(auditor: Client, cycle: DropCycle) -> None:
    item = WorkItem.objects.get(work_item_id="EmailDeleted")
    auditor.post(
        "/admin/integrations/workitem/",
        {
            "action": "set_work_item_status",
            "_selected_action": [item.pk],
            "apply": "1",
            "status_code": "2",
            "reason": "x",
        },
    )
    assert WorkItem.objects.get(pk=item.pk).status_code == 3


def test_export_streams_the_chosen_requests(auditor: Client, broker: Broker) -> None:
    other = broker_create(broker_id="1234", name="Other", mode="test", actor="test")
    history = outcome_history(broker, other)
    chosen = DeletionRequest.objects.filter(broker=broker, late_match=False)

    response = auditor.post(
        "/admin/integrations/deletionrequest/",
        {
            "action": "export_outcomes_csv",
            "_selected_action": list(chosen.values_list("pk", flat=True)),
        },
    )

    assert response["Content-Type"] == "text/csv; charset=utf-8"
    text = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["request_uuid"] for r in rows] == [
        str(history.deleted.request_uuid),
        str(history.failed.request_uuid),
    ]
    assert rows[1]["error_message"].startswith("'=")
    event = LedgerEvent.objects.get(kind="outcomes.exported")
    assert (event.actor, event.data["filters"]) == ("staff:bob", {"requests": 2})


@pytest.fixture
def refused(cycle: DropCycle) -> ReportFile:
    """EmailDeleted reported as 3 and accepted; DROP refuses (409) its amendment to 2."""
    item = WorkItem.objects.get(work_item_id="EmailDeleted")
    items_reported(cycle, [item])
    WorkItem.objects.filter(pk=item.pk).update(status_code=2)
    WorkItem.objects.filter(pk=item.pk).update(needs_amendment=True)
    amendment = items_reported(
        cycle, [WorkItem.objects.get(pk=item.pk)], kind="amend", state=ReportFileState.REFUSED
    )
    ReportFile.objects.filter(pk=amendment.pk).update(
        drop_response={"status": 409, "message": "An amendment is not possible now."},
    )
    return amendment


def test_discard_a_refused_amendment_with_a_reason(staff: Client, refused: ReportFile) -> None:
    listing = staff.get(CHANGELIST).content.decode()
    assert "An amendment is not possible now." in listing  # DROP's message, in the list
    chosen = {"action": "discard_amendment", "_selected_action": [refused.pk]}

    form_page = staff.post(CHANGELIST, chosen)
    assert b"20260312_4821_Email_amend01.csv (refused by drop" in form_page.content
    no_reason = staff.post(CHANGELIST, {**chosen, "apply": "1", "reason": ""})
    assert b"This field is required" in no_reason.content
    assert ReportFile.objects.get(pk=refused.pk).state == ReportFileState.REFUSED

    done = staff.post(
        CHANGELIST, {**chosen, "apply": "1", "reason": "DROP closed cycle 1"}, follow=True
    )

    assert b"Discarded 1 amendment(s)" in done.content
    refused.refresh_from_db()
    assert (refused.state, refused.discard_reason, refused.discarded_by) == (
        ReportFileState.DISCARDED,
        "DROP closed cycle 1",
        "staff:alice",
    )
    item = WorkItem.objects.get(work_item_id="EmailDeleted")
    assert (item.state, item.reported_status_code, item.needs_amendment) == (
        WorkItemState.REPORTED,
        3,
        False,
    )
    event = LedgerEvent.objects.get(kind="report_file.discarded")
    assert (event.actor, event.data["reason"]) == ("staff:alice", "DROP closed cycle 1")
    page = staff.get(f"{CHANGELIST}{refused.pk}/change/").content.decode()
    assert "DROP closed cycle 1" in page


def test_an_upload_is_not_discarded(staff: Client, refused: ReportFile) -> None:
    upload = ReportFile.objects.get(file_name="20260312_4821_Email.csv")
    response = staff.post(
        CHANGELIST,
        {
            "action": "discard_amendment",
            "_selected_action": [upload.pk],
            "apply": "1",
            "reason": "no",
        },
        follow=True,
    )
    assert b"only an amendment can be discarded" in response.content
    assert ReportFile.objects.get(pk=upload.pk).state == ReportFileState.ACCEPTED


def test_auditors_cannot_discard(auditor: Client, refused: ReportFile) -> None:
    auditor.post(
        CHANGELIST,
        {"action": "discard_amendment", "_selected_action": [refused.pk], "apply": "1",
         "reason": "no"},
    )  # fmt: skip
    assert ReportFile.objects.get(pk=refused.pk).state == ReportFileState.REFUSED
    assert not LedgerEvent.objects.filter(kind="report_file.discarded").exists()


@pytest.mark.parametrize("page", ["list", "record"])
def test_a_response_file_download_is_a_post_of_the_pages_form_and_a_ledger_event(
    cycle: DropCycle, page: str
) -> None:
    # The cycle's ZIP of the same files is an export in the ledger: a file taken from its row
    # was not, and a GET (a link, a prefetch, another site's <img>) took it.
    (report_file, _) = report_files_write(broker=cycle.broker)
    user = User.objects.create_user("ada", password="pw-123-role", is_staff=True)
    user.groups.add(Group.objects.get(name="Auditors"))
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    url = f"{CHANGELIST}{report_file.pk}/download/"
    assert client.get(url).status_code == 405
    assert not LedgerEvent.objects.filter(kind="report_files.exported").exists()

    where = CHANGELIST if page == "list" else f"{CHANGELIST}{report_file.pk}/change/"
    html = client.get(where).content.decode()
    assert f'href="{url}"' not in html  # no link a prefetch could follow
    assert f'form="dp-reportfile-download" formaction="{url}"' in html
    form = html.split('<form id="dp-reportfile-download" method="post"')[1].split("</form>")[0]
    token = form.split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]
    answer = client.post(url, {"csrfmiddlewaretoken": token})
    assert answer.status_code == 200
    assert answer.content == bytes(report_file.content)
    (event,) = LedgerEvent.objects.filter(kind="report_files.exported")
    assert event.actor == "staff:ada"
    assert event.data == {
        "via": "admin",
        "cycle": cycle.drop_session_id,
        "files": 1,
        "file_name": report_file.file_name,
    }
