"""Secrets shown exactly once: an API key, a Webhook Secret, right after staff created it.

A ModelAdmin that just created a secret answers with ``show_once(...)``: the secret waits in
the server-side session, the browser is redirected (so a reload cannot create a second one)
to a page that shows it with a copy button, says it will never be shown again, and links the
broker guide's section on where it goes. Rendering the page removes it from the session::

    def response_add(self, request, obj, post_url_continue=None):
        return show_once(request, SecretShownOnce(
            title="API key created", label="API key", secret=obj.created_key,
            facts=[("Prefix", obj.prefix)], guide_section="api-keys", guide_title="API keys",
            done_url=reverse("admin:integrations_apikey_changelist"), done_label="API keys"))

The page is ``no-store`` and only ever served to the session that created the secret.
"""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass, field

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse

SESSION_KEY = "dropportal_shown_once"


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
    token = secrets.token_urlsafe(16)
    pending = dict(request.session.get(SESSION_KEY, {}))
    pending[token] = asdict(shown)
    request.session[SESSION_KEY] = pending
    return HttpResponseRedirect(reverse("admin:shown_once", args=[token]))


def shown_once_view(request: HttpRequest, token: str) -> HttpResponse:
    pending = dict(request.session.get(SESSION_KEY, {}))
    stored = pending.pop(token, None)
    request.session[SESSION_KEY] = pending  # gone before the page is even sent
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
