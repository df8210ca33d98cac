"""Reading the admin's pages in tests without depending on the theme's CSS classes.

Unfold adds its own classes after Django's ``field-<name>`` on each list cell, and its own
attributes on links; these helpers find the cells and links by Django's names alone::

    assert cells(page, "days_left") == ["3 days"]
"""

from __future__ import annotations

import re


def cells(page: str, field: str) -> list[str]:
    """The inner HTML of each list cell of column ``field``, in page order, stripped."""
    pattern = rf'<t[dh] class="field-{re.escape(field)}(?:"| [^"]*")[^>]*>(.*?)</t[dh]>'
    return [inner.strip() for inner in re.findall(pattern, page, flags=re.DOTALL)]


def link_texts(page: str, href_pattern: str) -> list[str]:
    """The texts of the links whose href matches ``href_pattern`` (a regex)."""
    pattern = rf'<a href="{href_pattern}"[^>]*>\s*([^<]*?)\s*</a>'
    return re.findall(pattern, page)
