"""DROP's notifications to a broker: checked, recorded once per event, and acted on.

``download.ready`` queues the broker's pull at once (the periodic pull's job, one at a time
per broker); ``upload.*`` and ``amendment.*`` are ledger events on the file they are about;
``*.processed`` raises an alert at once (DROP's row-level results wait in its portal); any
other type is recorded as it came. The view passes the headers and raw body as received::

    received = drop_notification_receive(
        broker_id="4821", event_id=..., event_type="download.ready", delivery_id=...,
        timestamp=..., signature=..., body=request.body,
    )   # raises NotificationRejected (401: not ledgered, anyone can send those)
    received.duplicate, received.pull_queued
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from integrations import enqueue
from integrations.drop import notifications
from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, DropNotification, ReportFile, ReportKind
from integrations.selectors.pulls import brokers_with_drop_key_refused
from integrations.services.ledger import ledger_event_append

ACTOR = "drop:notification"
_ABOUT_REPORT_FILES = {
    notifications.UPLOAD_RECEIVED: ReportKind.UPLOAD,
    notifications.UPLOAD_PROCESSED: ReportKind.UPLOAD,
    notifications.AMENDMENT_RECEIVED: ReportKind.AMEND,
    notifications.AMENDMENT_PROCESSED: ReportKind.AMEND,
}


@dataclass(frozen=True)
class NotificationReceived:
    duplicate: bool  # the event id was seen before: nothing done
    pull_queued: bool = False


def drop_notification_receive(
    *,
    broker_id: str,
    event_id: str,
    event_type: str,
    delivery_id: str,
    timestamp: str | None,
    signature: str | None,
    body: bytes,
    now: dt.datetime | None = None,
) -> NotificationReceived:
    """Check that DROP signed the notification with ``broker_id``'s webhook secret within
    5 minutes, then record it once (see the module). Raises ``NotificationRejected`` (the
    same for an unknown broker or one without a secret: nothing tells them apart), or
    ``ValidationError`` when a signed notification has no event id or type."""
    broker = Broker.objects.filter(broker_id=broker_id).first()
    sent_at = notifications.notification_verify(
        broker.drop_webhook_secret if broker is not None else "",
        timestamp,
        signature,
        body,
        now=now or timezone.now(),
    )
    assert broker is not None  # no secret verifies for a broker that does not exist
    for header, value in (
        (notifications.EVENT_ID_HEADER, event_id),
        (notifications.EVENT_TYPE_HEADER, event_type),
    ):
        if not value.strip() or len(value) > notifications.HEADER_VALUE_MAX:
            raise ValidationError(
                f"{header} must be 1 to {notifications.HEADER_VALUE_MAX} characters"
            )
    report_file = _report_file_about(broker, event_type)
    with transaction.atomic():
        try:
            with transaction.atomic():  # a savepoint: the duplicate's error stays in it
                notification = DropNotification.objects.create(
                    broker=broker,
                    event_id=event_id,
                    event_type=event_type,
                    delivery_id=delivery_id[: notifications.HEADER_VALUE_MAX],
                    sent_at=sent_at,
                    message=notifications.notification_message(body),
                    report_file=report_file,
                    cycle_id=report_file.cycle_id if report_file is not None else None,
                )
        except IntegrityError:
            if DropNotification.objects.filter(broker=broker, event_id=event_id).exists():
                return NotificationReceived(duplicate=True)
            raise
        pull_queued = False
        pull_withheld = ""
        if event_type == notifications.DOWNLOAD_READY:
            if brokers_with_drop_key_refused(Broker.objects.filter(pk=broker.pk)).exists():
                # As the periodic pull: the same refused key cannot help (doctor, dashboard).
                pull_withheld = "DROP refused the broker's key (401) on the last pull"
            else:
                pull_queued = enqueue.drop_pull_enqueue(broker_pk=broker.pk, broker_id=broker_id)
        if event_type in notifications.RESULTS_IN_PORTAL:
            enqueue.alerts_evaluate_enqueue()
        ledger_event_append(
            kind=LedgerKind.DROP_NOTIFICATION_RECEIVED,
            broker_id=broker_id,
            subject=report_file.file_name if report_file is not None else event_type,
            actor=ACTOR,
            data={
                "event_id": event_id,
                "event_type": event_type,
                "known_type": event_type in notifications.EVENT_TYPES,
                "delivery_id": notification.delivery_id,
                "sent_at": sent_at.isoformat(),
                "message": notification.message,
                "report_file": report_file.file_name if report_file is not None else None,
                "drop_session_id": (
                    report_file.cycle.drop_session_id if report_file is not None else None
                ),
                # download.ready: whether a pull was queued now (False: one already waits,
                # or the reason it was withheld).
                "pull_queued": pull_queued,
                **({"pull_withheld": pull_withheld} if pull_withheld else {}),
            },
        )
    return NotificationReceived(duplicate=False, pull_queued=pull_queued)


def _report_file_about(broker: Broker, event_type: str) -> ReportFile | None:
    """The broker's latest file of the kind the event is about that went to DROP."""
    kind = _ABOUT_REPORT_FILES.get(event_type)
    if kind is None:
        return None
    return (
        ReportFile.objects.filter(broker=broker, kind=kind, uploaded_at__isnull=False)
        .select_related("cycle")
        .defer("content")
        .order_by("-uploaded_at", "-pk")
        .first()
    )
