"""How the admin shows a long identifier: its first 8 characters, whole on hover, copyable.

A UUID in full wraps over four lines of a list; staff recognise one by its start and copy
the rest when they need it (``integrations/static/integrations/console.js`` does the copy)::

    readonly_preprocess_fields = {"request_uuid": uuid_short}   # on a record's page
    uuid_link(obj.request_uuid, url)                            # as a list's link column
"""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString

SHOWN = 8


def _copy_button(full: str) -> SafeString:
    return format_html(
        '<button type="button" class="dp-copy" data-copy="{}" aria-label="Copy {}" '
        'title="Copy">'
        '<span class="material-symbols-outlined" aria-hidden="true">content_copy</span>'
        "</button>",
        full,
        full,
    )


def uuid_short(value: Any) -> SafeString:
    """``value`` (a UUID, or a record page's rendered text of one) as 8 characters + copy."""
    full = str(value).strip()
    if not full or full == "-":
        return format_html("{}", full)
    return format_html(
        '<span class="dp-uuid"><code title="{}">{}</code>{}</span>',
        full,
        full[:SHOWN],
        _copy_button(full),
    )


def uuid_link(value: Any, url: str) -> SafeString:
    """A list's link to a record, named by its identifier's start; the copy button beside
    the link, not inside it (a button in a link is two controls in one)."""
    full = str(value)
    return format_html(
        '<span class="dp-uuid"><a href="{}" title="{}"><code>{}</code></a>{}</span>',
        url,
        full,
        full[:SHOWN],
        _copy_button(full),
    )
