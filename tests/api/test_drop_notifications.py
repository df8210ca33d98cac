"""``POST /api/v1/drop/notifications/{broker_id}``: DROP's own notifications, signed with the
secret DROP's portal shows, recorded once per event id; ``download.ready`` starts a pull."""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import pytest
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob
from rest_framework.test import APIClient

from devtools.drop_simulator import DropSimulator
from integrations import enqueue, tasks
from integrations.drop.client import DropClient, DropUnavailable, UploadResult
from integrations.drop.notifications import (
    notification_signature,
    notification_timestamp,
    notification_verify,
)
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    AlertState,
    Broker,
    DropNotification,
    LedgerEvent,
    ReportFile,
    ReportFileState,
)
from integrations.services.ledger import ledger_event_append
from integrations.services.reporting import report_uploads
from integrations.services.reporting.report_files import report_files_write
from integrations.services.reporting.report_uploads import report_files_upload
from integrations.services.staff.alerts import alerts_evaluate
from integrations.services.staff.brokers import broker_drop_webhook_secret_set
from integrations.services.staff.keys import api_key_create
from tests.builders import (
    DROP_WEBHOOK_SECRET,
    DropCycleFactory,
    WorkItemFactory,
    broker_reports_to,
    drop_notification_post,
    items_reported,
)
from tests.conftest import bearer, database_url

pytestmark = pytest.mark.django_db

SECRET = DROP_WEBHOOK_SECRET
URL = "/api/v1/drop/notifications/4821"


@pytest.fixture
def webhook_broker(broker: Broker) -> Broker:
    return broker_drop_webhook_secret_set(broker=broker, secret=SECRET, actor="test")


def _pull_jobs() -> list[ProcrastinateJob]:
    return list(ProcrastinateJob.objects.filter(task_name=enqueue.PULL_BROKER, status="todo"))


def _notification_events() -> list[LedgerEvent]:
    return list(LedgerEvent.objects.filter(kind="drop.notification_received").order_by("id"))


def _pull_failed(status: int, error: str) -> None:
    """A pull DROP refused with ``status``, as the ledger keeps it."""
    ledger_event_append(
        kind=LedgerKind.DROP_PULL_FAILED,
        broker_id="4821",
        data={"status": status, "reason": "credentials", "error": error},
    )


def test_the_worked_example_of_drops_signature() -> None:
    timestamp = "2026-07-02T18:30:00.0000000Z"
    body = b'{"message":"download ready"}'
    expected = "sha256=9027e79375800659b91a7f374b525fdeca489ba00e7b5bdbf2344a3a72a463df"
    assert notification_signature("whsec_test", timestamp, body) == expected
    at = dt.datetime(2026, 7, 2, 18, 30, tzinfo=dt.UTC)
    assert notification_verify("whsec_test", timestamp, expected, body, now=at) == at
    assert notification_timestamp(at) == timestamp


def test_download_ready_queues_the_pull_once(api_client: APIClient, webhook_broker: Broker) -> None:
    answered = drop_notification_post(api_client, "download.ready")

    assert answered.status_code == 204
    assert answered.content == b""
    (job,) = _pull_jobs()
    assert job.args == {"broker_pk": webhook_broker.pk, "latest_cycle": 0}  # it had none
    assert job.queueing_lock == job.lock == "pull:4821"  # the periodic pull's, one at a time
    (event,) = _notification_events()
    assert event.broker_id == "4821"
    assert event.data["event_type"] == "download.ready"
    assert event.data["pull_queued"] is True

    # Another event before that pull started, and the periodic pull: no second job.
    assert drop_notification_post(api_client, "download.ready").status_code == 204
    Broker.objects.filter(pk=webhook_broker.pk).update(auto_pull=True)
    assert tasks.pull_due() == 0
    assert len(_pull_jobs()) == 1
    assert [e.data["pull_queued"] for e in _notification_events()] == [True, False]


def test_download_ready_queues_no_pull_with_a_key_drop_refused(
    api_client: APIClient, webhook_broker: Broker
) -> None:
    _pull_failed(401, "refused")

    assert drop_notification_post(api_client, "download.ready").status_code == 204

    assert _pull_jobs() == []
    (event,) = _notification_events()
    assert event.data["pull_queued"] is False
    assert event.data["pull_withheld"] == "DROP refused the broker's key (401) on the last pull"


def test_download_ready_after_a_403_pulls_again(
    api_client: APIClient, webhook_broker: Broker
) -> None:
    # DROP's 403: not eligible, or no list selected. The broker fixes that in DROP's portal,
    # which then says download.ready: the refusal must not stand until staff change the key.
    _pull_failed(401, "bad key")
    _pull_failed(403, "no list selected")

    assert drop_notification_post(api_client, "download.ready").status_code == 204

    assert len(_pull_jobs()) == 1
    (event,) = _notification_events()
    assert event.data["pull_queued"] is True
    assert "pull_withheld" not in event.data
    # The hourly pull tries again too, once that pull has run.
    ProcrastinateJob.objects.filter(task_name=enqueue.PULL_BROKER).update(status="succeeded")
    Broker.objects.filter(pk=webhook_broker.pk).update(auto_pull=True)
    assert tasks.pull_due() == 1


def test_an_event_delivered_again_does_nothing(
    api_client: APIClient, webhook_broker: Broker
) -> None:
    event_id = str(uuid.uuid4())
    assert (
        drop_notification_post(api_client, "download.ready", event_id=event_id).status_code == 204
    )
    ProcrastinateJob.objects.filter(task_name=enqueue.PULL_BROKER).update(status="succeeded")

    # The same event id, under a new delivery id.
    again = drop_notification_post(api_client, "download.ready", event_id=event_id)

    assert again.status_code == 204
    assert DropNotification.objects.count() == 1
    assert len(_notification_events()) == 1
    assert _pull_jobs() == []  # the first pull has run; the repeat starts none


def test_a_notification_killed_before_it_was_recorded_is_taken_when_drop_sends_it_again(
    api_client: APIClient, webhook_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from integrations.services.cycle import drop_notifications

    def killed(**kwargs: Any) -> None:
        raise KeyboardInterrupt("killed")

    event_id = str(uuid.uuid4())
    with monkeypatch.context() as kill:
        # Its row and its pull job written, the transaction not committed: DROP got no answer.
        kill.setattr(drop_notifications, "ledger_event_append", killed)
        with pytest.raises(KeyboardInterrupt):
            drop_notification_post(api_client, "download.ready", event_id=event_id)
    assert not DropNotification.objects.exists()
    assert _pull_jobs() == []

    # DROP delivers the event again, as it does any delivery not answered 2xx.
    again = drop_notification_post(api_client, "download.ready", event_id=event_id)

    assert again.status_code == 204
    assert DropNotification.objects.get().event_id == event_id
    assert len(_pull_jobs()) == 1
    (event,) = _notification_events()
    assert event.data["pull_queued"] is True


def _metric(api_client: APIClient, metrics_key: str, result: str) -> float:
    text = api_client.get("/metrics", **bearer(metrics_key)).content.decode()
    match = re.search(
        rf'^dropportal_drop_notifications_total\{{result="{result}"\}} (\S+)$', text, re.M
    )
    return float(match.group(1)) if match else 0.0


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"secret": "whsec_" + "x" * 43}, "signature_invalid"),
        ({"sent_at": timezone.now() - dt.timedelta(minutes=6)}, "timestamp_out_of_range"),
        ({"url": "/api/v1/drop/notifications/9999"}, "signature_invalid"),  # no such broker
        # Not an id at all, even text PostgreSQL refuses: the same answer, never a 500.
        ({"url": "/api/v1/drop/notifications/%00"}, "signature_invalid"),
        ({"url": "/api/v1/drop/notifications/%ED%A0%80"}, "signature_invalid"),
        ({"url": "/api/v1/drop/notifications/" + "4" * 100}, "signature_invalid"),
    ],
)
def test_a_notification_not_from_drop_now_is_401_counted_not_recorded(
    api_client: APIClient, webhook_broker: Broker, make_key: Any, change: dict[str, Any], code: str
) -> None:
    # The refusals are counted per process, not per broker: the operator's key of every broker.
    metrics_key = api_key_create(broker=None, scopes=["metrics"], actor="test").key
    before = _metric(api_client, metrics_key, code)
    events_before = LedgerEvent.objects.count()

    refused = drop_notification_post(api_client, "download.ready", **change)

    assert refused.status_code == 401
    if code == "signature_invalid":  # the same words for a broker that does not exist
        assert refused.json()["detail"] == (
            "The signature does not verify with the broker's DROP webhook secret."
        )
    assert refused["Content-Type"] == "application/problem+json"
    assert refused.json()["code"] == code
    assert _metric(api_client, metrics_key, code) == before + 1
    assert LedgerEvent.objects.count() == events_before
    assert DropNotification.objects.count() == 0
    assert _pull_jobs() == []
    # The same notification, signed by the broker's secret now, is taken (it fails for the
    # reason above, not for another).
    assert drop_notification_post(api_client, "download.ready").status_code == 204


def test_a_broker_without_a_secret_takes_no_notification(
    api_client: APIClient, broker: Broker
) -> None:
    assert (
        drop_notification_post(api_client, "download.ready").json()["code"] == "signature_invalid"
    )
    assert DropNotification.objects.count() == 0


def _send(client: APIClient, body: bytes, timestamp: str, signature: str, **headers: str) -> Any:
    meta: dict[str, Any] = {
        "HTTP_X_WEBHOOK_TIMESTAMP": timestamp,
        "HTTP_X_WEBHOOK_SIGNATURE": signature,
        **headers,
    }
    return client.post(URL, body, content_type="application/json", **meta)


def test_a_signed_notification_without_an_event_id_or_type_is_recorded(
    api_client: APIClient, webhook_broker: Broker
) -> None:
    # DROP signs neither header: a signed notification is DROP's whatever they say.
    for message in ("first", "second"):
        body = json.dumps({"message": message}).encode()
        timestamp = notification_timestamp(timezone.now())
        answered = _send(
            api_client, body, timestamp, notification_signature(SECRET, timestamp, body)
        )
        assert answered.status_code == 204

    first, second = _notification_events()
    assert first.data["event_id"] == second.data["event_id"] == ""
    assert first.data["event_type"] == ""
    assert first.data["known_type"] is False
    assert [first.data["message"], second.data["message"]] == ["first", "second"]
    assert DropNotification.objects.count() == 2
    assert _pull_jobs() == []


def test_a_captured_notification_sent_again_under_new_ids_does_nothing(
    api_client: APIClient, webhook_broker: Broker
) -> None:
    body = b'{"message":"download ready"}'
    timestamp = notification_timestamp(timezone.now())
    signature = notification_signature(SECRET, timestamp, body)
    first = _send(
        api_client,
        body,
        timestamp,
        signature,
        HTTP_X_WEBHOOK_EVENT_ID="evt-1",
        HTTP_X_WEBHOOK_EVENT_TYPE="download.ready",
    )
    assert first.status_code == 204
    ProcrastinateJob.objects.filter(task_name=enqueue.PULL_BROKER).update(status="succeeded")

    # The signature covers the timestamp and body only: new event ids and types, the same
    # signature (in any case, spaced) within the 5 minutes, are the same notification.
    for event_id, event_type, sent in (
        ("evt-2", "download.ready", signature),
        ("evt-3", "upload.processed", signature.upper()),
        ("", "", f" {signature} "),
    ):
        again = _send(
            api_client,
            body,
            timestamp,
            sent,
            HTTP_X_WEBHOOK_EVENT_ID=event_id,
            HTTP_X_WEBHOOK_EVENT_TYPE=event_type,
        )
        assert again.status_code == 204

    assert DropNotification.objects.count() == 1
    assert len(_notification_events()) == 1
    assert _pull_jobs() == []
    assert ProcrastinateJob.objects.filter(task_name=enqueue.EVALUATE_ALERTS).count() == 0


def test_accepted_notifications_cost_the_address_a_token(
    api_client: APIClient, webhook_broker: Broker, settings: Any
) -> None:
    settings.DROPPORTAL_CALLBACK_ANONYMOUS_RATE_LIMIT = 1.0  # bursts of 2

    assert drop_notification_post(api_client, "upload.received").status_code == 204
    assert drop_notification_post(api_client, "upload.received").status_code == 204
    throttled = drop_notification_post(api_client, "upload.received")

    assert throttled.status_code == 429
    assert throttled.json()["code"] == "rate_limited"
    assert len(_notification_events()) == 2


def test_a_known_and_an_unknown_broker_cost_one_hmac_and_read_only_the_secret(
    api_client: APIClient, webhook_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from integrations.drop import notifications as notifications_module

    computed: list[str] = []
    sign = notifications_module.notification_signature

    def counted(secret: str, timestamp: str, body: bytes) -> str:
        computed.append(timestamp)
        return sign(secret, timestamp, body)

    monkeypatch.setattr(notifications_module, "notification_signature", counted)
    for url in (URL, "/api/v1/drop/notifications/9999"):
        computed.clear()
        with CaptureQueriesContext(connection) as queries:
            refused = drop_notification_post(
                api_client, "download.ready", secret="whsec_wrong", url=url
            )
        assert refused.status_code == 401
        assert len(computed) == 1, url  # the same work whether the broker exists or not
        (read,) = [q["sql"] for q in queries if '"integrations_broker"' in q["sql"]]
        selected = re.findall(r'"integrations_broker"\."(\w+)"', read.split(" FROM ")[0])
        assert selected == ["id", "drop_webhook_secret"]  # no other credential is read


def test_upload_and_amendment_events_are_on_the_file_and_processed_alerts_at_once(
    api_client: APIClient, webhook_broker: Broker, admin_client: Client
) -> None:
    # Downloaded today, so that DROP's download cadence raises no alert of its own here.
    cycle = DropCycleFactory.create(broker=webhook_broker, downloaded_at=timezone.now())
    report_file = items_reported(cycle, [WorkItemFactory.create(cycle=cycle, status_code=5)])

    assert (
        drop_notification_post(api_client, "upload.received", message="file received").status_code
        == 204
    )
    assert ProcrastinateJob.objects.filter(task_name=enqueue.EVALUATE_ALERTS).count() == 0
    assert (
        drop_notification_post(
            api_client, "upload.processed", message="results ready for review"
        ).status_code
        == 204
    )

    received, processed = _notification_events()
    assert received.subject == processed.subject == report_file.file_name
    assert processed.data["drop_session_id"] == cycle.drop_session_id
    assert _pull_jobs() == []
    # Staff hear of it at once: the evaluation is queued with the event.
    assert ProcrastinateJob.objects.filter(task_name=enqueue.EVALUATE_ALERTS).count() == 1
    (alert,) = alerts_evaluate().raised
    assert alert.condition == "drop_results_in_portal"
    assert report_file.file_name in alert.text
    assert "DROP's portal" in alert.text
    # A reminder: it clears a week later.
    later = timezone.now() + dt.timedelta(days=8)
    assert [a.key for a in alerts_evaluate(now=later).cleared] == [alert.key]
    assert AlertState.objects.filter(active=True).count() == 0

    for page in (
        reverse("admin:integrations_dropcycle_change", args=[cycle.pk]),
        reverse("admin:integrations_reportfile_change", args=[report_file.pk]),
    ):
        html = admin_client.get(page).content.decode()
        assert "upload.processed" in html
        assert "results ready for review" in html
        assert "attached by guess" not in html  # the one file uploaded: no guess


def test_a_notification_about_one_of_several_files_uploaded_together_says_it_is_a_guess(
    api_client: APIClient, webhook_broker: Broker, admin_client: Client
) -> None:
    cycle = DropCycleFactory.create(broker=webhook_broker)
    items_reported(cycle, [WorkItemFactory.create(cycle=cycle, status_code=5)])
    latest = items_reported(
        cycle, [WorkItemFactory.create(cycle=cycle, list_type="Phone", status_code=5)]
    )

    assert (
        drop_notification_post(api_client, "upload.processed", message="results ready").status_code
        == 204
    )

    (notification,) = DropNotification.objects.all()
    assert notification.report_file == latest
    assert notification.report_file_guessed is True
    (event,) = _notification_events()
    assert event.data["report_file_guessed"] is True
    html = admin_client.get(
        reverse("admin:integrations_reportfile_change", args=[latest.pk])
    ).content.decode()
    assert "attached by guess: one run uploaded several files" in html


# ------------------------------------------------------- a notification before its upload's
# answer is recorded. DROP may notify about a file between its 202 and the uploader's record of
# it: the notification must not go to the broker's earlier file. These tests commit (DROP's
# notification is taken by another process, its own connection, while the upload is out).

Files = Sequence[tuple[str, Any]]


@pytest.fixture
def uploads(webhook_broker: Broker, drop: DropSimulator) -> tuple[ReportFile, ReportFile]:
    """The broker's upload DROP took an hour ago (an earlier run), and a file written now and
    not sent yet."""
    broker_reports_to(webhook_broker, drop)
    cycle = DropCycleFactory.create(broker=webhook_broker)
    earlier = items_reported(cycle, [WorkItemFactory.create(cycle=cycle, status_code=5)])
    ReportFile.objects.filter(pk=earlier.pk).update(
        uploaded_at=timezone.now() - dt.timedelta(hours=1)
    )
    WorkItemFactory.create(cycle=cycle, list_type="Phone", status_code=4)
    (written,) = report_files_write(broker=webhook_broker)
    return earlier, written


class _NotifyingDrop(DropClient):
    """DROP's client whose upload runs ``during`` around the call, as DROP's side sees it."""

    def __init__(self, drop: DropSimulator, during: Callable[[Callable[[], UploadResult]], Any]):
        super().__init__(drop.url, drop.api_key, sleep=lambda s: None, allow_private=True)
        self.during = during

    def upload(self, files: Files) -> UploadResult:
        send = super().upload
        return self.during(lambda: send(files))


def _drop_notifies(answers: list[int], message: str) -> threading.Thread:
    """DROP's ``upload.received``, taken by another process (a thread: its own connection)."""

    def post() -> None:
        try:
            answers.append(
                drop_notification_post(APIClient(), "upload.received", message=message).status_code
            )
        finally:
            connections.close_all()

    thread = threading.Thread(target=post)
    thread.start()
    return thread


def _attached_events() -> list[LedgerEvent]:
    return list(LedgerEvent.objects.filter(kind="drop.notification_attached").order_by("id"))


@pytest.mark.django_db(transaction=True)
def test_a_notification_between_drops_202_and_its_record_goes_to_that_upload(
    uploads: tuple[ReportFile, ReportFile], drop: DropSimulator, admin_client: Client
) -> None:
    earlier, sent = uploads
    answers: list[int] = []

    def notified_before_the_answer_is_recorded(send: Callable[[], UploadResult]) -> UploadResult:
        result = send()  # DROP's 202: the file is DROP's, our record of it not written yet
        _drop_notifies(answers, "file received").join()
        return result

    run = report_files_upload(
        broker=sent.broker, client=_NotifyingDrop(drop, notified_before_the_answer_is_recorded)
    )

    assert answers == [204]
    assert [f.file_name for f in run.accepted] == [sent.file_name]
    (notification,) = DropNotification.objects.all()
    assert notification.report_file_id == sent.pk, "attached to the earlier upload"
    assert (notification.report_file_guessed, notification.awaiting_report_file) == (False, False)
    assert notification.cycle_id == sent.cycle_id
    # Recorded once on arrival, about no file yet; attached once, with the file's answer.
    (received,) = _notification_events()
    assert received.data["report_file"] is None
    assert received.data["awaiting_report_file"] is True
    (attached,) = _attached_events()
    assert attached.subject == sent.file_name
    assert attached.data["event_id"] == notification.event_id
    assert attached.data["report_file_guessed"] is False
    accepted = LedgerEvent.objects.get(kind="report_file.accepted", subject=sent.file_name)
    assert accepted.id < attached.id  # in the transaction that records DROP's answer
    assert ReportFile.objects.get(pk=sent.pk).sending_since is None
    html = admin_client.get(
        reverse("admin:integrations_reportfile_change", args=[earlier.pk])
    ).content.decode()
    assert "file received" not in html


def _waits_for_a_lock(watcher: psycopg.Connection[Any]) -> bool:
    (waiting,) = watcher.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone() or (0,)
    return bool(waiting)


@pytest.mark.django_db(transaction=True)
def test_a_notification_while_the_upload_is_being_recorded_waits_for_that_record(
    uploads: tuple[ReportFile, ReportFile], drop: DropSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    _earlier, sent = uploads
    answers: list[int] = []
    notifying: list[threading.Thread] = []
    taken = report_uploads.report_rows_taken

    def notified_while_recording(**kwargs: Any) -> int:
        rows = taken(**kwargs)  # in the transaction that records DROP's 202, not committed
        notifying.append(_drop_notifies(answers, "file received"))
        # A second connection: this one's transaction would keep seeing one snapshot.
        with psycopg.connect(database_url(), autocommit=True) as watcher:
            while notifying[0].is_alive() and not _waits_for_a_lock(watcher):
                time.sleep(0.01)
        return rows

    monkeypatch.setattr(report_uploads, "report_rows_taken", notified_while_recording)
    run = report_files_upload(broker=sent.broker, client=_NotifyingDrop(drop, lambda s: s()))
    notifying[0].join()

    assert answers == [204]
    assert [f.file_name for f in run.accepted] == [sent.file_name]
    (notification,) = DropNotification.objects.all()
    assert notification.report_file_id == sent.pk, "attached to the earlier upload"
    assert notification.awaiting_report_file is False
    (received,) = _notification_events()
    assert received.subject == received.data["report_file"] == sent.file_name
    assert _attached_events() == []  # it waited for the record, and then read it


@pytest.mark.django_db(transaction=True)
def test_a_notification_during_an_upload_whose_answer_was_lost_waits_for_the_next_run(
    uploads: tuple[ReportFile, ReportFile], drop: DropSimulator, admin_client: Client
) -> None:
    earlier, sent = uploads
    answers: list[int] = []

    def notified_then_the_answer_lost(send: Callable[[], UploadResult]) -> UploadResult:
        send()
        _drop_notifies(answers, "file received").join()
        raise DropUnavailable("DROP POST /data/upload failed 3 times; last: timeout")

    first = report_files_upload(
        broker=sent.broker, client=_NotifyingDrop(drop, notified_then_the_answer_lost)
    )

    assert first.error is not None and answers == [204]
    # DROP may hold the file: the notification is not put on the earlier one meanwhile.
    (notification,) = DropNotification.objects.all()
    assert notification.report_file_id is None, "attached to the earlier upload"
    assert notification.awaiting_report_file is True
    assert ReportFile.objects.get(pk=sent.pk).sending_since is not None

    # Staff see it waiting on the file's page, not in the ledger alone.
    def file_page(report_file: ReportFile) -> str:
        url = reverse("admin:integrations_reportfile_change", args=[report_file.pk])
        return admin_client.get(url).content.decode()

    assert "Waiting for DROP's answer" in file_page(sent)
    assert "file received" in file_page(sent)
    assert "file received" not in file_page(earlier)

    again = report_files_upload(broker=sent.broker, client=_NotifyingDrop(drop, lambda s: s()))

    assert [f.file_name for f in again.accepted] == [sent.file_name]
    assert again.accepted[0].drop_response["already_uploaded"] is True
    notification.refresh_from_db()
    assert (notification.report_file_id, notification.awaiting_report_file) == (sent.pk, False)
    assert [e.subject for e in _attached_events()] == [sent.file_name]
    assert earlier.drop_notifications.count() == 0
    assert "Waiting for DROP" not in file_page(sent)
    assert "file received" in file_page(sent)  # attached now


@pytest.mark.django_db(transaction=True)
def test_a_notification_during_an_upload_drop_refuses_goes_where_it_would_have(
    uploads: tuple[ReportFile, ReportFile], drop: DropSimulator
) -> None:
    earlier, sent = uploads
    drop.active_download = False  # 409: DROP takes nothing
    answers: list[int] = []

    def notified_before_the_answer(send: Callable[[], UploadResult]) -> UploadResult:
        _drop_notifies(answers, "file received").join()
        return send()

    run = report_files_upload(
        broker=sent.broker, client=_NotifyingDrop(drop, notified_before_the_answer)
    )

    assert [f.file_name for f in run.refused] == [sent.file_name]
    assert ReportFile.objects.get(pk=sent.pk).state == ReportFileState.REFUSED
    # Not about the refused file: the broker's latest upload DROP took, once that is known.
    (notification,) = DropNotification.objects.all()
    assert (notification.report_file_id, notification.awaiting_report_file) == (earlier.pk, False)
    (attached,) = _attached_events()
    assert attached.subject == earlier.file_name


def test_an_unknown_event_type_is_recorded(api_client: APIClient, webhook_broker: Broker) -> None:
    answered = drop_notification_post(api_client, "lists.archived", message="something new")

    assert answered.status_code == 204
    (event,) = _notification_events()
    assert event.data["event_type"] == "lists.archived"
    assert event.data["known_type"] is False
    assert event.data["message"] == "something new"
    assert _pull_jobs() == []


def test_the_command_stores_the_secret_encrypted_and_prints_the_url(
    broker: Broker, tmp_path: Any, settings: Any
) -> None:
    from django.core.management import CommandError, call_command

    settings.DROPPORTAL_PUBLIC_URL = "https://portal.example.com"
    secret_file = tmp_path / "drop-webhook"
    secret_file.write_text(SECRET + "\n")
    out = io.StringIO()

    call_command(
        "brokers", "drop-webhook-secret", "4821", "--secret-file", str(secret_file), stdout=out
    )

    assert "https://portal.example.com/api/v1/drop/notifications/4821" in out.getvalue()
    assert SECRET not in out.getvalue()
    broker.refresh_from_db()
    assert broker.drop_webhook_secret == SECRET
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT drop_webhook_secret FROM integrations_broker WHERE id = %s", [broker.pk]
        )
        (stored,) = cursor.fetchone()
    assert SECRET not in stored  # encrypted at rest
    event = LedgerEvent.objects.filter(kind="broker.updated").latest("id")
    assert event.data == {"changes": {"drop_webhook_secret": {"changed": True}}}
    assert SECRET not in json.dumps(event.data)

    # From standard input, with "-".
    call_command(
        "brokers",
        "drop-webhook-secret",
        "4821",
        "-",
        stdin=io.StringIO("whsec_other\n"),
        stdout=out,
    )
    broker.refresh_from_db()
    assert broker.drop_webhook_secret == "whsec_other"

    secret_file.write_text("\n")
    with pytest.raises(CommandError, match="empty"):
        call_command("brokers", "drop-webhook-secret", "4821", "--secret-file", str(secret_file))
    with pytest.raises(CommandError, match="no broker"):
        call_command("brokers", "drop-webhook-secret", "9999", "--secret-file", str(tmp_path))


def test_the_broker_admin_takes_the_secret_write_only_and_shows_the_url(
    broker: Broker, admin_client: Client
) -> None:
    page = reverse("admin:integrations_broker_change", args=[broker.pk])
    html = admin_client.get(page).content.decode()
    assert "/api/v1/drop/notifications/4821" in html
    assert "DROP webhook secret" in html

    form = {
        "name": broker.name,
        "mode": broker.mode,
        "drop_base_url": "",
        "drop_api_key": "",
        "drop_webhook_secret": SECRET,
        "pull_interval_days": "30",
    }
    assert admin_client.post(page, form).status_code == 302
    broker.refresh_from_db()
    assert broker.drop_webhook_secret == SECRET
    assert SECRET not in admin_client.get(page).content.decode()

    # Left empty, it is kept.
    assert admin_client.post(page, {**form, "drop_webhook_secret": ""}).status_code == 302
    broker.refresh_from_db()
    assert broker.drop_webhook_secret == SECRET


def test_the_loopback_drop_signs_its_notifications_as_drop_does() -> None:
    """The stand-in DROP (tests and ``make demo``) is a second implementation of DROP's side:
    it must give the worked example's signature too."""
    from devtools.drop_simulator import DropSimulator

    with DropSimulator() as drop:
        drop.notify(
            drop.url + "/broker-webhook",
            "whsec_test",
            "download.ready",
            "download ready",
            event_id="evt-1",
            now=dt.datetime(2026, 7, 2, 18, 30, tzinfo=dt.UTC),
        )
        (sent,) = drop.calls("/broker-webhook")
    headers = {name.lower(): value for name, value in sent.headers.items()}
    assert sent.body == b'{"message":"download ready"}'
    assert headers["x-webhook-timestamp"] == "2026-07-02T18:30:00.0000000Z"
    assert headers["x-webhook-signature"] == (
        "sha256=9027e79375800659b91a7f374b525fdeca489ba00e7b5bdbf2344a3a72a463df"
    )
    assert headers["x-webhook-event-id"] == "evt-1"
    assert headers["x-webhook-event-type"] == "download.ready"


def test_the_endpoint_is_in_the_api_schema(api_client: APIClient) -> None:
    schema = api_client.get("/api/v1/schema", {"format": "json"}).json()
    operation = schema["paths"]["/api/v1/drop/notifications/{broker_id}"]["post"]
    assert set(operation["responses"]) == {"204", "401", "413", "429"}
    assert operation["responses"]["401"]["content"] == {
        "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
    }
    headers = {
        p["name"]: p.get("required", False) for p in operation["parameters"] if p["in"] == "header"
    }
    assert headers["X-Webhook-Signature"] and headers["X-Webhook-Event-Id"]
    assert not operation.get("security")  # DROP signs; it has no API key
