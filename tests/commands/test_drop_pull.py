"""``drop pull`` against the loopback DROP stand-in: every answer DROP gives, and the
periodic pull. No request leaves 127.0.0.1; waits are recorded, not slept."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import io
import json
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob

from devtools.drop_simulator import DropSimulator, build_drop_zip, work_items
from integrations import tasks
from integrations.drop.calendar import drop_date, drop_midnight, drop_today
from integrations.drop.client import PRODUCTION_URL, SANDBOX_URL
from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, DeletionRequest, DropCycle, LedgerEvent, WorkItem
from integrations.selectors.dashboard import dashboard_overview
from integrations.selectors.pulls import (
    brokers_due_for_pull,
    brokers_due_for_report,
    brokers_with_drop_key_refused,
    brokers_with_last_downloads,
    drop_pulls_reached,
)
from integrations.services.cycle import drop as drop_services
from integrations.services.cycle import drop_import as drop_import_services
from integrations.services.ledger import ledger_event_append
from integrations.services.staff.brokers import broker_create, broker_update
from tests.builders import (
    PACKAGE_DATE,
    ConsumerFactory,
    drop_zip,
)
from tests.conftest import database_url

pytestmark = pytest.mark.django_db

KEY = "dk_live_7Qz9SECRETkeyVALUE42"
ITEMS = list(work_items(5))
PACKAGE_NAME = f"{PACKAGE_DATE}_4821_DROP.zip"


@pytest.fixture
def drop(settings: Any) -> Iterator[DropSimulator]:
    # The simulator is on loopback: the one explicit opening of the outbound filter.
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    with DropSimulator(api_key=KEY) as simulator:
        yield simulator


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[float]:
    """Every wait between attempts, recorded instead of slept; packages kept in tmp_path."""
    recorded: list[float] = []
    monkeypatch.setattr(drop_services, "wait", recorded.append)
    short = dataclasses.replace(drop_services.DROP_LIMITS, connect_timeout=1.0, read_timeout=1.0)
    monkeypatch.setattr(drop_services, "DROP_LIMITS", short)
    monkeypatch.setattr(drop_services, "PACKAGES_DIR", tmp_path / "packages")
    return recorded


@pytest.fixture
def broker(db: None, drop: DropSimulator, waits: list[float]) -> Broker:
    registered = broker_create(
        broker_id="4821",
        name="Acme Data",
        mode="test",
        drop_api_key=KEY,
        drop_base_url=drop.url,
        actor="test",
    )
    ConsumerFactory.create(
        broker=registered, remote_identifier="C-1", hashes={"email": ITEMS[0][1]}
    )
    return registered


@pytest.fixture
def package(broker: Broker) -> bytes:
    return drop_zip(broker, {"Email": ITEMS[:3], "Phone": ITEMS[3:]})


def pull(*extra: str) -> None:
    call_command("drop", "pull", "--broker", "4821", *extra)


def pull_json(capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    pull("--json", *extra)
    return json.loads(capsys.readouterr().out)


def api_calls() -> list[tuple[int | None, str]]:
    return [
        (e.data["status"], e.data["outcome"])
        for e in LedgerEvent.objects.filter(kind="drop.api_call").order_by("id")
    ]


def assert_nothing_imported() -> None:
    assert not DropCycle.objects.exists()
    assert not WorkItem.objects.exists()
    assert not DeletionRequest.objects.exists()


def kept_files(tmp_path: Path) -> list[str]:
    """Every file under the broker's package directory, by its path there."""
    directory = tmp_path / "packages" / "4821"
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


@contextlib.contextmanager
def pull_running_elsewhere(broker: Broker) -> Iterator[None]:
    """The broker's pull lock held on another connection (the worker's pull, say; ``drop
    pull`` runs beside the job lock), and let go of at the end: unlocked, not left to the
    close, which the server completes a moment later (the next pull could find it held)."""
    holder = psycopg.connect(database_url(), autocommit=True)
    key = [drop_services._PULL_LOCK, broker.pk]
    try:
        holder.execute("SELECT pg_advisory_lock(%s, %s)", key)
        yield
    finally:
        holder.execute("SELECT pg_advisory_unlock(%s, %s)", key)
        holder.close()


def assert_key_never_recorded() -> None:
    for event in LedgerEvent.objects.all():
        assert KEY not in json.dumps(event.data) + event.subject + event.actor


# ---------------------------------------------------------------- answers DROP gives


def test_a_package_is_downloaded_imported_and_matched(
    broker: Broker, drop: DropSimulator, package: bytes, capsys, tmp_path: Path
) -> None:
    drop.queue_package(package, PACKAGE_NAME)
    shown = pull_json(capsys)
    assert shown["outcome"] == "imported"
    assert (shown["drop_session_id"], shown["work_items"], shown["matched"]) == ("1", 5, 1)
    assert shown["zip_name"] == PACKAGE_NAME
    cycle = DropCycle.objects.get()
    assert cycle.downloaded_at.date() == timezone.localdate()
    assert cycle.due_date == drop_today() + dt.timedelta(days=45)
    assert DeletionRequest.objects.get().remote_identifier == "C-1"
    assert drop.requests[0].headers["X-API-KEY"] == KEY
    assert api_calls() == [(200, "package")]
    broker.refresh_from_db()
    assert broker.last_pulled_at is not None
    assert LedgerEvent.objects.get(kind="drop.pulled").data["outcome"] == "imported"
    assert (tmp_path / "packages" / "4821" / PACKAGE_NAME).read_bytes() == package
    assert_key_never_recorded()


def test_nothing_new_is_recorded_and_counts_as_a_pull(
    broker: Broker, drop: DropSimulator, capsys
) -> None:
    drop.queue_nothing_new("No new data since your last completed download.")
    pull()
    assert "Nothing new from DROP: No new data" in capsys.readouterr().out
    assert_nothing_imported()
    broker.refresh_from_db()
    assert broker.last_pulled_at is not None
    assert api_calls() == [(200, "nothing_new")]


def test_a_package_still_being_built_is_waited_for(
    broker: Broker, drop: DropSimulator, package: bytes, waits: list[float], capsys
) -> None:
    drop.queue_pending(times=2, retry_after=5)
    drop.queue_package(package, PACKAGE_NAME)
    assert pull_json(capsys)["outcome"] == "imported"
    assert waits == [5.0, 5.0]
    assert api_calls() == [(202, "pending"), (202, "pending"), (200, "package")]


@pytest.mark.parametrize("answer", ["package", "nothing_new"])
def test_a_download_is_dated_by_its_start_not_by_the_end_of_its_waits(
    broker: Broker,
    drop: DropSimulator,
    package: bytes,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    answer: str,
) -> None:
    """A pull asked at 23:58 in California and done at 00:03, after DROP's 202s, downloaded
    on the first day, as DROP counts it: its cycle's due date, the next download's and the
    package's own file time (what a resumed pull reads) count from that day."""
    asked = drop_midnight(drop_today() - dt.timedelta(days=1)) - dt.timedelta(minutes=2)
    clock = [asked]
    monkeypatch.setattr(drop_services, "timezone", SimpleNamespace(now=lambda: clock[0]))

    def waited(seconds: float) -> None:  # DROP builds the package meanwhile
        clock[0] += dt.timedelta(minutes=5)

    monkeypatch.setattr(drop_services, "wait", waited)
    drop.queue_pending(times=1, retry_after=300)
    if answer == "package":
        drop.queue_package(package, PACKAGE_NAME)
    else:
        drop.queue_nothing_new()

    pull()

    broker.refresh_from_db()
    assert broker.last_pulled_at == asked
    event = LedgerEvent.objects.get(kind="drop.pulled")
    assert dt.datetime.fromisoformat(event.data["started_at"]) == asked
    (reached,) = brokers_with_last_downloads(Broker.objects.filter(pk=broker.pk))
    assert reached.last_pull_reached_at == asked  # type: ignore[attr-defined]
    if answer == "package":
        cycle = DropCycle.objects.get()
        assert cycle.downloaded_at == asked
        assert cycle.due_date == drop_date(asked) + dt.timedelta(days=45)
        kept = tmp_path / "packages" / "4821" / PACKAGE_NAME
        assert kept.stat().st_mtime_ns == int(asked.timestamp()) * 10**9 + asked.microsecond * 1000


def test_waiting_longer_than_max_wait_stops_and_the_next_pull_picks_up(
    broker: Broker, drop: DropSimulator, package: bytes, waits: list[float], capsys
) -> None:
    drop.queue_pending(times=2, retry_after=60)  # waits 60 s once; a second 60 s is too long
    with pytest.raises(CommandError, match="still prepares the package after 100 s"):
        pull("--max-wait", "100")
    assert_nothing_imported()
    assert LedgerEvent.objects.filter(kind="drop.pull_failed").count() == 1
    broker.refresh_from_db()
    assert broker.last_pulled_at is None

    assert waits == [60.0]
    drop.queue_package(package, PACKAGE_NAME)
    assert pull_json(capsys)["drop_session_id"] == "1"


def test_throttling_is_waited_out_as_drop_asks(
    broker: Broker, drop: DropSimulator, package: bytes, waits: list[float], capsys
) -> None:
    drop.queue_response(429, body={"message": "Too many requests"}, headers={"Retry-After": "7"})
    drop.queue_package(package, PACKAGE_NAME)
    assert pull_json(capsys)["outcome"] == "imported"
    assert waits == [7.0]


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (401, "Unauthorized", "bad API key"),
        (403, {"message": "Broker is not eligible"}, "not eligible or no list selected"),
        (
            409,
            {"message": "Previous download has work items without a status"},
            "report them first",
        ),
    ],
)
def test_a_refusal_stops_with_one_line_and_a_ledger_event(
    broker: Broker,
    drop: DropSimulator,
    package: bytes,
    status: int,
    body: object,
    message: str,
    capsys,
) -> None:
    drop.queue_response(status, body=body)  # type: ignore[arg-type]
    with pytest.raises(CommandError) as refused:
        pull()
    text = str(refused.value)
    assert message in text and "\n" not in text and KEY not in text
    assert_nothing_imported()
    assert api_calls() == [(status, "auth_error" if status in (401, 403) else "conflict")]
    failed = LedgerEvent.objects.get(kind="drop.pull_failed")
    assert failed.data["status"] == status
    broker.refresh_from_db()
    assert broker.last_pulled_at is None
    assert_key_never_recorded()

    drop.queue_package(package, PACKAGE_NAME)  # once staff fixed it, the next pull works
    assert pull_json(capsys)["drop_session_id"] == "1"


def test_a_failed_pull_is_the_commands_one_error_line_and_the_jobs_warning(
    broker: Broker, drop: DropSimulator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    drop.queue_response(409, body={"message": "Report first"})
    with pytest.raises(CommandError, match="Report first"):
        pull()
    # A log line would reach the command's stderr before its error line.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text

    # The periodic job has no error line to show: its log says it.
    drop.queue_response(409, body={"message": "Report first"})
    assert tasks.pull_broker(broker_pk=broker.pk) == "failed"
    (warned,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned.getMessage().startswith("DROP pull for broker 4821 failed: ")
    assert "Report first" in warned.getMessage()


def test_a_wrong_key_is_refused_without_showing_it(broker: Broker, drop: DropSimulator) -> None:
    broker.drop_api_key = "dk_live_WRONGkey"
    broker.save()
    with pytest.raises(CommandError, match="bad API key") as refused:
        pull()
    assert "WRONGkey" not in str(refused.value)
    assert "check the broker's DROP API key" in str(refused.value)


def test_server_errors_are_retried_with_backoff(
    broker: Broker, drop: DropSimulator, package: bytes, waits: list[float], capsys
) -> None:
    drop.queue_response(503, body={"message": "Service Unavailable"}, times=2)
    drop.queue_package(package, PACKAGE_NAME)
    assert pull_json(capsys)["outcome"] == "imported"
    assert waits == [2.0, 4.0]
    assert api_calls() == [(503, "server_error"), (503, "server_error"), (200, "package")]


def test_drop_down_for_good_stops_and_imports_nothing(
    broker: Broker, drop: DropSimulator, waits: list[float]
) -> None:
    drop.queue_response(500, body={"message": "Internal Server Error"}, times=10)
    with pytest.raises(CommandError, match="failed 5 times; last: Internal Server Error"):
        pull()
    assert_nothing_imported()
    assert len(api_calls()) == 5


def test_a_timeout_is_retried(
    broker: Broker, drop: DropSimulator, package: bytes, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    quick = dataclasses.replace(drop_services.DROP_LIMITS, read_timeout=0.25)
    monkeypatch.setattr(drop_services, "DROP_LIMITS", quick)
    drop.queue_response(200, body=package, delay=1.0, path="/data/download")  # past 0.25 s
    drop.queue_package(package, PACKAGE_NAME)
    assert pull_json(capsys)["outcome"] == "imported"
    assert [outcome for _, outcome in api_calls()] == ["timeout", "package"]


def test_a_body_cut_short_is_retried_and_never_imported_in_part(
    broker: Broker, drop: DropSimulator, package: bytes, capsys, tmp_path: Path
) -> None:
    drop.queue_package(package, PACKAGE_NAME, cut_after=len(package) // 2)
    drop.queue_package(package, PACKAGE_NAME)
    assert pull_json(capsys)["work_items"] == 5
    assert [outcome for _, outcome in api_calls()] == ["truncated", "package"]
    assert kept_files(tmp_path) == [PACKAGE_NAME]  # no partial file left behind


def test_a_body_cut_short_every_time_imports_nothing(
    broker: Broker, drop: DropSimulator, package: bytes, tmp_path: Path
) -> None:
    for _ in range(drop_services.DROP_LIMITS.max_body_retries + 1):
        drop.queue_package(package, PACKAGE_NAME, cut_after=100)
    with pytest.raises(CommandError, match="download cut short"):
        pull()
    assert_nothing_imported()
    assert kept_files(tmp_path) == []


def test_a_bad_package_is_refused_whole_and_kept_for_staff(
    broker: Broker, drop: DropSimulator, package: bytes, capsys, tmp_path: Path
) -> None:
    other = broker_create(broker_id="5555", name="Other", actor="test")
    bad = drop_zip(other, {"Email": ITEMS})
    drop.queue_package(bad, PACKAGE_NAME)
    with pytest.raises(CommandError) as refused:
        pull()
    text = str(refused.value)
    kept = tmp_path / "packages" / "4821" / PACKAGE_NAME
    assert f"{PACKAGE_DATE}_5555_Email.csv: broker id 5555 in the file name" in text
    assert f"The package is kept at {kept}" in text
    assert f"drop import --broker 4821 {kept}" in text
    assert kept.read_bytes() == bad
    assert_nothing_imported()
    assert LedgerEvent.objects.filter(kind="drop.import_refused").count() == 1
    assert LedgerEvent.objects.filter(kind="drop.pull_failed").count() == 1

    drop.queue_package(package, PACKAGE_NAME)
    assert pull_json(capsys)["drop_session_id"] == "1"


def test_the_same_package_again_changes_nothing(
    broker: Broker, drop: DropSimulator, package: bytes, capsys
) -> None:
    drop.queue_package(package, PACKAGE_NAME)
    pull_json(capsys)
    drop.queue_package(package, PACKAGE_NAME)
    assert pull_json(capsys)["outcome"] == "already_imported"
    assert DropCycle.objects.count() == 1
    assert WorkItem.objects.count() == 5


def test_a_broker_without_a_key_cannot_pull(broker: Broker, drop: DropSimulator) -> None:
    broker.drop_api_key = ""
    broker.save()
    with pytest.raises(CommandError, match="broker 4821 has no DROP API key"):
        pull()
    assert drop.requests == []
    assert LedgerEvent.objects.filter(kind="drop.pull_failed").exists()


def test_unknown_broker_and_negative_wait_are_refused(broker: Broker) -> None:
    with pytest.raises(CommandError, match="no broker with id '9999'"):
        call_command("drop", "pull", "--broker", "9999")
    for wait in ("-1", "nan", "inf"):  # nan compares false with every limit: it never ended
        with pytest.raises(CommandError, match="--max-wait must be 0 or more"):
            pull("--max-wait", wait)


# ---------------------------------------------------------------- where DROP is


def test_base_url_is_the_brokers_then_drop_api_url_then_by_mode(
    broker: Broker, drop: DropSimulator
) -> None:
    assert drop_services.drop_client_for(broker, actor="t").base_url == drop.url
    broker.drop_base_url = ""
    with override_settings(DROP_API_URL="http://127.0.0.1:9/sandbox"):
        assert drop_services.drop_client_for(broker, actor="t").base_url == (
            "http://127.0.0.1:9/sandbox"
        )
    with override_settings(DROP_API_URL=None):
        assert drop_services.drop_client_for(broker, actor="t").base_url == SANDBOX_URL
        broker.mode = "production"
        assert drop_services.drop_client_for(broker, actor="t").base_url == PRODUCTION_URL


def test_a_drop_url_the_client_refuses_is_named_without_its_token(
    broker: Broker, drop: DropSimulator, settings: Any
) -> None:
    Broker.objects.filter(pk=broker.pk).update(drop_base_url="")
    settings.DROP_API_URL = "ftp://drop.example/sandbox?token=S3CR3T"
    with pytest.raises(CommandError) as refused:
        pull()
    assert str(refused.value) == (
        "DROP base URL must be an http(s) URL (a port is a number up to 65535), got "
        "'ftp://drop.example/sandbox'"
    )
    assert drop.requests == []


# ---------------------------------------------------------------- the periodic pull


def days_ago(days: float) -> dt.datetime:
    return timezone.now() - dt.timedelta(days=days)


def test_due_brokers_are_those_with_auto_pull_and_an_old_or_no_pull(broker: Broker) -> None:
    def make(broker_id: str, **fields: object) -> None:
        created = broker_create(broker_id=broker_id, name=broker_id, actor="test")
        Broker.objects.filter(pk=created.pk).update(**fields)

    make("1001", auto_pull=True)  # never pulled
    make("1002", auto_pull=True, last_pulled_at=days_ago(29))
    make("1003", auto_pull=True, last_pulled_at=days_ago(30.01))
    make("1004", auto_pull=True, pull_interval_days=7, last_pulled_at=days_ago(8))
    make("1005", auto_pull=False, last_pulled_at=days_ago(90))
    # Stored before the cadence was 45 days, or at it: held to 44, a day to spare.
    make("1006", auto_pull=True, pull_interval_days=45, last_pulled_at=days_ago(44.01))
    make("1007", auto_pull=True, pull_interval_days=60, last_pulled_at=days_ago(43.99))
    due = [b.broker_id for b in brokers_due_for_pull(now=timezone.now())]
    assert due == ["1001", "1003", "1004", "1006"]


def test_the_periodic_job_defers_one_pull_per_due_broker(broker: Broker) -> None:
    Broker.objects.filter(pk=broker.pk).update(auto_pull=True)
    assert tasks.pull_due() == 1
    assert tasks.pull_due() == 0  # the first is still waiting: not queued twice
    job = ProcrastinateJob.objects.get(task_name="integrations.tasks.pull_broker")
    assert job.args == {"broker_pk": broker.pk, "latest_cycle": 0}  # it had none
    assert job.queueing_lock == "pull:4821"


def test_a_pull_job_imports_and_a_failed_one_tries_again_later(
    broker: Broker, drop: DropSimulator, package: bytes
) -> None:
    Broker.objects.filter(pk=broker.pk).update(auto_pull=True)
    drop.queue_response(409, body={"message": "Report first"})
    assert tasks.pull_broker(broker_pk=broker.pk) == "failed"
    assert [b.broker_id for b in brokers_due_for_pull(now=timezone.now())] == ["4821"]
    assert LedgerEvent.objects.get(kind="drop.pull_failed").actor == "system:auto-pull"

    drop.queue_package(package, PACKAGE_NAME)
    assert tasks.pull_broker(broker_pk=broker.pk) == "imported"
    assert DropCycle.objects.count() == 1
    assert list(brokers_due_for_pull(now=timezone.now())) == []
    assert [b.broker_id for b in brokers_due_for_pull(now=timezone.now() + dt.timedelta(30))] == [
        "4821"
    ]


def test_a_pull_job_asked_for_while_another_pull_imported_does_not_ask_drop(
    broker: Broker, drop: DropSimulator, package: bytes
) -> None:
    """``download.ready`` arriving while the periodic pull waits through DROP's 202 (or the
    periodic pull while a notified one imports) queues a second job, which runs once the
    first is done: asking DROP then gets a 409 (the new cycle's statuses are owed), a
    ``drop.pull_failed`` and an alert that would stand until the next pull."""
    Broker.objects.filter(pk=broker.pk).update(auto_pull=True)
    assert tasks.pull_due() == 1  # asked for with no cycle yet
    drop.queue_package(package, PACKAGE_NAME)
    pull()  # the package, by another hand, before that job runs
    (job,) = ProcrastinateJob.objects.filter(task_name="integrations.tasks.pull_broker")
    drop.queue_response(409, body={"message": "Report first"})
    asked = len(drop.requests)

    assert tasks.pull_broker(**job.args) == "imported_meanwhile"

    assert len(drop.requests) == asked  # DROP was not asked
    assert not LedgerEvent.objects.filter(kind="drop.pull_failed").exists()
    assert DropCycle.objects.count() == 1
    # Asked for after that import (its cycle known), the job asks DROP as ever.
    latest = DropCycle.objects.get().pk
    assert tasks.pull_broker(broker_pk=broker.pk, latest_cycle=latest) == "failed"
    assert len(drop.requests) == asked + 1
    # A job queued before the argument existed asks DROP as before.
    drop.queue_response(409, body={"message": "Report first"})
    assert tasks.pull_broker(broker_pk=broker.pk) == "failed"
    assert len(drop.requests) == asked + 2


def test_a_refused_pull_stays_on_the_dashboard_until_a_pull_succeeds(
    broker: Broker, drop: DropSimulator, package: bytes, admin_client
) -> None:
    drop.queue_response(401, body="Unauthorized")
    with pytest.raises(CommandError):
        pull()

    page = admin_client.get("/admin/").content.decode()
    assert "Last pull failed" in page
    assert "bad API key" in page
    assert "kind__exact=drop.pull_failed&amp;broker_id__exact=4821" in page

    drop.queue_package(package, PACKAGE_NAME)
    pull()
    assert "Last pull failed" not in admin_client.get("/admin/").content.decode()


def test_drop_unreachable_is_named_plainly(broker: Broker, waits: list[float]) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    Broker.objects.filter(pk=broker.pk).update(drop_base_url=f"http://127.0.0.1:{closed}")

    with pytest.raises(CommandError) as refused:
        pull()

    text = str(refused.value)
    assert text.startswith("DROP GET /data/download failed ")
    assert text.endswith("; last: cannot reach DROP: connection refused")
    assert len(waits) == drop_services.DROP_LIMITS.max_retries  # retried, then gave up
    assert_nothing_imported()


def test_after_a_403_the_automatic_pull_tries_again_the_next_hour(
    broker: Broker, drop: DropSimulator
) -> None:
    # Not eligible, or no list selected: fixed in DROP's portal, not by a new key.
    Broker.objects.filter(pk=broker.pk).update(auto_pull=True)
    drop.queue_response(403, body="Forbidden")
    assert tasks.pull_broker(broker_pk=broker.pk) == "failed"

    assert [b.broker_id for b in brokers_due_for_pull(now=timezone.now())] == ["4821"]


def test_after_a_refused_key_the_automatic_pull_waits_for_a_new_key_or_url(
    broker: Broker, drop: DropSimulator, package: bytes
) -> None:
    status = 401
    Broker.objects.filter(pk=broker.pk).update(auto_pull=True)
    drop.queue_response(status, body="Unauthorized")
    assert tasks.pull_broker(broker_pk=broker.pk) == "failed"

    assert list(brokers_due_for_pull(now=timezone.now())) == []
    assert tasks.pull_due() == 0  # not asked again every hour with the same key
    assert brokers_due_for_report() == []  # nor sent with each quarter hour's reports

    # A change of anything else does not count; a new key does.
    broker_update(broker=broker, name="Acme Data Inc.", actor="staff:ann")
    assert list(brokers_due_for_pull(now=timezone.now())) == []
    broker_update(broker=broker, drop_api_key=KEY, actor="staff:ann")
    assert [b.broker_id for b in brokers_due_for_pull(now=timezone.now())] == ["4821"]
    assert [b.broker_id for b in brokers_due_for_report()] == ["4821"]

    # Refused again, then the URL changes.
    drop.queue_response(status, body="Unauthorized")
    assert tasks.pull_broker(broker_pk=broker.pk) == "failed"
    assert list(brokers_due_for_pull(now=timezone.now())) == []
    broker_update(broker=broker, drop_base_url=drop.url + "/", actor="staff:ann")
    assert [b.broker_id for b in brokers_due_for_pull(now=timezone.now())] == ["4821"]


def test_a_manual_pull_that_succeeds_after_a_refusal_resumes_the_automatic_pull(
    broker: Broker, drop: DropSimulator, package: bytes
) -> None:
    Broker.objects.filter(pk=broker.pk).update(auto_pull=True)
    drop.queue_response(401, body="Unauthorized")
    assert tasks.pull_broker(broker_pk=broker.pk) == "failed"
    assert list(brokers_due_for_pull(now=timezone.now())) == []

    drop.queue_package(package, PACKAGE_NAME)  # DROP takes the key again
    pull()
    assert list(brokers_due_for_pull(now=timezone.now() + dt.timedelta(31))) != []


# ---------------------------------------------------------------- large packages, odd packages


@pytest.fixture
def slow_line(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounds small enough for a test: 0.2 s for DROP's answer to begin, 0.3 s of silence
    (the slow lines below send a piece every 0.03 s)."""
    settings.DROPPORTAL_DROP_STALL_SECONDS = 0.3
    short = dataclasses.replace(drop_services.DROP_LIMITS, total_timeout=0.2)
    monkeypatch.setattr(drop_services, "DROP_LIMITS", short)


def test_a_package_longer_in_coming_than_every_bound_is_imported(
    broker: Broker, drop: DropSimulator, package: bytes, slow_line: None, capsys
) -> None:
    # About 0.4 s in all, never silent for 0.3 s: a large package on a slow line.
    drop.queue_package(package, PACKAGE_NAME, pace=0.03, chunk=-(-len(package) // 14))

    assert pull_json(capsys)["outcome"] == "imported"

    assert api_calls() == [(200, "package")]
    pulled = LedgerEvent.objects.get(kind="drop.pulled").data
    assert (pulled["size_bytes"], pulled["attempts"]) == (len(package), 1)
    assert isinstance(pulled["duration_ms"], int)


def test_a_stalled_package_is_pulled_again(
    broker: Broker, drop: DropSimulator, package: bytes, slow_line: None, capsys, tmp_path: Path
) -> None:
    drop.queue_package(package, PACKAGE_NAME, stall_after=len(package) // 2, stall_for=3.0)
    drop.queue_package(package, PACKAGE_NAME)

    assert pull_json(capsys)["work_items"] == 5

    assert [outcome for _, outcome in api_calls()] == ["stalled", "package"]
    assert LedgerEvent.objects.get(kind="drop.pulled").data["attempts"] == 2
    assert kept_files(tmp_path) == [PACKAGE_NAME]


@pytest.mark.parametrize("ranges", [True, False], ids=["range-honoured", "range-ignored"])
def test_a_package_stalled_past_max_wait_is_resumed_and_arrives_whole(
    broker: Broker,
    drop: DropSimulator,
    package: bytes,
    slow_line: None,
    capsys,
    tmp_path: Path,
    ranges: bool,
) -> None:
    # Each attempt trickles its bytes 0.03 s apart, never silent for the 0.3 s stall bound
    # but longer in all than --max-wait 0.4: the first stalls half way (silent for 3 s),
    # after more than 0.4 s of receiving; the transfer, not DROP's preparing, took that time.
    half = len(package) // 2
    piece = -(-len(package) // 20)
    drop.queue_package(
        package, PACKAGE_NAME, pace=0.03, chunk=piece, stall_after=half, stall_for=3.0
    )
    drop.queue_package(package, PACKAGE_NAME, pace=0.03, chunk=piece, ranges=ranges)

    assert pull_json(capsys, "--max-wait", "0.4")["work_items"] == 5

    first, second = drop.calls("/data/download")
    assert "Range" not in first.headers
    assert second.headers["Range"] == f"bytes={half}-"  # the rest, where the stall stopped
    assert api_calls() == [(200, "stalled"), (206 if ranges else 200, "package")]
    pulled = LedgerEvent.objects.get(kind="drop.pulled").data
    assert pulled["zip_sha256"] == hashlib.sha256(package).hexdigest()
    assert (pulled["size_bytes"], pulled["attempts"]) == (len(package), 2)
    assert kept_files(tmp_path) == [PACKAGE_NAME]  # the part kept for the resume is gone
    assert (tmp_path / "packages" / "4821" / PACKAGE_NAME).read_bytes() == package


def test_a_package_that_keeps_stalling_is_given_up_after_max_body_retries(
    broker: Broker, drop: DropSimulator, package: bytes, slow_line: None, monkeypatch, tmp_path
) -> None:
    fewer = dataclasses.replace(drop_services.DROP_LIMITS, max_body_retries=2)
    monkeypatch.setattr(drop_services, "DROP_LIMITS", fewer)
    for _ in range(4):
        drop.queue_package(package, PACKAGE_NAME, stall_after=100, stall_for=3.0, ranges=True)

    with pytest.raises(CommandError, match="failed 3 times; last: download stalled"):
        pull()

    assert [outcome for _, outcome in api_calls()] == ["stalled"] * 3
    assert_nothing_imported()
    assert kept_files(tmp_path) == []


def test_an_odd_package_is_pulled_imported_in_part_and_the_exit_names_the_rest(
    broker: Broker, drop: DropSimulator, capsys
) -> None:
    package = build_drop_zip(
        "4821", PACKAGE_DATE, {"Email": [*ITEMS[:2], ("680", "5")], "Address": ITEMS[2:]}
    )
    drop.queue_package(package, PACKAGE_NAME)

    with pytest.raises(CommandError) as incomplete:
        pull()

    assert "Cycle 1 from" in capsys.readouterr().out
    assert f"{PACKAGE_DATE}_4821_Address.csv: list type 'Address'" in str(incomplete.value)
    assert f"{PACKAGE_DATE}_4821_Email.csv: 1 unreadable row(s)" in str(incomplete.value)
    assert WorkItem.objects.count() == 2
    assert LedgerEvent.objects.get(kind="drop.pulled").data["outcome"] == "imported"
    assert not LedgerEvent.objects.filter(kind="drop.pull_failed").exists()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stderr", [Terminal, io.StringIO], ids=["terminal", "pipe"])
def test_a_progress_bar_follows_the_download_on_a_terminal_only(
    broker: Broker, drop: DropSimulator, package: bytes, stderr: type[io.StringIO]
) -> None:
    drop.queue_package(package, PACKAGE_NAME, pace=0.05, chunk=-(-len(package) // 4))
    err = stderr()

    call_command("drop", "pull", "--broker", "4821", stdout=io.StringIO(), stderr=err)

    drawn = err.getvalue()
    if stderr is Terminal:
        assert "DROP package" in drawn
        assert f"100%|##########| {len(package)}/{len(package)}" in drawn
    else:
        assert drawn == ""


# ---------------------------------------------------------------- a pull that stopped midway


class _Killed(BaseException):
    """The process killed there: like SIGKILL, nothing of the command's handles it (Ctrl-C,
    KeyboardInterrupt, would be said as "interrupted")."""


def _killed(*args: Any, **kwargs: Any) -> None:
    raise _Killed("killed")


# What DROP may answer a download asked again before the package it sent has its statuses:
# its 409 (that download still has work items without a status), or "nothing new" (it was
# a completed download). Neither sends the package again.
DROP_WONT_SEND_IT_AGAIN = {
    "conflict": lambda drop: drop.queue_response(
        409, body={"message": "Report first"}, path="/data/download"
    ),
    "nothing_new": lambda drop: drop.queue_nothing_new(),
}


@pytest.mark.parametrize("answer", DROP_WONT_SEND_IT_AGAIN)
def test_a_pull_killed_before_its_import_committed_imports_the_kept_package_next_time(
    broker: Broker,
    drop: DropSimulator,
    package: bytes,
    monkeypatch: pytest.MonkeyPatch,
    capsys,
    tmp_path: Path,
    answer: str,
) -> None:
    drop.queue_package(package, PACKAGE_NAME)
    with monkeypatch.context() as kill:
        # Killed in the import's transaction, its work items written: it all rolls back.
        kill.setattr(drop_import_services, "canary_round_send", _killed)
        with pytest.raises(_Killed):
            pull()
    assert_nothing_imported()
    downloaded = LedgerEvent.objects.get(kind="drop.api_call").created_at
    DROP_WONT_SEND_IT_AGAIN[answer](drop)

    shown = pull_json(capsys)

    assert (shown["outcome"], shown["work_items"], shown["matched"]) == ("imported", 5, 1)
    assert DeletionRequest.objects.get().remote_identifier == "C-1"
    cycle = DropCycle.objects.get()
    assert cycle.downloaded_at <= downloaded  # DROP's 45 days run from the download
    assert len(drop.calls("/data/download")) == 1  # DROP is asked again at the next pull
    pulled = LedgerEvent.objects.get(kind="drop.pulled").data
    assert (pulled["outcome"], pulled["zip_sha256"], pulled["resumed"]) == (
        "imported",
        hashlib.sha256(package).hexdigest(),
        True,
    )
    broker.refresh_from_db()
    assert broker.last_pulled_at is not None
    assert kept_files(tmp_path) == [PACKAGE_NAME]

    # The next pull asks DROP again, as any pull does (what it answers is its own).
    with contextlib.suppress(CommandError):
        pull()
    assert len(drop.calls("/data/download")) == 2
    assert DropCycle.objects.count() == 1


def test_a_pull_killed_once_its_import_committed_is_done_at_the_next_pull(
    broker: Broker, drop: DropSimulator, package: bytes, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    drop.queue_package(package, PACKAGE_NAME)
    with monkeypatch.context() as kill:
        kill.setattr(drop_services, "_pulled", _killed)  # the import committed
        with pytest.raises(_Killed):
            pull()
    assert DropCycle.objects.count() == 1
    drop.queue_response(409, body={"message": "Report first"}, path="/data/download")

    assert pull_json(capsys)["outcome"] == "already_imported"

    assert len(drop.calls("/data/download")) == 1  # no 409 for a pull that had succeeded
    assert not LedgerEvent.objects.filter(kind="drop.pull_failed").exists()
    assert LedgerEvent.objects.get(kind="drop.pulled").data["outcome"] == "already_imported"
    broker.refresh_from_db()
    assert broker.last_pulled_at is not None
    assert DropCycle.objects.count() == 1


# ---------------------------------------------------------------- pulls side by side


def _left_in_incoming(tmp_path: Path, package: bytes, *, age: dt.timedelta) -> Path:
    """The package as a stopped pull left it in incoming/, downloaded ``age`` ago."""
    incoming = tmp_path / "packages" / "4821" / drop_services.INCOMING
    incoming.mkdir(parents=True, exist_ok=True)
    path = incoming / PACKAGE_NAME
    path.write_bytes(package)
    at = (timezone.now() - age).timestamp()
    os.utime(path, (at, at))
    return path


def test_a_pull_while_another_pull_of_the_broker_runs_is_refused_recording_nothing(
    broker: Broker, drop: DropSimulator, package: bytes
) -> None:
    drop.queue_package(package, PACKAGE_NAME)
    with (
        pull_running_elsewhere(broker),
        pytest.raises(CommandError, match="another pull of broker 4821 is running"),
    ):
        pull()

    assert not drop.calls("/data/download")
    assert not LedgerEvent.objects.filter(kind__startswith="drop.pull").exists()
    assert_nothing_imported()
    pull()  # once it is done, the next pull goes ahead
    assert DropCycle.objects.count() == 1


def test_a_package_gone_from_incoming_while_resumed_is_skipped_not_refused(
    broker: Broker,
    drop: DropSimulator,
    package: bytes,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    left = _left_in_incoming(tmp_path, package, age=dt.timedelta(hours=1))
    real_import = drop_services.drop_zip_import

    def taken_first(**kwargs: Any) -> Any:
        left.unlink()  # another hand kept it between the listing and the import
        return real_import(**kwargs)

    monkeypatch.setattr(drop_services, "drop_zip_import", taken_first)
    drop.queue_nothing_new()

    pull()

    assert not LedgerEvent.objects.filter(kind="drop.pull_failed").exists()
    assert len(drop.calls("/data/download")) == 1  # skipped: the pull asked DROP as usual


def test_a_resumed_pull_counts_from_the_package_download_not_now(
    broker: Broker, drop: DropSimulator, package: bytes, tmp_path: Path
) -> None:
    left = _left_in_incoming(tmp_path, package, age=dt.timedelta(days=2))

    pull()

    broker.refresh_from_db()
    downloaded = dt.datetime.fromtimestamp(
        left.parent.parent.joinpath(PACKAGE_NAME).stat().st_mtime, tz=dt.UTC
    )
    assert broker.last_pulled_at == DropCycle.objects.get().downloaded_at
    assert abs(broker.last_pulled_at - downloaded) < dt.timedelta(seconds=1)
    assert not drop.calls("/data/download")  # two days ago is not due again yet
    assert kept_files(tmp_path) == [PACKAGE_NAME]


@pytest.mark.parametrize("pulled_since", [False, True], ids=["never-recorded", "recorded-since"])
def test_a_stale_package_imported_before_does_not_use_up_a_due_pull(
    broker: Broker,
    drop: DropSimulator,
    package: bytes,
    tmp_path: Path,
    pulled_since: bool,
) -> None:
    left = _left_in_incoming(tmp_path, package, age=dt.timedelta(days=40))
    downloaded_at = timezone.now() - dt.timedelta(days=40)
    drop_import_services.drop_zip_import(
        broker=broker, path=left, downloaded_at=downloaded_at, actor="test"
    )
    if pulled_since:
        Broker.objects.filter(pk=broker.pk).update(
            last_pulled_at=timezone.now() - dt.timedelta(days=35)
        )
    drop.queue_nothing_new()

    assert pull_json_or_none() == "nothing_new"

    assert len(drop.calls("/data/download")) == 1  # DROP asked: the broker was due
    broker.refresh_from_db()
    assert broker.last_pulled_at is not None
    assert timezone.now() - broker.last_pulled_at < dt.timedelta(minutes=5)
    assert kept_files(tmp_path) == [PACKAGE_NAME]  # out of incoming/: no pull resumes it


def pull_json_or_none() -> str:
    out = io.StringIO()
    call_command("drop", "pull", "--broker", "4821", "--json", stdout=out)
    return json.loads(out.getvalue())["outcome"]


def test_drop_import_of_a_package_in_incoming_takes_it_out(
    broker: Broker, drop: DropSimulator, package: bytes, tmp_path: Path
) -> None:
    left = _left_in_incoming(tmp_path, package, age=dt.timedelta(hours=1))

    call_command("drop", "import", "--broker", "4821", str(left), stdout=io.StringIO())

    assert DropCycle.objects.count() == 1
    assert kept_files(tmp_path) == [PACKAGE_NAME]
    drop.queue_nothing_new()
    pull()
    assert len(drop.calls("/data/download")) == 1  # nothing to resume: DROP is asked


def test_a_resumed_pull_is_not_a_pull_that_reached_drop(broker: Broker) -> None:
    def event(kind: LedgerKind, **data: Any) -> None:
        ledger_event_append(kind=kind, broker_id="4821", subject="4821", actor="test", data=data)

    event(LedgerKind.DROP_PULL_FAILED, status=401, reason="credentials", error="refused")
    event(LedgerKind.DROP_PULLED, outcome="imported", resumed=True)

    assert list(brokers_with_drop_key_refused()) == [broker]  # DROP never saw the key again
    assert list(drop_pulls_reached()) == []
    (overview,) = dashboard_overview(now=timezone.now())
    assert overview.last_pulled_at is None

    event(LedgerKind.DROP_PULLED, outcome="nothing_new")
    assert list(brokers_with_drop_key_refused()) == []
    (overview,) = dashboard_overview(now=timezone.now())
    assert overview.last_pulled_at == LedgerEvent.objects.latest("id").created_at


def test_drop_import_of_a_package_in_incoming_waits_for_no_running_pull(
    broker: Broker, drop: DropSimulator, package: bytes, tmp_path: Path
) -> None:
    left = _left_in_incoming(tmp_path, package, age=dt.timedelta(hours=1))
    # A pull running on another connection resumes this very file: a hand import beside it
    # would race it for the file (importing it as it leaves incoming/).
    with (
        pull_running_elsewhere(broker),
        pytest.raises(CommandError, match="a pull of broker 4821 is running"),
    ):
        call_command("drop", "import", "--broker", "4821", str(left), stdout=io.StringIO())

    assert_nothing_imported()
    assert left.exists()  # still the next pull's to resume
    call_command("drop", "import", "--broker", "4821", str(left), stdout=io.StringIO())
    assert DropCycle.objects.count() == 1
    assert kept_files(tmp_path) == [PACKAGE_NAME]


def test_drop_import_of_a_package_outside_incoming_takes_no_pull_lock(
    broker: Broker, drop: DropSimulator, package: bytes, tmp_path: Path
) -> None:
    elsewhere = tmp_path / PACKAGE_NAME
    elsewhere.write_bytes(package)
    with pull_running_elsewhere(broker):
        call_command("drop", "import", "--broker", "4821", str(elsewhere), stdout=io.StringIO())
    assert DropCycle.objects.count() == 1
    assert elsewhere.exists()  # kept where staff put it
