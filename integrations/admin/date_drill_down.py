"""A list's date drill-down (``date_hierarchy``) at the calendar's edge: a bad filter, not a 500.

Django reads the drill-down's year, month and day inside a ``try``, but computes the end of
the period after it (Django ticket #37357): the year 9999 has no next year, so
``?created_at__year=9999`` raised ``ValueError`` (or ``OverflowError``) from the list. Here
that is an ``IncorrectLookupParameters``, as any other filter the list cannot apply: the list
answers with Django's "invalid filter" redirect, the ledger's export with a 400. Every admin
with a ``date_hierarchy`` takes it::

    class LedgerEventAdmin(DateDrillDownBounded, ModelAdmin): ...

(the axes admins through ``superuser_only.narrow_to_superusers``).
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin.options import IncorrectLookupParameters
from django.http import HttpRequest
from unfold.views import ChangeList


class BoundedDateChangeList(ChangeList):
    def get_filters(self, request: HttpRequest) -> Any:
        try:
            return super().get_filters(request)
        except (ValueError, OverflowError) as exc:
            raise IncorrectLookupParameters(exc) from exc


class DateDrillDownBounded:
    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return BoundedDateChangeList
