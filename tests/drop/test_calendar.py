"""DROP's calendar is California's (``DROPPORTAL_DROP_TIMEZONE``), not UTC's.

22:30 Pacific on November 25, 2026 is 06:30 UTC on November 26: every DROP date made at
that moment (match date, due date, days left, the year of the figures) is November 25's,
while the stored timestamps stay UTC.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from devtools.drop_simulator import work_items
from integrations.models import Broker, DeletionRequest, DropCycle
from integrations.services.staff.alerts import CONDITIONS
from tests.builders import (
    ConsumerFactory,
    DropCycleFactory,
    WebhookIntegrationFactory,
    WorkItemFactory,
    days_after,
    drop_zip,
    write_zip,
)

pytestmark = pytest.mark.django_db

LATE_EVENING_IN_CALIFORNIA = dt.datetime(2026, 11, 26, 6, 30, tzinfo=dt.UTC)  # 22:30 PST, 25th
CALIFORNIA_DAY = dt.date(2026, 11, 25)


@pytest.fixture
def late_evening(monkeypatch: pytest.MonkeyPatch) -> dt.datetime:
    monkeypatch.setattr(timezone, "now", lambda: LATE_EVENING_IN_CALIFORNIA)
    return LATE_EVENING_IN_CALIFORNIA


def _import(broker: Broker, tmp_path: Path, *extra: str) -> DropCycle:
    (item,) = work_items(1)
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": item[1]})
    WebhookIntegrationFactory.create(broker=broker)
    path = write_zip(
        tmp_path, drop_zip(broker, {"Email": [item]}, date="20261125"), "20261125_4821_DROP.zip"
    )
    call_command("drop", "import", "--broker", "4821", str(path), *extra, stdout=io.StringIO())
    return DropCycle.objects.get()


def test_a_download_at_2230_pacific_is_matched_on_that_californian_day(
    broker: Broker, tmp_path: Path, late_evening: dt.datetime
) -> None:
    cycle = _import(broker, tmp_path)

    assert cycle.match_date == CALIFORNIA_DAY  # UTC says the 26th
    request = DeletionRequest.objects.get()
    assert request.match_date == CALIFORNIA_DAY  # what the broker's dispatch body carries
    assert cycle.due_date == days_after("20261125", 45)


def test_a_downloaded_at_date_is_the_start_of_that_day_in_california(
    broker: Broker, tmp_path: Path
) -> None:
    cycle = _import(broker, tmp_path, "--downloaded-at", "2026-11-25")

    # Stored in UTC with its offset: midnight Pacific (PST, UTC-8) is 08:00 UTC.
    assert cycle.downloaded_at == dt.datetime(2026, 11, 25, 8, tzinfo=dt.UTC)
    assert cycle.due_date == days_after("20261125", 45)


def test_days_left_are_counted_in_californian_days(
    broker: Broker, late_evening: dt.datetime
) -> None:
    cycle = DropCycleFactory.create(broker=broker, match_date=dt.date(2026, 10, 13), due_in_days=45)
    WorkItemFactory.create(cycle=cycle)  # owed
    assert cycle.due_date == dt.date(2026, 11, 27)

    (firing,) = CONDITIONS["cycle_due_2_days"](late_evening)

    assert "is due in 2 day(s)" in firing.text  # the 25th to the 27th, not the 26th


def test_the_yearly_figures_count_a_new_years_eve_download_in_its_californian_year(
    broker: Broker,
) -> None:
    cycle = DropCycleFactory.create(broker=broker, match_date=dt.date(2026, 12, 31))
    # 19:00 Pacific on December 31, 2026: already 2027 in UTC.
    cycle.downloaded_at = dt.datetime(2027, 1, 1, 3, tzinfo=dt.UTC)
    cycle.save(update_fields=["downloaded_at"])
    WorkItemFactory.create(cycle=cycle, status_code=5)

    def received(year: int) -> int:
        out = io.StringIO()
        call_command(
            "drop", "metrics", "--broker", "4821", "--year", str(year), "--format", "json",
            stdout=out,
        )  # fmt: skip
        return int(json.loads(out.getvalue())["total"]["received"])

    assert (received(2026), received(2027)) == (1, 0)
