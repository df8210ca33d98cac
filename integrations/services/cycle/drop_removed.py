"""What a DROP Removed file does: close the work items it names, cancel what was not sent.

An import stages the Removed rows in the temporary table ``STAGED_REMOVED`` and, in its own
transaction, calls::

    removed = work_items_close_removed(broker, actor=actor, drop_session_id="17")
    removed.closed, removed.unknown, removed.requests_cancelled
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection

from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, RequestState, WorkItemState
from integrations.services.ledger import ledger_event_append
from integrations.services.locks import work_items_lock

STAGED_REMOVED = "drop_staged_removed"
# What a Removed file cancels: everything not final but what the broker is acting on
# (dispatched, awaiting its outcome). Failed and undeliverable ones included: nothing more is
# sent to the broker for a removed identifier (redelivery and redispatch refuse them).
_CANCELLED_ON_REMOVAL = (
    RequestState.PENDING,
    RequestState.QUEUED,
    RequestState.FAILED,
    RequestState.UNDELIVERABLE,
)


@dataclass(frozen=True)
class RemovedResult:
    rows: int  # rows of the Removed file
    closed: int  # work items closed by them
    unknown: int  # ids with no open work item of this broker (unknown or closed before)
    requests_cancelled: int


NO_REMOVED = RemovedResult(0, 0, 0, 0)


# The SaaS deletions of the items being closed that were not sent, cancelled: each locked,
# or (``_UNHELD``) those no other transaction holds.
_SAAS_DELETIONS_LOCKED = (
    "UPDATE integrations_saasdeletion sd"
    "   SET state = %(cancelled)s, next_attempt_at = NULL, completed_at = now(),"
    "       last_error = %(reason)s"
    "  FROM (SELECT sd.id FROM integrations_saasdeletion sd"
    "          JOIN integrations_resolutionrequest rr ON rr.id = sd.resolution_id"
    "          JOIN drop_closed_items c ON rr.work_item_id = c.id"
    "         WHERE sd.state = ANY(%(not_dispatched)s)"
    "         ORDER BY sd.id FOR NO KEY UPDATE OF sd"
)
_SAAS_DELETIONS_CANCEL = _SAAS_DELETIONS_LOCKED + ") locked WHERE sd.id = locked.id"
_SAAS_DELETIONS_CANCEL_UNHELD = (
    _SAAS_DELETIONS_LOCKED + " SKIP LOCKED) locked WHERE sd.id = locked.id"
)


def work_items_close_removed(broker: Broker, *, actor: str, drop_session_id: str) -> RemovedResult:
    """Close the work items named in the staged Removed rows; cancel what was not sent.

    No status is owed for them. Every request not final is cancelled (pending, queued,
    failed, undeliverable; a queued one's delivery job finds it cancelled and skips it), so
    nothing more is sent for them; requests already dispatched keep their course, since the
    broker may be acting on them, but are never sent again.
    """
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {STAGED_REMOVED}")  # noqa: S608
        rows = int(cursor.fetchone()[0])
        if not rows:
            return NO_REMOVED
        cursor.execute("DROP TABLE IF EXISTS drop_closed_items")
        cursor.execute(
            "CREATE TEMP TABLE drop_closed_items ON COMMIT DROP AS"  # noqa: S608
            " SELECT w.id FROM integrations_workitem w"
            f"  JOIN {STAGED_REMOVED} r ON w.work_item_id = r.work_item_id"
            " WHERE w.broker_id = %(broker)s AND w.state <> %(removed)s",
            {"removed": WorkItemState.REMOVED, "broker": broker.pk},
        )
        cancel: dict[str, Any] = {
            "cancelled": RequestState.CANCELLED,
            "not_dispatched": list(_CANCELLED_ON_REMOVAL),
            "reason": "work item removed by DROP (consumer cancelled)",
        }
        # The requests to cancel before their work items, as a delivery batch or a callback
        # holds its request while it settles the item (``matching_lock``); each kind locked
        # in id order, as staff enabling a SaaS connection locks its deletions without this
        # import's lock.
        cursor.execute(
            "UPDATE integrations_deletionrequest d"
            "   SET state = %(cancelled)s, next_attempt_at = NULL, completed_at = now(),"
            "       last_error = %(reason)s"
            "  FROM (SELECT d.id FROM integrations_deletionrequest d"
            "          JOIN drop_closed_items c ON d.work_item_id = c.id"
            "         WHERE d.state = ANY(%(not_dispatched)s)"
            "         ORDER BY d.id FOR NO KEY UPDATE OF d) locked"
            " WHERE d.id = locked.id",
            cancel,
        )
        cancelled = cursor.rowcount
        cursor.execute(
            "UPDATE integrations_resolutionrequest rr"
            "   SET state = %(cancelled)s, next_attempt_at = NULL, completed_at = now(),"
            "       last_error = %(reason)s"
            "  FROM (SELECT rr.id FROM integrations_resolutionrequest rr"
            "          JOIN drop_closed_items c ON rr.work_item_id = c.id"
            "         WHERE rr.state = ANY(%(not_dispatched)s)"
            "         ORDER BY rr.id FOR NO KEY UPDATE OF rr) locked"
            " WHERE rr.id = locked.id",
            cancel,
        )
        cancelled += cursor.rowcount
        cursor.execute(_SAAS_DELETIONS_CANCEL, cancel)
        cancelled += cursor.rowcount
        # Only this broker's imports remove items, one at a time (the matching lock): each
        # item listed is closed here. Locked by id first (``matching_lock``): the update
        # alone takes them in the order its plan reads them, while DROP taking a file (or
        # staff releasing one) takes its rows by id.
        work_items_lock(cursor, ids="SELECT id FROM drop_closed_items")
        # A resolution answer that locked its item before this did started SaaS deletions the
        # cancel above could not see; the answers after it wait for the item and read it
        # removed. Those a delivery batch holds now are skipped, not waited for (it locks
        # them, then the item); it cancels them itself if it reads the item removed before
        # sending (``saas_deletion_outbound``).
        cursor.execute(_SAAS_DELETIONS_CANCEL_UNHELD, cancel)
        cancelled += cursor.rowcount
        cursor.execute(
            "UPDATE integrations_workitem w"
            "   SET status_code = NULL, updated_at = now(),"
            # A removed item's state and flag (owing nothing), by the one rule
            # (work_item_settle.sql).
            "       (state, needs_amendment) = ("
            "           SELECT f.state, f.needs_amendment"
            "             FROM dropportal_work_item_status_fields("
            "                  p_state => %(removed)s, p_code => NULL,"
            "                  p_reported_at => w.reported_at,"
            "                  p_reported_code => w.reported_status_code,"
            "                  p_needs_amendment => false) f)"
            "  FROM drop_closed_items c"
            " WHERE w.id = c.id",
            {"removed": WorkItemState.REMOVED},
        )
        closed = cursor.rowcount
        cursor.execute("DROP TABLE drop_closed_items")
    result = RemovedResult(
        rows=rows, closed=closed, unknown=rows - closed, requests_cancelled=cancelled
    )
    ledger_event_append(
        kind=LedgerKind.DROP_WORK_ITEMS_REMOVED,
        broker_id=broker.broker_id,
        subject=drop_session_id,
        actor=actor,
        data={
            "drop_session_id": drop_session_id,
            "rows": result.rows,
            "work_items_closed": result.closed,
            "ids_not_open": result.unknown,
            "requests_cancelled": result.requests_cancelled,
        },
    )
    return result
