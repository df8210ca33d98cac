"""A change page's object read once per page, not once by our view and again by Django's.

A ``change_view`` that builds its context from the object (a cycle's progress, a work
item's story, a consumer's work items) reads it with ``get_object`` and hands on to Django's
``changeform_view``, which reads it again: the same row, through the same queryset (for a
cycle, the urgency selector's aggregates), twice on every page view.

``PageObjectReadOnce`` keeps what ``get_object`` read on the request, for that ModelAdmin
and that id, and Django's read takes it from there. Only for a GET or HEAD: a page that is
shown, not one that saves (a POST reads its object inside Django's transaction, as before).
The request ends and the object with it; nothing is kept across requests.

``PageRowsReadTogether`` reads the object with the rows its list reads with it
(``list_select_related``), so that its page does not read each of them again.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from django.db.models import Model
from django.http import HttpRequest

_ModelT = TypeVar("_ModelT", bound=Model)
_READ = "_dp_page_objects"
_SHOWN = frozenset({"GET", "HEAD"})


class PageObjectReadOnce(Generic[_ModelT]):
    """Before ``ModelAdmin`` in the bases, with the admin's model:
    ``class CycleAdmin(PageObjectReadOnce[DropCycle], ModelAdmin)``."""

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> _ModelT | None:
        read = super().get_object  # type: ignore[misc]
        if request.method not in _SHOWN:
            return read(request, object_id, from_field)  # type: ignore[no-any-return]
        kept: dict[tuple[Any, ...], _ModelT | None] = request.__dict__.setdefault(_READ, {})
        key = (self, str(object_id), from_field)
        if key not in kept:
            kept[key] = read(request, object_id, from_field)
        return kept[key]


class PageRowsReadTogether:
    """Before ``ModelAdmin`` in the bases: every row is read with the related rows its list
    reads (``list_select_related``), on its change page too, where Django's ``get_object``
    would otherwise read each shown foreign key (and the broker in a cycle's name) on its
    own."""

    list_select_related: Any

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).select_related(*self.list_select_related)  # type: ignore[misc]
