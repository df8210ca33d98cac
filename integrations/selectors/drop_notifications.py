"""Which report files DROP's notifications are about, and those kept waiting for one.

DROP names no file in an ``upload.*`` or ``amendment.*`` notification, only its kind. One
that comes while a file of that kind is being sent (``ReportFile.sending_since``) waits
(``DropNotification.awaiting_report_file``) until that file's answer is recorded; a send
that failed keeps it waiting until a later run or staff record the answer."""

from __future__ import annotations

from django.db.models import QuerySet

from integrations.drop import notifications
from integrations.models import AWAITING_DROP, DropNotification, ReportFile, ReportKind

REPORT_FILE_KIND = {
    notifications.UPLOAD_RECEIVED: ReportKind.UPLOAD,
    notifications.UPLOAD_PROCESSED: ReportKind.UPLOAD,
    notifications.AMENDMENT_RECEIVED: ReportKind.AMEND,
    notifications.AMENDMENT_PROCESSED: ReportKind.AMEND,
}


def event_types_about(kind: str) -> list[str]:
    """The notifications' event types about a report file of ``kind``."""
    return [event for event, about in REPORT_FILE_KIND.items() if about == kind]


def drop_notifications_awaiting(report_file: ReportFile) -> QuerySet[DropNotification]:
    """The broker's notifications waiting for DROP's answer to ``report_file`` (or to another
    file of its kind being sent beside it): none unless it is being sent, or its send failed
    with DROP's answer unknown."""
    if report_file.sending_since is None or report_file.state not in AWAITING_DROP:
        return DropNotification.objects.none()
    return DropNotification.objects.filter(
        broker_id=report_file.broker_id,
        awaiting_report_file=True,
        event_type__in=event_types_about(report_file.kind),
    )
