"""A work item's DROP status: settled from its requests' outcomes, or set by staff.

Issue the status after recording an outcome, in the same transaction::

    with transaction.atomic():
        ...record the callback's outcome on the deletion request...
        work_item_settle(work_item=request.work_item)

The rules (product.md section 1, step 6):

- A work item is reportable when every deletion request and resolution request it has, and
  every SaaS deletion those resolutions started, is final: ``completed`` with an outcome that
  is not ``failed``. ``pending``, ``queued``, ``dispatched``, ``failed`` and ``undeliverable``
  keep it open (the last two show as needing attention). ``cancelled`` ones do not count.
- Its code is the strongest outcome: ``opted_out`` (4) over ``deleted`` (3) over ``exempt``
  (2) over ``not_found`` (5). A resolution's ``opted_out``/``exempt`` counts like a deletion
  outcome; a SaaS deletion only has to be final (its 2xx says the call was taken, not what
  was found). Every request cancelled: no match remains, so ``not_found`` (5).
- A status DROP already has that differs from the new one must be amended
  (``needs_amendment``); the reporting service sends it to ``/data/amend``.
- A status staff set by hand (``work_item_status_set``, with a written reason) stands while
  any request is still open; once a new outcome makes every request final, the outcome wins
  (the ledger event says it replaced the staff status).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from integrations.models import (
    DROP_STATUS_CODES,
    DeletionRequest,
    DropCycle,
    DropOutcome,
    RequestState,
    WorkItem,
    WorkItemState,
)
from integrations.selectors import model_from_row
from integrations.services.ledger import ledger_event_append

# Strongest first: the first outcome present decides the code.
OUTCOME_PRECEDENCE: tuple[str, ...] = (
    DropOutcome.OPTED_OUT,
    DropOutcome.DELETED,
    DropOutcome.EXEMPT,
    DropOutcome.NOT_FOUND,
)
STATUS_CODES = frozenset(DROP_STATUS_CODES.values())
STATUS_REASON_MAX = 2000


def settled_status(rows: Iterable[tuple[str, str, str]]) -> int | None:
    """The code for a work item's ``(kind, state, drop_outcome)`` rows, or None while open.

    ``kind`` is ``deletion``, ``resolution`` or ``saas``. Pure, so the rules are testable
    on their own and the same everywhere.
    """
    outcomes: set[str] = set()
    counted = 0
    any_rows = False
    for kind, state, outcome in rows:
        any_rows = True
        if state == RequestState.CANCELLED:
            continue
        counted += 1
        if state != RequestState.COMPLETED or outcome == DropOutcome.FAILED:
            return None
        if kind == "deletion":
            if outcome not in DROP_STATUS_CODES:
                return None  # completed without an outcome: not something to report
            outcomes.add(outcome)
        elif kind == "resolution" and outcome in DROP_STATUS_CODES:
            outcomes.add(outcome)
    if not any_rows:
        return None  # not matched (yet): matching gives unmatched items their 5
    if counted == 0:
        return DROP_STATUS_CODES[DropOutcome.NOT_FOUND]
    for outcome in OUTCOME_PRECEDENCE:
        if outcome in outcomes:
            return DROP_STATUS_CODES[outcome]
    return None  # only resolutions and SaaS deletions, no deletion outcome yet


# The settlement runs inside every outcome's transaction (the callbacks' hot path), so its
# three statements are written out: building them with the ORM cost more CPU than running
# them (docs/benchmarks.md, callbacks).
#
# A settlement reads these fields of the locked work item (``wi``), in this order; every
# statement that locks one for it selects ``LOCKED_ITEM_SELECT`` first.
LOCKED_ITEM_COLUMNS = (
    "id",
    "work_item_id",
    "state",
    "status_code",
    "status_reason",
    "needs_amendment",
    "reported_at",
    "reported_status_code",
    "updated_at",
)
LOCKED_ITEM_SELECT = ", ".join(f"wi.{column}" for column in LOCKED_ITEM_COLUMNS)
_LOCK_ITEM = f"""
SELECT {LOCKED_ITEM_SELECT}, b.broker_id, c.drop_session_id
FROM integrations_workitem wi
JOIN integrations_broker b ON b.id = wi.broker_id
JOIN integrations_dropcycle c ON c.id = wi.cycle_id
WHERE wi.id = %s
FOR UPDATE OF wi
"""  # noqa: S608 (constant column names)
_REQUEST_ROWS = """
SELECT 'deletion', state, drop_outcome FROM integrations_deletionrequest
WHERE work_item_id = %(id)s
UNION ALL
SELECT 'resolution', state, drop_outcome FROM integrations_resolutionrequest
WHERE work_item_id = %(id)s
UNION ALL
SELECT 'saas', s.state, '' FROM integrations_saasdeletion s
JOIN integrations_resolutionrequest r ON r.id = s.resolution_id
WHERE r.work_item_id = %(id)s
"""
_UPDATE_STATUS = """
UPDATE integrations_workitem
SET status_code = %s, status_reason = %s, state = %s, needs_amendment = %s, updated_at = %s
WHERE id = %s
"""


def _request_rows(work_item_id: int) -> list[tuple[str, str, str]]:
    """Every request touching the work item, in one query."""
    with connection.cursor() as cursor:
        cursor.execute(_REQUEST_ROWS, {"id": work_item_id})
        return cursor.fetchall()


def _apply_status(item: WorkItem, code: int | None) -> None:
    """Set ``status_code`` and the state and amendment flag that follow from it."""
    item.status_code = code
    if code is None:
        # Waiting for an outcome. DROP keeps whatever status it has meanwhile, and an
        # amendment flag (a late match on a reported 5) stays until the outcome decides.
        item.state = WorkItemState.OPEN
    elif item.reported_at is None:
        item.state = WorkItemState.REPORTABLE
        item.needs_amendment = False
    else:
        # reported_status_code None with reported_at set: an amendment DROP rejected, so the
        # code DROP holds is the earlier one; amend again.
        item.needs_amendment = item.reported_status_code != code
        item.state = WorkItemState.REPORTABLE if item.needs_amendment else WorkItemState.REPORTED


_STATUS_FIELDS = ["status_code", "status_reason", "state", "needs_amendment", "updated_at"]


def work_item_settle(*, work_item: WorkItem, actor: str = "system") -> WorkItem:
    """Recompute ``work_item``'s status from its requests; a ledger event when it changes.

    Locks the work item row first, so two outcomes recorded at the same time for two
    requests of one item cannot both see the other still open (the requests are read by a
    later statement, which sees what the other transaction committed). Two queries when
    nothing changes (lock, read), four when it does (update, ledger event). Returns the
    item's status fields as stored; the caller's instance is refreshed too.
    """
    # No savepoint: called inside the transaction recording an outcome, where a failure
    # here must roll that back anyway. Two round trips saved.
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        cursor.execute(_LOCK_ITEM, [work_item.pk])
        row = cursor.fetchone()
        if row is None:
            raise WorkItem.DoesNotExist(f"work item {work_item.pk} does not exist")
        item = locked_work_item(row)
        broker_id, drop_session_id = row[len(LOCKED_ITEM_COLUMNS) :]
        event = work_item_settle_locked(
            work_item=item, broker_id=broker_id, drop_session_id=drop_session_id, actor=actor
        )
        if event is not None:
            ledger_event_append(**event)
    for field in (*_STATUS_FIELDS, "reported_status_code", "reported_at"):
        setattr(work_item, field, getattr(item, field))
    return item


def locked_work_item(row: Sequence[Any]) -> WorkItem:
    """The work item of a row that starts with ``LOCKED_ITEM_SELECT`` (its lock held by the
    caller); its other fields load from the database if read."""
    return model_from_row(
        WorkItem, dict(zip(LOCKED_ITEM_COLUMNS, row[: len(LOCKED_ITEM_COLUMNS)], strict=True))
    )


def work_item_settle_locked(
    *, work_item: WorkItem, broker_id: str, drop_session_id: str, actor: str = "system"
) -> dict[str, Any] | None:
    """``work_item_settle`` for a caller that holds the item's row lock and appends the
    ledger event itself (with its own, in one INSERT): updates the row if the status
    changes and returns that event's ``ledger_event_append`` arguments, else None."""
    item = work_item  # updated in place, as the caller's
    if item.state == WorkItemState.REMOVED:
        return None
    code = settled_status(_request_rows(item.pk))
    staff_reason = item.status_reason
    if code is None and (staff_reason or item.status_code is None):
        return None  # still open; a status set by staff stands meanwhile
    before = (item.status_code, item.state, item.needs_amendment)
    _apply_status(item, code)
    if code is not None:
        item.status_reason = ""
    if (item.status_code, item.state, item.needs_amendment) == before and not (
        staff_reason and code is not None
    ):
        return None
    item.updated_at = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            _UPDATE_STATUS,
            [
                item.status_code,
                item.status_reason,
                item.state,
                item.needs_amendment,
                item.updated_at,
                item.pk,
            ],
        )
    data: dict[str, object] = {
        "cycle": drop_session_id,
        "status_code": item.status_code,
        "previous_status_code": before[0],
        "state": item.state,
        "needs_amendment": item.needs_amendment,
    }
    if staff_reason and code is not None:
        data["replaced_staff_status"] = {"status_code": before[0], "reason": staff_reason}
    return {
        "kind": "work_item.status_settled",
        "broker_id": broker_id,
        "subject": item.work_item_id,
        "actor": actor,
        "data": data,
    }


def work_items_settle(*, cycle: DropCycle, actor: str = "system") -> int:
    """Settle every open work item of ``cycle`` whose deletion requests all look final.

    A safety net (the periodic report job runs it): outcomes normally settle their work
    item at once. Returns how many items changed.
    """
    not_final = DeletionRequest.objects.filter(work_item_id=OuterRef("pk")).filter(
        ~Q(state__in=[RequestState.COMPLETED, RequestState.CANCELLED])
        | Q(state=RequestState.COMPLETED, drop_outcome__in=["", DropOutcome.FAILED])
    )
    candidates = (
        WorkItem.objects.filter(cycle=cycle, state=WorkItemState.OPEN)
        .filter(Exists(DeletionRequest.objects.filter(work_item_id=OuterRef("pk"))))
        .exclude(Exists(not_final))
        .values_list("pk", flat=True)
    )
    changed = 0
    for pk in list(candidates.iterator(chunk_size=2000)):
        item = WorkItem(pk=pk)
        settled = work_item_settle(work_item=item, actor=actor)
        if settled.state != WorkItemState.OPEN:
            changed += 1
    return changed


def work_item_status_set(
    *, work_item: WorkItem, status_code: int, reason: str, actor: str
) -> WorkItem:
    """Staff set a status by hand; ``reason`` is required and kept with the item and ledger."""
    reason = (reason or "").strip()
    if status_code not in STATUS_CODES:
        raise ValidationError(
            {"status_code": f"a DROP status is 2, 3, 4 or 5, not {status_code!r}"}
        )
    if not reason:
        raise ValidationError({"reason": "write why this status is set by hand"})
    if len(reason) > STATUS_REASON_MAX:
        raise ValidationError({"reason": f"at most {STATUS_REASON_MAX} characters"})
    with transaction.atomic():
        item = (
            WorkItem.objects.select_for_update(of=("self",))
            .select_related("broker", "cycle")
            .get(pk=work_item.pk)
        )
        if item.state == WorkItemState.REMOVED:
            raise ValidationError(
                f"work item {item.work_item_id} was removed by DROP: no status is owed"
            )
        previous = item.status_code
        _apply_status(item, status_code)
        item.status_reason = reason
        item.updated_at = timezone.now()
        item.save(update_fields=_STATUS_FIELDS)
        ledger_event_append(
            kind="work_item.status_set",
            broker_id=item.broker.broker_id,
            subject=item.work_item_id,
            actor=actor,
            data={
                "cycle": item.cycle.drop_session_id,
                "status_code": status_code,
                "previous_status_code": previous,
                "needs_amendment": item.needs_amendment,
                "reason": reason,
            },
        )
    return item
