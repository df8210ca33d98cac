"""DROP's notifications to a broker: checked, recorded once per event and once per signature,
and acted on.

``download.ready`` queues the broker's pull at once (the periodic pull's job, one at a time
per broker); ``upload.*`` and ``amendment.*`` are ledger events on the file they are about;
``*.processed`` raises an alert at once (DROP's row-level results wait in its portal); any
other type is recorded as it came. The view passes the headers and raw body as received::

    received = drop_notification_receive(
        broker_id="4821", event_id=..., event_type="download.ready", delivery_id=...,
        timestamp=..., signature=..., body=request.body,
    )   # raises NotificationRejected (401: not ledgered, anyone can send those)
    # A signed one is recorded even without an event id or type (DROP signs neither header).
    received.duplicate, received.pull_queued

Which file an ``upload.*`` or ``amendment.*`` event is about: DROP names none, so it is the
broker's latest file of that kind DROP accepted (a guess when one run uploaded several). DROP
may notify about a file between its 202 and our recording of it; so while a file of that
kind is being sent (``ReportFile.sending_since``: set before the call, cleared with DROP's
answer) the notification is not attached to an earlier one: it is kept, awaiting, and the
uploader attaches it by the same rule when it records the last such answer::

    drop_notifications_attach_awaiting(broker=broker, kind=ReportKind.UPLOAD, actor=actor)
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from integrations import enqueue
from integrations.drop import notifications
from integrations.ledger_kinds import LedgerKind
from integrations.models import AWAITING_DROP, Broker, DropNotification, ReportFile
from integrations.models.brokers import broker_id_validator
from integrations.selectors.drop_notifications import REPORT_FILE_KIND, event_types_about
from integrations.selectors.pulls import brokers_with_drop_key_refused
from integrations.services.cycle.drop_schedule import drop_pull_ask
from integrations.services.ledger import ledger_event_append

ACTOR = "drop:notification"


# One report run uploads its files within this of each other: a notification about one of
# them names none, so it is attached to the latest by guess when there are several.
ONE_RUN = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class NotificationReceived:
    duplicate: bool  # the event id, or the signature, was seen before: nothing done
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
    same, after the same work, for an unknown broker or one without a secret: nothing tells
    them apart). A signed notification is recorded whatever its event id and type headers
    say, even none: they are not signed, so only the signature makes it a duplicate of
    one already taken (a capture sent again), or its event id (DROP delivering it again)."""
    # Only the secret: nothing else of the broker is read before the signature verifies. An
    # id that is not four digits names no broker (and may not be text PostgreSQL takes).
    found = Broker.objects.filter(broker_id=broker_id).values_list("pk", "drop_webhook_secret")
    try:
        broker_id_validator(broker_id)
        broker_pk, secret = found.first() or (None, "")
    except ValidationError:
        broker_pk, secret = None, ""
    sent_at = notifications.notification_verify(
        secret, timestamp, signature, body, now=now or timezone.now()
    )
    assert broker_pk is not None and signature is not None  # nothing verifies without them
    signature_key = notifications.notification_signature_key(signature)
    event_id = event_id.strip()[: notifications.HEADER_VALUE_MAX]
    event_type = event_type.strip()[: notifications.HEADER_VALUE_MAX]
    with transaction.atomic():
        # The files of its kind being sent, locked: one whose answer is being recorded is
        # waited for and then read as answered; the answer to one still out waits for this
        # commit, and attaches this notification.
        awaiting = _sending_locked(broker_pk, event_type)
        report_file, guessed = (
            (None, False) if awaiting else _report_file_about(broker_pk, event_type)
        )
        try:
            with transaction.atomic():  # a savepoint: the duplicate's error stays in it
                notification = DropNotification.objects.create(
                    broker_id=broker_pk,
                    event_id=event_id,
                    event_type=event_type,
                    delivery_id=delivery_id[: notifications.HEADER_VALUE_MAX],
                    sent_at=sent_at,
                    signature=signature_key,
                    message=notifications.notification_message(body),
                    report_file=report_file,
                    report_file_guessed=guessed,
                    awaiting_report_file=awaiting,
                    cycle_id=report_file.cycle_id if report_file is not None else None,
                )
        except IntegrityError:
            if _seen(broker_pk, event_id, signature_key):
                return NotificationReceived(duplicate=True)
            raise
        pull_queued = False
        pull_withheld = ""
        if event_type == notifications.DOWNLOAD_READY:
            if brokers_with_drop_key_refused(Broker.objects.filter(pk=broker_pk)).exists():
                # As the periodic pull: the same refused key cannot help (doctor, dashboard).
                pull_withheld = "DROP refused the broker's key (401) on the last pull"
            else:
                pull_queued = drop_pull_ask(broker_pk=broker_pk, broker_id=broker_id)
        if event_type in notifications.RESULTS_IN_PORTAL:
            enqueue.alerts_evaluate_enqueue()
        ledger_event_append(
            kind=LedgerKind.DROP_NOTIFICATION_RECEIVED,
            broker_id=broker_id,
            subject=(
                report_file.file_name if report_file is not None else event_type or "no event type"
            ),
            actor=ACTOR,
            data={
                "event_id": event_id,
                "event_type": event_type,
                "known_type": event_type in notifications.EVENT_TYPES,
                "delivery_id": notification.delivery_id,
                "sent_at": sent_at.isoformat(),
                "message": notification.message,
                "report_file": report_file.file_name if report_file is not None else None,
                "report_file_guessed": guessed,
                # A file of its kind was being sent: attached once DROP's answer is recorded
                # (a drop.notification_attached event).
                "awaiting_report_file": awaiting,
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


def _seen(broker_pk: int, event_id: str, signature_key: str) -> bool:
    """Whether the broker already took this event id, or this signature."""
    taken = Q(signature=signature_key)
    if event_id:
        taken |= Q(event_id=event_id)
    return DropNotification.objects.filter(taken, broker_id=broker_pk).exists()


def drop_notifications_attach_awaiting(*, broker: Broker, kind: str, actor: str) -> int:
    """Attach the broker's notifications about files of ``kind`` that came while one was
    being sent, once none is, by the rule one meets on arrival; a
    ``drop.notification_attached`` ledger event each. Called in the transaction that records
    DROP's answer to such a file (or staff's word for it), after clearing its
    ``sending_since`` under the file's lock: a notification that locked the file first has
    committed, one that waits for the lock then reads the answer. How many were attached."""
    if ReportFile.objects.filter(
        broker=broker, kind=kind, state__in=AWAITING_DROP, sending_since__isnull=False
    ).exists():
        return 0  # another file of that kind is still being sent: its answer attaches them
    event_types = event_types_about(kind)
    awaiting = DropNotification.objects.select_for_update().filter(
        broker=broker, event_type__in=event_types, awaiting_report_file=True
    )
    attached = 0
    for notification in awaiting.order_by("received_at", "pk"):
        report_file, guessed = _report_file_about(broker.pk, notification.event_type)
        notification.report_file = report_file
        notification.report_file_guessed = guessed
        notification.cycle_id = report_file.cycle_id if report_file is not None else None
        notification.awaiting_report_file = False
        notification.save(
            update_fields=["report_file", "report_file_guessed", "cycle", "awaiting_report_file"]
        )
        ledger_event_append(
            kind=LedgerKind.DROP_NOTIFICATION_ATTACHED,
            broker_id=broker.broker_id,
            subject=report_file.file_name if report_file is not None else notification.event_type,
            actor=actor,
            data={
                "event_id": notification.event_id,
                "event_type": notification.event_type,
                "received_at": notification.received_at.isoformat(),
                "report_file": report_file.file_name if report_file is not None else None,
                "report_file_guessed": guessed,
                "drop_session_id": (
                    report_file.cycle.drop_session_id if report_file is not None else None
                ),
            },
        )
        attached += 1
    return attached


def _sending_locked(broker_pk: int, event_type: str) -> bool:
    """Whether a file of the kind the event is about is being sent (DROP may be notifying
    about it before its answer is recorded), locking those files: a file whose answer is
    being recorded is waited for, then seen answered."""
    kind = REPORT_FILE_KIND.get(event_type)
    if kind is None:
        return False
    sending = ReportFile.objects.select_for_update().filter(
        broker_id=broker_pk, kind=kind, state__in=AWAITING_DROP, sending_since__isnull=False
    )
    return bool(list(sending.values_list("pk", flat=True)))


def _report_file_about(broker_pk: int, event_type: str) -> tuple[ReportFile | None, bool]:
    """The broker's latest file of the kind the event is about that went to DROP, and
    whether that is a guess: the same run uploaded others of that kind."""
    kind = REPORT_FILE_KIND.get(event_type)
    if kind is None:
        return None, False
    uploaded = ReportFile.objects.filter(broker_id=broker_pk, kind=kind, uploaded_at__isnull=False)
    latest = (
        uploaded.select_related("cycle").defer("content").order_by("-uploaded_at", "-pk").first()
    )
    if latest is None or latest.uploaded_at is None:
        return None, False
    same_run = uploaded.filter(uploaded_at__gte=latest.uploaded_at - ONE_RUN).exclude(pk=latest.pk)
    return latest, same_run.exists()
