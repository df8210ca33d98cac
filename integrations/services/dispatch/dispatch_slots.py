"""Dispatch slots: at most ``DROPPORTAL_DISPATCH_SLOTS_PER_BROKER`` delivery batches per broker
in flight at once, across every worker, so one slow broker cannot hold every worker::

    if broker_slot_take("4821", wait=5.0):   # held until the transaction ends
        ...deliver the broker's batch...

A slot is a PostgreSQL advisory lock held by the batch's transaction (nothing to release, and
a worker that dies frees its slots).
"""

from __future__ import annotations

import random

from django.conf import settings
from django.db import connection, transaction

from integrations.services.locks import LockBusy, lock_wait_bounded

# The first key of the advisory locks that are dispatch slots (the second: broker and slot).
SLOT_LOCK_SPACE = 0x44505344  # "DPSD"


def broker_slot_take(broker_id: str, *, wait: float = 0) -> bool:
    """Take one of ``broker_id``'s dispatch slots until the transaction ends, waiting up to
    ``wait`` seconds for one; False when every one stays taken (by other batches in flight,
    on any worker)."""
    slots = int(settings.DROPPORTAL_DISPATCH_SLOTS_PER_BROKER)
    if slots <= 0:
        return True
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT slot FROM generate_series(0, %s - 1) AS slot"
            " WHERE pg_try_advisory_xact_lock(%s, hashtext(%s || ':' || slot)) LIMIT 1",
            [slots, SLOT_LOCK_SPACE, broker_id],
        )
        if cursor.fetchone() is not None:
            return True
        if wait <= 0:
            return False
        try:
            # A savepoint: a lock timeout must not end the batch.
            with transaction.atomic(), lock_wait_bounded(cursor, wait):
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(%s, hashtext(%s || ':' || %s))",
                    [SLOT_LOCK_SPACE, broker_id, random.randrange(slots)],  # noqa: S311
                )
        except LockBusy:  # every slot stayed taken
            return False
        return True
