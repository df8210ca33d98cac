"""``drop metrics`` and the admin's metrics page: the year's DROP figures, counted by hand.

One broker's 2027 cycle (a 2026 cycle and another broker's 2027 cycle must not count)::

    item  list   matched by             DROP holds   reported after
    e1    Email  deletion: deleted      3            1 day
    e2    Email  deletion: opted_out    4            2 days
    e3    Email  resolution: exempt     2            10 days   (basis glba)
    e4    Email  -                      5            2 days
    e5    Email  deletion: dispatched   -            -         (open)
    e6    Email  -                      removed by DROP
    p1    Phone  -                      5            4 days
    p2    Phone  -                      (5 not yet reported: open)

Days to the reported status: 1, 2, 10, 2, 4: median 2, mean 3.8.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.test import Client

from devtools.drop_simulator import work_items
from integrations.drop.calendar import drop_date, drop_midnight, drop_today
from integrations.models import Broker, ReportFile, WorkItem, WorkItemState
from integrations.selectors.drop_metrics import METRIC_FIGURES, METRIC_FILTERS
from integrations.services.cycle.work_items import work_item_status_set
from integrations.services.reporting.report_files import report_files_write
from integrations.services.reporting.report_manual import report_file_mark_uploaded
from integrations.services.staff.brokers import broker_create
from tests.builders import (
    DeletionRequestFactory,
    DropCycleFactory,
    ResolutionRequestFactory,
    WebhookIntegrationFactory,
    WorkItemFactory,
    broker_in_production,
    drop_zip,
    write_zip,
)

pytestmark = pytest.mark.django_db
DOWNLOADED = dt.datetime(2027, 1, 10, 9, tzinfo=dt.UTC)


def reported(cycle: Any, code: int, days: float, list_type: str = "Email") -> Any:
    return WorkItemFactory.create(
        cycle=cycle,
        list_type=list_type,
        status_code=code,
        state=WorkItemState.REPORTED,
        reported_status_code=code,
        reported_at=DOWNLOADED + dt.timedelta(days=days),
    )


@pytest.fixture
def year(broker: Broker) -> None:
    cycle = DropCycleFactory.create(
        broker=broker, drop_session_id="7", match_date=DOWNLOADED.date()
    )
    integration = WebhookIntegrationFactory.create(broker=broker)
    DeletionRequestFactory.create(work_item=reported(cycle, 3, 1), drop_outcome="deleted")
    DeletionRequestFactory.create(work_item=reported(cycle, 4, 2), drop_outcome="opted_out")
    e3 = reported(cycle, 2, 10)
    resolution = ResolutionRequestFactory.create(
        work_item=e3, integration=integration, drop_outcome="exempt", completed=True
    )
    resolution.exemption_basis = "glba"
    resolution.save()
    reported(cycle, 5, 2)
    DeletionRequestFactory.create(work_item=WorkItemFactory.create(cycle=cycle), state="dispatched")
    WorkItemFactory.create(cycle=cycle, state=WorkItemState.REMOVED)
    reported(cycle, 5, 4, list_type="Phone")
    WorkItemFactory.create(cycle=cycle, list_type="Phone", status_code=5)
    # Not in the figures: the year before, and another broker.
    reported(
        DropCycleFactory.create(
            broker=broker, drop_session_id="6", match_date=dt.date(2026, 12, 31)
        ),
        3,
        1,
    )
    other = broker_create(broker_id="1234", name="Other", mode="test", actor="test")
    reported(
        DropCycleFactory.create(broker=other, drop_session_id="7", match_date=DOWNLOADED.date()),
        3,
        1,
    )


EXPECTED = {
    "broker_id": "4821",
    "year": 2027,
    "by_list_type": [
        {
            "list_type": "Email",
            "received": 6,
            "matched": 4,
            "complied": 2,
            "denied": 1,
            "not_found": 1,
            "open": 1,
            "removed": 1,
            "median_days": 2.0,
            "mean_days": 3.75,
        },
        {
            "list_type": "Phone",
            "received": 2,
            "matched": 0,
            "complied": 0,
            "denied": 0,
            "not_found": 1,
            "open": 1,
            "removed": 0,
            "median_days": 4.0,
            "mean_days": 4.0,
        },
    ],
    "total": {
        "list_type": "Total",
        "received": 8,
        "matched": 4,
        "complied": 2,
        "denied": 1,
        "not_found": 2,
        "open": 2,
        "removed": 1,
        "median_days": 2.0,
        "mean_days": 3.8,
    },
    "exemption_bases": {"glba": 1},
}


def metrics(*args: str) -> str:
    out = io.StringIO()
    call_command("drop", "metrics", "--broker", "4821", *args, stdout=out)
    return out.getvalue()


def test_json_figures_match_the_hand_count(year: None) -> None:
    assert json.loads(metrics("--year", "2027", "--format", "json")) == EXPECTED


def test_csv_is_the_same_table(year: None) -> None:
    rows = list(csv.reader(io.StringIO(metrics("--year", "2027"))))
    assert rows[0] == [
        "list_type", "received", "matched", "complied", "denied", "not_found", "open",
        "removed", "median_days", "mean_days",
    ]  # fmt: skip
    assert rows[1] == ["Email", "6", "4", "2", "1", "1", "1", "1", "2.0", "3.75"]
    assert rows[3] == ["Total", "8", "4", "2", "1", "2", "2", "1", "2.0", "3.8"]
    assert rows[4] == ["denied, exemption basis: glba", "", "", "", "1", "", "", "", "", ""]


def test_a_year_without_cycles_is_zeros(year: None) -> None:
    figures = json.loads(metrics("--year", "2025", "--format", "json"))
    assert figures["by_list_type"] == []
    assert figures["total"]["received"] == 0 and figures["total"]["median_days"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--broker", "9999", "--year", "2027"], "no broker with id '9999'"),
        (["--broker", "4821", "--year", "27"], "--year must be a year like 2027, not 27"),
    ],
)
def test_bad_requests(broker: Broker, args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("drop", "metrics", *args)


def _auditor(client: Client) -> None:
    user = User.objects.create_user("audrey", password="pw", is_staff=True)
    user.groups.add(Group.objects.get(name="Auditors"))
    client.force_login(user)


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
def test_each_figure_opens_the_list_behind_it(year: None, client: Client) -> None:
    _auditor(client)
    assert b'href="/admin/metrics/"' in client.get("/admin/").content
    page = client.get("/admin/metrics/", {"broker": "4821", "year": "2027"})
    assert page.status_code == 200
    table = page.context["table"]
    checked = 0
    for line in table:
        for value, link in line["cells"]:
            listing = client.get(link)
            assert listing.status_code == 200, link
            assert listing.context["cl"].result_count == value, link
            checked += 1
    assert checked == 3 * 7
    assert b"glba: 1" in page.content
    # The broker is in test mode: the page says what its figures count.
    assert b"4821 is in test mode" in page.content


def test_the_metrics_page_needs_the_view_permissions(year: None, client: Client) -> None:
    user = User.objects.create_user("nobody", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get("/admin/metrics/", {"broker": "4821", "year": "2027"}).status_code == 403


def test_received_counts_the_rows_drop_sent_that_could_not_be_read(
    broker: Broker, tmp_path: Path
) -> None:
    broker_in_production(broker)  # its cycles count: production ones
    rows = [*work_items(2), ("680", "5")]  # DROP's own short row: unreadable
    package = write_zip(tmp_path, drop_zip(broker, {"Email": rows, "Phone": [("681", "5")]}))
    with pytest.raises(CommandError):  # part of the package was not imported
        call_command("drop", "import", "--broker", "4821", str(package), stdout=io.StringIO())

    figures = json.loads(metrics("--year", "2026", "--format", "json"))

    by_type = {row["list_type"]: row["received"] for row in figures["by_list_type"]}
    assert by_type == {"Email": 3, "Phone": 1}
    assert (figures["total"]["received"], figures["total"]["open"]) == (4, 2)  # two 5s owed


def test_received_counts_the_rows_of_lists_not_read_at_all(broker: Broker, tmp_path: Path) -> None:
    broker_in_production(broker)  # its cycles count: production ones
    (good, _), *others = work_items(8)
    rows = [f"{item},{hashed}" for item, hashed in others]
    members = {
        "20260312_4821_Email.csv": f"ID,Hash\r\n{good}\r\n",
        # A type this version does not know: its rows count in the Total only.
        "20260312_4821_Fax.csv": "\r\n".join(["ID,Hash", *rows[:3]]) + "\r\n",
        # A known type with another header; a blank line is no row.
        "20260312_4821_Phone.csv": "\r\n".join(["Hash;ID", *rows[3:6], ""]) + "\r\n",
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    package = write_zip(tmp_path, buffer.getvalue())
    with pytest.raises(CommandError):  # part of the package was not imported
        call_command("drop", "import", "--broker", "4821", str(package), stdout=io.StringIO())

    figures = json.loads(metrics("--year", "2026", "--format", "json"))

    by_type = {row["list_type"]: row["received"] for row in figures["by_list_type"]}
    assert by_type == {"Email": 1, "Phone": 3}
    assert figures["total"]["received"] == 7  # 1 + 3 Fax + 3 Phone


def test_the_registry_columns(year: None, broker: Broker) -> None:
    # e1 (3, deleted) also had exempt data at another target: complied with in part. A
    # recurring round answered exempt (e2's) does not make DROP's request one in part.
    e1, e2 = (
        WorkItem.objects.get(
            cycle__broker=broker, cycle__drop_session_id="7", reported_status_code=code
        )
        for code in (3, 4)
    )
    DeletionRequestFactory.create(work_item=e1, drop_outcome="exempt")
    DeletionRequestFactory.create(work_item=e2, drop_outcome="exempt", round=1)
    figures = json.loads(metrics("--year", "2027", "--registry", "--format", "json"))
    assert figures == {
        "broker_id": "4821",
        "year": 2027,
        "received": 8,
        "complied_in_whole": 1,
        "complied_in_part": 1,
        "denied": 1,
        "mean_days": 3.8,
        "median_days": 2.0,
    }
    rows = list(csv.reader(io.StringIO(metrics("--year", "2027", "--registry"))))
    assert rows == [
        ["year", "received", "complied_in_whole", "complied_in_part", "denied", "mean_days",
         "median_days"],
        ["2027", "8", "1", "1", "1", "3.8", "2.0"],
    ]  # fmt: skip


def test_an_amendment_drop_takes_later_leaves_the_days_to_the_first_report(
    broker: Broker,
) -> None:
    """A status reported on day 2 and amended on day 300 (both files uploaded by hand): DROP
    holds the amendment, yet the item responded on day 2, in both the metrics and the
    registry's columns."""
    downloaded = drop_midnight(drop_today() - dt.timedelta(days=400)) + dt.timedelta(hours=9)
    cycle = DropCycleFactory.create(
        broker=broker, match_date=drop_date(downloaded), downloaded_at=downloaded
    )
    item = WorkItemFactory.create(cycle=cycle, status_code=5)

    def uploaded_by_hand(day: int) -> None:
        (written,) = report_files_write(broker=broker, cycle=cycle)
        ReportFile.objects.filter(pk=written.pk).update(created_at=downloaded)
        at = downloaded + dt.timedelta(days=day)
        report_file_mark_uploaded(report_file=written, actor="staff:alice", uploaded_at=at)

    uploaded_by_hand(2)
    work_item_status_set(
        work_item=item, status_code=3, reason="deleted after all", actor="staff:alice"
    )
    uploaded_by_hand(300)

    item.refresh_from_db()
    assert (item.reported_status_code, item.reported_at) == (3, downloaded + dt.timedelta(days=300))
    assert item.first_reported_at == downloaded + dt.timedelta(days=2)
    year = str(downloaded.year)
    figures = json.loads(metrics("--year", year, "--format", "json"))
    (email,) = (row for row in figures["by_list_type"] if row["list_type"] == "Email")
    assert (email["complied"], email["median_days"], email["mean_days"]) == (1, 2.0, 2.0)
    registry = json.loads(metrics("--year", year, "--registry", "--format", "json"))
    assert (registry["median_days"], registry["mean_days"]) == (2.0, 2.0)


def test_a_sandbox_cycle_counts_in_no_figure(year: None, broker: Broker) -> None:
    """A cycle downloaded while the broker was in test mode (DROP's sandbox) holds no
    consumer's request: the broker now in production, its yearly figures and registration
    columns leave it out, and so does the list behind each figure."""
    broker_in_production(broker)
    sandbox = DropCycleFactory.create(
        broker=broker, drop_session_id="70", match_date=DOWNLOADED.date(), mode="test"
    )
    reported(sandbox, 3, 1)
    reported(sandbox, 2, 1)
    WorkItemFactory.create(cycle=sandbox)
    err = io.StringIO()
    call_command(
        "drop", "metrics", "--broker", "4821", "--year", "2027", "--format", "json",
        stdout=(out := io.StringIO()), stderr=err,
    )  # fmt: skip
    assert json.loads(out.getvalue()) == EXPECTED
    assert err.getvalue() == ""  # a production broker's figures need no note
    registry = json.loads(metrics("--year", "2027", "--registry", "--format", "json"))
    assert (registry["received"], registry["complied_in_whole"], registry["denied"]) == (8, 2, 1)
    for key, _ in METRIC_FIGURES:
        assert not WorkItem.objects.filter(cycle=sandbox).filter(METRIC_FILTERS[key]).exists()


@pytest.mark.parametrize("registry", [[], ["--registry"]])
def test_a_broker_in_test_mode_is_told_what_its_figures_count(
    year: None, broker: Broker, registry: list[str]
) -> None:
    assert broker.mode == "test"
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "drop", "metrics", "--broker", "4821", "--year", "2027", "--format", "json", *registry,
        stdout=out, stderr=err,
    )  # fmt: skip
    assert err.getvalue().count("\n") == 1
    assert "4821 is in test mode (DROP's sandbox)" in err.getvalue()
    assert "only the cycles it downloaded in production mode" in err.getvalue()
    assert json.loads(out.getvalue())["year"] == 2027  # stdout stays whole JSON
