"""A change page's read-only values, each read once per object and page.

Unfold's read-only field (``unfold.fields.UnfoldAdminReadonlyField``) looks its value up as
it is built (``_resolve_field``) and again each time its template reads ``contents``, and its
row's classes build the row's fields once more: a ModelAdmin method shown read-only (a
broker's list selections, an integration's waiting deliveries, a canary round's results) ran
its queries three times for one page. Each value is kept on the object shown, the first time
it is looked up, for the page rendered from that object::

    readonly_values_read_once()   # DropportalAdminConfig.ready
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin.utils import lookup_field
from unfold import fields as unfold_fields

_KEPT = "_dropportal_readonly_values"


def lookup_field_once(name: Any, obj: Any, model_admin: Any = None) -> Any:
    """Django's lookup, its value kept on ``obj``; an exception is not kept, so unfold
    handles it (or the page fails) as without the cache, each time it is read."""
    kept: dict[tuple[Any, Any], Any] = obj.__dict__.setdefault(_KEPT, {})
    key = (name, model_admin)
    if key not in kept:
        kept[key] = lookup_field(name, obj, model_admin)
    return kept[key]


def readonly_values_read_once() -> None:
    """In place of Django's lookup, for unfold's read-only fields alone."""
    unfold_fields.lookup_field = lookup_field_once  # type: ignore[attr-defined]
