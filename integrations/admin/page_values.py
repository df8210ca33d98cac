"""Values read once for the page that shows them: ``page_value``, and through it a change
page's read-only values, each read once per object and page.

Unfold's read-only field (``unfold.fields.UnfoldAdminReadonlyField``) looks its value up as
it is built (``_resolve_field``) and again each time its template reads ``contents``, and its
row's classes build the row's fields once more: a ModelAdmin method shown read-only (a
broker's list selections, an integration's waiting deliveries, a canary round's results) ran
its queries three times for one page. Each value is kept on the object shown, the first time
it is looked up, for the page rendered from that object::

    readonly_values_read_once()   # DropportalAdminConfig.ready

``page_value`` is that keeping, for what an admin reads of the object shown in more than one
place of its page (a broker's selections: its form and its history) or for a whole list's
rows at once (``page_value_set``: a page of canary rounds judged in one query).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.contrib.admin.utils import lookup_field
from unfold import fields as unfold_fields

_KEPT = "_dropportal_page_values"
_T = TypeVar("_T")


def page_value(obj: Any, name: Any, read: Callable[[], _T]) -> _T:
    """What ``read()`` gives, kept on ``obj`` (an object a page shows) under ``name``: read
    once for the page. An exception is not kept: it is raised again on the next read."""
    kept: dict[Any, Any] = obj.__dict__.setdefault(_KEPT, {})
    if name not in kept:
        kept[name] = read()
    return kept[name]  # type: ignore[no-any-return]


def page_value_set(obj: Any, name: Any, value: object) -> None:
    """``value`` kept on ``obj`` under ``name``, read at once for many objects."""
    obj.__dict__.setdefault(_KEPT, {})[name] = value


def lookup_field_once(name: Any, obj: Any, model_admin: Any = None) -> Any:
    """Django's lookup, its value kept on ``obj``; an exception is not kept, so unfold
    handles it (or the page fails) as without the cache, each time it is read."""
    return page_value(obj, (name, model_admin), lambda: lookup_field(name, obj, model_admin))


def readonly_values_read_once() -> None:
    """In place of Django's lookup, for unfold's read-only fields alone."""
    unfold_fields.lookup_field = lookup_field_once  # type: ignore[attr-defined]
