"""Forgetting cycles that no longer have outstanding work items (``OutstandingCycle``).

The database marks a cycle as its work items come in or go back to ``open`` or
``reportable`` (``sql/outstanding_cycles.sql``); only this unmarks one, so that the probes
that read the mark (``DropCycle.objects.may_have_outstanding()``) leave a fully reported
cycle alone. A periodic job (``tasks.forget_settled_cycles``, every 15 minutes) runs it for
every broker, whether or not it uploads by itself (a broker whose files staff upload by hand
gets its cycles reported too)::

    cleared = outstanding_cycles_clear()               # every broker's cycles
    cleared = outstanding_cycles_clear(broker=broker)  # one broker's
"""

from __future__ import annotations

from django.db import connection, transaction

from integrations.models import Broker, DropCycle, OutstandingCycle, WorkItem
from integrations.services.locks import LockBusy, lock_wait_bounded

# How long a clearing waits for a transaction that marked the cycle and has not ended.
MARKER_WAIT_SECONDS = 1.0


def outstanding_cycles_clear(*, broker: Broker | None = None) -> int:
    """Delete the mark of each cycle (of ``broker``, or of every broker) with no outstanding
    work item; return how many were cleared.

    Per cycle, a transaction of its own: delete the row, then, in a new statement, ask
    whether the cycle has an outstanding item, and roll back if it has. The delete waits
    for every transaction that marked the cycle and has not ended (they hold a KEY SHARE
    lock on the row), and the question (READ COMMITTED) then sees what they committed; one
    that marks the cycle after the delete waits for this transaction and inserts the row
    again (``sql/outstanding_cycles.sql`` has the whole protocol). No work item is locked,
    so a settlement cannot deadlock with it. No ledger event: the mark is a read path's
    shortcut, not a fact of the cycle.

    Inside an outer transaction (``connection.in_atomic_block``) it clears nothing: its
    deletes would hold markers back until that one ends, and a mark left is always safe
    (the readers ask their exact question of its cycle).
    """
    if connection.in_atomic_block:
        return 0
    cleared = 0
    marked = DropCycle.objects.may_have_outstanding().order_by("pk")
    if broker is not None:
        marked = marked.filter(broker=broker)
    for cycle_pk in list(marked.values_list("pk", flat=True)):
        # Asked unlocked first: a cycle with an outstanding item keeps its mark without
        # making a settlement of it wait on the delete.
        if _has_outstanding(cycle_pk):
            continue
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                # A marker still running (a file import's late match, say) keeps the mark:
                # always safe, and neither job waits on it for long.
                with lock_wait_bounded(cursor, MARKER_WAIT_SECONDS):
                    deleted, _ = OutstandingCycle.objects.filter(cycle_id=cycle_pk).delete()
                if not deleted:
                    continue  # another clearing got there first
                if _has_outstanding(cycle_pk):  # a new statement: what markers committed
                    transaction.set_rollback(True)
                else:
                    cleared += 1
        except LockBusy:
            pass
    return cleared


def _has_outstanding(cycle_pk: int) -> bool:
    return WorkItem.objects.outstanding().filter(cycle_id=cycle_pk).exists()
