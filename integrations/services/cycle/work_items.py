"""A work item's DROP status: settled from its requests' outcomes, or set by staff.

Issue the status after recording an outcome, in the same transaction::

    with transaction.atomic():
        ...record the outcome on the resolution request...
        work_item_settle(work_item=request.work_item)

The rules (docs/contracts.md §1.6) are applied in SQL, because the callbacks' hot path
settles in the same statement that records the outcome (docs/benchmarks.md, callbacks):
``integrations/sql/work_item_settle.sql``. The function takes the rules as arguments
(``settle_rules()``, from ``models``), so they have one home. In short: a work item is
reportable when every request it has is final; its code is the strongest outcome
(``DROP_STATUS_PRECEDENCE``; all cancelled: ``DROP_STATUS_ALL_CANCELLED``); a status DROP
already holds that differs must be amended; a status staff set by hand stands while any
request is open, and gives way only to an outcome recorded after it.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from integrations.drop_statuses import STATUS_CODES, STATUS_CODES_TEXT
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    OUTCOMES_NOT_FINAL,
    DeletionRequest,
    DropCycle,
    RequestState,
    WorkItem,
    WorkItemState,
)
from integrations.models import requests as request_rules
from integrations.services.ledger import SYSTEM_ACTOR, ledger_event_append

STATUS_REASON_MAX = 2000


def settle_rules() -> dict[str, int | list[int] | list[str]]:
    """The settlement's rules as the SQL functions take them (named parameters, see _SETTLE):
    the final outcomes strongest first, the code each reports, and the code when all are
    cancelled. Read from ``models.requests`` at each call, so an edit there is the whole
    change (``tests/sql/test_sql_rules.py`` walks one)."""
    outcome_of_status = {code: outcome for outcome, code in request_rules.DROP_STATUS_CODES.items()}
    precedence = request_rules.DROP_STATUS_PRECEDENCE
    return {
        "settle_outcomes": [outcome_of_status[status.value] for status in precedence],
        "settle_codes": [status.value for status in precedence],
        "settle_all_cancelled": request_rules.DROP_STATUS_ALL_CANCELLED.value,
    }


_SETTLE = """
SELECT status_code, state, needs_amendment, status_reason, reported_status_code, reported_at
FROM dropportal_work_item_settle(
    p_item => %(item)s, p_actor => %(actor)s, p_outcomes => %(settle_outcomes)s,
    p_codes => %(settle_codes)s, p_all_cancelled => %(settle_all_cancelled)s
)
"""


def work_item_settle(*, work_item: WorkItem, actor: str = SYSTEM_ACTOR) -> WorkItem:
    """Recompute ``work_item``'s status from its requests; a ledger event when it changes.

    Locks the work item row first, so two outcomes recorded at the same time for two
    requests of one item cannot both see the other still open. Returns ``work_item`` with
    its status fields as stored (and what DROP holds).
    """
    with connection.cursor() as cursor:
        cursor.execute(_SETTLE, {"item": work_item.pk, "actor": actor, **settle_rules()})
        row = cursor.fetchone()
    if row is None:
        raise WorkItem.DoesNotExist(f"work item {work_item.pk} does not exist")
    (
        work_item.status_code,
        work_item.state,
        work_item.needs_amendment,
        work_item.status_reason,
        work_item.reported_status_code,
        work_item.reported_at,
    ) = row
    return work_item


# Many items in one statement, in the order given (by id: ``matching_lock``'s order); a
# round trip for each of tens of thousands was most of what retiring a target took.
_SETTLE_MANY = """
SELECT count(*), count(*) FILTER (WHERE s.state <> %(open)s)
FROM unnest(%(items)s::bigint[]) AS i(id)
CROSS JOIN LATERAL dropportal_work_item_settle(
    p_item => i.id, p_actor => %(actor)s, p_outcomes => %(settle_outcomes)s,
    p_codes => %(settle_codes)s, p_all_cancelled => %(settle_all_cancelled)s
) s
"""
_SETTLE_BATCH = 2000


def work_items_settle_by_id(*, items: list[int], actor: str = SYSTEM_ACTOR) -> int:
    """``work_item_settle`` for each of ``items`` (ids, sorted), in batches of one statement
    each (a batch is settled whole or not at all); how many are no longer open."""
    settled = 0
    with connection.cursor() as cursor:
        for start in range(0, len(items), _SETTLE_BATCH):
            batch = items[start : start + _SETTLE_BATCH]
            cursor.execute(
                _SETTLE_MANY,
                {"items": batch, "actor": actor, "open": WorkItemState.OPEN, **settle_rules()},
            )
            found, done = cursor.fetchone()
            if found != len(batch):  # as one by one: an id that is no work item is an error
                raise WorkItem.DoesNotExist(f"{len(batch) - found} of {batch} are no work items")
            settled += done
    return settled


def work_items_settle(*, cycle: DropCycle, actor: str = SYSTEM_ACTOR) -> int:
    """Settle every open work item of ``cycle`` whose deletion requests all look final.

    A safety net (the periodic report job runs it): outcomes normally settle their work
    item at once. Returns how many items changed.
    """
    # Round 0 only: a recurring round never settles (sql/work_item_settle.sql).
    not_final = DeletionRequest.objects.filter(work_item_id=OuterRef("pk"), round=0).filter(
        ~Q(state__in=[RequestState.COMPLETED, RequestState.CANCELLED])
        | Q(state=RequestState.COMPLETED, drop_outcome__in=OUTCOMES_NOT_FINAL)
    )
    candidates = (
        WorkItem.objects.awaiting_outcome()
        .filter(cycle=cycle)
        .filter(Exists(DeletionRequest.objects.filter(work_item_id=OuterRef("pk"))))
        .exclude(Exists(not_final))
        .values_list("pk", flat=True)
    )
    return work_items_settle_by_id(items=sorted(candidates), actor=actor)


# The state and amendment flag follow from the code as they do when settling (one rule,
# in work_item_settle.sql).
_SET_STATUS = """
UPDATE integrations_workitem w
SET status_code = %(code)s, status_reason = %(reason)s, status_set_at = %(at)s,
    updated_at = %(at)s,
    (state, needs_amendment) = (
        SELECT f.state, f.needs_amendment FROM dropportal_work_item_status_fields(
            p_state => w.state, p_code => %(code)s, p_reported_at => w.reported_at,
            p_reported_code => w.reported_status_code, p_needs_amendment => w.needs_amendment) f
    )
WHERE w.id = %(id)s
RETURNING w.state, w.needs_amendment
"""


def work_item_status_set(
    *, work_item: WorkItem, status_code: int, reason: str, actor: str
) -> WorkItem:
    """Staff set a status by hand; ``reason`` is required and kept with the item and ledger."""
    reason = (reason or "").strip()
    if status_code not in STATUS_CODES:
        raise ValidationError(
            {"status_code": f"a DROP status is {STATUS_CODES_TEXT}, not {status_code!r}"}
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
        if (item.status_code, item.status_reason) == (status_code, reason):
            return item  # a double submit, or set already: nothing changes, nothing to ledger
        previous = item.status_code
        item.status_code, item.status_reason = status_code, reason
        item.status_set_at = item.updated_at = timezone.now()
        with connection.cursor() as cursor:
            cursor.execute(
                _SET_STATUS,
                {"code": status_code, "reason": reason, "at": item.updated_at, "id": item.pk},
            )
            item.state, item.needs_amendment = cursor.fetchone()
        ledger_event_append(
            kind=LedgerKind.WORK_ITEM_STATUS_SET,
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
