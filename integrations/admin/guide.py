"""The broker guide (``docs/broker-guide.md``) rendered for staff inside the admin.

Guided pages link straight to its sections (``/admin/guide/#webhook-secret``), so the person
handing a secret to the broker sees where it goes without leaving the admin. The file is read
from the checkout, rendered once per change of the file, and is trusted content (ours)::

    path("guide/", site.admin_view(broker_guide_view), name="broker_guide")
"""

from __future__ import annotations

import functools
from pathlib import Path

import markdown
from django.conf import settings
from django.contrib import admin
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.safestring import SafeString, mark_safe


def guide_path() -> Path:
    return Path(settings.BASE_DIR) / "docs" / "broker-guide.md"


@functools.lru_cache(maxsize=4)
def _rendered(path: Path, mtime: float) -> tuple[SafeString, SafeString]:
    """(body, table of contents) of the guide as it was at ``mtime``."""
    converter = markdown.Markdown(
        extensions=["toc", "tables", "fenced_code"],
        extension_configs={"toc": {"toc_depth": "2-3"}},
    )
    body = converter.convert(path.read_text(encoding="utf-8"))
    # The guide is our own file from the checkout, not user input.
    return mark_safe(body), mark_safe(converter.toc)  # type: ignore[attr-defined]  # noqa: S308


def broker_guide_view(request: HttpRequest) -> HttpResponse:
    path = guide_path()
    try:
        body, toc = _rendered(path, path.stat().st_mtime)
    except FileNotFoundError:
        raise Http404("docs/broker-guide.md is not in this installation") from None
    context = {
        **admin.site.each_context(request),
        "title": "Broker integration guide",
        "guide": body,
        "toc": toc,
    }
    return TemplateResponse(request, "admin/broker_guide.html", context)
