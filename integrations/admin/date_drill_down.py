"""A list's date drill-down (``date_hierarchy``) at the calendar's edge: a bad filter, not a 500.

Django reads the drill-down's year, month and day inside a ``try``, but computes the end of
the period after it (Django ticket #37357): the year 9999 has no next year, so
``?created_at__year=9999`` raised ``ValueError`` (or ``OverflowError``) from the list. Here
that is an ``IncorrectLookupParameters``, as any other filter the list cannot apply: the list
answers with Django's "invalid filter" redirect, the ledger's export with a 400. Every admin
with a ``date_hierarchy`` takes it::

    class LedgerEventAdmin(DateDrillDownBounded, ModelAdmin): ...

(the axes admins through ``superuser_only.narrow_to_superusers``).

A list of millions of rows (the ledger) also says its field is indexed
(``date_hierarchy_indexed = True``): Django lists the years, months or days that hold a row
with ``SELECT DISTINCT date_trunc(...)`` over every row of the period, seconds on every page
at a few million events. Here each candidate period between the first and last row (both
read from the index) is asked for its first row (``ORDER BY`` the field ``LIMIT 1``, an index
probe): at most 31 small queries for the days of a month, the same links.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator
from typing import Any

from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import Max, Min, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from unfold.views import ChangeList

# More candidate periods than this (a drill-down of years over centuries of bad data):
# Django's own query.
_MOST_PROBES = 62


class BoundedDateChangeList(ChangeList):
    def get_filters(self, request: HttpRequest) -> Any:
        try:
            return super().get_filters(request)
        except (ValueError, OverflowError) as exc:
            raise IncorrectLookupParameters(exc) from exc

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet:
        listed = super().get_queryset(request, exclude_parameters)
        if self.date_hierarchy and getattr(self.model_admin, "date_hierarchy_indexed", False):
            listed.__class__ = _probed(type(listed))
        return listed


def _probed(queryset_class: type[QuerySet]) -> type[QuerySet]:
    """``queryset_class`` whose ``datetimes`` probes each period (see above)."""
    return type(f"Probed{queryset_class.__name__}", (PeriodsProbed, queryset_class), {})


class PeriodsProbed(QuerySet):
    def datetimes(self, field_name: str, kind: Any, order: Any = "ASC", tzinfo: Any = None) -> Any:
        zone = tzinfo or timezone.get_current_timezone()
        bounds = self.aggregate(first=Min(field_name), last=Max(field_name))
        if bounds["first"] is None or kind not in ("year", "month", "day"):
            return super().datetimes(field_name, kind, order, tzinfo)
        first, last = bounds["first"].astimezone(zone), bounds["last"].astimezone(zone)
        try:
            starts = list(itertools.islice(_period_starts(first, last, kind), _MOST_PROBES + 1))
            ends = [*starts[1:], _next_start(starts[-1], kind)]
        except (ValueError, OverflowError):  # a period past the year 9999
            starts = []
        if not starts or len(starts) > _MOST_PROBES:
            return super().datetimes(field_name, kind, order, tzinfo)
        # Ordered by the field: the planner walks its index from the period's start. Without
        # it (``exists()`` drops the order) it may scan the table from the far end for one row.
        found = [
            start
            for start, end in zip(starts, ends, strict=True)
            if self.filter(**{f"{field_name}__gte": start, f"{field_name}__lt": end})
            .order_by(field_name)
            .values_list(field_name)[:1]
        ]
        return found if order == "ASC" else found[::-1]


def _period_starts(first: dt.datetime, last: dt.datetime, kind: str) -> Iterator[dt.datetime]:
    """The starts of the years, months or days from ``first``'s to ``last``'s, in their zone
    (a day's start is its local midnight, whatever the clocks did that day)."""
    start = _truncated(first, kind)
    while start <= last:
        yield start
        start = _next_start(start, kind)


def _truncated(moment: dt.datetime, kind: str) -> dt.datetime:
    day = moment.date().replace(
        month=1 if kind == "year" else moment.month, day=1 if kind != "day" else moment.day
    )
    return _local_midnight(day, moment.tzinfo)


def _next_start(start: dt.datetime, kind: str) -> dt.datetime:
    day = start.date()
    if kind == "year":
        day = day.replace(year=day.year + 1)
    elif kind == "month":
        day = (day.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
    else:
        day += dt.timedelta(days=1)
    return _local_midnight(day, start.tzinfo)


def _local_midnight(day: dt.date, zone: Any) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=zone)


class DateDrillDownBounded:
    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return BoundedDateChangeList
