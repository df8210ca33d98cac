"""DROP access: every pull and notification of the pack's time, the longest gap between two
downloads against the cadence the law sets (``DROPPORTAL_DOWNLOAD_CADENCE_DAYS``, 45 days),
the failures, the outages and the written notices to CalPrivacy a long one obliges.

A download is a successful pull (``drop.pulled``, whether DROP had something new or not: the
broker reached its list; not one that resumed a package downloaded before) or a cycle's
download (a package fetched by hand and imported counts from the time it was downloaded). The
gaps run from the last download before the pack's time, through every download in it, to its
end (a gap still open counts too); with no download before the pack's time, the gap up to its
first download (or its end) counts from its start, or from the broker's set-up if later. No
gap counts from before the law's duty to download began (``selectors.pulls``
``download_clock_from``): the time before it is no gap.
Everything is counted in SQL; each access event is one row of ``components/drop_access.csv``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import F

from integrations.drop.calendar import drop_date
from integrations.exports import rechunk
from integrations.ledger_kinds import LedgerKind
from integrations.models import DropAccessObligation, DropOutage, LedgerEvent
from integrations.selectors.pulls import (
    download_clock_from,
    download_clock_from_sql,
    drop_pulls_reached,
)
from integrations.services.evidence.components.base import Component, PackContext
from integrations.services.evidence.evidence_writer import CsvRecordCounter

FILE = "components/drop_access.csv"
ACCESS_KINDS = (
    LedgerKind.DROP_PULLED,
    LedgerKind.DROP_PULL_FAILED,
    LedgerKind.DROP_NOTIFICATION_RECEIVED,
    LedgerKind.DROP_API_CALL,
    LedgerKind.DROP_OUTAGE_STARTED,
    LedgerKind.DROP_OUTAGE_ENDED,
    LedgerKind.DROP_ACCESS_OBLIGATION_CREATED,
    LedgerKind.DROP_ACCESS_NOTICE_RECORDED,
)
# One row per access event but the API calls (several a pull; counted, and in the ledger).
_ROW_KINDS = [kind.value for kind in ACCESS_KINDS if kind != LedgerKind.DROP_API_CALL]

_DOWNLOADS = """
WITH downloads AS (
    -- The pulls that reached DROP (selectors.pulls.drop_pulls_reached): a resumed pull's
    -- package counts by its cycle's downloaded_at.
    SELECT at FROM ({pulls}) pulls
    UNION
    SELECT downloaded_at FROM integrations_dropcycle WHERE broker_id = %(broker)s
), kept AS (
    SELECT at FROM downloads WHERE at >= %(start)s AND at < %(end)s
    UNION
    SELECT max(at) FROM downloads WHERE at < %(start)s
), gaps AS (
    -- A gap opens no earlier than the duty to download began: the longest is the longest
    -- of the duty's time.
    SELECT CASE WHEN lag(at) OVER w IS NOT NULL THEN {previous} END AS previous, at
    FROM kept WHERE at IS NOT NULL WINDOW w AS (ORDER BY at)
)
SELECT (SELECT count(*) FROM kept WHERE at >= %(start)s),
       (SELECT max(at) FROM kept),
       g.previous, g.at,
       -- With no download before the pack's time, the first gap opens at its start, or
       -- when the broker was set up in the service (broker.created) if that is later.
       NOT EXISTS (SELECT 1 FROM downloads WHERE at < %(start)s),
       (SELECT min(at) FROM kept WHERE at >= %(start)s),
       (SELECT min(created_at) FROM integrations_ledgerevent
         WHERE kind = %(created_kind)s AND broker_id = %(broker_id)s)
FROM (SELECT 1) one
-- The longest in days of DROP's calendar (the cadence's unit), then in time.
LEFT JOIN LATERAL (SELECT previous, at FROM gaps WHERE previous IS NOT NULL AND at > previous
                   ORDER BY (at AT TIME ZONE %(zone)s)::date
                            - (previous AT TIME ZONE %(zone)s)::date DESC,
                            at - previous DESC, at
                   LIMIT 1) g ON true
"""
_COUNTS = """
SELECT kind, coalesce(data ->> 'outcome', data ->> 'reason', data ->> 'event_type', ''), count(*)
FROM integrations_ledgerevent
WHERE broker_id = %(broker_id)s AND kind = ANY(%(kinds)s)
  AND created_at >= %(start)s AND created_at < %(end)s
GROUP BY 1, 2 ORDER BY 1, 2
"""
_ROWS = """
COPY (SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US') || '+00:00',
             id, kind,
             coalesce(data ->> 'outcome', data ->> 'reason', data ->> 'event_type', ''),
             coalesce(data ->> 'drop_session_id', ''), coalesce(data ->> 'status', '')
        FROM integrations_ledgerevent
       WHERE broker_id = %(broker_id)s AND kind = ANY(%(row_kinds)s)
         AND created_at >= %(start)s AND created_at < %(end)s
       ORDER BY created_at, id)
TO STDOUT WITH (FORMAT csv)
"""
_HEADER = b"at,ledger_event_id,kind,outcome,drop_session_id,status\n"


def build(context: PackContext) -> Component:
    start, end = context.window
    cadence = dt.timedelta(days=settings.DROPPORTAL_DOWNLOAD_CADENCE_DAYS)
    component = Component(
        key="drop_access",
        proves=(
            "When the service reached DROP in the pack's time: every pull, its outcome and "
            "every failure, DROP's notifications, the outages of the automated connection, "
            "and the notices to CalPrivacy staff recorded for those that lasted more than a "
            "day; all of them ledger events, in the pack's ledger range."
        ),
        cannot_prove=(
            "That DROP made a list available when a pull found nothing new (DROP's own "
            "records are the counterpart), or that a notice staff recorded reached CalPrivacy "
            "(its reference is what to ask CalPrivacy about)."
        ),
    )
    params: dict[str, Any] = {
        "broker_id": context.broker.broker_id,
        "broker": context.broker.pk,
        "start": start,
        "end": end,
        "kinds": [kind.value for kind in ACCESS_KINDS],
        "created_kind": LedgerKind.BROKER_CREATED.value,
        "zone": settings.DROPPORTAL_DROP_TIMEZONE,
    }
    pulls = drop_pulls_reached(LedgerEvent.objects.filter(broker_id=context.broker.broker_id))
    # compose_sql: PostgreSQL's operations only (the stubs know the base class).
    query = pulls.values(at=F("reached_at")).query.sql_with_params()
    pulls_sql = connection.ops.compose_sql(*query)  # type: ignore[attr-defined]
    previous_sql = download_clock_from_sql("lag(at) OVER w")
    # Their values are bound already: a % left in them must not read as a parameter.
    downloads_sql = _DOWNLOADS.format(
        pulls=pulls_sql.replace("%", "%%"), previous=previous_sql.replace("%", "%%")
    )
    with connection.cursor() as cursor:
        cursor.execute(downloads_sql, params)
        downloads, last, gap_from, gap_to, none_before, first, set_up = cursor.fetchone()
        cursor.execute(_COUNTS, params)
        counts = cursor.fetchall()
    events: dict[str, dict[str, int]] = {}
    for kind, outcome, count in counts:
        events.setdefault(kind, {})[outcome or "(none)"] = count
    gaps: list[tuple[dt.datetime, dt.datetime | None]] = []  # (from, to or still open)
    if gap_from is not None:
        gaps.append((gap_from, gap_to))
    if last is not None:
        gaps.append((download_clock_from(last), None))  # still open at the pack's end
    if none_before:
        # Nothing before the pack's time: the time up to its first download (or all of it)
        # is a gap too, not "nothing to measure"; from the broker's set-up if later, and
        # never from before the duty began.
        opened = max(start, set_up) if set_up is not None else start
        gaps.append((download_clock_from(opened), first))
    # The law counts days, as the download-due alert does: the next download is on time
    # through the 45th day of DROP's calendar after the one before, whatever its hour. A
    # gap still open ends on the pack's last day (its end is excluded).
    last_day = drop_date(end - dt.timedelta(microseconds=1))

    def measured(gap: tuple[dt.datetime, dt.datetime | None]) -> tuple[int, dt.timedelta]:
        opened, closed = gap
        days = (drop_date(closed) if closed else last_day) - drop_date(opened)
        # A pack's time that ends before the duty began (or a first download before it)
        # leaves no time to count: none, not less than none.
        return max(days.days, 0), max((closed or end) - opened, dt.timedelta())

    # Never empty: without any download, the time before the first is a gap.
    longest_ends = max(gaps, key=measured)
    longest_days, longest = measured(longest_ends)
    outages = list(
        DropOutage.objects.filter(broker=context.broker, started_at__lt=end)
        .exclude(ended_at__lt=start)
        .order_by("started_at")
    )
    obligations = list(
        DropAccessObligation.objects.filter(outage__in=outages).order_by("due_date", "pk")
    )
    component.records = {
        "from": start.isoformat(),
        "to": end.isoformat(),
        "downloads": downloads,
        "events": events,
        "longest_gap_days": round(longest.total_seconds() / 86400, 2),
        "longest_gap_drop_days": longest_days,
        "longest_gap": {
            "from": longest_ends[0].isoformat() if longest_ends[0] else None,
            "to": longest_ends[1].isoformat() if longest_ends[1] else "open at the end",
        },
        "cadence_days": settings.DROPPORTAL_DOWNLOAD_CADENCE_DAYS,
        "outages": [_outage(outage) for outage in outages],
        "notices": [_obligation(obligation) for obligation in obligations],
    }
    component.test(
        f"a download at least every {cadence.days} days",
        passed=longest_days <= cadence.days,
        detail=f"longest gap {longest.total_seconds() / 86400:.2f} days, {longest_days} "
        f"days of DROP's calendar ({component.records['longest_gap']['from']} to "
        f"{component.records['longest_gap']['to']})"
        + ("; no download at all: the broker has not reached DROP" if last is None else ""),
    )
    today = drop_date(context.exported_at)
    late = [
        obligation
        for obligation in obligations
        if (obligation.notice_sent_on or today) > obligation.due_date
    ]
    component.test(
        "a written notice to CalPrivacy for each outage of more than a day, by its due date",
        passed=not late,
        detail=(
            f"{len(obligations)} outage(s) obliged a notice, all sent or not yet due"
            if not late
            else "; ".join(
                f"the outage from {drop_date(o.failure_started_at)} needed one by {o.due_date}: "
                + (f"sent {o.notice_sent_on}" if o.notice_sent_on else "none recorded")
                for o in late
            )
        ),
    )
    context.writer.write(
        FILE,
        _rows(params),
        rows=CsvRecordCounter(),
        description="DROP access: every pull, failure, notification, outage and notice of the "
        "pack's time, one row each (its ledger event's id)",
    )
    component.files.append(FILE)
    return component


def _rows(params: dict[str, object]) -> Iterator[bytes]:
    yield _HEADER
    with (
        connection.cursor() as cursor,
        cursor.copy(_ROWS, {**params, "row_kinds": _ROW_KINDS}) as copy,
    ):
        yield from rechunk(copy)


def _outage(outage: DropOutage) -> dict[str, object]:
    return {
        "started_at": outage.started_at.isoformat(),
        "ended_at": outage.ended_at.isoformat() if outage.ended_at else None,
        "failures": outage.failures,
        "last_error": outage.last_error,
    }


def _obligation(obligation: DropAccessObligation) -> dict[str, object]:
    return {
        "failure_started_at": obligation.failure_started_at.isoformat(),
        "due_date": obligation.due_date.isoformat(),
        "notice_sent_on": obligation.notice_sent_on.isoformat()
        if obligation.notice_sent_on
        else None,
        "notice_reference": obligation.notice_reference or None,
        "recorded_by": obligation.notice_recorded_by or None,
    }
