"""``drop import``: a DROP ZIP from disk becomes a matched cycle; what of it cannot be read
is set aside and named, the rest is imported."""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import zipfile
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob

from devtools.drop_simulator import work_items
from integrations.drop.calendar import drop_today
from integrations.enqueue import EVALUATE_ALERTS
from integrations.models import (
    AlertState,
    Broker,
    CycleState,
    DeletionRequest,
    DropCycle,
    Integration,
    LedgerEvent,
    RequestState,
    UnreadableWorkItem,
    WorkItem,
    WorkItemState,
)
from integrations.selectors.deadlines import cycle_deadlines
from integrations.selectors.drop_metrics import drop_metrics
from integrations.selectors.stuck import StuckReason, stuck_work_items
from integrations.services.cycle.cycle_state import cycle_state_refresh
from integrations.services.staff.alerts import alerts_evaluate
from integrations.services.staff.brokers import broker_create
from tests.builders import (
    PACKAGE_DATE,
    ConsumerFactory,
    IsiConnectionFactory,
    WebhookIntegrationFactory,
    broker_in_production,
    days_after,
    drop_zip,
    items_reported,
    work_item_of,
    write_zip,
)

pytestmark = pytest.mark.django_db

ITEMS = list(work_items(8))
EMAIL, PHONE, NDZ = ITEMS[0:3], ITEMS[3:5], ITEMS[5:6]
DELIVERY_TASK = "integrations.tasks.deliver_deletion_requests"


def lists() -> dict[str, list[tuple[str, str]]]:
    return {"Email": EMAIL, "Phone": PHONE, "NDZ": NDZ, "MAID": []}


def drop_import(path: Path, *extra: str, capsys: pytest.CaptureFixture[str]) -> dict:
    call_command("drop", "import", "--broker", "4821", str(path), "--json", *extra)
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def package(broker: Broker, tmp_path: Path) -> Path:
    """Three lists and an empty one; the first email matches two consumers, a phone one."""
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": EMAIL[0][1]})
    ConsumerFactory.create(
        broker=broker, remote_identifier="C-2", hashes={"email": EMAIL[0][1], "phone": PHONE[1][1]}
    )
    ConsumerFactory.create(
        broker=broker, remote_identifier="C-3", hashes={"phone": EMAIL[1][1]}
    )  # same hash, other list type: no match
    return write_zip(tmp_path, drop_zip(broker, lists()))


def test_import_creates_the_cycle_with_its_counts_files_and_dates(
    package: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = drop_import(package, capsys=capsys)
    cycle = DropCycle.objects.get()
    assert cycle.drop_session_id == "1" == shown["drop_session_id"]
    assert cycle.zip_name == package.name
    assert (cycle.work_items, cycle.matched, cycle.not_found) == (6, 2, 4)
    assert cycle.files == {
        f"{PACKAGE_DATE}_4821_Email.csv": 3,
        f"{PACKAGE_DATE}_4821_Phone.csv": 2,
        f"{PACKAGE_DATE}_4821_NDZ.csv": 1,
        f"{PACKAGE_DATE}_4821_MAID.csv": 0,
    }
    # Fetched by hand: the due date runs from the package's date, never later.
    assert cycle.downloaded_at.date() == days_after(PACKAGE_DATE, 0)
    assert cycle.due_date == days_after(PACKAGE_DATE, 45)
    assert cycle.state == CycleState.OPEN
    event = LedgerEvent.objects.get(kind="drop.cycle_imported")
    assert event.data["work_items"] == 6
    assert event.data["zip_sha256"] == cycle.zip_sha256
    # Each list's match rate, as matched at import (the empty MAID list has none).
    assert (
        cycle.match_rates
        == event.data["match_rates"]
        == {
            "email": {"items": 3, "matched": 1},
            "phone": {"items": 2, "matched": 1},
            "ndz": {"items": 1, "matched": 0},
        }
    )


def test_unmatched_work_items_get_status_5_at_once(package: Path, capsys) -> None:
    drop_import(package, capsys=capsys)
    states = {w.work_item_id: (w.state, w.status_code) for w in WorkItem.objects.all()}
    assert states == {
        EMAIL[0][0]: (WorkItemState.OPEN, None),
        EMAIL[1][0]: (WorkItemState.REPORTABLE, 5),  # C-3's hash is a phone hash
        EMAIL[2][0]: (WorkItemState.REPORTABLE, 5),
        PHONE[0][0]: (WorkItemState.REPORTABLE, 5),
        PHONE[1][0]: (WorkItemState.OPEN, None),
        NDZ[0][0]: (WorkItemState.REPORTABLE, 5),
    }
    item = WorkItem.objects.get(work_item_id=EMAIL[0][0])
    assert base64.b64encode(bytes(item.hash)).decode() == EMAIL[0][1]
    assert item.hash_type == "email"
    assert item.file_name == f"{PACKAGE_DATE}_4821_Email.csv"


def test_without_a_target_each_matched_consumer_gets_one_waiting_request(
    package: Path, capsys
) -> None:
    shown = drop_import(package, capsys=capsys)
    requests = DeletionRequest.objects.order_by("remote_identifier", "hash_type")
    assert [(r.remote_identifier, r.hash_type) for r in requests] == [
        ("C-1", "email"),
        ("C-2", "email"),
        ("C-2", "phone"),
    ]
    assert {r.state for r in requests} == {RequestState.PENDING}
    assert {r.integration_id for r in requests} == {None}
    assert shown["deletion_requests"] == {"created": 3, "queued": 0, "pending": 3}
    assert not ProcrastinateJob.objects.filter(task_name=DELIVERY_TASK).exists()


def test_requests_carry_every_field_of_the_dispatch_body(
    broker: Broker, package: Path, capsys
) -> None:
    WebhookIntegrationFactory.create(broker=broker)
    drop_import(package, capsys=capsys)
    request = DeletionRequest.objects.get(remote_identifier="C-2", hash_type="phone")
    assert request.identifier_hash == PHONE[1][1]
    assert request.drop_session_id == "1"
    assert request.match_date == drop_today()
    assert request.broker_id_code == "4821"
    assert request.mode == "test"
    assert request.remote_identifier_kind == "external_id"
    assert request.late_match is False
    assert work_item_of(request).work_item_id == PHONE[1][0]
    assert request.request_uuid and request.webhook_request_id
    assert request.results_token is None  # ISI only


def test_each_match_gets_one_request_per_target_and_its_delivery_job(
    broker: Broker, package: Path, capsys
) -> None:
    hook = WebhookIntegrationFactory.create(broker=broker)
    paused = WebhookIntegrationFactory.create(
        broker=broker, name="Disabled", enabled=False
    )  # paused, still a target
    retired = WebhookIntegrationFactory.create(broker=broker, name="Retired", enabled=False)
    Integration.objects.filter(pk=retired.pk).update(retired_at=timezone.now(), retired_reason="x")
    connection = IsiConnectionFactory.create(integration__broker=broker)
    IsiConnectionFactory.create(
        integration__broker=broker, capabilities=["privacy/drop/delete"]
    )  # lacks identifiers
    shown = drop_import(package, capsys=capsys)
    requests = DeletionRequest.objects.all()
    assert shown["deletion_requests"] == {"created": 9, "queued": 9, "pending": 0}
    assert {(r.integration_id, r.isi_connection_id) for r in requests} == {
        (hook.pk, None),
        (paused.pk, None),
        (connection.integration_id, connection.pk),
    }
    assert {r.state for r in requests} == {RequestState.QUEUED}
    isi = [r for r in requests if r.isi_connection_id]
    assert all(len(r.results_token or "") == 64 for r in isi)
    assert len({r.results_token for r in isi}) == 3
    jobs = ProcrastinateJob.objects.filter(task_name=DELIVERY_TASK)
    queued_ids = sorted(i for job in jobs for i in job.args["request_ids"])
    assert queued_ids == sorted(r.pk for r in requests)


def test_the_same_zip_twice_changes_nothing(package: Path, capsys) -> None:
    drop_import(package, capsys=capsys)
    before = (
        WorkItem.objects.count(),
        DeletionRequest.objects.count(),
        LedgerEvent.objects.count(),
    )
    call_command("drop", "import", "--broker", "4821", str(package))
    assert "already imported as cycle 1: nothing changed" in capsys.readouterr().out
    assert DropCycle.objects.count() == 1
    after = (
        WorkItem.objects.count(),
        DeletionRequest.objects.count(),
        LedgerEvent.objects.count(),
    )
    assert after == before


def test_the_same_package_in_other_zip_bytes_is_refused_naming_its_cycle(
    package: Path, tmp_path: Path, capsys
) -> None:
    drop_import(package, capsys=capsys)
    before = (WorkItem.objects.count(), DeletionRequest.objects.count())
    # The same lists zipped anew (stored, not deflated), as a download fetched again by hand.
    again = write_zip(tmp_path, with_members(package.read_bytes(), {}), "again.zip")
    assert again.read_bytes() != package.read_bytes()

    with pytest.raises(CommandError) as refused:
        call_command("drop", "import", "--broker", "4821", str(again))

    assert str(refused.value) == (
        f"again.zip refused, nothing imported: every work item id in it was received before, "
        f"in cycle 1 ({package.name}): the same download again, with nothing new"
    )
    assert DropCycle.objects.count() == 1
    assert (WorkItem.objects.count(), DeletionRequest.objects.count()) == before
    event = LedgerEvent.objects.get(kind="drop.import_refused")
    assert event.data["zip_name"] == "again.zip"


def test_ids_received_before_are_set_aside_and_the_new_ones_imported(
    broker: Broker, package: Path, tmp_path: Path, capsys
) -> None:
    broker_in_production(broker)  # its cycles count in the yearly figures
    drop_import(package, capsys=capsys)
    requests_before = DeletionRequest.objects.count()
    new = ITEMS[6]
    lists = {"Email": [*EMAIL, new], "Phone": PHONE}
    later = write_zip(tmp_path, drop_zip(broker, lists, date="20261201"), "b.zip")

    with pytest.raises(CommandError) as incomplete:
        call_command("drop", "import", "--broker", "4821", str(later), "--json")

    shown = json.loads(capsys.readouterr().out)
    assert (shown["drop_session_id"], shown["work_items"]) == ("2", 1)
    # One work item per id for good: no second one, no second request for a match.
    assert WorkItem.objects.filter(work_item_id=EMAIL[0][0]).count() == 1
    assert WorkItem.objects.filter(cycle__drop_session_id="2").get().work_item_id == new[0]
    assert DeletionRequest.objects.count() == requests_before
    # Each repeated row kept for staff, naming the earlier cycle.
    email = "20261201_4821_Email.csv"
    set_aside = UnreadableWorkItem.objects.filter(cycle__drop_session_id="2")
    assert set_aside.count() == len(EMAIL) + len(PHONE)
    first = set_aside.get(file_name=email, line=2)
    assert (first.work_item_id, first.text) == (EMAIL[0][0], f"{EMAIL[0][0]},{EMAIL[0][1]}")
    assert first.reason == (
        f"work item id {EMAIL[0][0]} was received before, in cycle 1 ({package.name}): one "
        "work item already, not imported again"
    )
    assert f"{email}: {len(EMAIL)} unreadable row(s) kept for staff" in str(incomplete.value)
    # Received once: not counted again in the yearly figures.
    event = LedgerEvent.objects.get(kind="drop.cycle_imported", subject="2")
    assert event.data["received_before"] == {email: len(EMAIL), "20261201_4821_Phone.csv": 2}
    assert event.data["unreadable_rows"] == {}
    total = drop_metrics(broker=broker, year=2026).rows[-1]
    assert total.figures["received"] == len(ITEMS[:6]) + 1


def test_each_new_download_gets_the_next_session_id(
    broker: Broker, package: Path, tmp_path: Path, capsys
) -> None:
    drop_import(package, capsys=capsys)
    later = list(work_items(2, start=100))
    second = write_zip(tmp_path, drop_zip(broker, {"Email": later}, date="20261201"), "b.zip")
    assert drop_import(second, capsys=capsys)["drop_session_id"] == "2"


def test_each_cycle_keeps_the_mode_its_broker_was_downloaded_in(
    broker: Broker, package: Path, tmp_path: Path, capsys
) -> None:
    drop_import(package, capsys=capsys)  # the broker in test mode: DROP's sandbox
    broker_in_production(broker)
    later = list(work_items(2, start=100))
    second = write_zip(tmp_path, drop_zip(broker, {"Email": later}, date="20261201"), "b.zip")
    drop_import(second, capsys=capsys)
    modes = dict(DropCycle.objects.filter(broker=broker).values_list("drop_session_id", "mode"))
    # The switch leaves the sandbox cycle one: it never becomes a consumer's request.
    assert modes == {"1": "test", "2": "production"}


def test_another_brokers_consumers_never_match(package: Path, capsys) -> None:
    other = broker_create(broker_id="5555", name="Other", actor="test")
    ConsumerFactory.create(broker=other, remote_identifier="X-1", hashes={"email": EMAIL[2][1]})
    drop_import(package, capsys=capsys)
    item = WorkItem.objects.get(work_item_id=EMAIL[2][0])
    assert item.status_code == 5
    assert not DeletionRequest.objects.filter(remote_identifier="X-1").exists()


def test_downloaded_at_sets_the_due_date(package: Path, capsys) -> None:
    shown = drop_import(package, "--downloaded-at", "2026-11-21", capsys=capsys)
    assert shown["due_date"] == "2027-01-05"


@pytest.mark.parametrize("ahead", [dt.timedelta(minutes=5), dt.timedelta(days=366)])
def test_a_download_time_in_the_future_is_refused_in_one_line(
    package: Path, ahead: dt.timedelta
) -> None:
    # A typo of a year or a day ahead would push the due date past DROP's, and the cycle's
    # evidence pack would start its ledger after the cycle's own import.
    when = (timezone.now() + ahead).isoformat()
    with pytest.raises(CommandError, match=r"download time .* is in the future") as refused:
        call_command("drop", "import", "--broker", "4821", str(package), "--downloaded-at", when)
    assert "\n" not in str(refused.value)
    assert not DropCycle.objects.exists()
    assert not LedgerEvent.objects.filter(kind="drop.cycle_imported").exists()


@pytest.mark.parametrize("when", ["0001-01-01", "2026-11-19", "2026-11-20T07:59:59+00:00"])
def test_a_download_time_before_the_packages_date_is_refused_in_one_line(
    package: Path, when: str
) -> None:
    # The package is of 2026-11-20 (DROP's calendar: it starts 08:00 UTC). A download before
    # DROP made it would put the due date, and the year's figures, before it existed.
    with pytest.raises(CommandError, match=r"download time .* is before the package's date"):
        call_command("drop", "import", "--broker", "4821", str(package), "--downloaded-at", when)
    assert not DropCycle.objects.exists()
    assert not LedgerEvent.objects.filter(kind="drop.cycle_imported").exists()
    # Its first moment is a download time like any later one.
    call_command(
        "drop", "import", "--broker", "4821", str(package), "--downloaded-at", "2026-11-20",
        stdout=io.StringIO(),
    )  # fmt: skip
    assert DropCycle.objects.get().due_date == dt.date(2027, 1, 4)


def test_a_download_time_before_the_packages_date_is_refused_before_anything_happens(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused up front, as a time in the future is: not after asking the broker's API for
    its ISI connections (an outbound call, and a ledger event when it fails for good)."""
    from integrations.services.cycle import drop_import as service

    refreshed: list[Broker] = []

    def refresh(*, broker: Broker, actor: str) -> list[object]:
        refreshed.append(broker)
        return []

    monkeypatch.setattr(service, "isi_connections_refresh_for_broker", refresh)
    events = LedgerEvent.objects.count()

    with pytest.raises(CommandError, match=r"download time .* is before the package's date"):
        call_command(
            "drop", "import", "--broker", "4821", str(package), "--downloaded-at", "2026-11-19"
        )

    assert refreshed == []
    assert LedgerEvent.objects.count() == events
    assert not DropCycle.objects.exists()


# ---------------------------------------------------------------- refused ZIPs


def rewrite_member(content: bytes, name: str, text: str | bytes) -> bytes:
    """The same package with one member's text (or bytes) replaced."""
    source = zipfile.ZipFile(io.BytesIO(content))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == name:
                data = text if isinstance(text, bytes) else text.encode()
            target.writestr(info.filename, data)
    return buffer.getvalue()


EMAIL_CSV = f"{PACKAGE_DATE}_4821_Email.csv"
GOOD_ROWS = "".join(f"{wid},{h}\r\n" for wid, h in EMAIL)


def good(content: bytes) -> bytes:
    return content


def staging_tables() -> int:
    """Staging tables left behind (there must be none, whatever happened; temp tables go
    at commit by themselves)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_class"
            " WHERE relname LIKE 'drop\\_staged%%' AND relpersistence <> 't'"
        )
        return int(cursor.fetchone()[0])


def newer_zip_version(content: bytes) -> bytes:
    """The package as a later zip tool may write it: a "version needed" zipfile refuses."""
    at = content.index(b"PK\x01\x02") + 6
    return content[:at] + bytes([78]) + content[at + 1 :]


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        pytest.param(good, None, id="the good package imports"),
        pytest.param(lambda c: c[: len(c) // 2], "not a readable ZIP", id="truncated"),
        pytest.param(lambda c: b"<html>502 Bad Gateway</html>", "not a readable ZIP", id="not-zip"),
        pytest.param(newer_zip_version, "zip file version 7.8", id="newer-zip-version"),
        pytest.param(
            lambda c: raw_zip({"README.txt": b"hello", "lists/": b""}),
            "the ZIP holds no DROP list",
            id="no-drop-list",
        ),
    ],
)
def test_a_bad_zip_is_refused_whole_naming_file_line_and_reason(
    package: Path, spoil, message: str | None, capsys
) -> None:
    package.write_bytes(spoil(package.read_bytes()))
    if message is None:
        assert drop_import(package, capsys=capsys)["work_items"] == 6
        assert staging_tables() == 0
        return
    with pytest.raises(CommandError) as refused:
        call_command("drop", "import", "--broker", "4821", str(package))
    assert message in str(refused.value)
    assert "refused, nothing imported" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert not DropCycle.objects.exists()
    assert not WorkItem.objects.exists()
    assert not DeletionRequest.objects.exists()
    assert staging_tables() == 0
    event = LedgerEvent.objects.get(kind="drop.import_refused")
    assert message in event.data["error"]


def raw_zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def with_members(content: bytes, extra: dict[str, str]) -> bytes:
    """The same package with members added."""
    source = zipfile.ZipFile(io.BytesIO(content))
    members = {info.filename: source.read(info) for info in source.infolist()}
    members.update({name: text.encode() for name, text in extra.items()})
    return raw_zip(members)


ADDRESS_CSV = f"{PACKAGE_DATE}_4821_Address.csv"
PHONE_CSV = f"{PACKAGE_DATE}_4821_Phone.csv"


@pytest.fixture
def odd_package(package: Path) -> Path:
    """The package of ``package`` as DROP may send it: a README and a folder entry, a list
    type this version does not know, a list with another header (Phone), and DROP's own
    short row "680,5" among the Email rows."""
    content = rewrite_member(package.read_bytes(), EMAIL_CSV, "ID,Hash\r\n680,5\r\n" + GOOD_ROWS)
    content = rewrite_member(content, PHONE_CSV, "Id;Hash\r\n")
    package.write_bytes(
        with_members(content, {"README.txt": "About this package", "docs/": "", ADDRESS_CSV: ""})
    )
    return package


def test_one_odd_member_or_row_never_refuses_the_rest_of_the_package(
    odd_package: Path, capsys
) -> None:
    with pytest.raises(CommandError) as incomplete:
        call_command("drop", "import", "--broker", "4821", str(odd_package), "--json")

    # The rest is imported, matched and printed...
    shown = json.loads(capsys.readouterr().out)
    assert (shown["work_items"], shown["matched"]) == (4, 1)  # 3 Email rows and NDZ
    assert sorted(WorkItem.objects.values_list("file_name", flat=True).distinct()) == [
        EMAIL_CSV,
        f"{PACKAGE_DATE}_4821_NDZ.csv",
    ]
    assert DeletionRequest.objects.count() == 2
    # ... and the exit names each file not imported, and why, on one line.
    message = str(incomplete.value)
    assert "\n" not in message
    assert message.startswith("part of 20261120_4821_DROP.zip was not imported (the rest was")
    assert f"{ADDRESS_CSV}: list type 'Address' is not one this version reads" in message
    assert f"{PHONE_CSV}: header must be ID,Hash (any case), found 'Id;Hash'" in message
    assert f"{EMAIL_CSV}: 1 unreadable row(s) kept for staff, never reported (first: line 2" in (
        message
    )
    assert "README.txt" not in message  # not DROP's: skipped, in the ledger
    assert [part["file"] for part in shown["not_imported"]] == [ADDRESS_CSV, PHONE_CSV, EMAIL_CSV]

    cycle = DropCycle.objects.get()
    assert sorted(cycle.unread_files) == [ADDRESS_CSV, PHONE_CSV]
    unreadable = UnreadableWorkItem.objects.get()
    assert (unreadable.cycle, unreadable.file_name, unreadable.line) == (cycle, EMAIL_CSV, 2)
    assert (unreadable.work_item_id, unreadable.text) == ("680", "680,5")
    skipped = LedgerEvent.objects.get(kind="drop.package_members_skipped")
    assert [m["name"] for m in skipped.data["skipped"]] == ["README.txt", "docs/"]
    imported = LedgerEvent.objects.get(kind="drop.cycle_imported")
    assert imported.data["unread_files"] == cycle.unread_files
    assert imported.data["unreadable_rows"] == {EMAIL_CSV: 1}
    # The lists not read hold no data row here; DROP's figures count those rows as received.
    assert cycle.unread_rows == {ADDRESS_CSV: 0, PHONE_CSV: 0}
    assert imported.data["unread_rows"] == cycle.unread_rows
    # Staff hear of it at once: an alert evaluation waits in the same commit.
    assert ProcrastinateJob.objects.filter(task_name=EVALUATE_ALERTS).exists()


@pytest.mark.parametrize(
    "bad_row",
    [
        pytest.param(b"\x00" * 512, id="a list padded with NUL bytes"),
        pytest.param(b"\xff" * 300 + b"," + b"\x80" * 300, id="bytes that are not UTF-8"),
    ],
)
def test_a_row_of_bad_bytes_is_kept_escaped_and_the_rest_of_its_list_imports(
    broker: Broker, tmp_path: Path, bad_row: bytes
) -> None:
    content = rewrite_member(
        drop_zip(broker, {"Email": []}), EMAIL_CSV, b"ID,Hash\r\n" + GOOD_ROWS.encode() + bad_row
    )
    with pytest.raises(CommandError) as incomplete:
        call_command("drop", "import", "--broker", "4821", str(write_zip(tmp_path, content)))

    assert f"{EMAIL_CSV}: 1 unreadable row(s) kept for staff" in str(incomplete.value)
    assert WorkItem.objects.count() == len(EMAIL)
    # Kept as found, escaped, as much as its columns hold: each escape whole.
    row = UnreadableWorkItem.objects.get()
    escape = "\\x00" if bad_row[0] == 0 else "\\xff"
    assert row.work_item_id == escape * 16
    assert row.text == escape * 63  # 252 characters: a 64th escape would pass 255


def test_a_package_imported_before_still_says_what_was_not_imported(
    odd_package: Path, capsys
) -> None:
    with pytest.raises(CommandError):
        call_command("drop", "import", "--broker", "4821", str(odd_package))
    capsys.readouterr()

    with pytest.raises(CommandError) as again:
        call_command("drop", "import", "--broker", "4821", str(odd_package))

    assert "was already imported as cycle 1: nothing changed" in capsys.readouterr().out
    assert f"{EMAIL_CSV}: 1 unreadable row(s)" in str(again.value)
    assert f"{ADDRESS_CSV}: list type 'Address'" in str(again.value)
    assert DropCycle.objects.count() == 1


def test_a_package_read_whole_exits_0_even_with_a_readme(package: Path, capsys) -> None:
    package.write_bytes(with_members(package.read_bytes(), {"README.txt": "About"}))

    shown = drop_import(package, capsys=capsys)

    assert (shown["work_items"], shown["not_imported"]) == (6, [])
    assert LedgerEvent.objects.filter(kind="drop.package_members_skipped").count() == 1


def test_another_brokers_package_is_refused(broker: Broker, tmp_path: Path) -> None:
    other = broker_create(broker_id="5555", name="Other", actor="test")
    for target in (broker, other):
        path = write_zip(tmp_path, drop_zip(other, {"Email": EMAIL}), f"{target.broker_id}.zip")
        if target == other:
            call_command("drop", "import", "--broker", "5555", str(path))
            assert DropCycle.objects.filter(broker=other).exists()
            continue
        with pytest.raises(CommandError, match="broker id 5555 in the file name is not this"):
            call_command("drop", "import", "--broker", "4821", str(path))
        assert not DropCycle.objects.filter(broker=broker).exists()


def test_a_refused_zip_can_be_imported_once_fixed(package: Path, capsys) -> None:
    content = package.read_bytes()
    package.write_bytes(content[: len(content) // 2])
    with pytest.raises(CommandError):
        call_command("drop", "import", "--broker", "4821", str(package))
    package.write_bytes(content)
    assert drop_import(package, capsys=capsys)["drop_session_id"] == "1"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--broker", "9999", "x.zip"], "no broker with id '9999'"),
        (["--broker", "4821", "/nonexistent/x.zip"], "no such file: /nonexistent/x.zip"),
        (["--broker", "4821", "PKG", "--downloaded-at", "soon"], "not a date: 'soon'"),
        (["--broker", "4821", "DIR"], r"^/.* is a folder: give the ZIP as downloaded from DROP$"),
    ],
)
def test_bad_arguments_are_one_line_errors(package: Path, argv: list[str], message: str) -> None:
    given = {"PKG": str(package), "DIR": str(package.parent)}
    argv = [given.get(arg, arg) for arg in argv]
    with pytest.raises(CommandError, match=message):
        call_command("drop", "import", *argv)
    assert not DropCycle.objects.exists()


# ---------------------------------------------------------------- removed identifiers


@pytest.fixture
def imported(broker: Broker, package: Path, capsys) -> DropCycle:
    WebhookIntegrationFactory.create(broker=broker)
    drop_import(package, capsys=capsys)
    return DropCycle.objects.get()


def test_removed_identifiers_close_their_work_items_and_cancel_what_was_not_sent(
    broker: Broker, imported: DropCycle, tmp_path: Path, capsys
) -> None:
    c1 = DeletionRequest.objects.get(remote_identifier="C-1")
    c2 = DeletionRequest.objects.get(remote_identifier="C-2", hash_type="email")
    DeletionRequest.objects.filter(pk=c2.pk).update(state=RequestState.DISPATCHED)
    fresh = list(work_items(1, start=50))
    removed = [
        (EMAIL[0][0], EMAIL[0][1], "Email"),  # matched: C-1 queued, C-2 dispatched
        (NDZ[0][0], NDZ[0][1], "NDZ"),  # not found (5)
        ("ZZZZZZZZZZZZ", EMAIL[0][1], "Email"),  # never seen here
    ]
    second = write_zip(
        tmp_path, drop_zip(broker, {"Email": fresh}, removed, date="20261201"), "2.zip"
    )
    shown = drop_import(second, capsys=capsys)

    assert shown["removed"] == {"rows": 3, "closed": 2, "unknown": 1, "requests_cancelled": 1}
    for wid in (EMAIL[0][0], NDZ[0][0]):
        item = WorkItem.objects.get(work_item_id=wid)
        assert (item.state, item.status_code) == (WorkItemState.REMOVED, None)
    c1.refresh_from_db()
    c2.refresh_from_db()
    assert c1.state == RequestState.CANCELLED
    assert c2.state == RequestState.DISPATCHED  # the broker may be acting on it
    event = LedgerEvent.objects.get(kind="drop.work_items_removed")
    assert (event.subject, event.data["work_items_closed"], event.data["requests_cancelled"]) == (
        "2",
        2,
        1,
    )
    assert DropCycle.objects.get(drop_session_id="2").removed == 3


def test_a_package_with_only_removed_rows_owes_nothing(
    broker: Broker, imported: DropCycle, tmp_path: Path, capsys
) -> None:
    removed = [(EMAIL[1][0], EMAIL[1][1], "Email")]
    second = write_zip(tmp_path, drop_zip(broker, {}, removed, date="20261201"), "2.zip")
    drop_import(second, capsys=capsys)
    cycle = DropCycle.objects.get(drop_session_id="2")
    assert (cycle.work_items, cycle.state) == (0, CycleState.NOTHING_OWED)
    assert WorkItem.objects.get(work_item_id=EMAIL[1][0]).state == WorkItemState.REMOVED


def test_text_output_says_what_happened(package: Path, capsys) -> None:
    call_command("drop", "import", "--broker", "4821", str(package))
    out = capsys.readouterr().out
    assert "Cycle 1 from" in out
    assert "6 work items, 2 matched, 4 not found (status 5)" in out
    assert f"report by {days_after(PACKAGE_DATE, 45).isoformat()}" in out


# ---------------------------------------------------------------- what staff see of odd parts


def test_unreadable_rows_and_unread_lists_reach_staff_until_drop_sends_the_next_package(
    broker: Broker, odd_package: Path, tmp_path: Path, admin_client: Client
) -> None:
    WebhookIntegrationFactory.create(
        broker=broker
    )  # the matched items have a live path: only the odd parts are stuck
    with pytest.raises(CommandError):
        call_command("drop", "import", "--broker", "4821", str(odd_package))

    # The unreadable row: listed by `drop doctor` (exit 1), with the admin list holding it.
    [group] = stuck_work_items()
    assert (group.broker_id, group.reason, group.work_items, group.requests) == (
        "4821",
        StuckReason.UNREADABLE_WORK_ITEM,
        1,
        0,
    )
    assert group.nearest_due_date == DropCycle.objects.get().due_date
    page = admin_client.get(group.admin_path)
    assert page.status_code == 200
    assert "680,5" in page.content.decode()
    with pytest.raises(SystemExit) as doctor:
        call_command("drop", "doctor", "--broker", "4821")
    assert doctor.value.code == 1
    # Alerts: the stuck row, and the lists that were not read, each named (only those two
    # conditions are read, so only they are evaluated).
    read = ["stuck_work", "drop_lists_not_read"]
    raised = {state.condition: state.text for state in alerts_evaluate(conditions=read).raised}
    assert alert_keys("stuck_work") == ["stuck_work:4821:unreadable_work_item"]
    assert ADDRESS_CSV in raised["drop_lists_not_read"]
    assert PHONE_CSV in raised["drop_lists_not_read"]
    # Never reported: no work item carries it, so no response file can.
    assert not WorkItem.objects.filter(work_item_id="680").exists()

    # DROP sends no new package while one of its work items has no status: the next one
    # means the previous was answered (by staff, in DROP's portal), and both clear.
    next_package_import(broker, tmp_path)
    assert stuck_work_items() == []
    cleared = {state.condition for state in alerts_evaluate(conditions=read).cleared}
    assert {"stuck_work", "drop_lists_not_read"} <= cleared


def test_a_package_whose_only_rows_are_unreadable_owes_drop_until_the_next_one(
    broker: Broker, tmp_path: Path
) -> None:
    package = rewrite_member(drop_zip(broker, {"Email": []}), EMAIL_CSV, "ID,Hash\r\n680,5\r\n")
    with pytest.raises(CommandError):
        call_command("drop", "import", "--broker", "4821", str(write_zip(tmp_path, package)))

    cycle = DropCycle.objects.get()
    assert (cycle.work_items, cycle.state) == (0, CycleState.OPEN)  # not "nothing owed"
    (deadline,) = cycle_deadlines(broker_id="4821", today=drop_today())
    assert (deadline.cycle, deadline.owed, deadline.not_reportable) == (cycle, 1, 1)

    # The next package means staff answered it in DROP's portal.
    next_package_import(broker, tmp_path)
    cycle.refresh_from_db()
    assert cycle.state == CycleState.REPORTED
    assert cycle_deadlines(broker_id="4821", today=drop_today()) == []


def test_an_unreadable_row_of_the_removed_file_is_kept_and_owes_drop_nothing(
    broker: Broker, tmp_path: Path
) -> None:
    # "Fax" is no DROP list: the row cannot be read, and no status is owed for a removed id.
    wid, hash_value = EMAIL[0]
    package = drop_zip(broker, {"Email": []}, removed=[(wid, hash_value, "Fax")])
    with pytest.raises(CommandError) as incomplete:
        call_command("drop", "import", "--broker", "4821", str(write_zip(tmp_path, package)))

    assert f"{PACKAGE_DATE}_4821_Removed.csv: 1 unreadable row(s)" in str(incomplete.value)
    cycle = DropCycle.objects.get()
    assert cycle.state == CycleState.NOTHING_OWED
    assert cycle_deadlines(broker_id="4821", today=drop_today()) == []
    # Still kept, and listed for staff: it may name a withdrawn consumer still acted on.
    assert UnreadableWorkItem.objects.get().work_item_id == wid
    [group] = stuck_work_items()
    assert group.reason == StuckReason.UNREADABLE_WORK_ITEM


@pytest.mark.parametrize(
    ("repeated_hash", "state"),
    [
        pytest.param(EMAIL[0][1], CycleState.REPORTED, id="word for word: nothing more owed"),
        pytest.param(EMAIL[1][1], CycleState.OPEN, id="another hash: owed, staff answer it"),
    ],
)
def test_a_row_repeated_in_its_list_owes_nothing_beyond_its_ids_status(
    broker: Broker, tmp_path: Path, repeated_hash: str, state: CycleState
) -> None:
    wid = EMAIL[0][0]
    package = drop_zip(broker, {"Email": [(wid, EMAIL[0][1]), (wid, repeated_hash)]})
    with pytest.raises(CommandError):
        call_command("drop", "import", "--broker", "4821", str(write_zip(tmp_path, package)))
    cycle = DropCycle.objects.get()
    assert (cycle.work_items, UnreadableWorkItem.objects.count()) == (1, 1)

    # DROP accepts the status of the one id it sent (twice).
    items_reported(cycle, list(WorkItem.objects.all()))

    assert cycle_state_refresh(cycle=cycle).state == state


def next_package_import(broker: Broker, tmp_path: Path) -> None:
    """Import DROP's next package (an empty Email list): DROP sends it only once every row
    of the last one has a status."""
    path = write_zip(tmp_path, drop_zip(broker, {"Email": []}, date="20261201"), "2.zip")
    call_command("drop", "import", "--broker", "4821", str(path))


def alert_keys(condition: str) -> list[str]:
    return list(AlertState.objects.filter(condition=condition).values_list("key", flat=True))
