"""Advisory locks that serialize write services across processes and hosts.

``pg_advisory_xact_lock(int, int)``: the first key names the lock's purpose, the second is
the row it guards; held until the end of the caller's transaction. Two-key locks never
collide with the ledger sealer's one-key lock.
"""

from __future__ import annotations

from django.db import connection

from integrations.models import Broker

_MATCHING_LOCK = 0x6D617463  # "matc"


def matching_lock(*, broker: Broker) -> None:
    """Serialize matching for ``broker`` until the end of the current transaction.

    Matching a download, matching a late consumer and giving pending requests their
    targets all take it before they read: each one's snapshot then sees every consumer hash,
    work item and target committed by the others, and whatever another has not committed
    yet is matched by that one once it gets the lock.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_MATCHING_LOCK, broker.pk])
