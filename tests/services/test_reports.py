"""Reporting to DROP: response files written, uploaded and amended against the loopback DROP.

Every fault test shares its setup with the success test: a cycle with reportable items and
a running DropSimulator. What a user notices: the files DROP received (names, rows), the
file states and the ledger.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import io
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import connections
from procrastinate.contrib.django.models import ProcrastinateJob

from devtools.drop_simulator import DropSimulator
from integrations.drop import client as drop_client
from integrations.drop.client import DropClient, DropLimits, DropUnavailable
from integrations.models import (
    Broker,
    CycleState,
    DeletionRequest,
    DropCycle,
    LedgerEvent,
    ReportFile,
    ReportFileState,
    RequestState,
    WorkItem,
    WorkItemState,
)
from integrations.selectors.deadlines import cycle_deadlines
from integrations.selectors.drop_metrics import drop_metrics
from integrations.selectors.outcomes import deletion_outcomes
from integrations.services.cycle.outstanding import outstanding_cycles_clear
from integrations.services.cycle.work_items import work_item_settle
from integrations.services.reporting import report_uploads
from integrations.services.reporting.report_files import report_files_write
from integrations.services.reporting.report_manual import (
    report_file_discard,
    report_file_mark_uploaded,
)
from integrations.services.reporting.report_uploads import (
    _UPLOAD_LOCK,
    ReportBusy,
    report_files_upload,
)
from integrations.services.reporting.reports import report_auto, report_run
from tests.builders import (
    DeletionRequestFactory,
    DropCycleFactory,
    WorkItemFactory,
    broker_reports_to,
    drop_zip,
    write_zip,
)

pytestmark = pytest.mark.django_db

EMAIL = "20260312_4821_Email.csv"
PHONE = "20260312_4821_Phone.csv"


def csv_rows(content: bytes) -> dict[str, int]:
    lines = content.decode("ascii").split("\r\n")
    assert lines[0] == "Id,Status" and lines[-1] == ""
    return {line.split(",")[0]: int(line.split(",")[1]) for line in lines[1:-1]}


@pytest.fixture
def keyed_broker(broker: Broker, drop: DropSimulator) -> Broker:
    return broker_reports_to(broker, drop)


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def client(drop: DropSimulator, sleeps: list[float]) -> DropClient:
    return DropClient(
        drop.url,
        drop.api_key,
        sleep=sleeps.append,
        limits=DropLimits(max_retries=2, connect_timeout=1, read_timeout=2),
        allow_private=True,
    )


@pytest.fixture
def cycle(keyed_broker: Broker) -> DropCycle:
    """Email: two reportable items and one still open; Phone: one reportable; one removed."""
    cycle = DropCycleFactory.create(broker=keyed_broker)
    WorkItemFactory.create(cycle=cycle, status_code=3, work_item_id="EmailDeleted")
    WorkItemFactory.create(cycle=cycle, status_code=5, work_item_id="EmailNotFnd1")
    open_item = WorkItemFactory.create(cycle=cycle, work_item_id="EmailPending")
    DeletionRequestFactory.create(work_item=open_item, state=RequestState.DISPATCHED)
    WorkItemFactory.create(
        cycle=cycle, list_type="Phone", status_code=4, work_item_id="PhoneOptdOut"
    )
    WorkItemFactory.create(cycle=cycle, state=WorkItemState.REMOVED, work_item_id="EmailRemoved")
    return cycle


def late_match_deleted() -> WorkItem:
    """EmailNotFnd1 (5, not found) matched late to a consumer whose data was deleted: its
    status is 3 now."""
    late = WorkItem.objects.get(work_item_id="EmailNotFnd1")
    DeletionRequestFactory.create(work_item=late, drop_outcome="deleted", late_match=True)
    work_item_settle(work_item=late)
    return late


def test_write_one_file_per_list_with_the_reportable_items(cycle: DropCycle) -> None:
    written = report_files_write(broker=cycle.broker, actor="cli:alice")

    assert sorted(f.file_name for f in written) == [EMAIL, PHONE]
    email = ReportFile.objects.get(file_name=EMAIL)
    assert csv_rows(bytes(email.content)) == {"EmailDeleted": 3, "EmailNotFnd1": 5}
    assert (email.rows, email.kind, email.state) == (2, "upload", ReportFileState.WRITTEN)
    assert email.sha256 == hashlib.sha256(bytes(email.content)).hexdigest()
    # In the file, not reported yet: DROP holds nothing until it takes the file.
    written_item = WorkItem.objects.get(work_item_id="EmailDeleted")
    assert (written_item.state, written_item.pending_report_file_id) == (
        WorkItemState.REPORTABLE,
        email.pk,
    )
    assert (written_item.reported_status_code, written_item.reported_at) == (None, None)
    assert WorkItem.objects.get(work_item_id="EmailPending").pending_report_file_id is None
    event = LedgerEvent.objects.get(kind="report_file.written", subject=EMAIL)
    assert event.data | {"sha256": "x"} == {
        "cycle": "1",
        "file_name": EMAIL,
        "kind": "upload",
        "list": EMAIL,
        "rows": 2,
        "sha256": "x",
    }
    assert event.data["sha256"] == email.sha256
    assert event.actor == "cli:alice"


def test_a_second_run_writes_only_new_statuses_in_a_part_file(cycle: DropCycle) -> None:
    report_files_write(broker=cycle.broker)
    assert report_files_write(broker=cycle.broker) == []

    pending = WorkItem.objects.get(work_item_id="EmailPending")
    request = pending.deletion_requests.get()
    type(request).objects.filter(pk=request.pk).update(
        state=RequestState.COMPLETED, drop_outcome="exempt"
    )
    work_item_settle(work_item=pending)
    (part,) = report_files_write(broker=cycle.broker)

    assert part.file_name == "20260312_4821_Email_part02.csv"
    assert csv_rows(bytes(part.content)) == {"EmailPending": 2}


def test_upload_records_drops_answer_and_closes_the_cycle(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    pending = WorkItem.objects.get(work_item_id="EmailPending")
    pending.deletion_requests.update(state=RequestState.COMPLETED, drop_outcome="not_found")
    work_item_settle(work_item=pending)

    run = report_run(broker=cycle.broker, upload=True, client=client, actor="cli:alice")

    assert run.error is None
    assert sorted(f.file_name for f in run.accepted) == [EMAIL, PHONE]
    assert csv_rows(drop.uploaded[EMAIL]) == {
        "EmailDeleted": 3,
        "EmailNotFnd1": 5,
        "EmailPending": 5,
    }
    assert csv_rows(drop.uploaded[PHONE]) == {"PhoneOptdOut": 4}
    email = ReportFile.objects.get(file_name=EMAIL)
    assert email.state == ReportFileState.ACCEPTED
    assert email.uploaded_at is not None
    assert email.drop_response["status"] == 202
    assert email.drop_response["already_uploaded"] is False
    cycle.refresh_from_db()
    assert cycle.state == CycleState.REPORTED
    kinds = list(
        LedgerEvent.objects.filter(kind__startswith="report_file.")
        .order_by("id")
        .values_list("kind", flat=True)
    )
    assert kinds == ["report_file.written"] * 2 + ["report_file.accepted"] * 2
    assert LedgerEvent.objects.filter(kind="drop_cycle.reported", subject="1").exists()


@pytest.mark.parametrize(
    ("message", "kept"),
    [("Accepted\x00", "Accepted\ufffd"), ("Accepted \ud800", "Accepted \ufffd")],
)
def test_an_answer_with_text_postgresql_cannot_store_is_recorded(
    cycle: DropCycle,
    drop: DropSimulator,
    client: DropClient,
    monkeypatch: pytest.MonkeyPatch,
    message: str,
    kept: str,
) -> None:
    # "\u0000" and a lone "\ud800" are valid JSON escapes DROP may send in its message.
    answer = drop_client.upload_result
    monkeypatch.setattr(
        drop_client,
        "upload_result",
        lambda status, body, names, redact: answer(
            status, {**body, "message": message}, names, redact
        ),
    )

    run = report_run(broker=cycle.broker, upload=True, client=client, actor="cli:alice")

    assert run.error is None
    assert sorted(f.file_name for f in run.accepted) == [EMAIL, PHONE]
    email = ReportFile.objects.get(file_name=EMAIL)
    assert email.state == ReportFileState.ACCEPTED
    assert email.drop_response["message"] == kept
    event = LedgerEvent.objects.get(kind="report_file.accepted", subject=EMAIL)
    assert event.data["drop_response"] == email.drop_response


def test_a_cycle_with_open_items_stays_open_after_upload(
    cycle: DropCycle, client: DropClient
) -> None:
    report_run(broker=cycle.broker, upload=True, client=client)
    cycle.refresh_from_db()
    assert cycle.state == CycleState.OPEN


def test_a_written_file_leaves_its_statuses_owed_until_drop_accepts_it(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    today = cycle.due_date - dt.timedelta(days=10)
    report_files_write(broker=cycle.broker)

    # Written, not taken: every reader still counts the statuses as owed.
    (deadline,) = cycle_deadlines(today=today)
    assert (deadline.owed, deadline.not_reportable) == (4, 1)
    assert drop_metrics(broker=cycle.broker, year=2026).total.figures["open"] == 4
    exported = {
        row["work_item_id"]: row
        for row in deletion_outcomes(requests=DeletionRequest.objects.all())
    }
    assert (exported["EmailPending"]["reported_at"], exported["EmailPending"]["report_file"]) == (
        None,
        None,
    )
    assert WorkItem.objects.owed().count() == 4

    run = report_files_upload(broker=cycle.broker, client=client)

    assert len(run.accepted) == 2
    (deadline,) = cycle_deadlines(today=today)
    assert (deadline.owed, deadline.not_reportable) == (1, 1)  # EmailPending
    figures = drop_metrics(broker=cycle.broker, year=2026).total.figures
    assert (figures["open"], figures["complied"], figures["not_found"]) == (1, 2, 1)
    taken = WorkItem.objects.get(work_item_id="EmailDeleted")
    email = ReportFile.objects.get(file_name=EMAIL)
    assert (taken.state, taken.reported_status_code, taken.report_file_id) == (
        WorkItemState.REPORTED,
        3,
        email.pk,
    )
    assert taken.reported_at == email.uploaded_at
    assert taken.pending_report_file_id is None


def test_drop_holds_the_status_in_the_file_it_took_not_a_later_one(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    report_files_write(broker=cycle.broker)
    late = late_match_deleted()  # 5 in the file, 3 now

    report_files_upload(broker=cycle.broker, client=client)

    late.refresh_from_db()
    assert (late.reported_status_code, late.state, late.needs_amendment) == (
        5,
        WorkItemState.REPORTABLE,
        True,
    )


def test_marking_a_file_uploaded_by_hand_is_what_makes_it_reported(cycle: DropCycle) -> None:
    email, _ = sorted(report_files_write(broker=cycle.broker), key=lambda f: f.file_name)
    assert WorkItem.objects.filter(reported_at__isnull=False).count() == 0

    report_file_mark_uploaded(report_file=email, actor="staff:alice")

    reported = WorkItem.objects.filter(reported_at__isnull=False)
    assert sorted(reported.values_list("work_item_id", "reported_status_code")) == [
        ("EmailDeleted", 3),
        ("EmailNotFnd1", 5),
    ]
    assert WorkItem.objects.get(work_item_id="PhoneOptdOut").reported_at is None


def test_a_rejected_upload_never_brings_back_a_removed_item(
    cycle: DropCycle, drop: DropSimulator, client: DropClient, tmp_path: Path
) -> None:
    report_files_write(broker=cycle.broker)
    removed = WorkItem.objects.get(work_item_id="EmailDeleted")
    package = drop_zip(
        cycle.broker,
        {"Email": []},
        [(removed.work_item_id, base64.b64encode(bytes(removed.hash)).decode(), "Email")],
        date="20260320",
    )
    call_command(
        "drop",
        "import",
        "--broker",
        "4821",
        str(write_zip(tmp_path, package, name="20260320_4821_DROP.zip")),
        stdout=io.StringIO(),
    )
    assert WorkItem.objects.get(pk=removed.pk).state == WorkItemState.REMOVED
    drop.broker_id = "9999"  # DROP rejects the file the removed item was in

    report_files_upload(broker=cycle.broker, client=client)

    removed.refresh_from_db()
    assert (removed.state, removed.status_code) == (WorkItemState.REMOVED, None)
    assert not WorkItem.objects.owed().filter(pk=removed.pk).exists()
    drop.broker_id = "4821"
    again = report_run(broker=cycle.broker, upload=True, client=client)
    sent = {
        work_item_id
        for f in again.accepted
        for work_item_id in csv_rows(drop.uploaded[f.file_name])
    }
    assert sent == {"EmailNotFnd1", "PhoneOptdOut"}


def test_a_status_changed_after_reporting_goes_out_as_an_amendment(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    report_run(broker=cycle.broker, upload=True, client=client)
    late = late_match_deleted()

    run = report_run(broker=cycle.broker, upload=True, client=client)

    (amendment,) = run.accepted
    assert (amendment.file_name, amendment.kind) == ("20260312_4821_Email_amend01.csv", "amend")
    assert csv_rows(drop.amended[amendment.file_name]) == {"EmailNotFnd1": 3}
    late.refresh_from_db()
    assert (late.reported_status_code, late.needs_amendment, late.state) == (
        3,
        False,
        WorkItemState.REPORTED,
    )


def test_two_cycles_of_one_date_never_send_one_name(
    cycle: DropCycle, drop: DropSimulator, client: DropClient, tmp_path: Path
) -> None:
    """Both cycles' lists are dated March 12 (a second package pulled the same day): an
    amendment of the first, sent during the second's download, takes no name of the
    second's, or DROP would answer "already uploaded" and that counts as accepted."""
    report_run(broker=cycle.broker, upload=True, client=client)
    drop.queue_package(drop_zip(cycle.broker, {"Email": []}))
    client.download(tmp_path)  # DROP's second download of the day
    later = DropCycleFactory.create(broker=cycle.broker, drop_session_id="2")
    WorkItemFactory.create(cycle=later, status_code=5, work_item_id="LaterNotFnd1")
    report_run(broker=cycle.broker, upload=True, client=client)
    late_match_deleted()
    second = WorkItem.objects.get(work_item_id="LaterNotFnd1")
    DeletionRequestFactory.create(work_item=second, drop_outcome="deleted", late_match=True)
    work_item_settle(work_item=second)

    run = report_run(broker=cycle.broker, upload=True, client=client)

    names = sorted(f.file_name for f in run.accepted)
    assert names == [
        "20260312_4821_Email_amend01.csv",
        "20260312_4821_Email_amend02.csv",
    ], names
    assert all(not f.drop_response["already_uploaded"] for f in run.accepted)
    amended = {k: v for name in names for k, v in csv_rows(drop.amended[name]).items()}
    assert amended == {"EmailNotFnd1": 3, "LaterNotFnd1": 3}
    assert ReportFile.objects.get(cycle=later, kind="upload").file_name == (
        "20260312_4821_Email_part02.csv"
    )


# ---------------------------------------------------------------- faults


def test_drop_down_leaves_the_file_written_and_the_next_run_sends_it(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    drop.queue_response(503, body={"message": "Service Unavailable"}, times=3)

    failed = report_run(broker=cycle.broker, upload=True, client=client)

    assert failed.error is not None and "failed 3 times" in failed.error
    assert {f.file_name for f in failed.pending} == {EMAIL, PHONE}
    assert set(ReportFile.objects.values_list("state", flat=True)) == {ReportFileState.WRITTEN}
    assert drop.uploaded == {}
    written = dict(ReportFile.objects.values_list("file_name", "sha256"))
    event = LedgerEvent.objects.get(kind="report_file.upload_failed")
    assert event.data["status"] == 503

    again = report_run(broker=cycle.broker, upload=True, client=client)

    assert again.written == []  # nothing regenerated
    assert {f.file_name for f in again.accepted} == {EMAIL, PHONE}
    assert dict(ReportFile.objects.values_list("file_name", "sha256")) == written
    assert csv_rows(drop.uploaded[EMAIL]) == {"EmailDeleted": 3, "EmailNotFnd1": 5}


def test_drop_unreachable_is_the_same(cycle: DropCycle, drop: DropSimulator) -> None:
    drop.stop()
    unreachable = DropClient(
        drop.url,
        drop.api_key,
        sleep=lambda s: None,
        limits=DropLimits(max_retries=1, connect_timeout=1, read_timeout=1),
        allow_private=True,
    )

    run = report_run(broker=cycle.broker, upload=True, client=unreachable)

    assert run.error is not None and "cannot reach DROP" in run.error
    assert ReportFile.objects.filter(state=ReportFileState.WRITTEN).count() == 2


def test_throttling_is_waited_out_as_drop_asks(
    cycle: DropCycle, drop: DropSimulator, client: DropClient, sleeps: list[float]
) -> None:
    drop.queue_response(
        429, body={"message": "Too many requests"}, headers={"Retry-After": "7"}, times=2
    )

    run = report_run(broker=cycle.broker, upload=True, client=client)

    assert run.error is None
    assert sleeps[:2] == [7.0, 7.0]
    assert {f.file_name for f in run.accepted} == {EMAIL, PHONE}
    assert len(drop.calls("/data/upload")) == 4


def test_stopped_between_writing_and_uploading_the_next_run_uploads(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    written = report_run(broker=cycle.broker, upload=False)
    assert {f.file_name for f in written.pending} == {EMAIL, PHONE}
    assert drop.calls("/data/upload") == []

    run = report_files_upload(broker=cycle.broker, client=client)

    assert {f.file_name for f in run.accepted} == {EMAIL, PHONE}
    assert ReportFile.objects.count() == 2
    assert csv_rows(drop.uploaded[PHONE]) == {"PhoneOptdOut": 4}


class _DiesAfterDropAnswers(DropClient):
    """DROP accepted the upload; the process was killed before the answer was recorded."""

    def upload(self, files: Any) -> Any:
        super().upload(files)
        raise KeyboardInterrupt("killed")


def test_an_upload_accepted_then_retried_counts_as_accepted_once(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    dying = _DiesAfterDropAnswers(drop.url, drop.api_key, sleep=lambda s: None, allow_private=True)
    with pytest.raises(KeyboardInterrupt):
        report_run(broker=cycle.broker, upload=True, client=dying)
    assert ReportFile.objects.get(file_name=EMAIL).state == ReportFileState.WRITTEN
    assert EMAIL in drop.uploaded

    run = report_run(broker=cycle.broker, upload=True, client=client)

    assert {f.file_name for f in run.accepted} == {EMAIL, PHONE}
    email = ReportFile.objects.get(file_name=EMAIL)
    assert (email.state, email.drop_response["already_uploaded"]) == (
        ReportFileState.ACCEPTED,
        True,
    )
    assert ReportFile.objects.count() == 2  # no status was written into a second file
    sent = [r.files for r in drop.calls("/data/upload")]
    assert sent.count({EMAIL: drop.uploaded[EMAIL]}) == 2  # the same bytes both times


class _AnswerLostAfterDropTookIt(DropClient):
    """DROP took the upload; its answer never came back (timeouts past every retry)."""

    def upload(self, files: Any) -> Any:
        super().upload(files)
        raise DropUnavailable("DROP POST /data/upload failed 3 times; last: timeout")


def test_an_upload_whose_answer_timed_out_counts_as_accepted_once_when_sent_again(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    lost = _AnswerLostAfterDropTookIt(
        drop.url, drop.api_key, sleep=lambda s: None, allow_private=True
    )
    first = report_run(broker=cycle.broker, upload=True, client=lost)

    assert first.error is not None and "timeout" in first.error  # the run stops there
    email = ReportFile.objects.get(file_name=EMAIL)
    assert email.state == ReportFileState.WRITTEN
    assert email.drop_response["failures"] == 1
    assert WorkItem.objects.get(work_item_id="EmailDeleted").reported_at is None  # still owed
    assert EMAIL in drop.uploaded

    run = report_run(broker=cycle.broker, upload=True, client=client)

    assert {f.file_name for f in run.accepted} == {EMAIL, PHONE}
    email.refresh_from_db()
    assert (email.state, email.drop_response["already_uploaded"]) == (
        ReportFileState.ACCEPTED,
        True,
    )
    assert WorkItem.objects.get(work_item_id="EmailDeleted").reported_status_code == 3
    assert ReportFile.objects.count() == 2
    assert LedgerEvent.objects.filter(kind="report_file.accepted", subject=EMAIL).count() == 1
    assert LedgerEvent.objects.filter(kind="drop.outage_ended").count() == 1


def test_a_rejected_file_leaves_its_rows_owed_for_a_fresh_file(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    drop.broker_id = "9999"  # DROP refuses every file: the account's id differs

    run = report_run(broker=cycle.broker, upload=True, client=client)

    assert {f.file_name for f in run.rejected} == {EMAIL, PHONE}
    email = ReportFile.objects.get(file_name=EMAIL)
    assert email.state == ReportFileState.REJECTED
    assert "does not match" in email.drop_response["reason"]
    item = WorkItem.objects.get(work_item_id="EmailDeleted")
    assert (item.state, item.reported_at, item.report_file_id) == (
        WorkItemState.REPORTABLE,
        None,
        None,
    )
    assert item.pending_report_file_id == email.pk  # owed, with the file staff will look at
    assert email.drop_response["rows_owed_again"] == 2
    assert LedgerEvent.objects.filter(kind="report_file.rejected").count() == 2

    drop.broker_id = "4821"
    again = report_run(broker=cycle.broker, upload=True, client=client)

    assert sorted(f.file_name for f in again.accepted) == [
        "20260312_4821_Email_part02.csv",
        "20260312_4821_Phone_part02.csv",
    ]


def test_a_rejected_file_queues_an_alert_evaluation_at_once(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    evaluations = ProcrastinateJob.objects.filter(task_name="integrations.tasks.evaluate_alerts")
    report_run(broker=cycle.broker, upload=True, client=client)
    assert not evaluations.exists()  # accepted files alert nobody

    WorkItemFactory.create(cycle=cycle, status_code=3, work_item_id="EmailLater01")
    drop.broker_id = "9999"  # DROP refuses the next file
    run = report_run(broker=cycle.broker, upload=True, client=client)

    assert run.rejected
    assert evaluations.get().status == "todo"  # staff hear of it now, not in 5 minutes


def test_a_status_drop_never_accepted_is_never_sent_as_an_amendment(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    report_files_write(broker=cycle.broker)  # written; not uploaded yet
    late = late_match_deleted()  # its status changes before DROP saw the first one
    drop.broker_id = "9999"  # and DROP rejects that upload

    report_run(broker=cycle.broker, upload=True, client=client)
    drop.broker_id = "4821"
    again = report_run(broker=cycle.broker, upload=True, client=client)

    assert again.error is None
    assert drop.amended == {}  # DROP never accepted a status for it: nothing to amend
    assert csv_rows(drop.uploaded["20260312_4821_Email_part02.csv"]) == {
        "EmailDeleted": 3,
        "EmailNotFnd1": 3,
    }
    late.refresh_from_db()
    assert (late.state, late.reported_status_code, late.needs_amendment) == (
        WorkItemState.REPORTED,
        3,
        False,
    )
    assert not ReportFile.objects.filter(kind="amend").exists()


def test_a_changed_status_waits_for_drops_answer_to_its_upload_then_is_amended(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    report_files_write(broker=cycle.broker)
    late_match_deleted()

    first = report_run(broker=cycle.broker, upload=True, client=client)
    assert sorted(f.file_name for f in first.accepted) == [EMAIL, PHONE]
    assert csv_rows(drop.uploaded[EMAIL])["EmailNotFnd1"] == 5
    second = report_run(broker=cycle.broker, upload=True, client=client)

    (amendment,) = second.accepted
    assert csv_rows(drop.amended[amendment.file_name]) == {"EmailNotFnd1": 3}


def test_409_keeps_the_file_for_later(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    drop.active_download = False

    run = report_run(broker=cycle.broker, upload=True, client=client)

    assert run.error is None  # each file refused on its own: none stops the others
    assert {f.file_name for f in run.refused} == {EMAIL, PHONE}
    assert "no active download" in run.refused[0].drop_response["message"]
    assert ReportFile.objects.filter(state=ReportFileState.REFUSED).count() == 2

    drop.active_download = True
    again = report_run(broker=cycle.broker, upload=True, client=client)

    assert {f.file_name for f in again.accepted} == {EMAIL, PHONE}


def test_one_uploader_per_broker(cycle: DropCycle, client: DropClient) -> None:
    other = connections.create_connection("default")  # a second process's session
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", [_UPLOAD_LOCK, cycle.broker.pk])
        with pytest.raises(ReportBusy, match="another process is uploading"):
            report_run(broker=cycle.broker, upload=True, client=client)
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_UPLOAD_LOCK, cycle.broker.pk])
    finally:
        other.close()
    assert ReportFile.objects.filter(state=ReportFileState.WRITTEN).count() == 2

    assert report_files_upload(broker=cycle.broker, client=client).error is None


def test_upload_needs_a_drop_api_key(broker: Broker) -> None:
    cycle = DropCycleFactory.create(broker=broker)
    WorkItemFactory.create(cycle=cycle, status_code=5)
    with pytest.raises(ValidationError, match="no DROP API key"):
        report_run(broker=broker, upload=True)
    assert not ReportFile.objects.exists()  # refused before writing anything


# ---------------------------------------------------------------- manual mode


def test_mark_uploaded_by_hand(cycle: DropCycle) -> None:
    pending = WorkItem.objects.get(work_item_id="EmailPending")
    pending.deletion_requests.update(state=RequestState.COMPLETED, drop_outcome="deleted")
    work_item_settle(work_item=pending)
    files = report_files_write(broker=cycle.broker)

    for report_file in files:
        report_file_mark_uploaded(report_file=report_file, actor="staff:alice")

    assert set(ReportFile.objects.values_list("state", flat=True)) == {ReportFileState.MANUAL}
    assert LedgerEvent.objects.filter(kind="report_file.marked_uploaded").count() == 2
    cycle.refresh_from_db()
    assert cycle.state == CycleState.REPORTED
    with pytest.raises(ValidationError, match="only a written or refused file"):
        report_file_mark_uploaded(report_file=files[0], actor="staff:alice")


def test_no_mark_uploaded_while_the_files_are_being_uploaded(cycle: DropCycle) -> None:
    (email, _phone) = sorted(report_files_write(broker=cycle.broker), key=lambda f: f.file_name)
    other = connections.create_connection("default")  # an uploading process's session
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", [_UPLOAD_LOCK, cycle.broker.pk])
        # DROP could reject the file while staff mark it: wait for the upload to finish.
        with pytest.raises(ReportBusy, match="another process is uploading"):
            report_file_mark_uploaded(report_file=email, actor="staff:alice")
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_UPLOAD_LOCK, cycle.broker.pk])
    finally:
        other.close()
    assert ReportFile.objects.get(pk=email.pk).state == ReportFileState.WRITTEN
    assert not LedgerEvent.objects.filter(kind="report_file.marked_uploaded").exists()
    report_file_mark_uploaded(report_file=email, actor="staff:alice")
    assert ReportFile.objects.get(pk=email.pk).state == ReportFileState.MANUAL


@pytest.mark.django_db(transaction=True)
def test_drops_rejection_of_a_file_staff_try_to_mark_meanwhile_is_recorded(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    (email, _phone) = sorted(report_files_write(broker=cycle.broker), key=lambda f: f.file_name)
    drop.queue_response(
        400,
        body={
            "message": "0 accepted",
            "acceptedCount": 0,
            "rejectedCount": 1,
            "accepted": [],
            "rejected": [{"fileName": EMAIL, "message": "Invalid status in row 2."}],
        },
        path="/data/upload",
    )
    refused_to_staff: list[ReportBusy] = []
    upload = client.upload

    def upload_while_staff_mark_it(files: Any) -> Any:
        # Another process (the admin's "Mark uploaded") while the uploader sends the file.
        def staff_mark_it() -> None:
            try:
                report_file_mark_uploaded(report_file=email, actor="staff:alice")
            except ReportBusy as busy:
                refused_to_staff.append(busy)
            finally:
                connections.close_all()

        if [name for name, _content in files] == [EMAIL]:
            staff = threading.Thread(target=staff_mark_it)
            staff.start()
            staff.join()
        return upload(files)

    client.upload = upload_while_staff_mark_it  # type: ignore[method-assign]
    run = report_files_upload(broker=cycle.broker, client=client)

    assert len(refused_to_staff) == 1
    assert [f.file_name for f in run.rejected] == [EMAIL]
    assert ReportFile.objects.get(pk=email.pk).state == ReportFileState.REJECTED
    assert LedgerEvent.objects.filter(kind="report_file.rejected", subject=EMAIL).exists()
    assert not LedgerEvent.objects.filter(kind="report_file.marked_uploaded").exists()


# ---------------------------------------------------------------- the periodic job


@pytest.fixture
def auto(
    client: DropClient,
) -> Callable[..., Any]:
    def run(broker: Broker, today: dt.date = dt.date(2026, 3, 20)) -> Any:
        return report_auto(broker=broker, client=client, today=today)

    return run


def test_the_job_waits_for_a_complete_cycle(
    cycle: DropCycle, drop: DropSimulator, auto: Callable[..., Any]
) -> None:
    assert auto(cycle.broker).written == []

    pending = WorkItem.objects.get(work_item_id="EmailPending")
    # The outcome was recorded without settling the item: the job's safety net settles it.
    pending.deletion_requests.update(state=RequestState.COMPLETED, drop_outcome="exempt")

    run = auto(cycle.broker)

    assert {f.file_name for f in run.accepted} == {EMAIL, PHONE}
    assert csv_rows(drop.uploaded[EMAIL])["EmailPending"] == 2


def test_the_job_reports_in_part_when_the_due_date_is_close(
    cycle: DropCycle, drop: DropSimulator, auto: Callable[..., Any]
) -> None:
    run = auto(cycle.broker, today=cycle.due_date - dt.timedelta(days=2))

    assert {f.file_name for f in run.accepted} == {EMAIL, PHONE}
    assert "EmailPending" not in csv_rows(drop.uploaded[EMAIL])


def test_the_job_sends_amendments_for_reported_cycles(
    cycle: DropCycle, drop: DropSimulator, auto: Callable[..., Any]
) -> None:
    pending = WorkItem.objects.get(work_item_id="EmailPending")
    pending.deletion_requests.update(state=RequestState.COMPLETED, drop_outcome="not_found")
    work_item_settle(work_item=pending)
    auto(cycle.broker)
    cycle.refresh_from_db()
    assert cycle.state == CycleState.REPORTED
    late = WorkItem.objects.get(work_item_id="PhoneOptdOut")
    DeletionRequestFactory.create(work_item=late, drop_outcome="opted_out")
    DeletionRequestFactory.create(work_item=late, drop_outcome="deleted", remote_identifier="C-2")
    work_item_settle(work_item=late)  # still 4: nothing to amend
    late_match_deleted()

    run = auto(cycle.broker)

    (amendment,) = run.accepted
    assert csv_rows(drop.amended[amendment.file_name]) == {"EmailNotFnd1": 3}


def test_a_job_killed_once_drop_took_the_last_file_reports_the_cycle_next_run(
    cycle: DropCycle, drop: DropSimulator, auto: Callable[..., Any], monkeypatch
) -> None:
    pending = WorkItem.objects.get(work_item_id="EmailPending")
    pending.deletion_requests.update(state=RequestState.COMPLETED, drop_outcome="not_found")
    work_item_settle(work_item=pending)

    def killed(**kwargs: Any) -> None:
        raise KeyboardInterrupt("killed")

    with monkeypatch.context() as kill:
        # Every answer recorded; killed before the cycle's own state followed.
        kill.setattr(report_uploads, "cycle_state_refresh", killed)
        with pytest.raises(KeyboardInterrupt):
            auto(cycle.broker)
    assert not WorkItem.objects.owed().exists()  # DROP holds every status
    outstanding_cycles_clear()  # the periodic job that runs beside the report's

    auto(cycle.broker)

    cycle.refresh_from_db()
    assert cycle.state == CycleState.REPORTED
    assert LedgerEvent.objects.filter(kind="drop_cycle.reported", subject="1").count() == 1
    assert len(drop.calls("/data/upload")) == 2  # nothing sent again


def test_an_amendment_drop_took_before_the_process_was_killed_is_accepted_once(
    cycle: DropCycle, drop: DropSimulator, client: DropClient, auto: Callable[..., Any]
) -> None:
    report_run(broker=cycle.broker, upload=True, client=client)
    late_match_deleted()

    class DiesAfterDropAnswers(DropClient):
        def amend(self, files: Any) -> Any:
            super().amend(files)
            raise KeyboardInterrupt("killed")

    dying = DiesAfterDropAnswers(drop.url, drop.api_key, sleep=lambda s: None, allow_private=True)
    with pytest.raises(KeyboardInterrupt):
        report_auto(broker=cycle.broker, client=dying, today=dt.date(2026, 3, 20))
    amend = "20260312_4821_Email_amend01.csv"
    assert ReportFile.objects.get(file_name=amend).state == ReportFileState.WRITTEN
    assert csv_rows(drop.amended[amend]) == {"EmailNotFnd1": 3}

    run = auto(cycle.broker)

    assert [f.file_name for f in run.accepted] == [amend]  # the same file, not a second one
    assert ReportFile.objects.filter(kind="amend").count() == 1
    sent = [r.files for r in drop.calls("/data/amend")]
    assert sent == [{amend: drop.amended[amend]}] * 2  # the same bytes both times
    late = WorkItem.objects.get(work_item_id="EmailNotFnd1")
    assert (late.reported_status_code, late.needs_amendment) == (3, False)
    assert LedgerEvent.objects.filter(kind="report_file.accepted", subject=amend).count() == 1
    assert auto(cycle.broker).written == []  # nothing owed: nothing more goes to DROP
    assert len(drop.calls("/data/amend")) == 2


def test_the_job_leaves_a_rejected_files_rows_to_staff_and_sends_the_rest(
    cycle: DropCycle, drop: DropSimulator, client: DropClient, auto: Callable[..., Any]
) -> None:
    drop.broker_id = "9999"  # DROP rejects the partial report's files
    first = auto(cycle.broker, today=cycle.due_date)
    assert {f.file_name for f in first.rejected} == {EMAIL, PHONE}
    drop.broker_id = "4821"
    pending = WorkItem.objects.get(work_item_id="EmailPending")
    pending.deletion_requests.update(state=RequestState.COMPLETED, drop_outcome="exempt")
    work_item_settle(work_item=pending)

    run = auto(cycle.broker, today=cycle.due_date)

    # The cycle's other status goes out; the rejected rows wait for staff, not re-sent.
    (part,) = run.accepted
    assert csv_rows(drop.uploaded[part.file_name]) == {"EmailPending": 2}
    assert auto(cycle.broker, today=cycle.due_date).written == []
    owed = WorkItem.objects.owed().values_list("work_item_id", flat=True)
    assert sorted(owed) == ["EmailDeleted", "EmailNotFnd1", "PhoneOptdOut"]

    staff = report_run(broker=cycle.broker, upload=True, client=client)

    assert sorted(f.file_name for f in staff.accepted) == [
        "20260312_4821_Email_part03.csv",
        "20260312_4821_Phone_part02.csv",
    ]
    cycle.refresh_from_db()
    assert cycle.state == CycleState.REPORTED


def test_a_row_drop_would_refuse_stops_the_cycle_whole(cycle: DropCycle) -> None:
    WorkItemFactory.create(
        cycle=cycle, status_code=3, work_item_id="bad_id_00001"
    )  # not 12 letters or digits

    with pytest.raises(ValidationError, match="cannot write a response file"):
        report_files_write(broker=cycle.broker)

    assert not ReportFile.objects.exists()
    assert not WorkItem.objects.filter(reported_at__isnull=False).exists()
    assert not LedgerEvent.objects.filter(kind="report_file.written").exists()


# ---------------------------------------------------------------- one refused file


AMEND = "20260312_4821_Email_amend01.csv"
NEXT_EMAIL = "20260420_4821_Email.csv"


@pytest.fixture
def refused_amendment(cycle: DropCycle, drop: DropSimulator, client: DropClient) -> WorkItem:
    """Cycle 1 reported and accepted; a late match changes EmailNotFnd1 (5) to 3, and DROP
    no longer takes amendments of that download. Cycle 2 has a first status to upload."""
    report_run(broker=cycle.broker, upload=True, client=client)
    late = late_match_deleted()
    drop.closed_downloads.add("20260312")
    newer = DropCycleFactory.create(
        broker=cycle.broker, drop_session_id="2", match_date=dt.date(2026, 4, 20)
    )
    WorkItemFactory.create(cycle=newer, status_code=3, work_item_id="NextDeleted1")
    return late


def test_a_refused_amendment_of_an_old_cycle_holds_back_no_other_file(
    refused_amendment: WorkItem, drop: DropSimulator, client: DropClient
) -> None:
    run = report_run(broker=refused_amendment.broker, upload=True, client=client)

    assert csv_rows(drop.uploaded[NEXT_EMAIL]) == {"NextDeleted1": 3}  # sent all the same
    assert run.error is None
    assert [f.file_name for f in run.refused] == [AMEND]
    amendment = ReportFile.objects.get(file_name=AMEND)
    assert amendment.state == ReportFileState.REFUSED
    assert "not possible in the current state" in amendment.drop_response["message"]
    assert amendment.drop_response["status"] == 409
    event = LedgerEvent.objects.get(kind="report_file.refused")
    assert (event.subject, event.data["status"]) == (AMEND, 409)
    assert ReportFile.objects.get(file_name=NEXT_EMAIL).state == ReportFileState.ACCEPTED

    again = report_run(broker=refused_amendment.broker, upload=True, client=client)

    assert again.error is None and [f.file_name for f in again.refused] == [AMEND]
    assert LedgerEvent.objects.filter(kind="report_file.refused").count() == 1  # news once
    assert len(drop.calls("/data/amend")) == 2  # tried again: DROP's state may change
    drop.closed_downloads.clear()

    accepted = report_run(broker=refused_amendment.broker, upload=True, client=client)

    assert [f.file_name for f in accepted.accepted] == [AMEND]
    assert csv_rows(drop.amended[AMEND]) == {"EmailNotFnd1": 3}


def test_drop_down_still_stops_the_run(
    refused_amendment: WorkItem, drop: DropSimulator, client: DropClient
) -> None:
    drop.queue_response(503, body={"message": "Service Unavailable"}, times=3)

    run = report_run(broker=refused_amendment.broker, upload=True, client=client)

    assert run.error is not None and "failed 3 times" in run.error
    assert drop.uploaded.keys() == {EMAIL, PHONE}  # nothing more
    assert {f.file_name for f in run.pending} == {AMEND, NEXT_EMAIL}
    assert not ReportFile.objects.filter(state=ReportFileState.REFUSED).exists()


def test_the_job_goes_past_a_refused_amendment_too(
    refused_amendment: WorkItem, drop: DropSimulator, auto: Callable[..., Any]
) -> None:
    run = auto(refused_amendment.broker, today=dt.date(2026, 6, 1))

    assert [f.file_name for f in run.refused] == [AMEND]
    assert csv_rows(drop.uploaded[NEXT_EMAIL]) == {"NextDeleted1": 3}


def test_an_upload_refused_with_409_stops_only_itself(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    drop.queue_response(
        409, body={"message": "No active download is waiting for responses."}, times=1
    )

    run = report_run(broker=cycle.broker, upload=True, client=client)

    assert run.error is None
    (refused,) = run.refused
    (accepted,) = run.accepted
    assert refused.state == ReportFileState.REFUSED
    assert accepted.file_name in drop.uploaded
    cycle.refresh_from_db()
    assert cycle.state == CycleState.OPEN  # DROP has not got every file


def test_staff_discard_a_refused_amendment_and_the_item_keeps_what_drop_holds(
    refused_amendment: WorkItem, drop: DropSimulator, client: DropClient
) -> None:
    report_run(broker=refused_amendment.broker, upload=True, client=client)
    upload = ReportFile.objects.get(file_name=EMAIL)
    refused = ReportFile.objects.get(file_name=AMEND)
    before = WorkItem.objects.get(work_item_id="EmailDeleted")

    discarded = report_file_discard(
        report_file=refused, reason="DROP closed cycle 1; confirmed by its support", actor="cli:al"
    )

    assert (discarded.state, discarded.discard_reason, discarded.discarded_by) == (
        ReportFileState.DISCARDED,
        "DROP closed cycle 1; confirmed by its support",
        "cli:al",
    )
    item = WorkItem.objects.get(pk=refused_amendment.pk)
    assert (item.state, item.reported_status_code, item.report_file_id) == (
        WorkItemState.REPORTED,
        5,  # what DROP holds
        upload.pk,
    )
    assert (item.status_code, item.needs_amendment) == (3, False)
    assert item.reported_at == before.reported_at  # reported with the upload
    event = LedgerEvent.objects.get(kind="report_file.discarded")
    assert (event.subject, event.actor) == (AMEND, "cli:al")
    assert event.data["reason"] == "DROP closed cycle 1; confirmed by its support"
    assert event.data["work_items_kept"] == 1

    again = report_run(broker=refused_amendment.broker, upload=True, client=client)

    assert again.written == [] and again.refused == []  # nothing owed, nothing resent
    assert len(drop.calls("/data/amend")) == 1


def test_a_discarded_amendment_stays_given_up_when_the_item_is_settled_again(
    refused_amendment: WorkItem, drop: DropSimulator, client: DropClient
) -> None:
    """Every outcome settles its item again, a recurring round's too (45 days later): with
    the status unchanged, what staff gave up must not come back as a new amendment."""
    report_run(broker=refused_amendment.broker, upload=True, client=client)
    report_file_discard(
        report_file=ReportFile.objects.get(file_name=AMEND), reason="closed", actor="cli:al"
    )
    settled_events = LedgerEvent.objects.filter(kind="work_item.status_settled").count()

    work_item_settle(work_item=refused_amendment)

    item = WorkItem.objects.get(pk=refused_amendment.pk)
    assert (item.state, item.status_code, item.needs_amendment) == (
        WorkItemState.REPORTED,
        3,
        False,
    )
    assert LedgerEvent.objects.filter(kind="work_item.status_settled").count() == settled_events
    drop.closed_downloads.clear()
    again = report_run(broker=refused_amendment.broker, upload=True, client=client)
    assert again.written == [] and len(drop.calls("/data/amend")) == 1


def test_only_a_refused_or_rejected_amendment_can_be_discarded_and_with_a_reason(
    refused_amendment: WorkItem, client: DropClient
) -> None:
    report_run(broker=refused_amendment.broker, upload=True, client=client)
    refused = ReportFile.objects.get(file_name=AMEND)
    with pytest.raises(ValidationError, match="write why"):
        report_file_discard(report_file=refused, reason="  ", actor="cli:al")
    with pytest.raises(ValidationError, match="only an amendment"):
        report_file_discard(
            report_file=ReportFile.objects.get(file_name=EMAIL), reason="no", actor="cli:al"
        )
    accepted_upload = ReportFile.objects.get(file_name=NEXT_EMAIL)
    with pytest.raises(ValidationError, match="only an amendment"):
        report_file_discard(report_file=accepted_upload, reason="no", actor="cli:al")
    assert ReportFile.objects.get(file_name=AMEND).state == ReportFileState.REFUSED
    assert not LedgerEvent.objects.filter(kind="report_file.discarded").exists()


def test_a_status_changed_while_its_amendment_is_refused_waits_then_goes_out(
    refused_amendment: WorkItem, drop: DropSimulator, client: DropClient
) -> None:
    report_run(broker=refused_amendment.broker, upload=True, client=client)
    DeletionRequestFactory.create(
        work_item=refused_amendment, drop_outcome="opted_out", remote_identifier="C-2"
    )
    work_item_settle(work_item=refused_amendment)

    waiting = report_run(broker=refused_amendment.broker, upload=True, client=client)
    assert waiting.written == []  # not amended on top of an amendment DROP has not taken

    report_file_discard(
        report_file=ReportFile.objects.get(file_name=AMEND), reason="closed", actor="cli:al"
    )
    item = WorkItem.objects.get(pk=refused_amendment.pk)
    assert (item.state, item.reported_status_code, item.needs_amendment) == (
        WorkItemState.REPORTABLE,
        5,
        True,
    )
    drop.closed_downloads.clear()
    run = report_run(broker=refused_amendment.broker, upload=True, client=client)
    (amendment,) = run.accepted
    assert csv_rows(drop.amended[amendment.file_name]) == {"EmailNotFnd1": 4}


# ---------------------------------------------------------------- a rejected amendment


def test_a_rejected_amendment_leaves_the_status_drop_holds_and_is_owed_again(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    report_run(broker=cycle.broker, upload=True, client=client)
    upload = ReportFile.objects.get(file_name=EMAIL)
    late = WorkItem.objects.get(work_item_id="EmailNotFnd1")
    reported_at = late.reported_at
    DeletionRequestFactory.create(work_item=late, drop_outcome="deleted", late_match=True)
    work_item_settle(work_item=late)
    drop.broker_id = "9999"  # DROP rejects the amendment file

    run = report_run(broker=cycle.broker, upload=True, client=client)

    assert [f.file_name for f in run.rejected] == [AMEND]
    late.refresh_from_db()
    assert (late.reported_status_code, late.report_file_id, late.reported_at) == (
        5,  # DROP still holds the upload's status
        upload.pk,
        reported_at,
    )
    assert (late.state, late.needs_amendment) == (WorkItemState.REPORTABLE, True)
    assert late.pending_report_file_id == run.rejected[0].pk  # owed again, with that file
    # What the figures and exports say: DROP holds a 5 for it, not "nothing reported".
    figures = drop_metrics(broker=cycle.broker, year=2026).total.figures
    assert (figures["not_found"], figures["open"]) == (1, 1)  # the 5, and EmailPending
    (exported,) = [
        row
        for row in deletion_outcomes(requests=late.deletion_requests.all())
        if row["work_item_id"] == "EmailNotFnd1"
    ]
    assert (exported["reported_status_code"], exported["report_file"]) == (5, EMAIL)

    drop.broker_id = "4821"
    again = report_run(broker=cycle.broker, upload=True, client=client)

    (amendment,) = again.accepted
    assert amendment.file_name == "20260312_4821_Email_amend02.csv"
    assert csv_rows(drop.amended[amendment.file_name]) == {"EmailNotFnd1": 3}


def test_staff_discard_a_rejected_amendment(
    cycle: DropCycle, drop: DropSimulator, client: DropClient
) -> None:
    report_run(broker=cycle.broker, upload=True, client=client)
    late = late_match_deleted()
    drop.broker_id = "9999"
    report_run(broker=cycle.broker, upload=True, client=client)
    drop.broker_id = "4821"

    report_file_discard(
        report_file=ReportFile.objects.get(file_name=AMEND), reason="DROP says no", actor="x"
    )

    late.refresh_from_db()
    assert (late.state, late.reported_status_code, late.needs_amendment) == (
        WorkItemState.REPORTED,
        5,
        False,
    )
    assert report_run(broker=cycle.broker, upload=True, client=client).written == []
    assert drop.amended == {}


def test_no_discard_while_the_files_are_being_uploaded(
    refused_amendment: WorkItem, client: DropClient
) -> None:
    report_run(broker=refused_amendment.broker, upload=True, client=client)
    refused = ReportFile.objects.get(file_name=AMEND)
    other = connections.create_connection("default")  # an uploading process's session
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", [_UPLOAD_LOCK, refused.broker_id])
        # DROP could take the file while staff give it up: wait for the upload to finish.
        with pytest.raises(ReportBusy):
            report_file_discard(report_file=refused, reason="closed", actor="cli:al")
        # Let go before closing: the server ends a closed session (and its locks) a moment later.
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_UPLOAD_LOCK, refused.broker_id])
    finally:
        other.close()
    assert ReportFile.objects.get(pk=refused.pk).state == ReportFileState.REFUSED
    report_file_discard(report_file=refused, reason="closed", actor="cli:al")
    assert ReportFile.objects.get(pk=refused.pk).state == ReportFileState.DISCARDED


def test_a_run_refreshes_only_the_open_cycles_a_stopped_run_can_leave_behind(
    cycle: DropCycle, drop: DropSimulator, auto: Callable[..., Any], monkeypatch
) -> None:
    # A cycle with no file yet (EmailPending still open), and one whose file waits for DROP
    # (the run sends it: refreshed as one it sent); neither was left behind by a stopped run.
    waiting = DropCycleFactory.create(
        broker=cycle.broker, drop_session_id="2", match_date=dt.date(2026, 3, 15)
    )
    WorkItemFactory.create(cycle=waiting, status_code=3, work_item_id="NextDeleted1")
    refreshed: list[str] = []
    real_refresh = report_uploads.cycle_state_refresh

    def recorded(*, cycle: DropCycle, actor: str) -> Any:
        refreshed.append(cycle.drop_session_id)
        return real_refresh(cycle=cycle, actor=actor)

    monkeypatch.setattr(report_uploads, "cycle_state_refresh", recorded)

    auto(cycle.broker)

    assert refreshed == ["2"]  # cycle 1 has no file: nothing a stopped run could leave
