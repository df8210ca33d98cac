"""``drop report``: write the response CSVs, save them with --out, upload with --upload."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from devtools.drop_simulator import DropSimulator
from integrations.drop.calendar import drop_today
from integrations.models import (
    Broker,
    DropCycle,
    LedgerEvent,
    ReportFile,
    ReportFileState,
    RequestState,
    WorkItem,
)
from integrations.services.cycle.work_items import work_item_status_set
from tests.builders import (
    DeletionRequestFactory,
    DropCycleFactory,
    WorkItemFactory,
    broker_reports_to,
)

pytestmark = pytest.mark.django_db

EMAIL = "20260312_4821_Email.csv"
PHONE = "20260312_4821_Phone.csv"


@pytest.fixture
def cycle(broker: Broker, drop: DropSimulator) -> DropCycle:
    broker_reports_to(broker, drop)
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


def test_write_and_save_for_a_manual_upload(cycle: DropCycle, tmp_path: Path) -> None:
    output = run("--out", str(tmp_path / "responses"))

    assert f"Wrote {EMAIL}: 1 rows (upload (new statuses)), sha256 " in output
    assert "Waiting for upload: " in output
    saved = tmp_path / "responses" / EMAIL
    assert saved.read_bytes() == b"Id,Status\r\nEmailDeleted,3\r\n"
    assert (tmp_path / "responses" / PHONE).read_bytes() == b"Id,Status\r\nPhoneNotFnd1,5\r\n"

    again = run("--out", str(tmp_path / "again"))  # nothing new, the waiting files again

    assert "Wrote" not in again
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == [EMAIL, PHONE]


def test_two_cycles_of_one_date_save_side_by_side(cycle: DropCycle, tmp_path: Path) -> None:
    later = DropCycleFactory.create(broker=cycle.broker, drop_session_id="2")  # lists of one date
    WorkItemFactory.create(cycle=later, status_code=3, work_item_id="EmailDeleted2")

    run("--out", str(tmp_path))

    assert (tmp_path / EMAIL).read_bytes() == b"Id,Status\r\nEmailDeleted,3\r\n"
    later_name = EMAIL.replace(".csv", "_part02.csv")  # a broker never uses a name twice
    assert (tmp_path / later_name).read_bytes() == b"Id,Status\r\nEmailDeleted2,3\r\n"


def test_two_cycles_files_of_one_name_are_not_saved_over_each_other(
    cycle: DropCycle, tmp_path: Path
) -> None:
    """Files an older version wrote may share a name across two cycles of one date."""
    later = DropCycleFactory.create(broker=cycle.broker, drop_session_id="2")
    WorkItemFactory.create(cycle=later, status_code=3, work_item_id="EmailDeleted2")
    run()
    ReportFile.objects.filter(cycle=later).update(file_name=EMAIL)
    out = tmp_path / "responses"

    with pytest.raises(
        CommandError, match=rf"nothing saved: the files of cycles 1, 2 are all named {EMAIL}"
    ):
        run("--out", str(out))

    assert not out.exists() or not any(out.iterdir())
    for each in (cycle, later):  # one cycle at a time, each to its folder
        run("--cycle", each.drop_session_id, "--out", str(tmp_path / each.drop_session_id))
    first = (tmp_path / cycle.drop_session_id / EMAIL).read_bytes()
    assert first == b"Id,Status\r\nEmailDeleted,3\r\n"
    assert (tmp_path / later.drop_session_id / EMAIL).read_bytes().endswith(b"EmailDeleted2,3\r\n")


def test_upload(cycle: DropCycle, drop: DropSimulator) -> None:
    output = run("--upload")

    assert f"DROP accepted {EMAIL}" in output
    assert set(drop.uploaded) == {EMAIL, PHONE}
    assert set(ReportFile.objects.values_list("state", flat=True)) == {ReportFileState.ACCEPTED}
    assert "Nothing to report" in run("--upload")


def test_json(cycle: DropCycle) -> None:
    result = json.loads(run("--upload", "--json"))

    assert [f["file_name"] for f in result["written"]] == [EMAIL, PHONE]
    assert result["written"][0]["state"] == "accepted"
    assert result["written"][0]["rows"] == 1
    assert result["error"] is None
    assert result["open_cycles"] == []  # everything went out


def test_each_run_ends_with_what_is_still_owed(cycle: DropCycle) -> None:
    waiting = WorkItemFactory.create(cycle=cycle, work_item_id="EmailWaiting")
    DeletionRequestFactory.create(work_item=waiting, state=RequestState.DISPATCHED)
    days = (cycle.due_date - drop_today()).days
    when = f"overdue by {-days} day(s)" if days < 0 else f"{days} day(s) left"

    written = run()  # the known statuses are written, not sent: DROP holds none of them yet

    assert (
        f"Cycle 1 is due {cycle.due_date.isoformat()} ({when}): 3 status(es) DROP does not "
        "hold yet, 1 of them still waiting for an outcome (or for staff)." in written
    )

    sent = run("--upload")  # DROP takes the two files; one status is still waiting

    assert "1 status(es) DROP does not hold yet, 1 of them still waiting" in sent
    (open_cycle,) = json.loads(run("--json"))["open_cycles"]
    assert (open_cycle["statuses_owed"], open_cycle["waiting_for_outcome"]) == (1, 1)


def test_a_rejection_is_one_line_and_a_failing_exit(cycle: DropCycle, drop: DropSimulator) -> None:
    drop.broker_id = "9999"
    with pytest.raises(CommandError, match=f"{EMAIL} rejected: The data broker id"):
        run("--upload")
    assert WorkItem.objects.get(work_item_id="EmailDeleted").reported_at is None


def test_drop_refusing_leaves_the_files_for_the_next_run(
    cycle: DropCycle, drop: DropSimulator
) -> None:
    drop.active_download = False
    with pytest.raises(CommandError, match=rf"{EMAIL} refused: .*no active download"):
        run("--upload")
    assert set(ReportFile.objects.values_list("state", flat=True)) == {ReportFileState.REFUSED}

    drop.active_download = True
    assert f"DROP accepted {EMAIL}" in run("--upload")


def test_drop_down_stops_the_upload(cycle: DropCycle, drop: DropSimulator) -> None:
    drop.queue_response(401, body="Unauthorized", times=1)
    with pytest.raises(CommandError, match=r"upload stopped: .*refused the call"):
        run("--upload")
    assert len(drop.calls("/data/upload")) == 1  # the second file met the same key: not sent
    assert set(ReportFile.objects.values_list("state", flat=True)) == {ReportFileState.WRITTEN}


AMEND = "20260312_4821_Email_amend01.csv"


@pytest.fixture
def refused(cycle: DropCycle, drop: DropSimulator) -> ReportFile:
    """EmailDeleted (3) reported; DROP refuses (409) its amendment to 2."""
    run("--upload")
    item = WorkItem.objects.get(work_item_id="EmailDeleted")
    work_item_status_set(work_item=item, status_code=2, reason="exempt: B2B", actor="test")
    drop.closed_downloads.add("20260312")
    with pytest.raises(CommandError, match=f"{AMEND} refused: .*not possible in the current"):
        run("--upload")
    return ReportFile.objects.get(file_name=AMEND)


def test_discard_a_refused_amendment(refused: ReportFile, drop: DropSimulator) -> None:
    output = run("--discard", AMEND, "--reason", "DROP closed the cycle")

    assert f"Discarded {AMEND} (cycle 1): its work items keep the status DROP holds." in output
    refused.refresh_from_db()
    assert (refused.state, refused.discard_reason) == ("discarded", "DROP closed the cycle")
    item = WorkItem.objects.get(work_item_id="EmailDeleted")
    assert (item.state, item.reported_status_code, item.status_code) == ("reported", 3, 2)
    event = LedgerEvent.objects.get(kind="report_file.discarded")
    assert event.actor.startswith("cli:") and event.data["reason"] == "DROP closed the cycle"
    assert "Nothing to report" in run("--upload")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--discard", AMEND], "--discard FILE and --reason TEXT go together"),
        (["--reason", "why"], "--discard FILE and --reason TEXT go together"),
        (["--discard", AMEND, "--reason", " "], "--discard FILE and --reason TEXT go together"),
        (["--discard", "nope.csv", "--reason", "why"], "has no response file 'nope.csv'"),
        (["--discard", EMAIL, "--reason", "why"], "only an amendment can be discarded"),
        (["--discard", AMEND, "--reason", "why", "--upload"], "without --upload"),
    ],
)
def test_a_bad_discard_changes_nothing(refused: ReportFile, args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        run(*args)
    refused.refresh_from_db()
    assert refused.state == ReportFileState.REFUSED
    assert not LedgerEvent.objects.filter(kind="report_file.discarded").exists()


def test_one_cycle_only(cycle: DropCycle) -> None:
    later = DropCycleFactory.create(broker=cycle.broker, drop_session_id="2")
    WorkItemFactory.create(cycle=later, status_code=4, work_item_id="LaterItem001")
    output = run("--cycle", "2")
    assert "Wrote 20260312_4821_Email.csv: 1 rows" in output
    assert ReportFile.objects.get().cycle == later


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cycle", "7"], "broker 4821 has no cycle '7'"),
        (["--upload"], "no DROP API key"),
    ],
)
def test_bad_requests_write_nothing(broker: Broker, args: list[str], message: str) -> None:
    WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker), status_code=3)
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert not ReportFile.objects.exists()


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        # Rows stored before the key and base URL were checked on entry.
        ({"drop_api_key": "dk_test_7Qz9reportKEY42 "}, "DROP API key must be non-empty"),
        ({"drop_base_url": "ftp://drop.acme.test"}, "DROP base URL must be an http"),
    ],
)
def test_a_stored_drop_key_or_base_url_the_client_refuses_is_one_line(
    cycle: DropCycle, drop: DropSimulator, stored: dict[str, str], message: str
) -> None:
    Broker.objects.filter(pk=cycle.broker.pk).update(**stored)  # the service would refuse it
    with pytest.raises(CommandError, match=f"broker 4821 cannot reach DROP: {message}") as error:
        run("--upload")
    assert "\n" not in str(error.value)
    assert "7Qz9" not in str(error.value)  # never the key
    assert not ReportFile.objects.exists()  # refused before anything is written
    assert drop.calls("/data/upload") == []


def test_plain_http_stored_as_drop_base_url_is_one_line(cycle: DropCycle, settings: Any) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = False  # as in production: https only
    with pytest.raises(CommandError, match="broker 4821 cannot reach DROP: DROP base URL must use"):
        run("--upload")
    assert not ReportFile.objects.exists()


def test_unknown_broker_and_a_file_for_a_folder(cycle: DropCycle, tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="no broker with id '9999'"):
        call_command("drop", "report", "--broker", "9999")
    (tmp_path / "file").write_text("x")
    with pytest.raises(CommandError, match="is a file, not a folder"):
        run("--out", str(tmp_path / "file"))
    assert not ReportFile.objects.exists()


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (
            "{tmp}/file/responses",
            r"--out .*/file/responses: cannot make the folder: Not a directory",
        ),
        ("/proc/nope/responses", r"--out /proc/nope/responses: cannot make the folder: "),
        ("", r"--out is empty: give the folder to save the files in"),
    ],
)
def test_an_out_folder_that_cannot_be_written_is_refused_before_the_run(
    cycle: DropCycle, drop: DropSimulator, tmp_path: Path, out: str, message: str
) -> None:
    """Checked before the run, not when saving after it: by then the files were written and
    recorded in the ledger, and with --upload sent to DROP."""
    (tmp_path / "file").write_text("x")
    events = LedgerEvent.objects.count()

    with pytest.raises(CommandError, match=message) as refused:
        run("--upload", "--out", out.format(tmp=tmp_path))

    assert "\n" not in str(refused.value)
    assert not ReportFile.objects.exists()
    assert LedgerEvent.objects.count() == events
    assert drop.calls("/data/upload") == []


def test_a_missing_out_folder_is_made_before_the_run(cycle: DropCycle, tmp_path: Path) -> None:
    run("--out", str(tmp_path / "new" / "responses"))
    assert (tmp_path / "new" / "responses" / EMAIL).is_file()
