"""The page an admin action shows to ask for what it needs (a reason, an upload time)
before it acts: the selection travels in its form again, as Django's own delete page carries
it, with ``apply`` once filled in::

    form = DiscardForm(request.POST if "apply" in request.POST else None)
    if not form.is_valid():
        return action_form_page(self, request, queryset, action="discard_amendment",
                                title="Discard amendments DROP refuses", form=form,
                                template="admin/integrations/reportfile/discard.html",
                                files=taken(queryset)[:200])

It takes what one run of the action takes (``bounded_actions``): its count is of those rows,
and the page says when the selection holds more.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from integrations.admin.bounded_actions import form_page_note


def action_form_page(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet[Any],
    *,
    action: str,
    title: str,
    form: forms.Form,
    template: str,
    **shown: Any,
) -> TemplateResponse:
    """``template`` asking for ``form`` before ``action`` acts on ``queryset`` (how many it
    holds, and the selection to post again); ``shown``: what else the page lists."""
    count, bound_note = form_page_note(queryset)
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "form": form,
        "count": count,  # what this run takes
        "bound_note": bound_note,
        "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
        "select_across": request.POST.get("select_across", "0"),
        "action": action,
        "opts": modeladmin.model._meta,
        **shown,
    }
    return TemplateResponse(request, template, context)
