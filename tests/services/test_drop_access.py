"""DROP access obligations against the loopback DROP: an outage of the automated connection
that is not the broker's doing (5xx, timeouts, stalls) and lasts more than a day obliges a
download by hand and a written notice to CalPrivacy within 45 days (11 CCR 7612(b)(1)). The
clock is moved in the test; waits between attempts are recorded, not slept."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from devtools.drop_simulator import DropSimulator, work_items
from integrations.drop.calendar import drop_date, drop_today
from integrations.drop.errors import (
    DropApiError,
    DropAuthError,
    DropConflict,
    DropPending,
    DropThrottled,
    DropUnavailable,
)
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    AlertState,
    Broker,
    DropAccessObligation,
    DropOutage,
    LedgerEvent,
    ReportFile,
)
from integrations.services.cycle import drop as drop_services
from integrations.services.cycle.drop_access import (
    drop_access_notice_record,
    drop_failure_not_ours,
)
from integrations.services.reporting.reports import report_run
from integrations.services.staff.alerts import alerts_evaluate
from integrations.services.staff.brokers import broker_create
from tests.builders import PACKAGE_DATE, DropCycleFactory, WorkItemFactory, drop_zip

pytestmark = pytest.mark.django_db

KEY = "dk_live_7Qz9SECRETkeyVALUE42"
PACKAGE_NAME = f"{PACKAGE_DATE}_4821_DROP.zip"
ATTEMPTS = drop_services.DROP_LIMITS.max_retries + 1  # one failed pull: every attempt fails


@dataclasses.dataclass
class Clock:
    """``timezone.now`` moved forward by ``offset`` for the whole service."""

    offset: dt.timedelta = dt.timedelta()

    def advance(self, **delta: float) -> None:
        self.offset += dt.timedelta(**delta)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    moved = Clock()
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + moved.offset)
    return moved


@pytest.fixture
def drop(settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[DropSimulator]:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True  # the stand-in listens on loopback
    monkeypatch.setattr(drop_services, "wait", lambda seconds: None)
    monkeypatch.setattr(drop_services, "PACKAGES_DIR", tmp_path / "packages")
    with DropSimulator(api_key=KEY) as simulator:
        yield simulator


@pytest.fixture
def broker(db: None, drop: DropSimulator) -> Broker:
    return broker_create(
        broker_id="4821",
        name="Acme Data",
        mode="test",
        drop_api_key=KEY,
        drop_base_url=drop.url,
        actor="test",
    )


def pull_fails(drop: DropSimulator, status: int = 503) -> None:
    drop.queue_response(status, body={"message": "Service Unavailable"}, times=ATTEMPTS)
    with pytest.raises(CommandError):
        call_command("drop", "pull", "--broker", "4821")


def doctor() -> tuple[int, str]:
    err = io.StringIO()
    try:
        call_command("drop", "doctor", stderr=err, stdout=io.StringIO())
    except SystemExit as exited:
        return int(exited.code or 0), err.getvalue()
    return 0, err.getvalue()


def kinds() -> list[str]:
    drop_kinds = {
        LedgerKind.DROP_OUTAGE_STARTED,
        LedgerKind.DROP_OUTAGE_ENDED,
        LedgerKind.DROP_ACCESS_OBLIGATION_CREATED,
        LedgerKind.DROP_ACCESS_NOTICE_RECORDED,
    }
    return list(
        LedgerEvent.objects.filter(kind__in=drop_kinds)
        .order_by("id")
        .values_list("kind", flat=True)
    )


def dashboard(client: Client, admin_user: Any) -> str:
    client.force_login(admin_user)  # the moved clock ends sessions
    page = client.get("/admin/")
    assert page.status_code == 200
    return page.content.decode()


def active_alerts(condition: str) -> list[AlertState]:
    return list(AlertState.objects.filter(condition=condition, active=True))


# The condition the test reads the alerts of: only it is evaluated.
OBLIGATION = ["drop_access_obligation"]


def test_drop_down_for_more_than_a_day_obliges_a_notice_until_staff_record_it(
    broker: Broker, drop: DropSimulator, clock: Clock, client: Client, admin_user: Any
) -> None:
    pull_fails(drop)
    started = timezone.now()
    (outage,) = DropOutage.objects.all()
    assert outage.ended_at is None
    # Named where staff see it (the admin, its history) with the time's zone.
    pacific = started.astimezone(ZoneInfo("America/Los_Angeles"))
    assert str(outage) == f"4821 DROP outage from {pacific:%Y-%m-%d %H:%M %Z}"
    assert not DropAccessObligation.objects.exists()
    clock.advance(hours=12)
    pull_fails(drop)
    assert not DropAccessObligation.objects.exists()  # half a day: DROP has outages
    assert alerts_evaluate(conditions=OBLIGATION).raised == []

    clock.advance(hours=12, minutes=5)  # the next hourly pull, a day and 5 minutes in
    pull_fails(drop)

    (obligation,) = DropAccessObligation.objects.all()
    outage.refresh_from_db()
    assert outage.failures == 3
    assert abs(obligation.failure_started_at - started) < dt.timedelta(seconds=30)
    assert obligation.due_date == drop_date(outage.started_at) + dt.timedelta(days=45)
    due = obligation.due_date.isoformat()
    # In the alerts, in the doctor and on the dashboard, with its due date.
    (alert,) = alerts_evaluate(conditions=OBLIGATION).raised
    assert "notify CalPrivacy in writing through the DROP account by " + due in alert.text
    assert "drop notice --broker 4821 --sent DATE --reference TEXT" in alert.text
    code, printed = doctor()
    assert code == 1
    assert "[drop_access_obligation]" in printed and f"by {due}" in printed
    page = dashboard(client, admin_user)
    assert "Notice to CalPrivacy owed" in page
    assert obligation.due_date.strftime("%b %-d, %Y") in page
    assert "has been unreachable" in page

    # DROP answers again: the outage ends, the obligation stays until the notice.
    clock.advance(hours=1)
    drop.queue_package(drop_zip(broker, {"Email": list(work_items(2))}), PACKAGE_NAME)
    call_command("drop", "pull", "--broker", "4821", stdout=io.StringIO())
    outage.refresh_from_db()
    assert outage.ended_at is not None
    assert DropAccessObligation.objects.awaiting_notice().count() == 1
    assert doctor()[0] == 1
    assert "was unreachable for more than a day" in dashboard(client, admin_user)

    out = io.StringIO()
    call_command(
        "drop",
        "notice",
        "--broker",
        "4821",
        "--sent",
        drop_today().isoformat(),
        "--reference",
        "DROP message 1182",
        stdout=out,
    )

    assert f"due {due}, notified on {drop_today().isoformat()}." in out.getvalue()
    obligation.refresh_from_db()
    assert obligation.notice_sent_on == drop_today()
    assert obligation.notice_reference == "DROP message 1182"
    assert obligation.notice_recorded_by.startswith("cli")
    assert kinds() == [
        LedgerKind.DROP_OUTAGE_STARTED,
        LedgerKind.DROP_ACCESS_OBLIGATION_CREATED,
        LedgerKind.DROP_OUTAGE_ENDED,
        LedgerKind.DROP_ACCESS_NOTICE_RECORDED,
    ]
    notice = LedgerEvent.objects.get(kind=LedgerKind.DROP_ACCESS_NOTICE_RECORDED)
    assert notice.data["reference"] == "DROP message 1182"
    assert notice.data["late"] is False
    assert "drop_access_obligation" in [
        a.condition for a in alerts_evaluate(conditions=OBLIGATION).cleared
    ]
    assert active_alerts("drop_access_obligation") == []
    assert doctor() == (0, "")
    assert "Notice to CalPrivacy owed" not in dashboard(client, admin_user)


def test_a_refused_key_for_more_than_a_day_is_the_brokers_doing(
    broker: Broker, drop: DropSimulator, clock: Clock
) -> None:
    pull_fails(drop, status=401)
    clock.advance(days=2)
    pull_fails(drop, status=401)
    pull_fails(drop, status=403)

    assert not DropOutage.objects.exists()
    assert not DropAccessObligation.objects.exists()
    assert active_alerts("drop_access_obligation") == []


def test_an_outage_of_less_than_a_day_ends_without_an_obligation(
    broker: Broker, drop: DropSimulator, clock: Clock
) -> None:
    pull_fails(drop, status=500)
    clock.advance(hours=23)
    pull_fails(drop, status=502)
    clock.advance(hours=1)  # the next failure would be past a day: DROP answered first
    drop.queue_response(401, body="Unauthorized")  # any answer: DROP is up
    with pytest.raises(CommandError):
        call_command("drop", "pull", "--broker", "4821")

    (outage,) = DropOutage.objects.all()
    assert outage.ended_at is not None and outage.failures == 2
    assert not DropAccessObligation.objects.exists()
    ended = LedgerEvent.objects.get(kind=LedgerKind.DROP_OUTAGE_ENDED)
    assert ended.data["obligation"] is None and ended.data["failures"] == 2

    clock.advance(days=3)
    pull_fails(drop)  # a new outage, from now
    assert DropOutage.objects.ongoing().get().pk != outage.pk


def test_uploads_failing_for_more_than_a_day_oblige_a_notice_too(
    broker: Broker, drop: DropSimulator, clock: Clock
) -> None:
    drop.active_download = True
    cycle = DropCycleFactory.create(broker=broker, drop_session_id="3", match_date=drop_today())
    WorkItemFactory.create(cycle=cycle, status_code=5)
    drop.queue_response(503, times=ATTEMPTS, path="/data/upload")
    assert report_run(broker=broker, upload=True).error is not None
    clock.advance(days=1, minutes=15)
    drop.queue_response(504, times=ATTEMPTS, path="/data/upload")
    assert report_run(broker=broker, upload=True).error is not None

    (obligation,) = DropAccessObligation.objects.all()
    assert obligation.outage.failures == 2

    clock.advance(minutes=15)
    assert report_run(broker=broker, upload=True).accepted  # DROP takes the file
    assert ReportFile.objects.get().state == "accepted"
    assert DropOutage.objects.ongoing().count() == 0
    assert DropAccessObligation.objects.awaiting_notice().count() == 1


def test_timeouts_start_an_outage_too(
    broker: Broker, drop: DropSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    short = dataclasses.replace(
        drop_services.DROP_LIMITS, connect_timeout=0.3, read_timeout=0.3, total_timeout=0.3
    )
    monkeypatch.setattr(drop_services, "DROP_LIMITS", short)
    drop.queue_response(200, body=b"late", delay=0.6, times=ATTEMPTS)
    with pytest.raises(CommandError, match="did not answer"):
        call_command("drop", "pull", "--broker", "4821")

    (outage,) = DropOutage.objects.ongoing()
    assert "did not answer" in outage.last_error


@pytest.mark.parametrize(
    ("error", "not_ours"),
    [
        (DropUnavailable("DROP GET /data/download failed 5 times", status=503), True),
        (DropUnavailable("DROP did not answer within 300 s"), True),  # timeouts, stalls
        (DropThrottled(status=429), True),
        (DropPending(status=202), True),
        (DropApiError("odd server error", status=501), True),
        (DropAuthError(status=401), False),
        (DropAuthError(status=403), False),
        (DropConflict(status=409), False),
        (DropApiError("DROP base URL refused"), False),  # ours: no answer was asked for
        (OSError("disk full"), False),
    ],
)
def test_which_failures_are_not_the_brokers_doing(error: BaseException, not_ours: bool) -> None:
    assert drop_failure_not_ours(error) is not_ours


@pytest.fixture
def obligation(broker: Broker, drop: DropSimulator, clock: Clock) -> DropAccessObligation:
    pull_fails(drop)
    clock.advance(days=1, minutes=1)
    pull_fails(drop)
    return DropAccessObligation.objects.get()


@pytest.mark.parametrize(
    ("sent", "reference", "refusal"),
    [
        ("2026-13-01", "X-1", "--sent is not a date"),
        ("tomorrow", "X-1", "--sent is not a date"),
        ("future", "X-1", "a future day"),
        ("before", "X-1", "before the failure it reports"),
        ("today", "  ", "reference is required"),
        # Longer than its column: one line, not the database's DataError.
        ("today", "R" * 256, "reference: at most 255 characters, not 256"),
    ],
)
def test_a_notice_that_cannot_be_right_is_refused(
    obligation: DropAccessObligation, sent: str, reference: str, refusal: str
) -> None:
    day = {
        "future": drop_today() + dt.timedelta(days=1),
        "before": drop_date(obligation.failure_started_at) - dt.timedelta(days=1),
        "today": drop_today(),
    }.get(sent)
    with pytest.raises(CommandError, match=refusal):
        call_command(
            "drop",
            "notice",
            "--broker",
            "4821",
            "--sent",
            day.isoformat() if day else sent,
            "--reference",
            reference,
        )
    assert DropAccessObligation.objects.awaiting_notice().count() == 1


def test_a_notice_with_no_obligation_waiting_is_refused(broker: Broker) -> None:
    with pytest.raises(CommandError, match="no DROP access obligation awaiting a notice"):
        call_command(
            "drop", "notice", "--broker", "4821", "--sent", "2026-01-05", "--reference", "X"
        )


def test_a_staff_member_of_the_longest_username_records_a_notice(
    obligation: DropAccessObligation, broker: Broker
) -> None:
    # Django allows 150 characters of username; the "staff:" before it must fit too.
    actor = "staff:" + "u" * 150

    drop_access_notice_record(broker=broker, sent_on=drop_today(), reference="R-7", actor=actor)

    obligation.refresh_from_db()
    assert obligation.notice_recorded_by == actor
    assert LedgerEvent.objects.get(kind=LedgerKind.DROP_ACCESS_NOTICE_RECORDED).actor == actor


def test_staff_record_the_notice_in_the_admin(
    obligation: DropAccessObligation, client: Client, admin_user: Any
) -> None:
    client.force_login(admin_user)  # after the clock moved
    admin_client = client
    url = f"/admin/integrations/dropaccessobligation/{obligation.pk}/change/"
    page = admin_client.get(url)
    assert page.status_code == 200
    shown = page.content.decode()
    assert obligation.due_date.strftime("%b %-d, %Y") in shown
    assert f">{(obligation.due_date - drop_today()).days}</div>" in shown  # days left

    refused = admin_client.post(url, {"notice_sent_on": "", "notice_reference": "R-7"})
    assert refused.status_code == 200  # the form again, with the error
    assert DropAccessObligation.objects.awaiting_notice().count() == 1

    answer = admin_client.post(
        url, {"notice_sent_on": drop_today().isoformat(), "notice_reference": "Letter R-7"}
    )

    assert answer.status_code == 302
    obligation.refresh_from_db()
    assert obligation.notice_reference == "Letter R-7"
    assert obligation.notice_recorded_by == "staff:admin"
    event = LedgerEvent.objects.get(kind=LedgerKind.DROP_ACCESS_NOTICE_RECORDED)
    assert event.actor == "staff:admin"
    # Recorded: the page shows it and edits nothing.
    assert b'name="notice_reference"' not in admin_client.get(url).content


def test_an_outage_is_named_in_drops_zone(broker: Broker) -> None:
    """06:30 UTC on November 26 is 22:30 on November 25 in California."""
    outage = DropOutage(
        broker=broker,
        started_at=dt.datetime(2026, 11, 26, 6, 30, tzinfo=dt.UTC),
        last_failure_at=dt.datetime(2026, 11, 26, 6, 30, tzinfo=dt.UTC),
    )
    assert str(outage) == "4821 DROP outage from 2026-11-25 22:30 PST"
