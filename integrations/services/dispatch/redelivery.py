"""Staff actions that send something to the broker's systems again.

::

    deletion_request_redeliver(deletion_request=request, actor="staff:ann")
    deletion_request_redispatch(deletion_request=request, actor="staff:ann")  # after failed

A redelivery is a new notification: a new ``webhook_request_id`` (the broker's idempotency
key), the attempt count back to zero, and a delivery job deferred in the same transaction.
Redelivery is for what did not get through (``undeliverable``, or ``queued``/``dispatched``
with no outcome); redispatch is for a ``failed`` outcome, which the broker asked us to send
again. Staff redispatch; so does the automatic policy when ``DROPPORTAL_AUTO_REDISPATCH_HOURS``
is set (``deletion_requests_redispatch_failed``, run hourly; off by default).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone

from integrations.dispatch.policy import AUTO_REDISPATCH_ACTOR, AUTO_REDISPATCH_MAX
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    DeletionRequest,
    RequestState,
    ResolutionRequest,
    SaasDeletion,
    WorkItemState,
)
from integrations.selectors.requests import automatic_redispatches
from integrations.services.dispatch.deliveries import (
    DELETION_REQUESTS,
    RESOLUTION_REQUESTS,
    SAAS_DELETIONS,
)
from integrations.services.dispatch.delivery_loop import DeliveryKind
from integrations.services.dispatch.resolutions import recurring_marks
from integrations.services.ledger import ledger_event_append

REDELIVERABLE = (RequestState.QUEUED, RequestState.DISPATCHED, RequestState.UNDELIVERABLE)

Row = TypeVar("Row", DeletionRequest, ResolutionRequest, SaasDeletion)
# Why a row may not be sent again (None: it may).
Refusal = Callable[[Row], str | None]


def _requeue(
    kind: DeliveryKind[Row], pk: int, *, refusal: Refusal[Row], reset: Mapping[str, Any],
    event: LedgerKind, actor: str, marks: Callable[[Row], Mapping[str, Any]] | None = None,
    also_set: Mapping[str, Any] | None = None,
) -> Row:  # fmt: skip
    """Queue row ``pk`` of ``kind`` again from attempt zero, with ``reset`` set on it, unless
    ``refusal`` (or its removed work item, or its target) says why not; ``marks`` adds to its
    ledger event what the row says of itself. ``also_set`` is set on the row too, not in
    the event: which requeue this was, which the event's kind says already."""
    set_too: Mapping[str, Any] = also_set or {}
    with transaction.atomic():
        row = (
            kind.model.objects.select_for_update(of=("self",))
            .select_related(*kind.related)
            .get(pk=pk)
        )
        refused = _removed_refusal(row) or refusal(row)
        if refused:
            raise ValidationError(refused)
        destination = kind.target(row)
        if destination is None:
            raise ValidationError("it has no target to deliver to")
        if destination.retired_refusal:
            raise ValidationError(destination.retired_refusal)
        if not destination.enabled:
            raise ValidationError(
                f"'{destination.name}' is disabled ({destination.disabled_reason or 'by staff'}):"
                " enable it first"
            )
        before = {"state": row.state, "attempts": row.attempts}
        for name, value in {**reset, **set_too}.items():
            setattr(row, name, value)
        row.state = RequestState.QUEUED
        row.attempts = 0
        row.last_error = ""
        # The database's time, as the delivery loop's due check reads it: a web host's
        # clock a moment ahead would leave the row not due to the job queued just below.
        row.next_attempt_at = Now()
        row.dispatched_at = None
        row.save(
            update_fields=[
                *reset,
                *set_too,
                "state",
                "attempts",
                "last_error",
                "next_attempt_at",
                "dispatched_at",
            ]
        )
        kind.enqueue([row.pk])
        data = {
            "previous": before,
            **{k: str(v) for k, v in reset.items() if v},
            **(marks(row) if marks else {}),
        }
        ledger_event_append(
            kind=event,
            broker_id=kind.broker_id(row),
            subject=kind.subject(row),
            actor=actor,
            data=data,
        )
    return row


REMOVED_REFUSAL = (
    "its work item was removed by DROP (consumer cancelled): nothing more is sent for it"
)


def _removed_refusal(row: DeletionRequest | ResolutionRequest | SaasDeletion) -> str | None:
    """Once DROP removed the identifier, nothing more goes to the broker for it."""
    item = row.resolution.work_item if isinstance(row, SaasDeletion) else row.work_item
    # None: a canary round's request, which DROP never sent.
    if item is not None and item.state == WorkItemState.REMOVED:
        return f"it is {row.state}: {REMOVED_REFUSAL}"
    if row.state == RequestState.CANCELLED:
        return f"it is cancelled ({row.last_error or 'by staff'}): nothing more is sent for it"
    return None


def _not_redeliverable(row: DeletionRequest | ResolutionRequest | SaasDeletion) -> str | None:
    if row.state in REDELIVERABLE and not getattr(row, "drop_outcome", ""):
        return None
    if row.state == RequestState.FAILED:
        return f"it is {row.state}: redispatch it instead"
    if row.state == RequestState.PENDING:
        return (
            "it is pending: it waits for a deletion target; add or enable an integration"
            " and it is queued at once"
        )
    return f"it is {row.state}: only what has no outcome yet can be redelivered"


def deletion_request_redeliver(*, deletion_request: DeletionRequest, actor: str) -> DeletionRequest:
    return _requeue(
        DELETION_REQUESTS,
        deletion_request.pk,
        refusal=_not_redeliverable,
        reset={"webhook_request_id": uuid.uuid4()},
        event=LedgerKind.DELETION_REQUEST_REDELIVERY_REQUESTED,
        actor=actor,
        # What it resends may have reached the broker: a failure may answer it at once.
        also_set={"redispatched_at": None, "requeued": True},
    )


def deletion_request_redispatch(
    *, deletion_request: DeletionRequest, actor: str
) -> DeletionRequest:
    """Send a request whose outcome was ``failed`` again; its next outcome is awaited."""

    def only_failed(row: DeletionRequest) -> str | None:
        if row.state == RequestState.FAILED:
            return None
        return f"it is {row.state}: only a failed outcome is redispatched"

    return _requeue(
        DELETION_REQUESTS,
        deletion_request.pk,
        refusal=only_failed,
        # The failure stays in the ledger and the attempts; the request awaits a new outcome.
        reset={
            "webhook_request_id": uuid.uuid4(),
            "drop_outcome": "",
            "drop_status_code": None,
            "error_message": "",
            "completed_at": None,
        },
        event=LedgerKind.DELETION_REQUEST_REDISPATCHED,
        actor=actor,
        # Until its first attempt, a failure answers the dispatch before (the callbacks'
        # stale-failure rule, deletion_outcome_record.sql).
        also_set={"redispatched_at": timezone.now(), "requeued": True},
    )


def deletion_requests_redispatch_failed(*, failed_before: dt.datetime, limit: int = 1000) -> int:
    """The automatic policy: redispatch the requests whose outcome ``failed`` before
    ``failed_before`` and that were redispatched automatically fewer than
    ``AUTO_REDISPATCH_MAX`` times (each a ``deletion_request.redispatched`` event by
    ``system:auto-redispatch``). One whose integration is disabled stays for staff.
    Returns how many were redispatched."""
    due = (
        DeletionRequest.objects.filter(state=RequestState.FAILED, completed_at__lt=failed_before)
        .exclude(work_item__state=WorkItemState.REMOVED)
        .annotate(automatic=automatic_redispatches())
        .filter(automatic__lt=AUTO_REDISPATCH_MAX)
        .order_by("completed_at")
        .values_list("pk", flat=True)[:limit]
    )
    redispatched = 0
    for pk in list(due):
        try:
            deletion_request_redispatch(
                deletion_request=DeletionRequest(pk=pk), actor=AUTO_REDISPATCH_ACTOR
            )
        except ValidationError:
            continue  # its integration is disabled, or it changed meanwhile: staff see it
        redispatched += 1
    return redispatched


def resolution_request_redeliver(
    *, resolution_request: ResolutionRequest, actor: str
) -> ResolutionRequest:
    def no_answer_yet(row: ResolutionRequest) -> str | None:
        if row.completed_at is not None:
            return f"it is {row.state}: the broker has answered it"
        return _not_redeliverable(row)

    return _requeue(
        RESOLUTION_REQUESTS,
        resolution_request.pk,
        refusal=no_answer_yet,
        reset={"webhook_request_id": uuid.uuid4()},
        event=LedgerKind.RESOLUTION_REQUEST_REDELIVERY_REQUESTED,
        actor=actor,
    )


def saas_deletion_redeliver(*, saas_deletion: SaasDeletion, actor: str) -> SaasDeletion:
    def undelivered(row: SaasDeletion) -> str | None:
        if row.state in (RequestState.QUEUED, RequestState.UNDELIVERABLE):
            return None
        return f"it is {row.state}: only a queued or undeliverable SaaS deletion is redelivered"

    return _requeue(
        SAAS_DELETIONS,
        saas_deletion.pk,
        refusal=undelivered,
        reset={},
        event=LedgerKind.SAAS_DELETION_REDELIVERY_REQUESTED,
        actor=actor,
        marks=lambda row: recurring_marks(row.resolution.round),
    )
