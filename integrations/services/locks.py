"""Advisory locks that serialize write services across processes and hosts.

``pg_advisory_xact_lock(int, int)``: the first key names the lock's purpose, the second is
the row it guards; held until the end of the caller's transaction. Two-key locks never
collide with the ledger sealer's one-key lock. A caller that must not wait long (an API
call, holding a web worker) passes a timeout and gets ``LockBusy`` when it runs out; any
other lock is bounded the same way, by ``lock_wait_bounded``::

    advisory_xact_lock(cursor, purpose=_MATCHING_LOCK, key=broker.pk, timeout=10.0)
    with lock_wait_bounded(cursor, 1.0):
        ...  # each lock taken here waits a second at most (LockBusy after)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

from django.db import OperationalError, connection

from integrations.models import Broker

_MATCHING_LOCK = 0x6D617463  # "matc"
_LOCK: Final = "SELECT pg_advisory_xact_lock(%s, %s)"
_SESSION_LOCK_TRY: Final = "SELECT pg_try_advisory_lock(%s, %s)"
_SESSION_UNLOCK: Final = "SELECT pg_advisory_unlock(%s, %s)"
_LOCK_TIMEOUT: Final = "SELECT current_setting('lock_timeout')"
_LOCK_TIMEOUT_SET: Final = "SELECT set_config('lock_timeout', %s, true)"


class LockBusy(Exception):
    """Another transaction held the lock for longer than the caller would wait; the
    caller's transaction is aborted and must end."""


@contextmanager
def lock_wait_bounded(cursor: Any, seconds: float) -> Iterator[None]:
    """Each lock taken inside waits at most ``seconds`` (``LockBusy`` after, the transaction
    or savepoint then aborted); the transaction's later locks wait as before."""
    cursor.execute(_LOCK_TIMEOUT)
    previous = cursor.fetchone()[0]
    # PostgreSQL reads 0 as no limit at all: a bound rounds up to a millisecond.
    cursor.execute(_LOCK_TIMEOUT_SET, [f"{max(1, round(seconds * 1000))}ms"])
    try:
        yield
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == "55P03":  # lock_not_available
            raise LockBusy from None
        raise
    cursor.execute(_LOCK_TIMEOUT_SET, [previous])


def advisory_xact_lock(
    cursor: Any, *, purpose: int, key: int, timeout: float | None = None
) -> None:
    """Take the lock ``(purpose, key)`` until the transaction ends, waiting as long as it
    takes, or at most ``timeout`` seconds (``LockBusy``)."""
    if timeout is None:
        cursor.execute(_LOCK, [purpose, key])
        return
    with lock_wait_bounded(cursor, timeout):
        cursor.execute(_LOCK, [purpose, key])


@contextmanager
def advisory_session_lock(
    *, purpose: int, key: int, busy: Callable[[], Exception]
) -> Iterator[None]:
    """Hold the lock ``(purpose, key)`` while the block runs, or raise ``busy()`` at once when
    another session holds it. A session lock, not a transaction's: the block may commit as
    often as it likes, and a dead process's connection releases it."""
    with connection.cursor() as cursor:
        cursor.execute(_SESSION_LOCK_TRY, [purpose, key])
        if not cursor.fetchone()[0]:
            raise busy()
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(_SESSION_UNLOCK, [purpose, key])


def work_items_lock(cursor: Any, *, ids: str) -> None:
    """Lock the work items whose ids the subquery ``ids`` selects (a caller's constant, over
    its own temp table), in id order (``matching_lock``'s order): done before one statement
    updates many, which would take them in whatever order its plan reads them."""
    cursor.execute(
        "SELECT 1 FROM integrations_workitem w"  # noqa: S608 (a caller's constant)
        f" WHERE w.id IN ({ids}) ORDER BY w.id FOR NO KEY UPDATE OF w"
    )


def matching_lock(*, broker: Broker, timeout: float | None = None) -> None:
    """Serialize matching for ``broker`` until the end of the current transaction.

    Matching a download, matching a late consumer and giving pending requests their
    targets all take it before they read: each one's snapshot then sees every consumer hash,
    work item and target committed by the others, and whatever another has not committed
    yet is matched by that one once it gets the lock. So do the others that insert requests
    (a recurring round, a canary round) and forgetting a consumer, which deletes what those
    requests name. With ``timeout`` (seconds), gives up after that long (``LockBusy``).

    Lock order: a consumer registration's lock where one is taken, then this lock, then a
    cycle's row, then requests (deletion, resolution, SaaS deletion), then their
    target's row (integration, SaaS connection), then work items in id order. Its holder
    inserts requests naming a target (their foreign key check, at its commit, waits for any
    ``FOR UPDATE`` of the target's row) and cancels the requests of work items DROP
    removed: a transaction that held a target or a request while it waited for this lock
    would deadlock with it. Requests before their target, because a delivery
    batch holds its requests and, answered 410 Gone, updates their target. A transaction
    holding none of these may take it later (after inserting its own new rows, say). A
    broker's first consumer set takes it before attaching its partition of the consumer
    hashes: the attach locks the default partition, which the holder of this lock reads
    when matching a broker that has no partition of its own.

    A cycle before its work items: the report holds its cycle while it marks the cycle's
    items, and an import closing the items DROP removed then refreshes earlier cycles.
    Requests before their work items: a delivery batch or a callback holds its request while
    it settles the request's item, and an import cancels the requests of the items it
    removes. Work items by id, because a delivery batch and a retirement each settle several
    in one transaction; settling a SaaS deletion takes its resolution's row just before its
    item's, so those go by (work item, resolution) (``DeliveryKind.settles``). One statement
    updating many work items takes them as its plan reads them, so each that may meet a
    settler locks its rows by id first: the late match (whose new requests' foreign key
    checks would take the rest at commit, as they were written), a file's rows released or
    given up, and closing the items DROP removed (its requests cancelled first: a batch
    holding one is waited for there; but DROP may be taking a file of those items at the
    same time: DROP taking a file locks the file's cycle first, as the import locks the
    open cycles before closing items). The exception, measured: the report's two markings
    of a cycle's million rows (the write's, and DROP taking a file) do not lock by id, since
    the pass costs a quarter of the report's time (docs/benchmarks.md, reporting). They
    meet a settler only on items whose status staff set while their SaaS deletions were
    out; PostgreSQL then ends one of the two ("deadlock detected"): a job runs again at its
    next try, a hand ``drop report`` is run again.
    """
    with connection.cursor() as cursor:
        advisory_xact_lock(cursor, purpose=_MATCHING_LOCK, key=broker.pk, timeout=timeout)
