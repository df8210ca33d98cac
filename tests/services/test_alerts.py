"""Alerts: each condition alerts once when it starts and once when it clears, by email to a
real SMTP server (aiosmtpd, started here) and as JSON to a loopback webhook, sent by the job
worker; every alert is a ledger event."""

from __future__ import annotations

import contextlib
import datetime as dt
import email
import email.policy
import io
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob
from procrastinate.jobs import Job

from devtools.drop_simulator import DropSimulator, work_items
from devtools.loopback import serve_in_thread
from integrations import enqueue, tasks
from integrations.dispatch.alerts import AlertNotSent, AlertRefused, alert_send
from integrations.drop.calendar import drop_date, drop_midnight, drop_today
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    AlertState,
    Broker,
    DeletionRequest,
    Directive,
    LedgerEvent,
    ReportFile,
    ReportFileState,
    RequestState,
)
from integrations.services.cycle import drop as drop_services
from integrations.services.cycle.work_items import work_item_status_set
from integrations.services.ledger import ledger_event_append
from integrations.services.reporting.report_files import report_files_write
from integrations.services.reporting.report_manual import report_file_discard
from integrations.services.reporting.reports import report_run
from integrations.services.staff.alerts import CONDITIONS, alerts_evaluate
from integrations.services.staff.brokers import broker_create, broker_update
from integrations.services.staff.integrations import integration_disable, integration_enable
from integrations.services.staff.saas import saas_connection_disable, saas_connection_enable
from tests.builders import (
    PACKAGE_DATE,
    DeletionRequestFactory,
    DirectiveFactory,
    DropCycleFactory,
    SaasConnectionFactory,
    WorkItemFactory,
    drop_zip,
    items_reported,
    run_worker,
    webhook_integration_created,
)
from tests.conftest import subprocess_env
from tests.ports import free_port
from tests.started_settings import start_with

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "dk_live_alerts_SECRET_1"
RECIPIENT = "privacy@acme.test"


class Inbox:
    """What the SMTP server received."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.messages: list[email.message.EmailMessage] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(message, email.message.EmailMessage)
        message["X-Rcpt"] = ",".join(envelope.rcpt_tos)
        self.messages.append(message)
        return "250 OK"

    def subjects(self) -> list[str]:
        return [str(m["Subject"]) for m in self.messages]


class Hook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append(json.loads(body))
        # A path ending in a status answers with it (".../404": a URL that is wrong).
        last = self.path.rsplit("/", 1)[-1]
        self.send_response(int(last) if last.isdigit() else 200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    handler = Inbox(free_port())
    controller = Controller(handler, hostname="127.0.0.1", port=handler.port)
    controller.start()
    yield handler
    controller.stop()


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []
    handler = type("Handler", (Hook,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    serve_in_thread(server, name="alert-webhook")  # its short poll: a quick shutdown
    yield f"http://127.0.0.1:{server.server_address[1]}/hooks/alerts", received
    server.shutdown()
    server.server_close()


@pytest.fixture
def channels(
    settings: Any, inbox: Inbox, webhook: tuple[str, list[dict[str, Any]]]
) -> tuple[Inbox, list[dict[str, Any]]]:
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = inbox.port
    settings.DROPPORTAL_ALERT_EMAILS = [RECIPIENT]
    settings.DROPPORTAL_ALERT_WEBHOOK_URL = webhook[0]
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True  # the webhook listens on loopback
    return inbox, webhook[1]


@pytest.fixture
def drop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, settings: Any) -> Iterator[DropSimulator]:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True  # the stand-in listens on loopback
    monkeypatch.setattr(drop_services, "wait", lambda seconds: None)
    monkeypatch.setattr(drop_services, "PACKAGES_DIR", tmp_path / "packages")
    with DropSimulator(api_key=KEY) as simulator:
        yield simulator


@pytest.fixture
def broker(drop: DropSimulator) -> Broker:
    return broker_create(
        broker_id="4821",
        name="Acme Data",
        mode="test",
        drop_api_key=KEY,
        drop_base_url=drop.url,
        actor="test",
    )


def evaluate_and_send() -> None:
    alerts_evaluate()
    run_worker()


def pull() -> None:
    call_command("drop", "pull", "--broker", "4821")


def test_a_refused_pull_alerts_once_and_once_more_when_a_pull_succeeds(
    channels: tuple[Inbox, list[dict[str, Any]]], broker: Broker, drop: DropSimulator
) -> None:
    inbox, hooks = channels
    drop.queue_response(401, body="Unauthorized")
    with pytest.raises(CommandError):
        pull()

    evaluate_and_send()
    evaluate_and_send()  # still failing: nothing new

    assert len(inbox.messages) == 1
    message = inbox.messages[0]
    assert message["X-Rcpt"] == RECIPIENT
    assert message["Subject"].startswith("[dropportal] ALERT: DROP pull for broker 4821 failed")
    assert "check the broker's DROP API key" in message.get_content()
    assert KEY not in message.as_string()
    assert len(hooks) == 1
    assert hooks[0]["text"] == message["Subject"]
    assert hooks[0]["alert"]["condition"] == "drop_pull_failed"
    assert hooks[0]["alert"]["state"] == "raised"
    assert hooks[0]["alert"]["details"]["reason"] == "credentials"

    package = drop_zip(broker, {"Email": list(work_items(2))})
    drop.queue_package(package, f"{PACKAGE_DATE}_4821_DROP.zip")
    pull()
    evaluate_and_send()
    evaluate_and_send()

    assert len(inbox.messages) == 2
    assert inbox.messages[1]["Subject"].startswith("[dropportal] Cleared: DROP pull for broker")
    assert [h["alert"]["state"] for h in hooks] == ["raised", "cleared"]
    events = LedgerEvent.objects.filter(kind__startswith="alert.").order_by("id")
    assert [(e.kind, e.subject, e.broker_id) for e in events] == [
        ("alert.raised", "drop_pull_failed:4821", "4821"),
        ("alert.cleared", "drop_pull_failed:4821", "4821"),
    ]


def _evaluations_waiting() -> int:
    return ProcrastinateJob.objects.filter(
        task_name="integrations.tasks.evaluate_alerts", status="todo"
    ).count()


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ((401, "Unauthorized"), "credentials"),
        ((200, b"PK not a zip"), "package"),
    ],
)
def test_a_refused_drop_key_or_package_alerts_at_once_not_at_the_next_evaluation(
    channels: tuple[Inbox, list[dict[str, Any]]],
    broker: Broker,
    drop: DropSimulator,
    answer: tuple[int, Any],
    reason: str,
) -> None:
    inbox, hooks = channels
    if reason == "package":
        drop.queue_package(answer[1], f"{PACKAGE_DATE}_4821_DROP.zip")
    else:
        drop.queue_response(answer[0], body=answer[1])
    with pytest.raises(CommandError):
        pull()

    # The pull queued an evaluation: the worker alone sends the alert, no periodic run.
    assert _evaluations_waiting() == 1
    run_worker()

    assert len(inbox.messages) == 1
    assert inbox.messages[0]["Subject"].startswith("[dropportal] ALERT: DROP pull for broker")
    assert hooks[0]["alert"]["details"]["reason"] == reason


def test_a_refused_upload_alerts_at_once_until_drop_takes_one(
    channels: tuple[Inbox, list[dict[str, Any]]], broker: Broker, drop: DropSimulator
) -> None:
    inbox, hooks = channels
    cycle = DropCycleFactory.create(broker=broker, drop_session_id="3", match_date=drop_today())
    WorkItemFactory.create(cycle=cycle, status_code=3)
    drop.active_download = True
    drop.queue_response(401, body="Unauthorized")  # the key was replaced in DROP's portal

    refused = report_run(broker=broker, upload=True)

    assert refused.error is not None and "bad API key" in refused.error
    assert _evaluations_waiting() == 1  # staff hear of it now, not at the next evaluation
    run_worker()
    evaluate_and_send()  # still refused: nothing new
    assert [hook["text"] for hook in hooks] == [
        f"[dropportal] ALERT: DROP upload of {refused.pending[0].file_name} for broker 4821 "
        "failed: DROP refused the call (bad API key): Unauthorized (HTTP 401); check the "
        "broker's DROP API key and DROP account, then upload again (`drop report --upload`)"
    ]
    assert len(inbox.messages) == 1 and hooks[0]["text"].startswith(inbox.subjects()[0])
    assert hooks[0]["alert"]["condition"] == "drop_upload_refused"
    assert hooks[0]["alert"]["details"]["status"] == 401
    assert KEY not in inbox.messages[0].as_string()

    drop.queue_response(503, body="Service Unavailable", times=5)  # every try of the run
    down = report_run(broker=broker, upload=True)  # DROP down: still not known to take the key
    assert down.error is not None and "503" in down.error
    evaluate_and_send()
    assert len(hooks) == 1

    assert report_run(broker=broker, upload=True).accepted  # the broker fixed it
    evaluate_and_send()
    assert [h["alert"]["state"] for h in hooks] == ["raised", "cleared"]


def test_an_unreachable_drop_queues_no_evaluation_of_its_own(broker: Broker) -> None:
    broker.drop_base_url = "http://127.0.0.1:9/"  # nothing listens: alerted after a day only
    broker.save()
    with pytest.raises(CommandError):
        pull()
    assert _evaluations_waiting() == 0


def test_a_disabled_integration_alerts_once_and_once_more_when_enabled(
    channels: tuple[Inbox, list[dict[str, Any]]], broker: Broker
) -> None:
    inbox, hooks = channels
    integration = webhook_integration_created(broker, "https://crm.acme.test/drop").integration
    integration_disable(integration=integration, reason="410 Gone from the target", actor="test")

    evaluate_and_send()
    evaluate_and_send()

    assert inbox.subjects() == [
        "[dropportal] ALERT: Integration 'Acme CRM' of broker 4821 is disabled "
        "(410 Gone from the target); its deliveries wait until it is enabled"
    ]
    assert [h["alert"]["key"] for h in hooks] == [
        f"integration_disabled:integration:{integration.uuid}"
    ]

    integration.refresh_from_db()
    integration_enable(integration=integration, actor="test")
    evaluate_and_send()
    ProcrastinateJob.objects.filter(task_name__endswith="deliver_deletion_requests").delete()

    assert len(inbox.messages) == 2
    assert inbox.messages[1]["Subject"].startswith("[dropportal] Cleared: Integration 'Acme CRM'")
    assert [h["alert"]["state"] for h in hooks] == ["raised", "cleared"]
    assert LedgerEvent.objects.filter(kind="alert.raised").count() == 1
    assert LedgerEvent.objects.filter(kind="alert.cleared").count() == 1


def test_a_webhook_that_fails_is_retried_by_the_job(settings: Any, broker: Broker) -> None:
    settings.DROPPORTAL_ALERT_EMAILS = []
    settings.DROPPORTAL_ALERT_WEBHOOK_URL = f"http://127.0.0.1:{free_port()}/closed"
    integration = webhook_integration_created(broker, "https://crm.acme.test/drop").integration
    integration_disable(integration=integration, reason="by hand", actor="test")

    evaluate_and_send()

    job = ProcrastinateJob.objects.get(task_name="integrations.tasks.send_alert")
    assert job.status == "todo"  # failed once, scheduled again
    assert job.attempts == 1


def test_an_alert_text_keeps_no_query_string(
    channels: tuple[Inbox, list[dict[str, Any]]], broker: Broker
) -> None:
    inbox, hooks = channels
    integration = webhook_integration_created(broker, "https://crm.acme.test/drop").integration
    integration_disable(
        integration=integration,
        reason="410 Gone from HTTPS://crm.acme.test/drop?token=s3cr3t at 12:00 UTC",
        actor="test",
    )

    evaluate_and_send()

    (state,) = AlertState.objects.all()
    assert "(410 Gone from https://crm.acme.test/drop at 12:00 UTC)" in state.text
    sent = json.dumps([hooks, inbox.subjects(), [str(m) for m in inbox.messages]])
    assert "s3cr3t" not in sent and "s3cr3t" not in state.text
    assert "https://crm.acme.test/drop at 12:00" in hooks[0]["text"]


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_the_alert_webhook_goes_through_the_outbound_filter(
    settings: Any, webhook: tuple[str, list[dict[str, Any]]], scheme: str
) -> None:
    # The same loopback endpoint that takes alerts while private targets are allowed.
    url, received = webhook
    settings.DROPPORTAL_ALERT_WEBHOOK_URL = url.replace("http://", f"{scheme}://", 1)
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = False

    with pytest.raises(AlertNotSent) as refused:
        alert_send(channel="webhook", text="[dropportal] ALERT: test", alert={"key": "k"})

    expected = "plain http not allowed" if scheme == "http" else "127.0.0.1"
    assert expected in str(refused.value)
    assert received == []


def test_a_download_due_within_the_week_alerts_until_one_is_made(broker: Broker) -> None:
    today = drop_today()
    DropCycleFactory.create(broker=broker, match_date=today - dt.timedelta(days=37))
    assert alerts_evaluate().raised == []  # due in 8 days

    (raised,) = alerts_evaluate(now=timezone.now() + dt.timedelta(days=1)).raised
    assert raised.condition == "drop_download_due"
    due = today + dt.timedelta(days=8)
    assert f"Broker 4821 must download from DROP by {due}" in raised.text
    assert "(in 7 day(s))" in raised.text and "drop pull --broker 4821" in raised.text
    assert "drop report" not in raised.text  # nothing owed: the pull alone
    overdue = alerts_evaluate(now=timezone.now() + dt.timedelta(days=10))
    assert overdue.raised == []  # raised once, while it lasts

    DropCycleFactory.create(broker=broker, drop_session_id="2", match_date=today)
    (cleared,) = alerts_evaluate(now=timezone.now() + dt.timedelta(days=10)).cleared
    assert cleared.condition == "drop_download_due"


def test_a_broker_that_never_downloaded_counts_from_its_set_up(broker: Broker) -> None:
    due = drop_date(broker.created_at) + dt.timedelta(days=45)
    assert alerts_evaluate(now=timezone.now() + dt.timedelta(days=30)).raised == []

    (raised,) = alerts_evaluate(now=timezone.now() + dt.timedelta(days=39)).raised

    assert raised.condition == "drop_download_due"
    assert f"Broker 4821 must download from DROP by {due}" in raised.text
    assert "before a first, after its set-up here" in raised.text


def test_a_broker_set_up_before_the_duty_to_download_counts_from_august_1_2026(
    broker: Broker,
) -> None:
    """The duty to download every 45 days begins on 1 August 2026: a broker set up on
    June 1 owes nothing in July, and its first download is due 45 days after August 1."""
    june_1 = drop_midnight(dt.date(2026, 6, 1)) + dt.timedelta(hours=9)
    Broker.objects.filter(pk=broker.pk).update(created_at=june_1)

    assert alerts_evaluate(now=drop_midnight(dt.date(2026, 7, 20))).raised == []

    (raised,) = alerts_evaluate(now=drop_midnight(dt.date(2026, 9, 10))).raised
    assert raised.condition == "drop_download_due"
    assert "Broker 4821 must download from DROP by 2026-09-15 (in 5 day(s))" in raised.text


def test_cycles_due_alert_at_7_days_and_again_at_2_while_statuses_are_owed(
    broker: Broker,
) -> None:
    today = drop_today()  # days left count California's days, not UTC's
    cycle = DropCycleFactory.create(
        broker=broker, drop_session_id="9", match_date=today - dt.timedelta(days=40)
    )
    item = WorkItemFactory.create(cycle=cycle)  # waiting for an outcome: owed
    days_left = (cycle.due_date - today).days
    assert 2 < days_left <= 7

    raised = alerts_evaluate(now=timezone.now()).raised
    # Downloaded 40 days ago: the next download is due within the week too, and DROP
    # refuses it until the statuses are reported, so the alert says to report first.
    assert [a.condition for a in raised] == ["cycle_due_7_days", "drop_download_due"]
    assert "drop report --broker 4821 --upload" in raised[1].text
    assert raised[1].details["statuses_owed"] is True
    assert alerts_evaluate().raised == []

    later = timezone.now() + dt.timedelta(days=days_left - 2)
    assert [a.condition for a in alerts_evaluate(now=later).raised] == ["cycle_due_2_days"]

    item.state = "reported"
    item.reported_at = timezone.now()
    item.save()
    cleared = alerts_evaluate(now=later).cleared
    assert sorted(a.condition for a in cleared) == ["cycle_due_2_days", "cycle_due_7_days"]


def test_a_stored_drop_key_the_client_refuses_alerts_until_it_is_entered_again(
    broker: Broker,
) -> None:
    # Stored before keys were checked on entry: pasted with a trailing space. Every pull
    # and upload fails on it, whether or not the broker pulls automatically.
    Broker.objects.filter(pk=broker.pk).update(drop_api_key=KEY + " ")

    raised = alerts_evaluate().raised

    assert [a.key for a in raised] == ["drop_settings_refused:4821"]
    assert raised[0].text == (
        "Broker 4821 cannot reach DROP: DROP API key must be non-empty printable ASCII "
        "without spaces; its pulls and uploads fail until it is entered again in the admin"
    )
    assert KEY not in str(LedgerEvent.objects.filter(kind="alert.raised").values("data"))
    broker.refresh_from_db()
    broker_update(broker=broker, actor="test", drop_api_key=KEY)
    assert [a.key for a in alerts_evaluate().cleared] == ["drop_settings_refused:4821"]


def test_an_unreachable_drop_alerts_only_after_a_day(broker: Broker) -> None:
    ledger_event_append(
        kind=LedgerKind.DROP_PULL_FAILED,
        broker_id="4821",
        subject="4821",
        data={"error": "cannot reach DROP", "status": None, "reason": "unreachable"},
    )
    assert alerts_evaluate().raised == []
    tomorrow = timezone.now() + dt.timedelta(days=1, minutes=1)
    assert [a.key for a in alerts_evaluate(now=tomorrow).raised] == ["drop_pull_failed:4821"]


def test_a_rejected_upload_alerts_until_its_statuses_go_out_in_a_new_file(
    broker: Broker,
) -> None:
    cycle = DropCycleFactory.create(broker=broker, drop_session_id="3", match_date=drop_today())
    item = WorkItemFactory.create(cycle=cycle, status_code=3)
    rejected = items_reported(cycle, [item], state=ReportFileState.REJECTED)
    ReportFile.objects.filter(pk=rejected.pk).update(drop_response={"reason": "bad header"})
    rejected_only = ["upload_rejected"]  # the condition read: only it is evaluated
    raised = alerts_evaluate(conditions=rejected_only).raised
    assert [(a.condition, a.text) for a in raised if a.condition == "upload_rejected"] == [
        (
            "upload_rejected",
            f"DROP rejected {rejected.file_name} (broker 4821, cycle 3): bad header; its "
            "statuses are owed until `drop report --upload` sends them in a new file",
        )
    ]
    # Another file of the cycle does not settle the rejected file's statuses.
    items_reported(cycle, [WorkItemFactory.create(cycle=cycle, status_code=5)])
    assert "upload_rejected" not in {
        a.condition for a in alerts_evaluate(conditions=rejected_only).cleared
    }

    report_files_write(broker=broker)  # staff run the report: the statuses go out anew

    assert "upload_rejected" in {
        a.condition for a in alerts_evaluate(conditions=rejected_only).cleared
    }


def test_a_failed_nightly_ledger_verify_alerts(broker: Broker) -> None:
    assert tasks.verify_ledger() is True
    assert alerts_evaluate().raised == []
    # Tamper with an event the way someone with the table owner's rights could.
    event = LedgerEvent.objects.filter(kind="broker.created").get()
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE integrations_ledgerevent DISABLE TRIGGER USER")
        cursor.execute(
            "UPDATE integrations_ledgerevent SET subject = 'tampered' WHERE id = %s", [event.id]
        )
        cursor.execute("ALTER TABLE integrations_ledgerevent ENABLE TRIGGER USER")
    assert tasks.verify_ledger() is False
    raised = alerts_evaluate().raised
    assert [a.condition for a in raised] == ["ledger_verify_failed"]
    assert f"event {event.id}" in raised[0].text


def test_conditions_are_a_registry() -> None:
    assert set(CONDITIONS) >= {
        "drop_pull_failed",
        "integration_disabled",
        "upload_rejected",
        "cycle_due_7_days",
        "cycle_due_2_days",
        "ledger_verify_failed",
        "stuck_work",
        "drop_lists_not_read",
        "drop_results_in_portal",
        "report_file_refused",
        "drop_settings_refused",
        "drop_upload_refused",
        "drop_download_due",
    }
    assert AlertState.objects.count() == 0


def _checked(live: Any, env: dict[str, str]) -> str:
    """What ``manage.py check`` writes on stderr in a process started with ``env``, run here
    on the settings that start reads (tests/started_settings.py)."""
    start_with(live, env)
    stderr = io.StringIO()
    call_command("check", stdout=io.StringIO(), stderr=stderr)
    return stderr.getvalue()


def test_email_url_configures_the_mail_that_alerts_use(settings: Any, inbox: Inbox) -> None:
    """EMAIL_URL (django-environ's format) is all a process needs to send alerts by mail."""
    env = subprocess_env(
        EMAIL_URL=f"smtp://127.0.0.1:{inbox.port}", DROPPORTAL_ALERT_EMAILS=RECIPIENT
    )
    checked = _checked(settings, env)

    alert_send(channel="email", text="[dropportal] ALERT: test", alert={"key": "k"})

    assert inbox.subjects() == ["[dropportal] ALERT: test"]
    assert inbox.messages[0]["X-Rcpt"] == RECIPIENT
    assert "dropportal.W003" not in checked  # recipients with a mail server: no warning


def test_without_email_url_no_alert_is_emailed_and_the_checks_say_so(settings: Any) -> None:
    """DROPPORTAL_ALERT_EMAILS alone emails nothing: without EMAIL_URL there is no mail
    server the operator chose (Django's default, an SMTP server on localhost:25, is not).
    The start-up checks warn, so the recipients are not dropped unseen."""
    env = subprocess_env(DROPPORTAL_ALERT_EMAILS=RECIPIENT)
    env.pop("EMAIL_URL", None)

    checked = _checked(settings, env)

    assert settings.DROPPORTAL_ALERT_EMAILS == []
    assert "dropportal.W003" in checked
    assert "DROPPORTAL_ALERT_EMAILS is set but EMAIL_URL is not" in checked


def test_a_disabled_saas_connection_alerts_until_enabled(broker: Broker) -> None:
    connection_ = SaasConnectionFactory.create(broker=broker, url="https://mailer.acme.test/delete")
    saas_connection_disable(connection=connection_, reason="410 Gone", actor="test")

    raised = alerts_evaluate().raised
    assert [(a.condition, a.key) for a in raised] == [
        ("integration_disabled", f"integration_disabled:saas:{connection_.pk}")
    ]
    assert "SaaS connection 'Mailer' of broker 4821 is disabled (410 Gone)" in raised[0].text

    connection_.refresh_from_db()
    saas_connection_enable(connection=connection_, actor="test")
    assert [a.key for a in alerts_evaluate().cleared] == [raised[0].key]


def test_stuck_work_found_by_drop_doctor_alerts_once_per_broker_and_reason(
    broker: Broker,
) -> None:
    crm = webhook_integration_created(broker, "https://crm.acme.test/drop").integration
    DeletionRequestFactory.create(integration=crm, state=RequestState.UNDELIVERABLE)
    DeletionRequestFactory.create(integration=crm, state=RequestState.UNDELIVERABLE)

    raised = alerts_evaluate().raised
    assert [(a.condition, a.key) for a in raised] == [
        ("stuck_work", "stuck_work:4821:undeliverable")
    ]
    assert raised[0].text.startswith("2 work item(s) of broker 4821 are stuck: undeliverable")
    assert alerts_evaluate().raised == []

    DeletionRequest.objects.filter(integration=crm).update(state=RequestState.CANCELLED)
    assert [a.key for a in alerts_evaluate().cleared] == ["stuck_work:4821:undeliverable"]


def test_a_refused_file_alerts_at_once_until_staff_discard_it(
    channels: tuple[Inbox, list[dict[str, Any]]], broker: Broker, drop: DropSimulator
) -> None:
    inbox, hooks = channels
    drop.active_download = True
    cycle = DropCycleFactory.create(
        broker=broker, drop_session_id="3", match_date=dt.date(2026, 3, 12)
    )
    item = WorkItemFactory.create(cycle=cycle, status_code=5, work_item_id="Refused00001")
    report_run(broker=broker, upload=True)
    work_item_status_set(work_item=item, status_code=3, reason="found after all", actor="test")
    drop.closed_downloads.add("20260312")
    truncate_jobs_now()

    report_run(broker=broker, upload=True)  # DROP answers the amendment 409

    queued = ProcrastinateJob.objects.filter(task_name="integrations.tasks.evaluate_alerts")
    assert queued.count() == 1  # queued with the refusal, not left to the 5-minute run
    run_worker()
    (alert,) = AlertState.objects.filter(condition="report_file_refused", active=True)
    assert alert.text.startswith(
        "DROP refused 20260312_4821_Email_amend01.csv (broker 4821, cycle 3): DROP: an "
        "amendment is not possible in the current state"
    )
    assert "--discard 20260312_4821_Email_amend01.csv" in alert.text
    assert any(
        subject.startswith("[dropportal] ALERT: DROP refused 20260312_4821_Email_amend01.csv")
        for subject in inbox.subjects()
    )

    report_file_discard(
        report_file=ReportFile.objects.get(file_name="20260312_4821_Email_amend01.csv"),
        reason="DROP closed the cycle",
        actor="test",
    )
    run_worker()
    alert.refresh_from_db()
    assert alert.active is False
    assert [
        h["alert"]["state"] for h in hooks if h["alert"]["condition"] == "report_file_refused"
    ] == [
        "raised",
        "cleared",
    ]


def truncate_jobs_now() -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE procrastinate_jobs, procrastinate_periodic_defers CASCADE")


def test_a_directives_due_date_in_its_alert_is_a_day_of_drops_calendar(settings: Any) -> None:
    """Issued at 18:00 Pacific on 4 January (02:00 UTC on the 5th), due ten days later: the
    14th in DROP's calendar, as ``drop doctor`` says, not UTC's 15th."""
    settings.DROPPORTAL_DIRECTIVE_ACK_DAYS = 10
    directive = DirectiveFactory.create(provider__name="Mailhouse")
    issued = dt.datetime(2027, 1, 5, 2, 0, tzinfo=dt.UTC)
    Directive.objects.filter(pk=directive.pk).update(created_at=issued)

    (firing,) = CONDITIONS["directive_not_acknowledged"](issued + dt.timedelta(days=11))

    assert "due 2027-01-14)" in firing.text, firing.text


def test_a_mail_server_that_never_answers_fails_the_send_instead_of_holding_it(
    settings: Any,
) -> None:
    """A send_alert job holds the one slot its worker shares with the ledger's sealing, the
    stalled jobs' retry and the alerts' evaluation: a mail server that takes the connection
    and says nothing (a half-dead relay, a firewall that swallows the rest) must fail it, so
    that the job's retries take over, not hold that slot for as long as the process lives."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.DROPPORTAL_ALERT_EMAILS = [RECIPIENT]
    # The deployment's bound (Django's default, None, waits for as long as the process
    # lives), then the same bound made short, so the test does not sit out ten seconds.
    assert settings.EMAIL_TIMEOUT is not None and 0 < settings.EMAIL_TIMEOUT <= 30
    settings.EMAIL_TIMEOUT = 0.5
    held: list[socket.socket] = []
    listener = socket.create_server(("127.0.0.1", 0))
    settings.EMAIL_HOST, settings.EMAIL_PORT = listener.getsockname()

    def accept_and_say_nothing() -> None:
        with contextlib.suppress(OSError):  # closed at the end of the test
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=accept_and_say_nothing, daemon=True).start()
    failed: list[BaseException] = []

    def send() -> None:
        try:
            alert_send(channel="email", text="[dropportal] ALERT: test", alert={"key": "k"})
        except Exception as exc:
            failed.append(exc)

    sender = threading.Thread(target=send, daemon=True)
    try:
        sender.start()
        sender.join(60)
        assert not sender.is_alive(), "the send still waits for the mail server"
    finally:
        listener.close()
        for held_connection in held:
            held_connection.close()  # a send still waiting reads the end and gives up
        sender.join(30)
    assert failed and isinstance(failed[0], OSError)  # the job fails, and is retried


def test_an_alerts_clear_is_not_sent_before_its_raise_that_waits_for_a_retry(
    settings: Any, webhook: tuple[str, list[dict[str, Any]]], broker: Broker
) -> None:
    """The raise's message failed (the webhook was down) and waits for its next try, hours
    away by then; the condition clears meanwhile. Staff must not read "Cleared" first and
    then, hours later, an "ALERT" that looks current: a channel sends one key's messages in
    the order they were queued."""
    url, hooks = webhook
    settings.DROPPORTAL_ALERT_EMAILS = []
    settings.DROPPORTAL_ALERT_WEBHOOK_URL = f"http://127.0.0.1:{free_port()}/closed"
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    integration = webhook_integration_created(broker, "https://crm.acme.test/drop").integration
    integration_disable(integration=integration, reason="by hand", actor="test")
    evaluate_and_send()  # the raise's message fails once
    raise_job = ProcrastinateJob.objects.get(task_name="integrations.tasks.send_alert")
    assert raise_job.status == "todo"
    # Its next try, a few tries later, is hours away.
    ProcrastinateJob.objects.filter(pk=raise_job.pk).update(
        scheduled_at=timezone.now() + dt.timedelta(hours=2)
    )

    settings.DROPPORTAL_ALERT_WEBHOOK_URL = url  # the webhook is back
    integration.refresh_from_db()
    integration_enable(integration=integration, actor="test")
    evaluate_and_send()
    ProcrastinateJob.objects.filter(pk=raise_job.pk).update(scheduled_at=timezone.now())
    run_worker(["alerts"])

    assert [h["alert"]["state"] for h in hooks] == ["raised", "cleared"]


def _a_job_failed() -> ProcrastinateJob:
    """A job the worker ended as failed: doing, then failed (Procrastinate's event)."""
    enqueue.alerts_evaluate_enqueue()
    (job,) = ProcrastinateJob.objects.all()
    with connection.cursor() as cursor:
        for status in ("doing", "failed"):
            cursor.execute(
                "UPDATE procrastinate_jobs SET status = %s WHERE id = %s", [status, job.pk]
            )
    return job


def test_a_job_that_failed_for_good_alerts_for_a_day(broker: Broker) -> None:
    job = _a_job_failed()

    (raised,) = alerts_evaluate().raised

    assert (raised.condition, raised.key) == ("jobs_failed", f"jobs_failed:{job.task_name}")
    assert f"1 `{job.task_name}` job(s) failed for good" in raised.text
    later = timezone.now() + dt.timedelta(hours=25)
    assert [a.condition for a in alerts_evaluate(now=later).cleared] == ["jobs_failed"]


@pytest.mark.parametrize(
    ("status", "retried"), [(404, False), (400, False), (429, True), (503, True)]
)
def test_an_alert_the_webhook_refuses_for_good_is_not_sent_again(
    settings: Any, webhook: tuple[str, list[dict[str, Any]]], status: int, retried: bool
) -> None:
    # Retried for a day, a 404 held back the same alert's next message (its clearing) too.
    settings.DROPPORTAL_ALERT_WEBHOOK_URL = f"{webhook[0]}/{status}"
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    with pytest.raises(AlertNotSent) as refused:
        alert_send(channel="webhook", text="[dropportal] ALERT: test", alert={"key": "k"})
    assert isinstance(refused.value, AlertRefused) is not retried

    job = Job(id=1, queue="alerts", lock=None, queueing_lock=None, task_name="send_alert")
    decision = tasks.ALERT_SEND_RETRY.get_retry_decision(exception=refused.value, job=job)
    assert (decision is not None) is retried


def test_named_conditions_are_evaluated_alone(broker: Broker) -> None:
    job = _a_job_failed()
    Broker.objects.filter(pk=broker.pk).update(drop_api_key=KEY + " ")  # refused: it alerts
    with pytest.raises(ValueError, match="no alert condition job_failed"):
        alerts_evaluate(conditions=["jobs_failed", "job_failed"])
    assert not AlertState.objects.exists()  # a misspelt name evaluates nothing

    assert [a.key for a in alerts_evaluate(conditions=["jobs_failed"]).raised] == [
        f"jobs_failed:{job.task_name}"
    ]
    # The others were left as they were: a whole evaluation raises them now.
    assert [a.key for a in alerts_evaluate().raised] == ["drop_settings_refused:4821"]
