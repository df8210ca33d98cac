"""Unfold's list, its column headers worked out once per list rather than once per row.

Unfold's ``items_for_result`` (``unfold.templatetags.unfold_list``) rebuilds every column's
header (its label, its sort state and three sort links) for each row it renders, only to read
each header's text as the cell's ``data-label``; the table's own header row builds them once
more. They depend on the list alone (its columns, its ordering, its query string), so each
``ChangeList`` keeps the first ones built and every later call reads those: the same page.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.contrib.admin.views.main import ChangeList
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
