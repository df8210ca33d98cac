"""The big lists' count, read no further than a cap: "10,000+ work items", not a count of all.

Django's list counts every row it lists on each page (``paginator.count``), filters and
search applied: over hundreds of millions of consumers, or millions of work items, requests
or ledger events, that ``COUNT(*)`` alone passes the web statement bound. Here the count
stops at ``cap + 1`` rows (``SELECT count(*) FROM (... LIMIT cap + 1)``, no ordering, no
annotations); beyond the cap the list's foot, its header and "Select all" read "10,000+",
and its page links end at the cap's page (filters and search reach further rows)::

    @admin.register(WorkItem)
    class WorkItemAdmin(ModelAdmin):
        paginator = CappedCountPaginator
        show_full_result_count = False  # the unfiltered total is a second count of all
"""

from __future__ import annotations

from math import ceil
from typing import Any

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property


class CountAtLeast(int):
    """A count known only to pass the cap: it compares and pages as ``cap + 1`` rows, and
    reads "10,000+" wherever the admin prints it (a template, ``%s``, a plural's counter)."""

    def __str__(self) -> str:
        return f"{self - 1:,}+"


class CappedCountPaginator(Paginator):
    cap = 10_000
    object_list: QuerySet[Any]

    @cached_property
    def count(self) -> int:
        # Any cap + 1 rows tell the count passes it: no ORDER BY, and only the key selected,
        # so no annotation of the list's (a consumer's hash counts) is computed for them.
        first = self.object_list.order_by().values("pk")[: self.cap + 1].count()
        return CountAtLeast(first) if first > self.cap else first

    @cached_property
    def num_pages(self) -> int:
        if isinstance(self.count, CountAtLeast):
            return ceil(self.cap / self.per_page)  # the last page is the cap's, not the end
        return super().num_pages
