"""Auditors' pages: the yearly DROP figures and signed evidence packs.

    GET  /admin/metrics/?broker=4821&year=2027   the figures; each opens the work items behind it
    GET  /admin/evidence/                        the export form and the public key
    POST /admin/evidence/                        the pack (ZIP), an ``evidence.exported`` event

The figures need the view permissions of the cycle; the evidence page needs the export
permission only Auditors (and superusers) hold. Nothing here writes but the export's event.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import FileResponse, HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode

from integrations.admin.actors import staff_actor
from integrations.drop.calendar import DROP_YEARS, drop_day_bounds, drop_today
from integrations.models import Broker, BrokerMode, DropCycle
from integrations.selectors.drop_metrics import METRIC_FIGURES, drop_metrics, sandbox_note
from integrations.services.evidence.evidence import evidence_pack_export, evidence_public_key_pem
from integrations.services.evidence.evidence_sample import SAMPLE_MAX

METRICS_PERMISSIONS = ("integrations.view_workitem", "integrations.view_dropcycle")
# Held by Auditors (migration 0021): every export of the ledger, the outcome history or an
# evidence pack needs it, and is itself a ledger event.
AUDIT_EXPORT_PERMISSION = "integrations.export_audit_records"
EVIDENCE_PERMISSIONS = (
    AUDIT_EXPORT_PERMISSION,
    "integrations.view_ledgerevent",
    "integrations.view_deletionrequest",
    "integrations.view_reportfile",
)
IN_MEMORY = 16 * 1024 * 1024  # larger packs spill to a temporary file


class MetricsForm(forms.Form):
    broker = forms.ModelChoiceField(
        Broker.objects.order_by("broker_id"), to_field_name="broker_id", empty_label=None
    )
    year = forms.IntegerField(min_value=DROP_YEARS[0], max_value=DROP_YEARS[-1])


def drop_metrics_view(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perms(METRICS_PERMISSIONS):
        raise PermissionDenied
    data = request.GET if "broker" in request.GET else None
    form = MetricsForm(data, initial={"year": drop_today().year})
    context: dict[str, Any] = {
        **admin.site.each_context(request),
        "title": "DROP metrics",
        "form": form,
        "figures": METRIC_FIGURES,
    }
    if form.is_bound and form.is_valid():
        broker, year = form.cleaned_data["broker"], form.cleaned_data["year"]
        metrics = drop_metrics(broker=broker, year=year)
        if broker.mode != BrokerMode.PRODUCTION:
            messages.warning(request, sandbox_note(broker))
        changelist = reverse("admin:integrations_workitem_changelist")
        base = {"broker__id__exact": broker.pk, "drop_year": year}
        context["metrics"] = metrics
        context["table"] = [
            {
                "row": row,
                "cells": [
                    (
                        row.figures[key],
                        f"{changelist}?"
                        + urlencode(
                            {
                                **base,
                                "metric": key,
                                **({"hash_type__exact": row.hash_type} if row.hash_type else {}),
                            }
                        ),
                    )
                    for key, _ in METRIC_FIGURES
                ],
            }
            for row in metrics.rows
        ]
        context["denied_link"] = f"{changelist}?" + urlencode({**base, "metric": "denied"})
    return TemplateResponse(request, "admin/drop_metrics.html", context)


def _in_drop_years(day: dt.date) -> None:
    # A date past DROP_YEARS has no end in UTC to export up to (9999-12-31's next day).
    if day.year not in DROP_YEARS:
        raise ValidationError(f"give a date in the years {DROP_YEARS[0]} to {DROP_YEARS[-1]}")


class EvidenceForm(forms.Form):
    broker = forms.ModelChoiceField(
        Broker.objects.order_by("broker_id"), to_field_name="broker_id", empty_label=None
    )
    cycle = forms.CharField(required=False, help_text="a cycle's drop_session_id, or a period:")
    since = forms.DateField(
        required=False,
        validators=[_in_drop_years],
        help_text="YYYY-MM-DD, inclusive (a DROP day)",
    )
    until = forms.DateField(
        required=False,
        validators=[_in_drop_years],
        help_text="YYYY-MM-DD, inclusive (a DROP day)",
    )
    sample = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=SAMPLE_MAX,
        help_text="add this many work items' stories, drawn by:",
    )
    seed = forms.CharField(
        required=False, max_length=200, help_text="any text; the same seed draws the same items"
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if (data.get("sample") is None) != (not data.get("seed")):
            raise ValidationError("give a sample size and a seed together")
        broker, cycle = data.get("broker"), data.get("cycle")
        if cycle and (data.get("since") or data.get("until")):
            raise ValidationError("give a cycle or a period, not both")
        if cycle and broker is not None:
            try:
                data["cycle"] = DropCycle.objects.get(broker=broker, drop_session_id=cycle)
            except DropCycle.DoesNotExist:
                raise ValidationError(f"broker {broker} has no cycle {cycle!r}") from None
        elif not (data.get("since") and data.get("until")):
            raise ValidationError("give a cycle, or both since and until")
        elif data["until"] < data["since"]:
            raise ValidationError("until must not be before since")
        return data


def _day(day: dt.date | None, *, end: bool = False) -> dt.datetime | None:
    """A day of the period, in DROP's calendar as ``evidence export`` reads it."""
    if day is None:
        return None
    start, next_day = drop_day_bounds(day)
    return (next_day if end else start).astimezone(dt.UTC)


def evidence_view(request: HttpRequest) -> HttpResponseBase:
    if not request.user.has_perms(EVIDENCE_PERMISSIONS):
        raise PermissionDenied
    form = EvidenceForm(request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        pack_file = tempfile.SpooledTemporaryFile(max_size=IN_MEMORY)  # noqa: SIM115  (FileResponse closes it)
        try:
            evidence_pack_export(
                broker=data["broker"],
                cycle=data["cycle"] or None,
                since=_day(data["since"]),
                until=_day(data["until"], end=True),
                sample=data["sample"],
                seed=data["seed"] or None,
                out=pack_file,  # type: ignore[arg-type]
                actor=staff_actor(request),
                via="admin",
            )
        except ValidationError as exc:
            pack_file.close()
            form.add_error(None, exc)
        else:
            pack_file.seek(0)
            name = f"{data['broker'].broker_id}_evidence_{timezone.now():%Y%m%dT%H%M%S}.zip"
            return FileResponse(
                pack_file, as_attachment=True, filename=name, content_type="application/zip"
            )
    context = {
        **admin.site.each_context(request),
        "title": "Evidence packs",
        "form": form,
        "public_key": evidence_public_key_pem(),
    }
    return TemplateResponse(request, "admin/evidence.html", context)
