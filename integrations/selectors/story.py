"""A work item's story, oldest first: what DROP sent, the match, each request and attempt,
the broker's answers, the status settled, the report file and DROP's answer to it, and
each time a matched consumer was registered again (a reappearance, with its source).

Read from the rows and from the ledger events that name the item, its requests, its cycle
or its report file (events since the cycle's download only). An event that records a step
the rows tell (an attempt, an outcome, a file written) becomes that step's ledger link;
any other (a status set by hand, a removal, a redelivery) is a step of its own::

    for step in work_item_story(work_item=item):
        step.at, step.title, step.detail, step.record, step.ledger_event_id
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from integrations.drop_statuses import DropStatus
from integrations.models import (
    DeletionRequest,
    DeliveryAttempt,
    LedgerEvent,
    Reappearance,
    ResolutionRequest,
    SaasDeletion,
    WorkItem,
    WorkItemState,
)

# What a ledger event says, in staff's words; a kind not named here reads as its name.
TITLES = {
    "drop.work_items_removed": "DROP removed it from its list",
    "drop_cycle.reported": "Every status of the cycle reported to DROP",
    "drop_cycle.statuses_held": "Every status the cycle owed held by DROP (an amendment to send)",
    "work_item.status_set": "Status set",
    "work_item.status_settled": "Status settled from the broker's outcomes",
    "deletion_request.delivery_failed": "A delivery attempt failed",
    "deletion_request.undeliverable": "Undeliverable: retries used up",
    "deletion_request.cancelled": "Deletion request cancelled",
    "deletion_request.outcome_repeated": "The broker sent the same outcome again",
    "deletion_request.redelivery_requested": "Redelivery asked",
    "deletion_request.redispatched": "Sent again after a failed outcome",
    "resolution_request.outcome_recorded": "The broker answered the resolution request",
    "resolution_request.identifiers_purged": "Resolved identifiers purged",
    "report_file.written": "Report file written",
    "report_file.accepted": "DROP accepted the report file",
    "report_file.upload_failed": "Upload to DROP failed",
    "report_file.rejected": "DROP rejected the report file",
    "report_file.marked_uploaded": "Report file marked uploaded (by hand in DROP's portal)",
    "report_file.awaiting_approval": "Report file waiting for approval by a second person",
    "report_file.approved": "Report file approved for upload",
    "report_file.approval_rejected": "Report file not approved: not uploaded",
}
# The fields of an event's data worth a line on the timeline, in this order.
DETAIL_FIELDS = ("drop_outcome", "status_code", "state", "reason", "rows", "outcome", "status")


@dataclass
class StoryStep:
    at: dt.datetime
    title: str
    detail: str = ""
    record: Any = None  # the row the step is about, linked from the page
    ledger_event_id: int | None = None
    tone: str = "info"  # info / good / bad / staff
    # The ledger event recording this same step: (kind, subject) or (kind, subject, attempt).
    ledger_key: tuple[str, ...] = ()


def work_item_story(*, work_item: WorkItem) -> list[StoryStep]:
    deletions = list(
        DeletionRequest.objects.filter(work_item=work_item)
        .select_related("integration", "consumer")
        .order_by("matched_at")
    )
    resolutions = list(
        ResolutionRequest.objects.filter(work_item=work_item).select_related("integration")
    )
    steps = [_download_step(work_item)]
    if not deletions and not resolutions and work_item.status_code == DropStatus.NOT_FOUND:
        steps.append(
            StoryStep(
                at=work_item.created_at,
                title="No registered consumer matched: status 5 (not found)",
                record=work_item,
            )
        )
    for request in deletions:
        steps += _deletion_steps(request)
    for resolution in resolutions:
        steps += _resolution_steps(resolution)
    steps += [_reappearance_step(seen) for seen in Reappearance.objects.filter(work_item=work_item)]
    steps += _report_steps(work_item)
    if work_item.state == WorkItemState.REMOVED:
        steps.append(
            StoryStep(
                at=work_item.updated_at,
                title=TITLES["drop.work_items_removed"],
                detail=work_item.status_reason,
                record=work_item.cycle,
                ledger_key=("drop.work_items_removed", work_item.cycle.drop_session_id),
            )
        )
    steps = _with_ledger(steps, work_item, deletions, resolutions)
    return sorted(steps, key=lambda step: step.at)


def _download_step(work_item: WorkItem) -> StoryStep:
    cycle = work_item.cycle
    return StoryStep(
        at=cycle.downloaded_at,
        title=f"DROP sent it in cycle {cycle.drop_session_id}",
        detail=f"package {cycle.zip_name}, list {work_item.file_name} "
        f"({work_item.get_hash_type_display()})",
        record=cycle,
        ledger_key=("drop.cycle_imported", cycle.drop_session_id),
    )


def _attempt_step(attempt: DeliveryAttempt, target: str, kind: str, subject: str) -> StoryStep:
    answer = f"HTTP {attempt.status}" if attempt.status else (attempt.error or "no answer")
    took = f", {attempt.duration_ms} ms" if attempt.duration_ms is not None else ""
    return StoryStep(
        at=attempt.started_at,
        title=f"Delivery attempt {attempt.number} to {target}",
        detail=f"{attempt.url}: {answer}{took}",
        record=attempt,
        tone="good" if attempt.status and 200 <= attempt.status < 300 else "bad",
        ledger_key=(f"{kind}.delivered", subject, str(attempt.number)),
    )


def _deletion_steps(request: DeletionRequest) -> list[StoryStep]:
    uuid = str(request.request_uuid)
    target = str(request.integration or "the broker")
    consumer = request.remote_identifier or "(since forgotten)"
    title = "Matched consumer " + consumer + (", a late match" if request.late_match else "")
    if request.round:
        title = f"Recurring deletion, round {request.round}: consumer {consumer} asked again"
    steps = [
        StoryStep(
            at=request.matched_at,
            title=title,
            detail=f"deletion request {uuid[:8]} to {target}",
            record=request.consumer or request,
        )
    ]
    steps += [
        _attempt_step(attempt, target, "deletion_request", uuid)
        for attempt in request.delivery_attempts.order_by("started_at")
    ]
    if request.completed_at and request.drop_outcome:
        steps.append(
            StoryStep(
                at=request.completed_at,
                title=f"The broker answered {request.get_drop_outcome_display()}"
                + (
                    f" (recurring round {request.round}: DROP's status unchanged)"
                    if request.round
                    else ""
                ),
                detail=request.error_message,
                record=request,
                tone="bad" if request.drop_outcome == "failed" else "good",
                ledger_key=("deletion_request.outcome_recorded", uuid),
            )
        )
    return steps


def _reappearance_step(seen: Reappearance) -> StoryStep:
    # The source, with the file's digest or the key's prefix, is how staff find the supplier
    # that sells deleted people again.
    if seen.api_key_prefix:
        detail = f"through the API, key {seen.api_key_prefix}"
    else:
        detail = f"from {seen.source}" + (
            f", SHA-256 {seen.source_sha256}" if seen.source_sha256 else ""
        )
    return StoryStep(
        at=seen.reappeared_at,
        title=f"Registered again: consumer {seen.remote_identifier}, a reappearance",
        detail=detail,
        record=seen,
        tone="bad",
    )


def _resolution_steps(resolution: ResolutionRequest) -> list[StoryStep]:
    uuid = str(resolution.request_uuid)
    target = str(resolution.integration)
    steps = [
        StoryStep(
            at=resolution.created_at,
            title="The broker's identifiers asked (resolution request)"
            + (f", recurring round {resolution.round}" if resolution.round else ""),
            detail=f"resolution request {uuid[:8]} to {target}",
            record=resolution,
        )
    ]
    steps += [
        _attempt_step(attempt, target, "resolution_request", uuid)
        for attempt in resolution.delivery_attempts.order_by("started_at")
    ]
    for deletion in SaasDeletion.objects.filter(resolution=resolution).select_related(
        "saas_connection"
    ):
        steps.append(
            StoryStep(
                at=deletion.completed_at or deletion.created_at,
                title=f"SaaS deletion at {deletion.saas_connection}: "
                f"{deletion.get_state_display()}",
                detail=deletion.last_error,
                record=deletion,
                tone="bad" if deletion.last_error else "info",
            )
        )
    return steps


def _report_steps(work_item: WorkItem) -> list[StoryStep]:
    report_file = work_item.report_file
    if report_file is None:
        return []
    steps = [
        StoryStep(
            at=report_file.created_at,
            title=f"Written in report file {report_file.file_name}",
            detail=f"status {work_item.reported_status_code}",
            record=report_file,
            ledger_key=("report_file.written", report_file.file_name),
        )
    ]
    if report_file.uploaded_at:
        steps.append(
            StoryStep(
                at=report_file.uploaded_at,
                title=f"Uploaded to DROP: {report_file.get_state_display()}",
                detail=str((report_file.drop_response or {}).get("message", "")),
                record=report_file,
                tone="bad" if report_file.state == "rejected" else "good",
                ledger_key=(f"report_file.{report_file.state}", report_file.file_name),
            )
        )
    return steps


def _with_ledger(
    steps: list[StoryStep],
    work_item: WorkItem,
    deletions: list[DeletionRequest],
    resolutions: list[ResolutionRequest],
) -> list[StoryStep]:
    cycle = work_item.cycle
    # The list's own response file (named as DROP's list) carried the item's first status
    # even when an amendment file carries its latest.
    subjects = {work_item.work_item_id, work_item.file_name}
    subjects |= {str(request.request_uuid) for request in deletions}
    subjects |= {str(resolution.request_uuid) for resolution in resolutions}
    if work_item.report_file is not None:
        subjects.add(work_item.report_file.file_name)
    cycle_kinds = ["drop.cycle_imported", "drop_cycle.statuses_held", "drop_cycle.reported"]
    if work_item.state == WorkItemState.REMOVED:  # the cycle's removals name no item
        cycle_kinds.append("drop.work_items_removed")
    about = Q(subject__in=subjects) | Q(subject=cycle.drop_session_id, kind__in=cycle_kinds)
    events = LedgerEvent.objects.filter(
        about, broker_id=work_item.broker.broker_id, created_at__gte=cycle.downloaded_at
    ).order_by("created_at", "id")
    told = {step.ledger_key: step for step in steps if step.ledger_key}
    steps = list(steps)
    for event in events:
        attempt = str((event.data or {}).get("attempt", ""))
        step = told.get((event.kind, event.subject, attempt)) or told.get(
            (event.kind, event.subject)
        )
        if step is not None and step.ledger_event_id is None:
            step.ledger_event_id = event.id
            continue
        if event.kind in ("drop.cycle_imported", "deletion_request.delivered"):
            continue  # told by a row already linked to its first event
        by_staff = event.actor.startswith("staff:")
        title = TITLES.get(event.kind) or event.kind.replace("_", " ").replace(".", ": ", 1)
        data = event.data or {}
        steps.append(
            StoryStep(
                at=event.created_at,
                title=title[:1].upper()
                + title[1:]
                + (f" by {event.actor.removeprefix('staff:')}" if by_staff else ""),
                detail=", ".join(
                    f"{key.replace('_', ' ')} {data[key]}"
                    for key in DETAIL_FIELDS
                    if data.get(key) not in ("", None)
                ),
                ledger_event_id=event.id,
                tone="staff" if by_staff else "info",
            )
        )
    return steps


def consumer_work_items(*, consumer: Any, limit: int = 200) -> list[WorkItem]:
    """The work items DROP matched to ``consumer``, newest first (each has a story)."""
    matched = DeletionRequest.objects.filter(consumer=consumer).values("work_item_id")
    resolved = ResolutionRequest.objects.filter(consumer=consumer).values("work_item_id")
    return list(
        WorkItem.objects.filter(Q(pk__in=matched) | Q(pk__in=resolved))
        .select_related("cycle")
        .order_by("-created_at", "-pk")[:limit]
    )
