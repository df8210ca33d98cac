"""Registered consumers in the admin: pointers, list types and hash counts, never a clear value.

Consumers arrive through ``consumers import`` and the API only, so the admin adds and edits
none. Search is an exact ``remote_identifier`` (served by the unique index, one probe per
broker, at any table size). Deleting a consumer forgets it through ``consumer_forget``,
with its ledger event.
"""

from __future__ import annotations

import base64
from typing import Any

from django.contrib import admin, messages
from django.db.models import JSONField, QuerySet
from django.db.models.expressions import RawSQL
from django.http import HttpRequest
from unfold.admin import ModelAdmin, TabularInline

from integrations.admin.actors import staff_actor
from integrations.admin.capped_count import CappedCountPaginator
from integrations.admin.page_object import PageObjectReadOnce
from integrations.admin.refusals import RefusalsShown, Refused
from integrations.models import Broker, Consumer, ConsumerHash
from integrations.selectors.story import consumer_work_items
from integrations.services.cycle.consumers import consumer_forget

# Per consumer {list type: hash count}, computed for the rows of the page only (the
# planner evaluates a sub-select in the select list after LIMIT).
_HASH_COUNTS = RawSQL(
    "SELECT jsonb_object_agg(t.hash_type, t.n) FROM ("
    " SELECT h.hash_type, count(*) AS n FROM integrations_consumerhash h"
    "  WHERE h.broker_id = integrations_consumer.broker_id"  # one partition
    "    AND h.consumer_id = integrations_consumer.id GROUP BY h.hash_type) t",
    [],
    output_field=JSONField(),
)


def _counts_text(counts: dict[str, int] | None) -> str:
    if not counts:
        return "none"
    return ", ".join(f"{list_type} {counts[list_type]}" for list_type in sorted(counts))


class ConsumerHashInline(TabularInline):
    model = ConsumerHash
    fields = ["hash_type", "hash_base64"]
    readonly_fields = ["hash_type", "hash_base64"]
    ordering = ["hash_type", "id"]
    extra = 0
    can_delete = False
    verbose_name = "identifier hash"

    @admin.display(description="hash (Base64)")
    def hash_base64(self, obj: ConsumerHash) -> str:
        return base64.b64encode(bytes(obj.hash)).decode()

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Consumer)
class ConsumerAdmin(PageObjectReadOnce[Consumer], RefusalsShown, ModelAdmin):
    list_display = ["remote_identifier", "remote_identifier_kind", "broker", "hashes", "created_at"]
    list_filter = ["broker"]
    list_select_related = ["broker"]
    search_fields = ["remote_identifier"]  # exact match: see get_search_results
    search_help_text = "The exact remote_identifier."
    fields = ["broker", "remote_identifier", "remote_identifier_kind", "hashes", "created_at"]
    readonly_fields = [
        "broker",
        "remote_identifier",
        "remote_identifier_kind",
        "hashes",
        "created_at",
    ]
    inlines = [ConsumerHashInline]
    paginator = CappedCountPaginator  # hundreds of millions of consumers: counted to a cap
    show_full_result_count = False  # a second COUNT over every consumer on each page

    change_form_after_template = "admin/integrations/consumer/stories.html"

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        consumer = self.get_object(request, object_id)
        items = consumer_work_items(consumer=consumer) if consumer is not None else []
        context = {"consumer_work_items": items, **(extra_context or {})}
        return super().change_view(request, object_id, form_url, context)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Consumer]:
        return super().get_queryset(request).annotate(hash_counts=_HASH_COUNTS)

    @admin.display(description="list types (hashes)")
    def hashes(self, obj: Consumer) -> str:
        return _counts_text(getattr(obj, "hash_counts", None))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Consumer], search_term: str
    ) -> tuple[QuerySet[Consumer], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        # The unique index is (broker, remote_identifier): naming the brokers lets the
        # planner probe it once per broker instead of scanning every consumer.
        brokers = list(Broker.objects.values_list("pk", flat=True))
        return queryset.filter(broker_id__in=brokers, remote_identifier=term), False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    # Forgotten meanwhile (a double click, a colleague, ``consumers forget``, a full file's
    # import): the service finds no such consumer, and the page says so rather than a 500.

    def delete_model(self, request: HttpRequest, obj: Consumer) -> None:
        try:
            self._forget(request, obj)
        except Consumer.DoesNotExist as exc:
            messages.error(request, f"{exc}: forgotten meanwhile; nothing was changed")
            raise Refused from exc

    # "Delete selected" hands it one run's rows at most (admin/bounded_actions.py), however
    # many consumers "select all" took.
    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Consumer]) -> None:
        for consumer in queryset.select_related("broker"):
            try:
                self._forget(request, consumer)
            except Consumer.DoesNotExist as exc:  # the others are still forgotten
                messages.error(request, f"{exc}: forgotten meanwhile")

    @staticmethod
    def _forget(request: HttpRequest, consumer: Consumer) -> None:
        consumer_forget(
            broker=consumer.broker,
            remote_identifier=consumer.remote_identifier,
            actor=staff_actor(request),
        )
