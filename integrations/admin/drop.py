"""DROP cycles and their work items in the admin: what DROP sent, read-only.

Cycles list their counts, due date and days left, the cycles owing statuses first (the
``drop_cycles_by_urgency`` selector, shared with the dashboard). Work items filter by list
type, state and status; the dashboard links to those filtered lists. Nothing here edits a
row: cycles and work items change only through the cycle's services (``drop pull``,
``drop import``, outcomes, reports, and the "set the DROP status by hand" action of
``admin/reports.py``), each with its ledger event.
"""

from __future__ import annotations

import base64
from typing import Any

from django.contrib import admin
from django.db.models import Case, Model, QuerySet, Value, When
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from unfold.admin import ModelAdmin

from integrations.admin.capped_count import CappedCountPaginator
from integrations.admin.charts import cycle_timeline
from integrations.admin.drop_notifications import drop_notifications_table
from integrations.admin.page_object import PageObjectReadOnce, PageRowsReadTogether
from integrations.admin.reports import set_work_item_status
from integrations.admin.story import story_context
from integrations.ascii_integers import ascii_integer
from integrations.drop.calendar import (
    DROP_YEARS,
    drop_date,
    drop_timezone,
    drop_today,
    drop_year_bounds,
)
from integrations.drop_statuses import STATUS_CODES, DropStatus
from integrations.list_types import DATA_TYPE_OF
from integrations.models import (
    DropCycle,
    DropNotification,
    UnreadableWorkItem,
    WorkItem,
)
from integrations.selectors.cycle_progress import cycle_progress
from integrations.selectors.deadlines import drop_cycles_by_urgency
from integrations.selectors.drop_metrics import METRIC_FIGURES, METRIC_FILTERS
from integrations.selectors.match_rates import match_rate
from integrations.selectors.work_item_search import work_items_find


class ReadOnlyAdmin(ModelAdmin):
    """Viewable, never added, edited or deleted through a form."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The list may offer actions (they check their own permission); a row's page only
        # shows it.
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Model, form: Any, change: bool) -> None:
        raise PermissionError("read-only")  # unreachable: no change permission on a row


def _work_items_url(**filters: Any) -> str:
    return reverse("admin:integrations_workitem_changelist") + "?" + urlencode(filters)


@admin.register(DropCycle)
class DropCycleAdmin(PageObjectReadOnce[DropCycle], ReadOnlyAdmin):
    # Fits 1280 pixels; the package name and the not-found and removed counts are on the
    # cycle's page.
    list_display = [
        "drop_session_id",
        "broker_code",
        "downloaded_at",
        "due_date",
        "days_left",
        "state",
        "work_items_link",
        "matched",
        "owed",
        "waiting",
    ]
    list_display_links = ["drop_session_id"]
    list_filter = ["state", "mode", "broker"]
    search_fields = ["drop_session_id", "zip_name", "zip_sha256"]
    list_select_related = ["broker"]
    fields = _CYCLE_FIELDS = (
        "broker",
        "mode",
        "drop_session_id",
        "state",
        "zip_name",
        "zip_sha256",
        "downloaded_at",
        "match_date",
        "due_date",
        "days_left",
        "work_items_link",
        "matched",
        "not_found",
        "removed",
        "owed",
        "waiting",
        "match_rates_table",
        "files_table",
        "unread_files_table",
        "drop_notifications",
        "created_at",
    )
    readonly_fields = _CYCLE_FIELDS
    change_form_before_template = "admin/integrations/dropcycle/progress.html"

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        cycle = self.get_object(request, object_id)
        context: dict[str, Any] = {}
        if cycle is not None:
            # The cycle's days count in DROP's calendar (California's).
            progress = cycle_progress(
                cycle=cycle, start=drop_date(cycle.downloaded_at), today=drop_today()
            )
            context = {
                "cycle_progress": progress,
                "cycle_timeline": cycle_timeline(
                    start=progress.start,
                    due=cycle.due_date,
                    today=progress.today,
                    not_removed=progress.items.not_removed,
                    with_status=progress.known,
                    reported=progress.reported,
                    owed=progress.owed,
                    title=f"Cycle {cycle.drop_session_id}: {cycle.due_date:%Y-%m-%d} deadline",
                ),
                "cycle_work_items_url": _work_items_url(cycle__id__exact=cycle.pk),
            }
        return super().change_view(
            request, object_id, form_url, {**context, **(extra_context or {})}
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet[DropCycle]:
        # Every cycle, as Django's would give them (its ordering is replaced by the
        # selector's): the selector's query of every cycle, built once.
        return drop_cycles_by_urgency()

    def get_ordering(self, request: HttpRequest) -> list[Any]:
        # The list replaces the queryset's order: keep the selector's, cycles owing first.
        owing_first = Case(When(owed_items__gt=0, then=Value(0)), default=Value(1))
        return [owing_first, "due_date", "-downloaded_at"]

    @admin.display(description="Broker ID", ordering="broker__broker_id")
    def broker_code(self, obj: DropCycle) -> str:
        return obj.broker.broker_id

    @admin.display(description="days left", ordering="due_date")
    def days_left(self, obj: DropCycle) -> str:
        days = (obj.due_date - drop_today()).days
        if not getattr(obj, "owed_items", 0):
            return "nothing owed"
        if days < 0:
            return f"overdue by {-days} day{'s' if days != -1 else ''}"
        return f"{days} day{'s' if days != 1 else ''}"

    @admin.display(description="work items", ordering="work_items")
    def work_items_link(self, obj: DropCycle) -> str:
        return format_html(
            '<a href="{}">{}</a>', _work_items_url(cycle__id__exact=obj.pk), obj.work_items
        )

    @admin.display(description="statuses owed", ordering="owed_items")
    def owed(self, obj: DropCycle) -> int:
        return int(getattr(obj, "owed_items", 0))

    @admin.display(description="of which waiting for an outcome", ordering="unreportable_items")
    def waiting(self, obj: DropCycle) -> int:
        return int(getattr(obj, "unreportable_items", 0))

    @admin.display(description="DROP's notifications")
    def drop_notifications(self, obj: DropCycle) -> str:
        return drop_notifications_table(DropNotification.objects.filter(cycle=obj))

    @admin.display(description="files (rows)")
    def files_table(self, obj: DropCycle) -> str:
        return format_html(
            "<table>{}</table>",
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td></tr>",
                sorted(obj.files.items()),
            ),
        )

    @admin.display(description="match rate by list type (at import)")
    def match_rates_table(self, obj: DropCycle) -> str:
        if not obj.match_rates:
            return "not kept (imported before match rates were)"
        rows = []
        for hash_type, entry in sorted(
            obj.match_rates.items(),
            key=lambda pair: (
                pair[0] not in DATA_TYPE_OF,
                list(DATA_TYPE_OF).index(pair[0]) if pair[0] in DATA_TYPE_OF else 0,
                pair[0],
            ),
        ):
            rate = match_rate(entry)
            rows.append(
                (
                    DATA_TYPE_OF.get(hash_type, hash_type),
                    entry.get("matched", 0),
                    entry.get("items", 0),
                    f"{float(rate):.1%}" if rate is not None else "-",
                )
            )
        return format_html(
            "<table><tr><th>list</th><th>matched</th><th>items</th><th>rate</th></tr>{}</table>",
            format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", rows),
        )

    @admin.display(description="DROP lists not read (why)")
    def unread_files_table(self, obj: DropCycle) -> str:
        unreadable = reverse("admin:integrations_unreadableworkitem_changelist")
        return format_html(
            '<table>{}</table><a href="{}?{}">unreadable rows</a>',
            format_html_join(
                "", "<tr><td>{}</td><td>{}</td></tr>", sorted(obj.unread_files.items())
            ),
            unreadable,
            urlencode({"cycle__id__exact": obj.pk}),
        )


@admin.register(UnreadableWorkItem)
class UnreadableWorkItemAdmin(PageRowsReadTogether, ReadOnlyAdmin):
    """Rows DROP sent that could not be read as work items: answered in DROP's portal."""

    list_display = ["file_name", "line", "text", "reason", "cycle"]
    list_filter = ["broker"]
    # Its page shows the broker and the cycle, whose name holds the broker's id.
    list_select_related = ["broker", "cycle__broker"]
    search_fields = ["=work_item_id", "file_name"]
    fields = readonly_fields = (
        "broker",
        "cycle",
        "file_name",
        "line",
        "work_item_id",
        "text",
        "reason",
        "created_at",
    )


class DropYearFilter(admin.SimpleListFilter):
    """Work items of the cycles downloaded in one year of DROP's calendar, as the yearly
    figures count."""

    title = "DROP year"
    parameter_name = "drop_year"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        years = DropCycle.objects.datetimes(
            "downloaded_at", "year", order="DESC", tzinfo=drop_timezone()
        )
        return [(str(day.year), str(day.year)) for day in years]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        year = ascii_integer(self.value() or "")
        if year is not None and year in DROP_YEARS:
            start, end = drop_year_bounds(year)
            cycles = DropCycle.objects.filter(downloaded_at__gte=start, downloaded_at__lt=end)
            return queryset.filter(cycle__in=cycles.values("pk"))
        return queryset


class MetricFilter(admin.SimpleListFilter):
    """The work items behind one figure of the yearly DROP metrics."""

    title = "DROP metric"
    parameter_name = "metric"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(METRIC_FIGURES)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value in METRIC_FILTERS:
            return queryset.filter(METRIC_FILTERS[value])
        return queryset


class StatusCodeFilter(admin.SimpleListFilter):
    """DROP's four codes and "none yet", without a DISTINCT over millions of rows."""

    title = "status"
    parameter_name = "status_code__exact"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(status.value), status.short_label) for status in DropStatus]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value in {str(code) for code in STATUS_CODES}:
            return queryset.filter(status_code=int(value))
        return queryset


@admin.register(WorkItem)
class WorkItemAdmin(PageObjectReadOnce[WorkItem], PageRowsReadTogether, ReadOnlyAdmin):
    list_display = [
        "work_item_id",
        "hash_type",
        "state",
        "status_code",
        "needs_amendment",
        "reported_status_code",
        "cycle_link",
        "broker_code",
        "updated_at",
    ]  # fits 1280 pixels: the list file's name is on the item's page
    list_filter = [
        ("hash_type", admin.ChoicesFieldListFilter),
        ("state", admin.ChoicesFieldListFilter),
        StatusCodeFilter,
        "needs_amendment",
        DropYearFilter,
        MetricFilter,
    ]
    search_fields = ["=work_item_id"]  # see get_search_results: what staff know
    search_help_text = (
        "A work item id, request UUID, remote_identifier, DROP hash, or an email address or "
        "phone number (hashed at once, never kept)"
    )
    # Its page shows the broker and the cycle, whose name holds the broker's id.
    list_select_related = ["broker", "cycle__broker"]
    actions = [set_work_item_status]  # with a written reason; an Operators' action
    paginator = CappedCountPaginator  # counted to a cap, not every item of every cycle
    show_full_result_count = False  # a cycle holds up to millions of rows
    # Newest first, as the list shows them without it; Django's autocomplete pages by it too.
    ordering = ["-id"]
    fields = _ITEM_FIELDS = (
        "work_item_id",
        "broker",
        "cycle",
        "hash_type",
        "identifier_hash",
        "file_name",
        "state",
        "status_code",
        "status_reason",
        "reported_status_code",
        "reported_at",
        "first_reported_at",
        "report_file",
        "pending_report_file",  # written, not taken by DROP (yet): still owed
        "needs_amendment",
        "created_at",
        "updated_at",
    )
    readonly_fields = _ITEM_FIELDS

    change_form_before_template = "admin/integrations/workitem/story.html"  # the story first

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[WorkItem], search_term: str
    ) -> tuple[QuerySet[WorkItem], bool]:
        return work_items_find(queryset=queryset, term=search_term), False

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        work_item = self.get_object(request, object_id)
        story = story_context(work_item) if work_item is not None else {}
        return super().change_view(request, object_id, form_url, {**story, **(extra_context or {})})

    @admin.display(description="Broker ID", ordering="broker__broker_id")
    def broker_code(self, obj: WorkItem) -> str:
        return obj.broker.broker_id

    @admin.display(description="cycle", ordering="cycle__drop_session_id")
    def cycle_link(self, obj: WorkItem) -> str:
        url = reverse("admin:integrations_dropcycle_change", args=[obj.cycle_id])
        return format_html('<a href="{}">{}</a>', url, obj.cycle.drop_session_id)

    @admin.display(description="hash (as DROP sent it)")
    def identifier_hash(self, obj: WorkItem) -> str:
        return base64.b64encode(bytes(obj.hash)).decode("ascii")
