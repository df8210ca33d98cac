"""Reappearances in the admin: read only, with the same rows counted by source and month
above the list (``selectors.suppression.reappearances_by_source_month``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse

from integrations.admin.date_drill_down import DateDrillDownBounded
from integrations.admin.drop import ReadOnlyAdmin
from integrations.ascii_integers import ascii_integer
from integrations.models import Broker, Reappearance
from integrations.selectors.suppression import reappearances_by_source_month


@admin.register(Reappearance)
class ReappearanceAdmin(DateDrillDownBounded, ReadOnlyAdmin):
    """Consumers registered again after DROP sent them and the broker had matched them: by
    file (name and SHA-256) or API key, so staff find the supplier that sells them again."""

    list_display = [
        "reappeared_at",
        "broker",
        "source_shown",
        "remote_identifier",
        "work_item",
    ]
    list_filter = ["broker"]
    list_select_related = ["broker", "work_item"]
    search_fields = ["=remote_identifier", "source", "=api_key_prefix", "=source_sha256"]
    date_hierarchy = "reappeared_at"
    list_before_template = "admin/integrations/reappearance/summary.html"
    fields = readonly_fields = (
        "broker",
        "work_item",
        "consumer",
        "remote_identifier",
        "source",
        "source_sha256",
        "api_key_prefix",
        "reappeared_at",
    )

    @admin.display(description="source", ordering="source")
    def source_shown(self, obj: Reappearance) -> str:
        return obj.source_label

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        broker_pk = ascii_integer(request.GET.get("broker__id__exact", ""))
        broker = Broker.objects.filter(pk=broker_pk).first() if broker_pk is not None else None
        summary = reappearances_by_source_month(broker=broker)
        extra_context = {
            **(extra_context or {}),
            "reappearance_summary": summary,
            "reappearance_filtered": broker is not None,
        }
        return super().changelist_view(request, extra_context)
