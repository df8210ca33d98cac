"""Deletion and resolution requests, SaaS deletions and opt-out records in the admin.

Read-only records of what was sent and answered, each with its delivery attempts inline.
The only writes are staff actions, each through a service with its ledger event:

- redeliver (what got no outcome: undeliverable, or queued/dispatched with no callback): a new
  ``webhook_request_id``, attempts from zero, a delivery job;
- redispatch a ``failed`` outcome;
- cancel a SaaS deletion staff give up on (its resolved identifiers can then be purged).

An opt-out record's email is shown only on its own page, never in a list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Model, QuerySet
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from unfold.admin import ModelAdmin, TabularInline

from integrations.admin.actors import staff_actor
from integrations.admin.audit import AUDIT_EXPORT_PERMISSION
from integrations.admin.bounded_actions import first_rows
from integrations.admin.capped_count import CappedCountPaginator
from integrations.admin.display import uuid_link, uuid_short
from integrations.admin.reports import export_outcomes_csv, export_outcomes_jsonl
from integrations.ascii_integers import ascii_integer
from integrations.models import (
    DeletionRequest,
    DeliveryAttempt,
    DropCycle,
    OptOutRecord,
    ResolutionRequest,
    SaasDeletion,
)
from integrations.models.fields import encrypted_columns_unread
from integrations.services.dispatch.redelivery import (
    deletion_request_redeliver,
    deletion_request_redispatch,
    resolution_request_redeliver,
    saas_deletion_redeliver,
)
from integrations.services.dispatch.resolutions import (
    NOT_DELETED_OUTCOMES,
    saas_deletion_cancel,
)


class ReadOnlyAdmin(ModelAdmin):
    """Rows written only by the cycle: viewable, never edited through a form."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The list offers actions (each checks the change permission); a row's page is a
        # "View" page with no Save button.
        return obj is None and super().has_change_permission(request)

    # Requests, SaaS deletions and opt-outs grow with every cycle: counted to a cap.
    paginator = CappedCountPaginator
    show_full_result_count = False

    hidden_fields: tuple[str, ...] = ()
    # Identifiers as 8 characters with a copy button (integrations/admin/display.py).
    readonly_preprocess_fields = {
        "request_uuid": uuid_short,
        "webhook_request_id": uuid_short,
    }
    change_form_before_template = "admin/integrations/story_link.html"
    # The request column links itself, its copy button beside the link.
    list_display_links: list[str] | None = None

    @admin.display(description="request", ordering="request_uuid")
    def request_link(self, obj: Any) -> str:
        opts = self.model._meta
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
        return uuid_link(obj.request_uuid, url)

    @admin.display(description="Broker ID", ordering="broker__broker_id")
    def broker_code(self, obj: Any) -> str:
        return obj.broker.broker_id

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if self.fields:
            return list(self.fields)
        return [f.name for f in self.model._meta.fields if f.name not in self.hidden_fields]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.get_fields(request, obj)

    def save_model(self, request: HttpRequest, obj: Model, form: Any, change: bool) -> None:
        pass  # every field is read-only; writes go through the actions


def _apply(
    request: HttpRequest,
    queryset: QuerySet[Any],
    service: Callable[[Any], Any],
    done: str,
) -> None:
    """Run ``service`` on each row one run takes (``bounded_actions``); report how many were
    done, why the rest were not, and what the run left of the selection."""
    batch = first_rows(queryset)
    ok, refused = 0, []
    for row in batch.rows:
        try:
            service(row)
            ok += 1
        except ValidationError as exc:
            refused.append(f"{row}: {' '.join(exc.messages)}")
    if ok:
        messages.success(request, f"{done}: {ok}.")
    if refused:
        shown = "; ".join(refused[:10]) + (
            f"; and {len(refused) - 10} more" if len(refused) > 10 else ""
        )
        messages.warning(request, f"Not done for {len(refused)}: {shown}")
    batch.tell(request)


class CycleFilter(admin.SimpleListFilter):
    """The DROP cycle (download) of the request's work item, most recent first."""

    title = "cycle"
    parameter_name = "cycle"
    recent = 30

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # A cycle's name holds its broker's id, never its credentials: a filter of its own
        # reads its choices as a list's filter by a relation does (``dropportal/admin.py``).
        cycles = encrypted_columns_unread(
            DropCycle.objects.select_related("broker").order_by("-downloaded_at")
        )
        return [(str(c.pk), str(c)) for c in cycles[: self.recent]]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        cycle = ascii_integer(value)
        if cycle is None:
            return queryset.none()
        return queryset.filter(work_item__cycle_id=cycle)


class RoundFilter(admin.SimpleListFilter):
    """The match's own request (round 0) or a recurring deletion round's (1, 2...), offered
    as two fixed choices: Django's filter of a number reads every request's for its own."""

    title = "round"
    parameter_name = "round"
    recurring = "recurring"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("0", "0: the match's own"), (self.recurring, "1 or later: recurring")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        if value == self.recurring:
            return queryset.filter(round__gte=1)
        number = ascii_integer(value)  # one round, as ?round=2 chose it before
        if number is None:
            return queryset.none()
        return queryset.filter(round=number)


class ResolutionOutcomeFilter(admin.SimpleListFilter):
    """A resolution's two outcomes, without a DISTINCT over every resolution request (its
    field has no choices: most answers give identifiers, no outcome)."""

    title = "DROP outcome"
    parameter_name = "drop_outcome__exact"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(outcome.value, outcome.label) for outcome in NOT_DELETED_OUTCOMES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        if value not in {outcome.value for outcome in NOT_DELETED_OUTCOMES}:
            return queryset.none()
        return queryset.filter(drop_outcome=value)


class AttemptInline(TabularInline):
    model = DeliveryAttempt
    fields = ("number", "started_at", "url", "status", "duration_ms", "error", "answer", "headers")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ["started_at"]

    @admin.display(description="Answer (first 4 KiB)")
    def answer(self, obj: DeliveryAttempt) -> str:
        return obj.response_body[:300] + ("…" if len(obj.response_body) > 300 else "")

    @admin.display(description="Request headers")
    def headers(self, obj: DeliveryAttempt) -> str:
        return "\n".join(f"{k}: {v}" for k, v in obj.request_headers.items())

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class DeletionAttemptInline(AttemptInline):
    fk_name = "deletion_request"


class ResolutionAttemptInline(AttemptInline):
    fk_name = "resolution_request"


class SaasAttemptInline(AttemptInline):
    fk_name = "saas_deletion"


@admin.register(DeletionRequest)
class DeletionRequestAdmin(ReadOnlyAdmin):
    # Fits 1280 pixels: the outcome names its status code, late matches are a filter.
    list_display = [
        "request_link",
        "broker_code",
        "integration",
        "state",
        "drop_outcome",
        "attempts",
        "dispatched_at",
        "completed_at",
    ]
    list_filter = [
        "state",
        "drop_outcome",
        # Every integration, read from its own table: "only those with requests" is a
        # DISTINCT over every request.
        ("integration", admin.RelatedFieldListFilter),
        CycleFilter,
        "broker",
        "dispatched_at",
        "late_match",
        RoundFilter,
    ]
    search_fields = ["=request_uuid", "remote_identifier", "=work_item__work_item_id"]
    list_select_related = ["broker", "integration"]
    inlines = [DeletionAttemptInline]
    actions = ["redeliver", "redispatch", export_outcomes_csv, export_outcomes_jsonl]

    def has_export_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request) and request.user.has_perm(AUDIT_EXPORT_PERMISSION)

    @admin.action(
        description="Redeliver (new webhook_request_id, attempts from zero)", permissions=["change"]
    )
    def redeliver(self, request: HttpRequest, queryset: QuerySet[DeletionRequest]) -> None:
        actor = staff_actor(request)
        _apply(
            request,
            queryset,
            lambda row: deletion_request_redeliver(deletion_request=row, actor=actor),
            "Queued for redelivery",
        )

    @admin.action(description="Redispatch a failed outcome", permissions=["change"])
    def redispatch(self, request: HttpRequest, queryset: QuerySet[DeletionRequest]) -> None:
        actor = staff_actor(request)
        _apply(
            request,
            queryset,
            lambda row: deletion_request_redispatch(deletion_request=row, actor=actor),
            "Queued for redispatch",
        )


class SaasDeletionInline(TabularInline):
    model = SaasDeletion
    fields = (
        "saas_connection",
        "state",
        "attempts",
        "next_attempt_at",
        "completed_at",
        "last_error",
    )
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ResolutionRequest)
class ResolutionRequestAdmin(ReadOnlyAdmin):
    list_display = [
        "request_link",
        "broker_code",
        "integration",
        "state",
        "drop_outcome",
        "attempts",
        "dispatched_at",
        "completed_at",
    ]  # fits 1280 pixels: when the identifiers were purged is on the request's page
    list_filter = [
        "state",
        ResolutionOutcomeFilter,
        ("integration", admin.RelatedFieldListFilter),  # as the deletion requests'
        CycleFilter,
        "broker",
        RoundFilter,
    ]
    search_fields = ["=request_uuid", "=results_token", "remote_identifier"]
    list_select_related = ["broker", "integration"]
    # The resolved identifiers are clear personal data: kept encrypted, never displayed.
    hidden_fields = ("identifiers",)
    inlines = [ResolutionAttemptInline, SaasDeletionInline]
    actions = ["redeliver"]

    @admin.action(
        description="Redeliver (new webhook_request_id, attempts from zero)", permissions=["change"]
    )
    def redeliver(self, request: HttpRequest, queryset: QuerySet[ResolutionRequest]) -> None:
        actor = staff_actor(request)
        _apply(
            request,
            queryset,
            lambda row: resolution_request_redeliver(resolution_request=row, actor=actor),
            "Queued for redelivery",
        )


@admin.register(SaasDeletion)
class SaasDeletionAdmin(ReadOnlyAdmin):
    list_display = [
        "pk",
        "resolution_link",
        "saas_connection",
        "state",
        "attempts",
        "next_attempt_at",
        "completed_at",
        "last_error",
    ]
    list_filter = ["state", ("saas_connection", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["=resolution__request_uuid"]
    list_select_related = ["resolution", "saas_connection"]
    list_display_links = ["pk"]
    inlines = [SaasAttemptInline]

    @admin.display(description="resolution request", ordering="resolution__request_uuid")
    def resolution_link(self, obj: SaasDeletion) -> str:
        url = reverse("admin:integrations_resolutionrequest_change", args=[obj.resolution_id])
        return uuid_link(obj.resolution.request_uuid, url)

    actions = ["redeliver", "cancel"]

    @admin.action(description="Redeliver (attempts from zero)", permissions=["change"])
    def redeliver(self, request: HttpRequest, queryset: QuerySet[SaasDeletion]) -> None:
        actor = staff_actor(request)
        _apply(
            request,
            queryset,
            lambda row: saas_deletion_redeliver(saas_deletion=row, actor=actor),
            "Queued for redelivery",
        )

    @admin.action(
        description="Cancel (give up; the identifiers can be purged)", permissions=["change"]
    )
    def cancel(self, request: HttpRequest, queryset: QuerySet[SaasDeletion]) -> None:
        actor = staff_actor(request)
        _apply(
            request,
            queryset,
            lambda row: saas_deletion_cancel(
                saas_deletion=row, reason="cancelled by staff", actor=actor
            ),
            "Cancelled",
        )


@admin.register(OptOutRecord)
class OptOutRecordAdmin(ReadOnlyAdmin):
    list_display = ["request_link", "broker_code", "created_at"]  # no email in lists
    list_filter = ["broker"]
    search_fields = ["=deletion_request__request_uuid", "=resolution_request__request_uuid"]
    list_select_related = ["deletion_request", "resolution_request", "broker"]
    fields = ["deletion_request", "resolution_request", "broker", "email", "created_at"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    # The record's request is its deletion's or its resolution's (one of the two, by its
    # check constraint): ``request_uuid`` is a property here, so the column sorts by both.
    @admin.display(
        description="request",
        ordering=Coalesce("deletion_request__request_uuid", "resolution_request__request_uuid"),
    )
    def request_link(self, obj: OptOutRecord) -> str:
        return super().request_link(obj)
