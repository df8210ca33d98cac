"""A second pair of eyes before DROP hears anything (a broker's "approve uploads").

With the broker's ``approve_uploads`` on, every response file is written ``awaiting_approval``
(``report_files``) instead of ``written``: nothing sends it. A person other than whoever
wrote it (the periodic job writes as ``system``: then anyone may) reviews its counts per
status and list (``selectors.report_reviews``) and decides::

    report_file_approve(report_file=f, actor="staff:bob")            # written: uploaded next
    report_file_reject(report_file=f, reason="counts look wrong", actor="cli:bob")

Approved, the file becomes ``written`` and the broker's report job is queued (the periodic
job's: it uploads every written file); a broker without a DROP API key uploads by hand, as
any written file. Rejected, the file becomes ``not_approved`` and is never sent; its rows
leave it, still owed, and go into a new file at the next report run (the periodic job's, or
``drop report``), which waits for approval in turn. The role check (Operators and
superusers: ``integrations.approve_reportfile``) is the interface's; the rule that the
approver is not the writer is here, for every interface.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from integrations.drop.calendar import drop_time_text
from integrations.enqueue import drop_report_enqueue
from integrations.ledger_kinds import LedgerKind
from integrations.models import AWAITING_DROP, Broker, ReportFile, ReportFileState, WorkItem
from integrations.selectors.pulls import brokers_due_for_report
from integrations.selectors.report_reviews import report_file_review
from integrations.services.ledger import actor_person, ledger_event_append
from integrations.services.reporting.report_files import (
    report_file_awaiting_approval_record,
    report_file_facts,
)
from integrations.services.reporting.report_uploads import ReportBusy, report_upload_lock

REVIEW_REASON_MAX = 2000
APPROVE_PERMISSION = "integrations.approve_reportfile"


def report_files_hold_for_approval(*, broker: Broker, actor: str) -> list[ReportFile]:
    """The broker's files not sent yet (written, or refused and sent again each run), held
    for a second person's approval: its uploads need one from now. Call it in the
    transaction that turns *Approve uploads* on. With no upload running, a file a failed
    call left marked (``sending_since``) is held too (sent again after approval, DROP's
    "already uploaded" counts as accepted); while one runs, a marked file may be on its way
    and goes it. One held after the upload read it is skipped by it."""
    files = ReportFile.objects.select_for_update().filter(broker=broker, state__in=AWAITING_DROP)
    try:
        # Taken and let go at once: the rows locked below keep an upload from marking them
        # until this commits.
        with report_upload_lock(broker):
            held = list(files.order_by("pk"))
    except ReportBusy:
        held = list(files.filter(sending_since__isnull=True).order_by("pk"))
    ReportFile.objects.filter(pk__in=[f.pk for f in held]).update(
        state=ReportFileState.AWAITING_APPROVAL
    )
    for report_file in held:
        report_file.state = ReportFileState.AWAITING_APPROVAL
        report_file_awaiting_approval_record(
            report_file=report_file, broker=broker, actor=actor, written_by=report_file.written_by
        )
    return held


def report_file_approve(*, report_file: ReportFile, actor: str, reason: str = "") -> ReportFile:
    """Approve a file waiting for approval: it becomes ``written`` and is uploaded by the
    broker's report job, queued now. Raises ``ValidationError`` (nothing changed) when it
    does not wait for approval or ``actor`` wrote it."""
    reason = _reason_checked(reason, required=False)
    with transaction.atomic():
        locked = _awaiting_locked(report_file, actor=actor, verb="approve")
        _decided(
            locked,
            state=ReportFileState.WRITTEN,
            kind=LedgerKind.REPORT_FILE_APPROVED,
            actor=actor,
            reason=reason,
        )
        # As the periodic job would: a broker it serves gets its report job now.
        if any(b.pk == locked.broker_id for b in brokers_due_for_report()):
            drop_report_enqueue(broker_pk=locked.broker_id, broker_id=locked.broker.broker_id)
    return locked


def report_file_reject(*, report_file: ReportFile, reason: str, actor: str) -> ReportFile:
    """Reject a file waiting for approval, with a written reason: it becomes ``not_approved``
    and is never sent; its rows leave it, still owed, for a new file at the next report run.
    Raises ``ValidationError`` (nothing changed) without a reason, when it does not wait for
    approval, ``actor`` wrote it, or a failed send may have left it at DROP already."""
    reason = _reason_checked(reason, required=True)
    with transaction.atomic():
        locked = _awaiting_locked(report_file, actor=actor, verb="reject")
        if locked.sending_since is not None:
            # A call that failed after sending it: DROP may hold it, and its rows written
            # again would reach DROP twice. Sent again, "already uploaded" settles it.
            raise ValidationError(
                f"{locked.file_name} may already be at DROP (a send of it at "
                f"{drop_time_text(locked.sending_since)} got no answer): approve it, and "
                "the next upload learns whether DROP holds it; correct it later by amendment"
            )
        # Back to what they were before the file was written: reportable, DROP holding
        # what it held. The next write puts them in a new file.
        rows = WorkItem.objects.filter(cycle_id=locked.cycle_id, pending_report_file=locked)
        # Locked by id first (``matching_lock``): the update alone takes them in the order
        # its plan reads them, while a delivery batch settles several by id.
        list(rows.order_by("pk").select_for_update(no_key=True).values_list("pk", flat=True))
        released = rows.update(
            pending_report_file=None, pending_status_code=None, updated_at=timezone.now()
        )
        _decided(
            locked,
            state=ReportFileState.NOT_APPROVED,
            kind=LedgerKind.REPORT_FILE_APPROVAL_REJECTED,
            actor=actor,
            reason=reason,
            work_items_owed_again=released,
        )
    return locked


def _decided(
    locked: ReportFile,
    *,
    state: ReportFileState,
    kind: LedgerKind,
    actor: str,
    reason: str,
    **data: Any,
) -> None:
    """Record a decision on a locked file waiting for approval: its new state, who decided
    and why, and the ledger event with the counts the person reviewed (the file's bytes)."""
    review = report_file_review(locked)
    locked.state = state
    locked.reviewed_by = actor
    locked.reviewed_at = timezone.now()
    locked.review_reason = reason
    locked.save(update_fields=["state", "reviewed_by", "reviewed_at", "review_reason"])
    ledger_event_append(
        kind=kind,
        broker_id=locked.broker.broker_id,
        subject=locked.file_name,
        actor=actor,
        data={
            **report_file_facts(locked),
            "list": review.list_type,
            "statuses": review.as_json()["statuses"],
            "written_by": locked.written_by,
            "reason": reason,
            **data,
        },
    )


def _reason_checked(reason: str, *, required: bool) -> str:
    reason = (reason or "").strip()
    if required and not reason:
        raise ValidationError({"reason": "write why this file is not approved"})
    if len(reason) > REVIEW_REASON_MAX:
        raise ValidationError({"reason": f"at most {REVIEW_REASON_MAX} characters"})
    return reason


def _awaiting_locked(report_file: ReportFile, *, actor: str, verb: str) -> ReportFile:
    """The file, locked, once it waits for approval and ``actor`` may decide on it."""
    locked = (
        ReportFile.objects.select_for_update(of=("self",))
        .select_related("broker", "cycle")
        .defer("content")
        .get(pk=report_file.pk)
    )
    if locked.state != ReportFileState.AWAITING_APPROVAL:
        raise ValidationError(
            f"{locked.file_name} is {locked.get_state_display().lower()}: only a file "
            f"waiting for approval can be {verb.rstrip('e')}ed"
        )
    person = actor_person(actor)
    if not person:
        raise ValidationError(f"only a named person can {verb} {locked.file_name}")
    if person == actor_person(locked.written_by):
        raise ValidationError(
            f"{locked.file_name} was written by {locked.written_by}: a second person must {verb} it"
        )
    return locked
