"""Suppression list: its size per list type at export, the reappearances of the pack's time
by source, and the checks made against it; tested against the ledger and the requests."""

from __future__ import annotations

from typing import Any

from django.db import connection

from integrations.ledger_kinds import LedgerKind
from integrations.models import Reappearance, WorkItemState
from integrations.services.evidence.components.base import Component, PackContext

_SIZE = """
SELECT hash_type, count(DISTINCT hash) FROM integrations_workitem
WHERE broker_id = %(broker)s AND state <> %(removed)s
GROUP BY hash_type ORDER BY hash_type
"""
_BY_SOURCE = """
SELECT CASE WHEN api_key_prefix <> '' THEN 'api key ' || api_key_prefix ELSE source END,
       source_sha256, count(*), count(DISTINCT work_item_id)
FROM integrations_reappearance
WHERE broker_id = %(broker)s AND reappeared_at >= %(start)s AND reappeared_at < %(end)s
GROUP BY 1, 2 ORDER BY 3 DESC, 1
"""
_LEDGER = """
SELECT kind, count(*),
       coalesce(sum((data ->> 'reappearances')::bigint), 0),
       coalesce(sum((data ->> 'entries')::bigint), 0),
       coalesce(sum((data ->> 'suppressed')::bigint), 0)
FROM integrations_ledgerevent
WHERE broker_id = %(broker_id)s AND kind = ANY(%(kinds)s)
  AND created_at >= %(start)s AND created_at < %(end)s
GROUP BY kind
"""
# The list is made of the work items DROP sent and did not remove: how many there are, and
# how many the ledger's imports and Removed files leave (all time, like the list). A work
# item deleted, or marked removed without a Removed file, takes a deleted person off the list
# silently: only the sealed events can say what should be on it.
_KEPT = """
SELECT count(*) FILTER (WHERE state <> %(removed)s) FROM integrations_workitem
WHERE broker_id = %(broker)s
"""
_KEPT_BY_LEDGER = """
SELECT coalesce(sum((data ->> 'work_items')::bigint) FILTER (WHERE kind = %(imported)s), 0)
     - coalesce(sum((data ->> 'work_items_closed')::bigint)
                FILTER (WHERE kind = %(removed_kind)s), 0)
FROM integrations_ledgerevent
WHERE broker_id = %(broker_id)s AND kind IN (%(imported)s, %(removed_kind)s)
"""
# Every reappearance and every consumers.reappeared event, over all time: the rows are
# stamped when their registration's transaction began, the event when it ends, so a window's
# edge may fall between them (a long import across the period's end).
_REAPPEARED_ALL = """
SELECT (SELECT count(*) FROM integrations_reappearance WHERE broker_id = %(broker)s),
       (SELECT coalesce(sum((data ->> 'reappearances')::bigint), 0)
          FROM integrations_ledgerevent
         WHERE broker_id = %(broker_id)s AND kind = %(reappeared)s)
"""
# A reappeared consumer (not forgotten since) that got no request for its work item.
_NOT_SENT = """
SELECT count(*) FROM integrations_reappearance r
WHERE r.broker_id = %(broker)s AND r.reappeared_at >= %(start)s AND r.reappeared_at < %(end)s
  AND r.consumer_id IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM integrations_deletionrequest d
                  WHERE d.work_item_id = r.work_item_id AND d.consumer_id = r.consumer_id)
  AND NOT EXISTS (SELECT 1 FROM integrations_resolutionrequest q
                  WHERE q.work_item_id = r.work_item_id AND q.consumer_id = r.consumer_id)
"""


def build(context: PackContext) -> Component:
    start, end = context.window
    component = Component(
        key="suppression_list",
        proves=(
            "How many hashes DROP sent and did not remove the broker keeps suppressed, per "
            "list type; each consumer registered again whose hash was already matched (a "
            "reappearance), by the source that brought it back, and that each got a deletion "
            "request again; how many suppression checks were made and what they found."
        ),
        cannot_prove=(
            "That the broker checks every acquisition against the list: only the checks made "
            "through this service (the API, the command) are counted, and data acquired and "
            "never registered here is not seen."
        ),
    )
    params: dict[str, Any] = {
        "broker": context.broker.pk,
        "broker_id": context.broker.broker_id,
        "removed": WorkItemState.REMOVED.value,
        "start": start,
        "end": end,
        "reappeared": LedgerKind.CONSUMERS_REAPPEARED.value,
        "imported": LedgerKind.DROP_CYCLE_IMPORTED.value,
        "removed_kind": LedgerKind.DROP_WORK_ITEMS_REMOVED.value,
        "kinds": [
            LedgerKind.CONSUMERS_REAPPEARED.value,
            LedgerKind.SUPPRESSION_CHECKED.value,
            LedgerKind.SUPPRESSION_EXPORTED.value,
        ],
    }
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL work_mem = '64MB'")  # the distinct count's sort, once
        cursor.execute(_SIZE, params)
        size = dict(cursor.fetchall())
        cursor.execute(_BY_SOURCE, params)
        sources = cursor.fetchall()
        cursor.execute(_LEDGER, params)
        ledger = {kind: rest for kind, *rest in cursor.fetchall()}
        cursor.execute(_NOT_SENT, params)
        not_sent = int(cursor.fetchone()[0])
        cursor.execute(_REAPPEARED_ALL, params)
        rows_all, ledgered_all = (int(n) for n in cursor.fetchone())
        cursor.execute(_KEPT, params)
        kept = int(cursor.fetchone()[0])
        cursor.execute(_KEPT_BY_LEDGER, params)
        kept_by_ledger = int(cursor.fetchone()[0])
    reappearances = Reappearance.objects.filter(
        broker=context.broker, reappeared_at__gte=start, reappeared_at__lt=end
    ).count()
    on_ledger = int(ledger.get(LedgerKind.CONSUMERS_REAPPEARED.value, (0, 0, 0, 0))[1])
    checks = ledger.get(LedgerKind.SUPPRESSION_CHECKED.value, (0, 0, 0, 0))
    component.records = {
        "size_at_export_by_list_type": size,
        "size_at_export": sum(size.values()),
        "work_items_on_list": kept,
        "work_items_by_ledger": kept_by_ledger,
        "reappearances": reappearances,
        "reappearances_by_source": [
            {"source": source, "sha256": sha256 or None, "reappearances": n, "work_items": items}
            for source, sha256, n, items in sources
        ],
        "checks": {
            "checks": int(checks[0]),
            "entries_checked": int(checks[2]),
            "suppressed_found": int(checks[3]),
        },
        "exports": int(ledger.get(LedgerKind.SUPPRESSION_EXPORTED.value, (0,))[0]),
    }
    component.test(
        "every hash DROP sent and did not remove is on the list",
        passed=kept == kept_by_ledger,
        detail=f"{kept} work item(s) on the list; the ledger's imports and removals leave "
        f"{kept_by_ledger}",
    )
    component.test(
        "every reappearance recorded on the ledger",
        passed=rows_all == ledgered_all,
        detail=f"{rows_all} reappearance(s), {ledgered_all} in consumers.reappeared events "
        f"(all time; in the pack's time {reappearances} and {on_ledger})",
    )
    component.test(
        "every reappeared consumer sent a deletion again",
        passed=not_sent == 0,
        detail=f"{not_sent} reappeared consumer(s) without a request for the work item"
        if not_sent
        else f"{reappearances} reappearance(s), each with its request",
    )
    return component
