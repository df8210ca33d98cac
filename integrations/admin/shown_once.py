"""Secrets shown exactly once: an API key, a Webhook Secret, right after staff created it.

A ModelAdmin that just created a secret answers with ``show_once(...)``: the secret waits,
encrypted, in a short-lived store bound to this session (``services.staff.shown_once``: 10 minutes
at most, never in the session table), the browser is redirected (so a reload cannot create a
second one) to a page that shows it with a copy button, says it will never be shown again,
and links the broker guide's section on where it goes. Rendering the page deletes it::

    def response_add(self, request, obj, post_url_continue=None):
        return show_once(request, SecretShownOnce(
            title="API key created", label="API key", secret=obj.created_key,
            facts=[("Prefix", obj.prefix)], guide_section="api-keys", guide_title="API keys",
            done_url=reverse("admin:integrations_apikey_changelist"), done_label="API keys"))

The page is ``no-store`` and only ever served to the session that created the secret.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse

from integrations.services.staff.shown_once import shown_once_put, shown_once_take


@dataclass(frozen=True)
class SecretShownOnce:
    title: str  # "API key created"
    label: str  # "API key"
    secret: str
    done_url: str
    done_label: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    explanation: str = ""
    guide_section: str = ""  # an anchor of docs/broker-guide.md
    guide_title: str = ""


def show_once(request: HttpRequest, shown: SecretShownOnce) -> HttpResponseRedirect:
    if request.session.session_key is None:
        request.session.save()
    token = shown_once_put(session_key=request.session.session_key or "", payload=asdict(shown))
    return HttpResponseRedirect(reverse("admin:shown_once", args=[token]))


def shown_once_view(request: HttpRequest, token: str) -> HttpResponse:
    # Gone before the page is even sent.
    stored = shown_once_take(session_key=request.session.session_key or "", token=token)
    if stored is not None:
        stored["facts"] = [tuple(fact) for fact in stored["facts"]]
    context = {
        **admin.site.each_context(request),
        "shown": SecretShownOnce(**stored) if stored else None,
        "guide_url": _guide_url(stored["guide_section"]) if stored else None,
        "title": stored["title"] if stored else "Already shown",
    }
    response = TemplateResponse(
        request, "admin/shown_once.html", context, status=200 if stored else 410
    )
    response["Cache-Control"] = "no-store"  # the admin adds its never_cache headers too
    return response


def _guide_url(section: str) -> str | None:
    try:
        url = reverse("admin:broker_guide")
    except NoReverseMatch:
        return None
    return f"{url}#{section}" if section else url
