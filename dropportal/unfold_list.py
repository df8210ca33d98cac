"""Unfold's list, its column headers worked out once per list rather than once per row, and
the list's full count read only when the list is narrowed.

Unfold's ``items_for_result`` (``unfold.templatetags.unfold_list``) rebuilds every column's
header (its label, its sort state and three sort links) for each row it renders, only to read
each header's text as the cell's ``data-label``; the table's own header row builds them once
more. They depend on the list alone (its columns, its ordering, its query string), so each
``ChangeList`` keeps the first ones built and every later call reads those: the same page.

Django's ``ChangeList.get_results`` counts the listed rows and then, for "3 results (40
total)", every row of the admin's queryset again: on a list with no filter, search or date
drill-down applied, the same ``COUNT(*)`` twice. Here the second is run only when the list's
query selects other rows than the admin's own; otherwise the total is the count just read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from unfold.templatetags import unfold_list

# Unfold's own (its module attribute is replaced by ``result_headers`` below).
_unfold_result_headers = getattr(
    unfold_list.result_headers, "__wrapped__", unfold_list.result_headers
)
_KEPT = "_dropportal_result_headers"


def result_headers(cl: ChangeList) -> Iterator[dict[str, Any]]:
    kept = cl.__dict__.get(_KEPT)
    if kept is None:
        kept = list(_unfold_result_headers(cl))
        setattr(cl, _KEPT, kept)
    return iter(kept)


result_headers.__wrapped__ = _unfold_result_headers  # type: ignore[attr-defined]


def result_headers_once_per_list() -> None:
    """In place of unfold's, for its list tag and each row (``DropportalAdminConfig.ready``)."""
    unfold_list.result_headers = result_headers


# Django's own (its class attribute is replaced by ``results_counted_once`` below).
_django_get_results = getattr(ChangeList.get_results, "__wrapped__", ChangeList.get_results)


def _lists_every_row(listed: QuerySet[Any], root: QuerySet[Any]) -> bool:
    """Whether ``listed`` (the root, ordered and perhaps filtered) selects every row of
    ``root``: its count is then the root's.

    Only what a filter, search or drill-down changes is compared; anything else that differs
    (a join, an annotation, a DISTINCT) counts as narrowed, and the total is counted.
    """
    a, b = listed.query, root.query
    return (
        a.where == b.where
        and a.distinct == b.distinct
        and a.distinct_fields == b.distinct_fields
        and a.combinator is None
        and b.combinator is None
        and not a.is_sliced
        and not b.is_sliced
        and a.group_by == b.group_by
        and a.annotations.keys() == b.annotations.keys()
        and a.alias_map.keys() == b.alias_map.keys()
        and a.extra == b.extra
        and a.extra_tables == b.extra_tables
    )


class _TotalNotCounted:
    """Stands for the root queryset while Django's ``get_results`` runs: no query."""

    def count(self) -> None:
        return None


def results_counted_once(cl: ChangeList, request: HttpRequest) -> None:
    """Django's ``ChangeList.get_results``, the admin's full count not read again when the
    list selects every row of the admin's queryset (``_lists_every_row``): that total is the
    list's own count. Narrowed, or with ``show_full_result_count`` off, it is Django's."""
    if not (
        cl.model_admin.show_full_result_count and _lists_every_row(cl.queryset, cl.root_queryset)
    ):
        _django_get_results(cl, request)
        return
    root = cl.root_queryset
    cl.root_queryset = _TotalNotCounted()  # type: ignore[assignment]
    try:
        _django_get_results(cl, request)
    finally:
        cl.root_queryset = root
    # What Django derives from the total, as it would with the total counted: its
    # ``ChangeList.get_results`` sets both (show_full_result_count is on here); keep in step.
    cl.full_result_count = cl.result_count
    cl.show_admin_actions = bool(cl.full_result_count)


results_counted_once.__wrapped__ = _django_get_results  # type: ignore[attr-defined]


def full_count_only_when_narrowed() -> None:
    """In place of Django's, for every list of the site (``DropportalAdminConfig.ready``)."""
    ChangeList.get_results = results_counted_once  # type: ignore[method-assign,assignment]
