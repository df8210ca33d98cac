"""The ledger in the admin: read-only, for everyone who may see it, and exportable by
Auditors (and superusers: the export permission, ``AUDIT_EXPORT_PERMISSION``).

The list's "Export CSV" and "Export JSONL" buttons stream exactly the events the list shows
(its filters, date drill-down and search), with their chain hashes, as ``ledger export``
writes them. Each export is itself a ``ledger.exported`` event (who, which filters)::

    /admin/integrations/ledgerevent/export.csv?kind__exact=broker.created
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import (
    HttpRequest,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    StreamingHttpResponse,
)
from django.http.response import HttpResponseBase
from django.urls import URLPattern, path
from django.utils import timezone
from unfold.admin import ModelAdmin

from integrations import exports
from integrations.admin.actors import staff_actor
from integrations.admin.audit import AUDIT_EXPORT_PERMISSION
from integrations.admin.capped_count import CappedCountPaginator
from integrations.admin.date_drill_down import DateDrillDownBounded
from integrations.admin.display import uuid_short
from integrations.models import Broker, LedgerEvent
from integrations.selectors.ledger import LEDGER_COLUMNS, ledger_events
from integrations.selectors.search_terms import ledger_search_token
from integrations.services.evidence.audit import ledger_export_record

CONTENT_TYPES = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson"}


class BrokerIdFilter(admin.SimpleListFilter):
    """The ledger's brokers, from the brokers' table: Django's filter on a plain column lists
    its values with ``SELECT DISTINCT`` over every event, seconds on every page at a few
    million. The parameter keeps the name Django gave it (links use it)."""

    title = "Broker ID"
    parameter_name = "broker_id__exact"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        brokers = Broker.objects.order_by("broker_id").values_list("broker_id", flat=True)
        return [*((b, b) for b in brokers), ("", "none (the service's own)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[LedgerEvent]) -> Any:
        value = self.value()
        return queryset if value is None else queryset.filter(broker_id=value)


@admin.register(LedgerEvent)
class LedgerEventAdmin(DateDrillDownBounded, ModelAdmin):
    list_display = ["id", "created_at", "broker_id", "kind", "subject_shown", "actor"]
    list_filter = ["kind", BrokerIdFilter]  # kinds: the registry's choices, no query
    search_fields = ["subject", "actor", "kind"]
    search_term_for_url = staticmethod(ledger_search_token)  # ids, kinds and actors
    date_hierarchy = "created_at"
    date_hierarchy_indexed = True  # its periods probed through the index (date_drill_down)
    readonly_fields = [
        "id",
        "created_at",
        "broker_id",
        "kind",
        "subject",
        "actor",
        "data",
        "event_hash",
        "txid",
    ]
    paginator = CappedCountPaginator  # the list's own count too, up to a cap
    show_full_result_count = False  # counting millions of events on every page is slow
    change_list_template = "admin/integrations/ledgerevent/change_list.html"

    @admin.display(description="subject", ordering="subject")
    def subject_shown(self, obj: LedgerEvent) -> str:
        # A request's or an integration's UUID as 8 characters with a copy button.
        try:
            uuid.UUID(obj.subject)
        except ValueError:
            return obj.subject
        return uuid_short(obj.subject)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_export_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request) and request.user.has_perm(AUDIT_EXPORT_PERMISSION)

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "export.<str:fmt>",
                self.admin_site.admin_view(self.export_view),
                name="integrations_ledgerevent_export",
            ),
            *super().get_urls(),
        ]

    def export_view(self, request: HttpRequest, fmt: str) -> HttpResponseBase:
        if request.method != "POST":  # it writes a ledger event: no link may trigger it
            return HttpResponseNotAllowed(["POST"])
        if not self.has_export_permission(request):
            raise PermissionDenied
        if fmt not in CONTENT_TYPES:
            return HttpResponseBadRequest("export as .csv or .jsonl")
        try:
            listed = self.get_changelist_instance(request).get_queryset(request)
        except IncorrectLookupParameters:
            return HttpResponseBadRequest("these filters do not apply to the ledger")
        ledger_export_record(
            actor=staff_actor(request), via="admin", filters=request.GET.dict(), fmt=fmt
        )
        response = StreamingHttpResponse(
            exports.iter_lines(fmt, LEDGER_COLUMNS, ledger_events(events=listed)),
            content_type=CONTENT_TYPES[fmt],
        )
        stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
        response["Content-Disposition"] = f'attachment; filename="ledger-{stamp}.{fmt}"'
        return response
