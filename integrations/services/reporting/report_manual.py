"""What staff do by hand with a response file: give up an amendment, or mark a file uploaded.

An amendment DROP refuses or rejected is given up with a written reason; its work items keep
the status DROP holds. In manual mode, staff upload the files in DROP's portal and say so,
with when they did when that was not just now::

    report_file_discard(report_file=amendment, reason="DROP keeps refusing it", actor=actor)
    report_file_mark_uploaded(report_file=upload, actor=actor, uploaded_at=yesterday_evening)

Both wait for no upload of the broker (``ReportBusy`` while one runs) and refresh the cycle.
"""

from __future__ import annotations

import datetime as dt

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Max, Q
from django.db.models.functions import Greatest
from django.utils import timezone

from integrations.drop.calendar import drop_time_text
from integrations.enqueue import alerts_evaluate_enqueue
from integrations.ledger_kinds import LedgerKind
from integrations.models import AWAITING_DROP, Broker, ReportFile, ReportFileState, ReportKind
from integrations.services.cycle.cycle_state import cycle_state_refresh
from integrations.services.cycle.drop_notifications import drop_notifications_attach_awaiting
from integrations.services.ledger import ledger_event_append
from integrations.services.reporting.report_files import (
    report_file_facts,
)
from integrations.services.reporting.report_uploads import report_rows_taken, report_upload_lock

DISCARD_REASON_MAX = 2000


# Staff give up an amendment: its rows (those still with it: not written into a later
# file) keep what DROP holds. A row whose status is still the one the amendment carried owes
# DROP nothing more: that code counts as held, so the row is ``reported``, no amendment
# (its rows were reported before, so reported_at is set). One whose status changed again
# since follows from what DROP does hold. Both by the settling rule (work_item_settle.sql).
# Locked by id first (``matching_lock``), as when DROP takes a file (``report_uploads``).
_AMENDMENT_GIVE_UP = """
UPDATE integrations_workitem w
SET pending_report_file_id = NULL, pending_status_code = NULL,
    (state, needs_amendment) = (
        SELECT f.state, f.needs_amendment FROM dropportal_work_item_status_fields(
            p_state => w.state, p_code => w.status_code, p_reported_at => w.reported_at,
            p_reported_code => CASE WHEN w.status_code = w.pending_status_code
                                    THEN w.pending_status_code
                                    ELSE w.reported_status_code END,
            p_needs_amendment => w.needs_amendment) f
    ),
    updated_at = %(now)s
FROM (SELECT id FROM integrations_workitem
       WHERE cycle_id = %(cycle)s AND pending_report_file_id = %(file)s
       ORDER BY id FOR NO KEY UPDATE) locked
WHERE w.id = locked.id
"""


def report_file_discard(*, report_file: ReportFile, reason: str, actor: str) -> ReportFile:
    """Staff give up an amendment DROP refuses (or rejected), with a written reason.

    Its work items keep the status DROP holds (the one before the amendment) and owe DROP
    nothing more, unless their status changed again since. The file stays, ``discarded``,
    with the reason, who and when; one ``report_file.discarded`` ledger event. An upload
    cannot be discarded: its statuses are owed to DROP.

    Raises ``ReportBusy`` while the broker's files are being uploaded: DROP could take this
    very file while staff give it up.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError({"reason": "write why this amendment is given up"})
    if len(reason) > DISCARD_REASON_MAX:
        raise ValidationError({"reason": f"at most {DISCARD_REASON_MAX} characters"})
    broker = Broker.objects.get(pk=report_file.broker_id)
    with report_upload_lock(broker):
        discarded = _report_file_discard(report_file=report_file, reason=reason, actor=actor)
    cycle_state_refresh(cycle=discarded.cycle, actor=actor)
    return discarded


def _report_file_discard(*, report_file: ReportFile, reason: str, actor: str) -> ReportFile:
    with transaction.atomic():
        locked = (
            ReportFile.objects.select_for_update(of=("self",))
            .select_related("broker", "cycle")
            .get(pk=report_file.pk)
        )
        if locked.kind != ReportKind.AMEND:
            raise ValidationError(
                f"{locked.file_name} is an upload: only an amendment can be discarded (the "
                "statuses of an upload are owed to DROP)"
            )
        if locked.state not in (ReportFileState.REFUSED, ReportFileState.REJECTED):
            raise ValidationError(
                f"{locked.file_name} is {locked.get_state_display().lower()}: only an "
                "amendment DROP refused or rejected can be discarded"
            )
        previous_state = locked.state
        with connection.cursor() as cursor:
            cursor.execute(
                _AMENDMENT_GIVE_UP,
                {
                    "now": timezone.now(),
                    "cycle": locked.cycle_id,
                    "file": locked.pk,
                },
            )
            kept = cursor.rowcount
        locked.state = ReportFileState.DISCARDED
        locked.sending_since = None  # a failed send may have left it marked
        locked.discard_reason = reason
        locked.discarded_by = actor
        locked.discarded_at = timezone.now()
        locked.save(
            update_fields=[
                "state",
                "sending_since",
                "discard_reason",
                "discarded_by",
                "discarded_at",
            ]
        )
        ledger_event_append(
            kind=LedgerKind.REPORT_FILE_DISCARDED,
            broker_id=locked.broker.broker_id,
            subject=locked.file_name,
            actor=actor,
            data={
                **report_file_facts(locked),
                "previous_state": previous_state,
                "drop_message": locked.drop_response.get("message")
                or locked.drop_response.get("reason", ""),
                "reason": reason,
                "work_items_kept": kept,
            },
        )
        alerts_evaluate_enqueue()  # its alert clears now rather than at the next run
        # Notifications that came while a failed send left it marked: attached elsewhere now.
        drop_notifications_attach_awaiting(broker=locked.broker, kind=locked.kind, actor=actor)
    return locked


def report_file_mark_uploaded(
    *, report_file: ReportFile, actor: str, uploaded_at: dt.datetime | None = None
) -> ReportFile:
    """Staff uploaded the file by hand in DROP's portal (manual mode), at ``uploaded_at``
    (default: now).

    DROP holds its statuses from ``uploaded_at``, not from when staff say so: the rows'
    ``reported_at`` (the days to respond), the file's ``uploaded_at`` and, when this file
    completes its cycle, when the cycle was reported (its due date's verdict). The
    ``report_file.marked_uploaded`` event says it; its own time is the marking. A time in
    the future, or before the file was written, is refused (``ValidationError``).

    Raises ``ReportBusy`` while the broker's files are being uploaded: DROP could reject
    this very file meanwhile, and its answer would find the file marked and go unrecorded.
    """
    broker = Broker.objects.get(pk=report_file.broker_id)
    with report_upload_lock(broker):
        marked = _report_file_mark_uploaded(
            report_file=report_file, actor=actor, uploaded_at=uploaded_at
        )
    cycle_state_refresh(cycle=marked.cycle, actor=actor, reported_at=_cycle_taken_at(marked))
    return marked


def _report_file_mark_uploaded(
    *, report_file: ReportFile, actor: str, uploaded_at: dt.datetime | None
) -> ReportFile:
    with transaction.atomic():
        locked = (
            ReportFile.objects.select_for_update(of=("self",))
            .select_related("broker", "cycle")
            .defer("content")
            .get(pk=report_file.pk)
        )
        if locked.state not in AWAITING_DROP:
            raise ValidationError(
                f"{locked.file_name} is {locked.get_state_display().lower()}: only a written "
                "or refused file can be marked uploaded"
            )
        now = timezone.now()
        uploaded_at = _upload_time_checked(locked, uploaded_at or now, now=now)
        locked.state = ReportFileState.MANUAL
        locked.sending_since = None  # a failed send may have left it marked
        locked.uploaded_at = uploaded_at
        locked.save(update_fields=["state", "sending_since", "uploaded_at"])
        # Staff's word that DROP took it: its rows hold the file's statuses from the upload.
        report_rows_taken(report_file=locked, at=uploaded_at)
        ledger_event_append(
            kind=LedgerKind.REPORT_FILE_MARKED_UPLOADED,
            broker_id=locked.broker.broker_id,
            subject=locked.file_name,
            actor=actor,
            data={
                **report_file_facts(locked),
                "uploaded_at": uploaded_at.isoformat(),
            },
        )
        # Notifications that came while a failed send left it marked: this file is DROP's now.
        drop_notifications_attach_awaiting(broker=locked.broker, kind=locked.kind, actor=actor)
    return locked


def _upload_time_checked(
    report_file: ReportFile, uploaded_at: dt.datetime, *, now: dt.datetime
) -> dt.datetime:
    """``uploaded_at`` in UTC, or why it cannot be when staff uploaded ``report_file``."""
    if uploaded_at > now:
        raise ValidationError(
            f"{report_file.file_name} not marked uploaded: its upload time "
            f"{drop_time_text(uploaded_at)} is in the future; give the time it was uploaded "
            "in DROP's portal"
        )
    if uploaded_at < report_file.created_at:
        raise ValidationError(
            f"{report_file.file_name} not marked uploaded: its upload time "
            f"{drop_time_text(uploaded_at)} is before the file was written "
            f"({drop_time_text(report_file.created_at)}); give the time it was uploaded in "
            "DROP's portal"
        )
    return uploaded_at.astimezone(dt.UTC)


def _cycle_taken_at(report_file: ReportFile) -> dt.datetime | None:
    """When DROP had the last of the cycle's files it holds or staff gave up (this one, or
    one taken or discarded between its upload by hand and the marking): when the cycle was
    reported, if this marking completes it."""
    held = Q(state__in=(ReportFileState.ACCEPTED, ReportFileState.MANUAL))
    latest = ReportFile.objects.filter(cycle_id=report_file.cycle_id).aggregate(
        at=Greatest(Max("uploaded_at", filter=held), Max("discarded_at"))
    )
    return latest["at"]  # type: ignore[no-any-return]
