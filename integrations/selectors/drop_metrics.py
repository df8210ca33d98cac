"""The yearly DROP figures, per broker.

One pass over the year's work items in SQL (a year can hold tens of millions). Only the
work items of production cycles count: a cycle downloaded while the broker was in test mode
(DROP's sandbox, ``DropCycle.mode``) is no consumer's request. A work item
counts in the year its cycle was downloaded, in DROP's calendar (California's,
``drop.calendar``); its category is the status DROP holds
(the last one reported to it). The figures' admin links filter with ``METRIC_FILTERS``, and
the tests hold the two to the same counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q

from integrations.drop.calendar import drop_year_bounds
from integrations.drop.files import DATA_TYPE_TO_HASH_TYPE, REMOVED
from integrations.drop_statuses import DropStatus
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    BrokerMode,
    DeletionRequest,
    DropOutcome,
    ResolutionRequest,
    WorkItem,
    WorkItemState,
    no_status_held,
)
from integrations.selectors._common import LIST_TYPES

# DROP's figures group the statuses it holds: complied with, denied, not found.
METRIC_STATUSES: dict[str, tuple[DropStatus, ...]] = {
    "complied": (DropStatus.DELETED, DropStatus.OPTED_OUT),
    "denied": (DropStatus.EXEMPT,),
    "not_found": (DropStatus.NOT_FOUND,),
}


def _named(statuses: tuple[DropStatus, ...]) -> str:
    return ", ".join(f"{status.value} {status.label.lower()}" for status in statuses)


METRIC_FIGURES = (
    ("received", "Received (work items downloaded, rows not read included)"),
    ("matched", "Matched"),
    ("complied", f"Complied with ({_named(METRIC_STATUSES['complied'])})"),
    ("denied", f"Denied ({_named(METRIC_STATUSES['denied'])})"),
    ("not_found", f"{DropStatus.NOT_FOUND.label} ({DropStatus.NOT_FOUND.value})"),
    ("open", "Still open (no status reported)"),
    ("removed", "Removed by DROP"),
)
_NOT_REMOVED = ~Q(state=WorkItemState.REMOVED)
# Every figure counts the work items of production cycles only (``_YEAR_CYCLES``).
_PRODUCTION = Q(cycle__mode=BrokerMode.PRODUCTION)
METRIC_FILTERS: dict[str, Q] = {
    "received": _PRODUCTION,
    "matched": _PRODUCTION
    & (
        Q(Exists(DeletionRequest.objects.filter(work_item=OuterRef("pk"))))
        | Q(Exists(ResolutionRequest.objects.filter(work_item=OuterRef("pk"))))
    ),
    **{
        key: _PRODUCTION & _NOT_REMOVED & Q(reported_status_code__in=statuses)
        for key, statuses in METRIC_STATUSES.items()
    },
    "open": _PRODUCTION & no_status_held(),
    "removed": _PRODUCTION & Q(state=WorkItemState.REMOVED),
}


def _codes_in(key: str) -> str:
    """``IN (3, 4)``, a figure's codes as SQL (integers from DropStatus, never input)."""
    return "IN (" + ", ".join(str(int(status)) for status in METRIC_STATUSES[key]) + ")"


NOT_GIVEN = "(not given)"

# The year's production cycles: a cycle of DROP's sandbox (``DropCycle.mode``) holds no
# consumer's request, whatever the broker's mode is now.
_YEAR_CYCLES = """
SELECT c.id, c.drop_session_id, c.downloaded_at FROM integrations_dropcycle c
WHERE c.broker_id = %(broker)s AND c.downloaded_at >= %(start)s AND c.downloaded_at < %(end)s
  AND c.mode = %(production)s
"""
# One pass over the work items, narrow rows (the sort by list type for the ROLLUP and the
# ordered-set aggregates is most of the cost).
_METRICS_SQL = (
    "WITH cycles AS ("  # noqa: S608  (constants only)
    + _YEAR_CYCLES
    + """)
SELECT w.hash_type, count(*),
       count(*) FILTER (WHERE w.state <> %(removed)s AND w.reported_status_code {complied}),
       count(*) FILTER (WHERE w.state <> %(removed)s AND w.reported_status_code {denied}),
       count(*) FILTER (WHERE w.state <> %(removed)s AND w.reported_status_code {not_found}),
       -- "open": no_status_held (integrations.models), compiled by _metrics_sql
       count(*) FILTER (WHERE {{no_status_held}}),
       count(*) FILTER (WHERE w.state = %(removed)s),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY d.days),
       avg(d.days)
FROM cycles c
JOIN integrations_workitem w ON w.cycle_id = c.id
-- The days to respond count to the first status DROP took, not to a later amendment;
-- reported_at stands in for a row the old release reported while 0067 filled the column.
CROSS JOIN LATERAL (
    SELECT CASE WHEN w.reported_at IS NOT NULL AND w.reported_status_code IS NOT NULL
                AND w.state <> %(removed)s
                THEN extract(epoch FROM coalesce(w.first_reported_at, w.reported_at))
                     - extract(epoch FROM c.downloaded_at)
           END / 86400 AS days
) d
GROUP BY ROLLUP (w.hash_type)
"""
).format(**{key: _codes_in(key) for key in METRIC_STATUSES})


def _metrics_sql() -> str:
    """``_METRICS_SQL`` with its "open" figure's condition compiled from
    ``WorkItem.objects.no_status_held()`` (over ``w``), not restated: its values bound
    (as the client binds every parameter anyway), a ``%`` in them doubled for the
    statement's own parameters."""
    condition = WorkItem.objects.no_status_held().where_sql(alias="w")
    # compose_sql: PostgreSQL's operations only (the stubs know the base class).
    bound = connection.ops.compose_sql(*condition)  # type: ignore[attr-defined]
    return _METRICS_SQL.format(no_status_held=bound.replace("%", "%%"))


# Matched work items, from the requests (a tenth of the work items or less) rather than a
# join of every work item with them.
_MATCHED_SQL = (
    "WITH cycles AS ("  # noqa: S608  (constants only)
    + _YEAR_CYCLES
    + """), matched AS (
    SELECT d.work_item_id FROM integrations_deletionrequest d
    JOIN cycles c ON c.drop_session_id = d.drop_session_id
    WHERE d.broker_id = %(broker)s
    UNION
    SELECT r.work_item_id FROM integrations_resolutionrequest r
    JOIN cycles c ON c.drop_session_id = r.drop_session_id
    WHERE r.broker_id = %(broker)s
)
SELECT w.hash_type, count(*)
FROM matched m JOIN integrations_workitem w ON w.id = m.work_item_id
GROUP BY ROLLUP (w.hash_type)
"""
)
# The rows of the year's packages that could not be read as work items, per list file: the
# rows set aside one by one, as the import counted them (all of them; only the first thousand
# a list are kept as rows), and the data rows of the lists set aside whole, as the cycle keeps
# them. DROP sent each as a request: they are received, and in no other figure.
_UNREADABLE_SQL = (
    "WITH cycles AS ("
    + _YEAR_CYCLES
    + """)
SELECT r.key, r.value::bigint
FROM cycles c
JOIN integrations_ledgerevent e
  ON e.broker_id = %(broker_id)s AND e.kind = %(imported)s AND e.subject = c.drop_session_id
CROSS JOIN LATERAL jsonb_each_text(coalesce(e.data -> 'unreadable_rows', '{}'::jsonb)) r
UNION ALL
SELECT u.key, u.value::bigint
FROM cycles c
JOIN integrations_dropcycle d ON d.id = c.id
CROSS JOIN LATERAL jsonb_each_text(d.unread_rows) u
"""
)
# Why a denial: the exemption basis of a resolution's "exempt" (a deletion callback's exempt
# carries none).
_EXEMPTION_BASES_SQL = """
SELECT coalesce((SELECT min(r.exemption_basis) FROM integrations_resolutionrequest r
                 WHERE r.work_item_id = w.id AND r.drop_outcome = %(exempt)s
                   AND r.exemption_basis <> ''), %(not_given)s), count(*)
FROM integrations_dropcycle c JOIN integrations_workitem w ON w.cycle_id = c.id
WHERE c.broker_id = %(broker)s AND c.downloaded_at >= %(start)s AND c.downloaded_at < %(end)s
  AND c.mode = %(production)s AND w.state <> %(removed)s AND w.reported_status_code {denied}
GROUP BY 1 ORDER BY 2 DESC, 1
""".format(denied=_codes_in("denied"))  # noqa: S608  (constants only)


# Complied with in part: a work item DROP holds as complied with (3 or 4) of which one of the
# requests made for it (not a recurring round) was answered exempt: some of the consumer's
# data was kept under an exemption, the rest deleted or opted out.
_IN_PART_SQL = (
    "WITH cycles AS ("  # noqa: S608  (constants only)
    + _YEAR_CYCLES
    + """), exempted AS (
    SELECT d.work_item_id FROM integrations_deletionrequest d
    JOIN cycles c ON c.drop_session_id = d.drop_session_id
    WHERE d.broker_id = %(broker)s AND d.drop_outcome = %(exempt)s AND d.round = 0
    UNION
    SELECT r.work_item_id FROM integrations_resolutionrequest r
    JOIN cycles c ON c.drop_session_id = r.drop_session_id
    WHERE r.broker_id = %(broker)s AND r.drop_outcome = %(exempt)s AND r.round = 0
)
SELECT count(*) FROM exempted e JOIN integrations_workitem w ON w.id = e.work_item_id
WHERE w.state <> %(removed)s AND w.reported_status_code {complied}
"""
).format(complied=_codes_in("complied"))

# The Delete Act registration's columns for deletion requests received through DROP.
REGISTRY_COLUMNS = (
    ("received", "Deletion requests received from DROP"),
    ("complied_in_whole", "Complied with in whole"),
    ("complied_in_part", "Complied with in part"),
    ("denied", "Denied"),
    ("mean_days", "Mean days to respond"),
    ("median_days", "Median days to respond"),
)


@dataclass(frozen=True)
class MetricRow:
    list_type: str  # "Email", ..., or "Total"
    hash_type: str  # "" for the total
    figures: dict[str, int]
    median_days: float | None
    mean_days: float | None


@dataclass(frozen=True)
class DropMetrics:
    broker_id: str
    year: int
    rows: list[MetricRow]  # by list type, the total last
    exemption_bases: dict[str, int]

    @property
    def total(self) -> MetricRow:
        return self.rows[-1]

    def as_json(self) -> dict[str, Any]:
        return {
            "broker_id": self.broker_id,
            "year": self.year,
            "by_list_type": [_metric_row_json(row) for row in self.rows[:-1]],
            "total": _metric_row_json(self.total),
            "exemption_bases": self.exemption_bases,
        }


def _metric_row_json(row: MetricRow) -> dict[str, Any]:
    return {
        "list_type": row.list_type,
        **row.figures,
        "median_days": row.median_days,
        "mean_days": row.mean_days,
    }


def drop_metrics(*, broker: Broker, year: int) -> DropMetrics:
    """The year's DROP figures for ``broker``: counts by list type and in total, and the
    median and mean days from download to the first status DROP took, an amendment taken
    later not counted (rounded to 0.01)."""
    start, end = drop_year_bounds(year)
    params: dict[str, Any] = {
        "broker": broker.pk,
        "start": start,
        "end": end,
        "not_given": NOT_GIVEN,
        "removed": WorkItemState.REMOVED.value,
        "exempt": DropOutcome.EXEMPT.value,
        "broker_id": broker.broker_id,
        "imported": LedgerKind.DROP_CYCLE_IMPORTED.value,
        "production": BrokerMode.PRODUCTION.value,
    }
    by_type: dict[str | None, MetricRow] = {}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        cursor.execute("SET LOCAL work_mem = '256MB'")
        cursor.execute(_MATCHED_SQL, params)
        matched = dict(cursor.fetchall())
        cursor.execute(_metrics_sql(), params)
        for hash_type, received, *counts, median, mean in cursor.fetchall():
            figures = [received, matched.get(hash_type, 0), *counts]
            by_type[hash_type] = MetricRow(
                list_type=_list_type_name(hash_type),
                hash_type=hash_type or "",
                figures=dict(zip([k for k, _ in METRIC_FIGURES], figures, strict=True)),
                median_days=None if median is None else round(float(median), 2),
                mean_days=None if mean is None else round(float(mean), 2),
            )
        cursor.execute(_EXEMPTION_BASES_SQL, params)
        bases = dict(cursor.fetchall())
        cursor.execute(_UNREADABLE_SQL, params)
        unreadable = cursor.fetchall()
    for file_name, rows in unreadable:
        for key in _received_in(file_name):
            if key not in by_type:
                by_type[key] = _metric_row_empty(key)
            by_type[key].figures["received"] += rows
    total = by_type.pop(None, None) or _metric_row_empty(None)
    rows = [by_type[hash_type] for hash_type, _ in LIST_TYPES if hash_type in by_type]
    return DropMetrics(broker.broker_id, year, [*rows, total], bases)


def drop_registry_figures(*, broker: Broker, year: int) -> dict[str, Any]:
    """The registration's columns for ``year`` (``REGISTRY_COLUMNS``), from the yearly figures'
    totals and one count of the compliances in part (``docs/audit.md`` says how each counts)."""
    metrics = drop_metrics(broker=broker, year=year)
    start, end = drop_year_bounds(year)
    with connection.cursor() as cursor:
        cursor.execute(
            _IN_PART_SQL,
            {
                "broker": broker.pk,
                "start": start,
                "end": end,
                "exempt": DropOutcome.EXEMPT.value,
                "removed": WorkItemState.REMOVED.value,
                "production": BrokerMode.PRODUCTION.value,
            },
        )
        in_part = int(cursor.fetchone()[0])
    total = metrics.total
    return {
        "broker_id": broker.broker_id,
        "year": year,
        "received": total.figures["received"],
        "complied_in_whole": total.figures["complied"] - in_part,
        "complied_in_part": in_part,
        "denied": total.figures["denied"],
        "mean_days": total.mean_days,
        "median_days": total.median_days,
    }


def sandbox_note(broker: Broker) -> str:
    """One line for the figures of a broker in test mode: what they count."""
    return (
        f"Broker {broker.broker_id} is in test mode (DROP's sandbox): these figures count only "
        "the cycles it downloaded in production mode; its sandbox cycles are no consumer "
        "requests and are left out."
    )


def _list_type_name(hash_type: str | None) -> str:
    """A row's list type as shown: "Email"..., or "Total" for the total (None)."""
    return dict(LIST_TYPES).get(hash_type, hash_type) if hash_type else "Total"


def _metric_row_empty(hash_type: str | None) -> MetricRow:
    """A row no work item reached (every figure 0, no days): a list type, or the Total."""
    figures = {key: 0 for key, _ in METRIC_FIGURES}
    return MetricRow(_list_type_name(hash_type), hash_type or "", figures, None, None)


def _received_in(file_name: str) -> tuple[str | None, ...]:
    """Where a list file's rows count as received: its list type's row and the Total (None);
    the Total alone for a type this version does not know; nowhere for the Removed file,
    whose rows are no requests. Its type is read from the name even when the name is
    otherwise wrong (a bad date): such a list is still that type's."""
    parts = file_name.split("_")
    data_type = parts[2].split(".")[0] if len(parts) > 2 else ""
    if data_type == REMOVED:
        return ()
    hash_type = DATA_TYPE_TO_HASH_TYPE.get(data_type)
    return (None,) if hash_type is None else (hash_type, None)
