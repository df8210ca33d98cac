"""``drop report --approve FILE`` / ``--reject FILE --reason TEXT``: a broker's "approve
uploads" decided on the command line, by someone other than whoever wrote the file."""

from __future__ import annotations

import io
import json
import os
import pwd
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from procrastinate.contrib.django.models import ProcrastinateJob

from devtools.drop_simulator import DropSimulator
from integrations.management.base import DropportalCommand
from integrations.models import Broker, DropCycle, LedgerEvent, ReportFile, ReportFileState
from integrations.services.reporting.report_approval import report_file_approve
from integrations.services.reporting.report_files import report_files_write
from integrations.services.staff.brokers import broker_update
from tests.builders import DropCycleFactory, WorkItemFactory, broker_reports_to

pytestmark = pytest.mark.django_db

ME = f"cli:{pwd.getpwuid(os.geteuid()).pw_name}"  # who runs the tests, by the user table

EMAIL = "20260312_4821_Email.csv"
PHONE = "20260312_4821_Phone.csv"


@pytest.fixture
def cycle(broker: Broker, drop: DropSimulator) -> DropCycle:
    broker_reports_to(broker, drop)
    broker_update(broker=broker, approve_uploads=True, actor="staff:carol")
    cycle = DropCycleFactory.create(broker=broker)
    WorkItemFactory.create(cycle=cycle, status_code=3, work_item_id="EmailDeleted")
    WorkItemFactory.create(
        cycle=cycle, list_type="Phone", status_code=5, work_item_id="PhoneNotFnd1"
    )
    return cycle


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("drop", "report", "--broker", "4821", *args, stdout=out)
    return out.getvalue()


def test_the_report_writes_files_that_wait_and_says_who_approves(
    cycle: DropCycle, drop: DropSimulator
) -> None:
    output = run("--upload")

    assert f"Waiting for approval: {EMAIL} (Email upload, 1 rows: 3 deleted 1)" in output
    assert f"--approve {EMAIL}`" in output
    assert drop.uploaded == {}
    listed = json.loads(run("--json"))
    assert [(f["file_name"], f["statuses"]["3"]) for f in listed["awaiting_approval"]] == [
        (EMAIL, 1),
        (PHONE, 0),
    ]
    assert listed["awaiting_approval"][0]["written_by"] == ME


def test_a_waiting_file_is_not_saved_for_an_upload_by_hand(
    cycle: DropCycle, tmp_path: Path
) -> None:
    output = run("--out", str(tmp_path))  # writes them, waiting
    assert f"Wrote {EMAIL}" in output
    assert list(tmp_path.iterdir()) == []

    report_file_approve(report_file=ReportFile.objects.get(file_name=EMAIL), actor="staff:bob")
    run("--out", str(tmp_path))

    assert [p.name for p in tmp_path.iterdir()] == [EMAIL]


def test_who_wrote_it_cannot_approve_it_on_the_command_line(cycle: DropCycle) -> None:
    run()  # written as cli:<this user>

    with pytest.raises(CommandError, match="a second person must approve it"):
        run("--approve", EMAIL)

    assert ReportFile.objects.get(file_name=EMAIL).state == ReportFileState.AWAITING_APPROVAL


def test_naming_another_user_in_the_environment_does_not_make_a_second_person(
    cycle: DropCycle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``getpass.getuser`` reads ``LOGNAME`` and ``USER`` first: a writer who set them could
    approve their own file under another's name."""
    run()  # written as cli:<this user>
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.setenv(name, "someone-else")

    with pytest.raises(CommandError, match="a second person must approve it"):
        run("--approve", EMAIL)

    assert not LedgerEvent.objects.filter(kind="report_file.approved").exists()
    assert LedgerEvent.objects.filter(actor=ME).exists()
    assert not LedgerEvent.objects.filter(actor__contains="someone-else").exists()


def test_a_user_id_without_a_name_is_named_by_its_number(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_such_user(uid: int) -> None:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_such_user)

    assert DropportalCommand.actor() == f"cli:uid {os.geteuid()}"


def test_another_person_approves_then_the_report_job_uploads_it(
    cycle: DropCycle, drop: DropSimulator
) -> None:
    report_files_write(broker=cycle.broker, actor="staff:alice")

    output = run("--approve", EMAIL, "--reason", "counts match the CRM")

    assert output.startswith(f"Approved {EMAIL} (Email upload, 1 rows: 3 deleted 1)")
    event = LedgerEvent.objects.get(kind="report_file.approved")
    assert (event.actor, event.data["reason"]) == (
        ME,
        "counts match the CRM",
    )
    assert ProcrastinateJob.objects.filter(task_name="integrations.tasks.report_broker").exists()

    run("--upload")  # what the job does: send every written file

    assert set(drop.uploaded) == {EMAIL}
    assert ReportFile.objects.get(file_name=EMAIL).state == ReportFileState.ACCEPTED
    assert ReportFile.objects.get(file_name=PHONE).state == ReportFileState.AWAITING_APPROVAL


def test_reject_needs_a_reason_then_the_file_is_never_sent(
    cycle: DropCycle, drop: DropSimulator
) -> None:
    report_files_write(broker=cycle.broker, actor="staff:alice")

    with pytest.raises(CommandError, match="--reject FILE and --reason TEXT go together"):
        run("--reject", EMAIL)
    with pytest.raises(CommandError, match="one or the other"):
        run("--approve", EMAIL, "--reject", PHONE, "--reason", "x")
    with pytest.raises(CommandError, match="has no response file 'nope"):
        run("--approve", "nope.csv")

    decided = json.loads(run("--reject", EMAIL, "--reason", "the CRM export was partial", "--json"))

    assert decided["rejected"]["state"] == ReportFileState.NOT_APPROVED
    assert decided["rejected"]["review_reason"] == "the CRM export was partial"
    # Its statuses are owed again: the next report writes them into a new file, which waits.
    output = run("--upload")
    assert "Wrote 20260312_4821_Email_part02.csv" in output
    assert "Waiting for approval: 20260312_4821_Email_part02.csv" in output
    assert drop.uploaded == {}
    assert LedgerEvent.objects.get(kind="report_file.approval_rejected").data["reason"] == (
        "the CRM export was partial"
    )
