"""Reporting in the admin: response files (download, mark uploaded, generate) and the actions
other admins borrow (set a work item's status by hand, export the outcome history).

Manual mode, for brokers who upload in DROP's own portal: "Generate response files" writes a
cycle's files, each row's download button gives the exact bytes (a POST: the download is a
``report_files.exported`` ledger event, as the cycle's ZIP is), and "Mark uploaded" records
that staff uploaded them, and when (an optional time in DROP's calendar; empty: now).
"Discard amendment" gives up an amendment DROP refuses or rejected, with a written reason
(its items keep the status DROP holds). Every change goes
through ``services.reporting.report_files``, ``services.reporting.report_manual`` and
``services.cycle.work_items`` (ledger events with the staff actor)::

    class WorkItemAdmin(admin.ModelAdmin):
        actions = [set_work_item_status]
    class DeletionRequestAdmin(admin.ModelAdmin):
        actions = [export_outcomes_csv]

"Approve" and "Reject" decide on a file waiting for approval (a broker's "approve uploads"):
their page shows each file's counts per status and list, and a second person (never whoever
wrote it: ``services.reporting.report_approval``) approves it, the report job then uploads
it, or rejects it with a reason.

Permissions: reading files needs "view report file"; generating files, marking them
uploaded, discarding an amendment and setting a status change work items, so they need
"change work item" (the Operators role has it); approving or rejecting needs "approve report
file" (Operators, not Auditors).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Exists, OuterRef, QuerySet
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from unfold.admin import ModelAdmin

from integrations import exports
from integrations.admin.action_pages import action_form_page
from integrations.admin.actors import staff_actor
from integrations.admin.bounded_actions import Batch, first_rows, taken
from integrations.admin.drop_notifications import drop_notifications_table
from integrations.admin.page_object import PageRowsReadTogether
from integrations.drop.calendar import drop_moment, drop_today
from integrations.drop_statuses import DropStatus
from integrations.models import (
    DeletionRequest,
    DropCycle,
    DropNotification,
    ReportFile,
    ReportFileState,
    WorkItem,
)
from integrations.selectors.deadlines import drop_cycles_by_urgency
from integrations.selectors.drop_notifications import drop_notifications_awaiting
from integrations.selectors.outcomes import (
    OUTCOME_COLUMNS,
    deletion_outcomes,
    deletion_outcomes_csv,
)
from integrations.selectors.report_reviews import report_file_review
from integrations.services.cycle.work_items import work_item_status_set
from integrations.services.evidence.audit import outcome_export_record, report_files_export_record
from integrations.services.reporting.report_approval import (
    APPROVE_PERMISSION,
    REVIEW_REASON_MAX,
    report_file_approve,
    report_file_reject,
)
from integrations.services.reporting.report_files import report_files_write
from integrations.services.reporting.report_manual import (
    DISCARD_REASON_MAX,
    report_file_discard,
    report_file_mark_uploaded,
)
from integrations.services.reporting.report_uploads import ReportBusy

REPORT_PERMISSION = "integrations.change_workitem"
# The form each row's "download" button submits, with the page's CSRF token.
DOWNLOAD_FORM = "admin/integrations/reportfile/download_form.html"
DOWNLOAD_FORM_ID = "dp-reportfile-download"


def _may_report(request: HttpRequest) -> bool:
    return request.user.has_perm(REPORT_PERMISSION)


@admin.register(ReportFile)
class ReportFileAdmin(PageRowsReadTogether, ModelAdmin):
    list_display = [
        "file_name",
        "broker_code",
        "cycle_session",
        "kind",
        "rows",
        "state",
        "drop_message",
        "uploaded_at",
        "download",
    ]  # fits 1280 pixels: when it was written is on the file's page
    list_filter = ["state", "kind", "broker"]
    search_fields = ["file_name", "sha256"]
    # Its page shows the broker and the cycle, whose name holds the broker's id.
    list_select_related = ["broker", "cycle__broker"]
    exclude = ["content"]
    readonly_fields = [
        "broker",
        "cycle",
        "kind",
        "file_name",
        "rows",
        "sha256",
        "state",
        "drop_response",
        "created_at",
        "uploaded_at",
        "discard_reason",
        "discarded_by",
        "discarded_at",
        "written_by",
        "review_counts",
        "reviewed_by",
        "reviewed_at",
        "review_reason",
        "download",
        "drop_notifications",
    ]
    actions = ["mark_uploaded", "discard_amendment", "approve_files", "reject_files"]
    change_list_template = "admin/integrations/reportfile/change_list.html"
    list_after_template = DOWNLOAD_FORM
    change_form_outer_after_template = DOWNLOAD_FORM

    def get_queryset(self, request: HttpRequest) -> QuerySet[ReportFile]:
        return super().get_queryset(request).defer("content")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # what DROP got is evidence

    def has_report_permission(self, request: HttpRequest) -> bool:
        return _may_report(request)

    def has_approve_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(APPROVE_PERMISSION)

    @admin.display(description="rows per status")
    def review_counts(self, obj: ReportFile) -> str:
        """What an approver reviews: the file's list and its rows per DROP status."""
        return report_file_review(obj).text

    @admin.display(description="Broker ID", ordering="broker__broker_id")
    def broker_code(self, obj: ReportFile) -> str:
        return obj.broker.broker_id

    @admin.display(description="cycle", ordering="cycle__drop_session_id")
    def cycle_session(self, obj: ReportFile) -> str:
        return obj.cycle.drop_session_id

    @admin.display(description="DROP's notifications")
    def drop_notifications(self, obj: ReportFile) -> str:
        attached = DropNotification.objects.filter(report_file=obj)
        awaiting = drop_notifications_awaiting(obj)
        if not awaiting.exists():
            return drop_notifications_table(attached)
        # Kept waiting while this file was being sent: its send failed or is under way, so
        # they are attached once DROP's answer is recorded (a run, or "Mark uploaded").
        return format_html(
            "{}<p>Waiting for DROP's answer to a file of this kind to be recorded:</p>{}",
            drop_notifications_table(attached) if attached.exists() else "",
            drop_notifications_table(awaiting),
        )

    @admin.display(description="DROP's message")
    def drop_message(self, obj: ReportFile) -> str:
        """Why DROP refused or rejected it (the rest of its answer is on the file's page)."""
        answer = obj.drop_response or {}
        if obj.state == ReportFileState.REFUSED:
            return str(answer.get("message", ""))
        if obj.state in (ReportFileState.REJECTED, ReportFileState.DISCARDED):
            return str(answer.get("reason") or answer.get("message") or "")
        return ""

    @admin.display(description="CSV")
    def download(self, obj: ReportFile) -> str:
        # A download is a ledger event, as the cycle's ZIP of the same files is, so it is a
        # POST: the button submits the page's one download form (DOWNLOAD_FORM, outside the
        # list's and the record's own forms).
        url = reverse("admin:integrations_reportfile_download", args=[obj.pk])
        return format_html(
            '<button type="submit" form="{}" formaction="{}" class="dp-post-button">{}</button>',
            DOWNLOAD_FORM_ID,
            url,
            "download",
        )

    @admin.action(
        description="Mark uploaded (uploaded by hand in DROP's portal)", permissions=["report"]
    )
    def mark_uploaded(
        self, request: HttpRequest, queryset: QuerySet[ReportFile]
    ) -> HttpResponse | None:
        """An intermediate page asks when they were uploaded (empty: now), then each file is
        marked on its own."""
        # Checked here too: the action's permission guards the list, not a crafted POST.
        if not self.has_report_permission(request):
            raise PermissionDenied
        form = MarkUploadedForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            done, batch = self._each_file(
                request,
                queryset,
                report_file_mark_uploaded,
                uploaded_at=form.cleaned_data["uploaded_at"],
            )
            if done:
                self.message_user(request, f"Marked {done} file(s) uploaded.", messages.SUCCESS)
            batch.tell(request)
            return None
        return action_form_page(
            self,
            request,
            queryset,
            action="mark_uploaded",
            title="Mark uploaded by hand in DROP's portal",
            form=form,
            template="admin/integrations/reportfile/mark_uploaded.html",
            files=taken(queryset)[:200],
        )

    @admin.action(
        description="Discard amendment DROP refuses or rejected (with a reason)",
        permissions=["report"],
    )
    def discard_amendment(
        self, request: HttpRequest, queryset: QuerySet[ReportFile]
    ) -> HttpResponse | None:
        """An intermediate page asks for the reason, then each file is discarded on its own."""
        form = DiscardForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            done, batch = self._each_file(
                request, queryset, report_file_discard, reason=form.cleaned_data["reason"]
            )
            if done:
                self.message_user(
                    request,
                    f"Discarded {done} amendment(s): their work items keep the status DROP holds.",
                    messages.SUCCESS,
                )
            batch.tell(request)
            return None
        return action_form_page(
            self,
            request,
            queryset,
            action="discard_amendment",
            title="Discard amendments DROP refuses",
            form=form,
            template="admin/integrations/reportfile/discard.html",
            files=taken(queryset)[:200],
        )

    @admin.action(
        description="Approve for upload (files waiting for approval)", permissions=["approve"]
    )
    def approve_files(
        self, request: HttpRequest, queryset: QuerySet[ReportFile]
    ) -> HttpResponse | None:
        """The review page shows each file's counts; approving asks for an optional note."""
        return self._review(request, queryset, approve=True)

    @admin.action(
        description="Reject, not uploaded (files waiting for approval; with a reason)",
        permissions=["approve"],
    )
    def reject_files(
        self, request: HttpRequest, queryset: QuerySet[ReportFile]
    ) -> HttpResponse | None:
        return self._review(request, queryset, approve=False)

    def _review(
        self, request: HttpRequest, queryset: QuerySet[ReportFile], *, approve: bool
    ) -> HttpResponse | None:
        # Checked here too: the action's permission guards the list, not a crafted POST.
        if not self.has_approve_permission(request):
            raise PermissionDenied
        form_class = ApproveForm if approve else RejectForm
        form = form_class(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            decide = report_file_approve if approve else report_file_reject
            done, batch = self._each_file(
                request, queryset, decide, reason=form.cleaned_data["reason"]
            )
            if done and approve:
                self.message_user(
                    request,
                    f"Approved {done} file(s): they are uploaded with the broker's next report.",
                    messages.SUCCESS,
                )
            elif done:
                self.message_user(
                    request,
                    f"Rejected {done} file(s): never uploaded; their statuses go into a new "
                    "file at the next report run.",
                    messages.SUCCESS,
                )
            batch.tell(request)
            return None
        files = list(taken(queryset.select_related("broker", "cycle").defer("content"))[:200])
        return action_form_page(
            self,
            request,
            queryset,
            action="approve_files" if approve else "reject_files",
            title="Approve for upload" if approve else "Reject: not uploaded",
            form=form,
            template="admin/integrations/reportfile/review.html",
            reviews=[(f, report_file_review(f)) for f in files],
            approve=approve,
        )

    def _each_file(
        self,
        request: HttpRequest,
        queryset: QuerySet[ReportFile],
        act: Callable[..., object],
        **details: Any,
    ) -> tuple[int, Batch[ReportFile]]:
        """``act`` on each selected file one run takes (``bounded_actions``) in turn, as
        this member of staff and with ``details`` (a reason, an upload time); a file it
        refuses is named in an error message. Returns how many it took, and the run's rows."""
        done = 0
        batch = first_rows(queryset)
        for report_file in batch.rows:
            try:
                act(report_file=report_file, actor=staff_actor(request), **details)
            except ValidationError as exc:
                self.message_user(
                    request, f"{report_file}: {' '.join(exc.messages)}", messages.ERROR
                )
            except ReportBusy as exc:
                self.message_user(request, f"{report_file}: {exc}", messages.ERROR)
            else:
                done += 1
        return done, batch

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path(
                "<int:pk>/download/",
                view(self.download_view),
                name="integrations_reportfile_download",
            ),
            path("generate/", view(self.generate_view), name="integrations_reportfile_generate"),
            *super().get_urls(),
        ]

    def download_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        if request.method != "POST":  # it writes a ledger event: no link or prefetch may trigger it
            return HttpResponseNotAllowed(["POST"])
        if not self.has_view_permission(request):
            raise PermissionDenied
        report_file = get_object_or_404(ReportFile.objects.select_related("broker", "cycle"), pk=pk)
        report_files_export_record(
            actor=staff_actor(request),
            broker_id=report_file.broker.broker_id,
            cycle=report_file.cycle.drop_session_id,
            files=1,
            file_name=report_file.file_name,
        )
        response = HttpResponse(bytes(report_file.content), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="{report_file.file_name}"'
        return response

    def generate_view(self, request: HttpRequest) -> HttpResponse:
        if not _may_report(request):
            raise PermissionDenied
        reportable = WorkItem.objects.reportable().filter(cycle=OuterRef("pk"))
        cycles = drop_cycles_by_urgency(
            DropCycle.objects.may_have_outstanding()
            .filter(Exists(reportable))
            .select_related("broker")
        )
        form = GenerateForm(request.POST or None, cycles=cycles)
        if request.method == "POST" and form.is_valid():
            cycle = form.cleaned_data["cycle"]
            written = report_files_write(
                broker=cycle.broker, cycle=cycle, actor=staff_actor(request)
            )
            if written:
                names = ", ".join(f"{f.file_name} ({f.rows} rows)" for f in written)
                waiting = (
                    " They wait for approval by another Operator (the broker approves uploads)."
                    if any(f.state == ReportFileState.AWAITING_APPROVAL for f in written)
                    else ""
                )
                self.message_user(request, f"Wrote {names}.{waiting}", messages.SUCCESS)
            else:
                self.message_user(request, "Nothing new to report for that cycle.")
            changelist = reverse("admin:integrations_reportfile_changelist")
            return HttpResponseRedirect(f"{changelist}?cycle__id__exact={cycle.pk}")
        context = {
            **self.admin_site.each_context(request),
            "title": "Generate response files",
            "form": form,
            "opts": self.model._meta,
            "today": drop_today(),
        }
        return TemplateResponse(request, "admin/integrations/reportfile/generate.html", context)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra_context = {**(extra_context or {}), "may_report": _may_report(request)}
        return super().changelist_view(request, extra_context)


class _CycleChoice(forms.ModelChoiceField):
    def label_from_instance(self, obj: Any) -> str:
        return (
            f"{obj.broker.broker_id} cycle {obj.drop_session_id}, due {obj.due_date:%Y-%m-%d}"
            f" ({obj.owed_items} work items without a status sent, "
            f"{obj.unreportable_items} still waiting for an outcome)"
        )


class MarkUploadedForm(forms.Form):
    uploaded_at = forms.CharField(label="Uploaded at", required=False, max_length=64)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["uploaded_at"].help_text = (
            "When it was uploaded in DROP's portal: YYYY-MM-DD HH:MM, in DROP's calendar "
            f"({settings.DROPPORTAL_DROP_TIMEZONE}) unless an offset is given; not in the "
            "future, nor before the file was written. Empty: now. DROP holds its statuses "
            "from then (days to respond, the cycle's due date)."
        )

    def clean_uploaded_at(self) -> dt.datetime | None:
        text = self.cleaned_data["uploaded_at"].strip()
        if not text:
            return None
        try:
            return drop_moment(text)
        except ValueError:
            raise ValidationError(
                "not a date and time: use YYYY-MM-DD HH:MM (DROP's calendar) or an ISO 8601 time"
            ) from None


class DiscardForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=DISCARD_REASON_MAX,
        help_text="Why DROP will not get this amendment; kept on the file and in the ledger.",
    )


class ApproveForm(forms.Form):
    reason = forms.CharField(
        label="Note",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=REVIEW_REASON_MAX,
        help_text="Optional: what you checked; kept on the file and in the ledger.",
    )


class RejectForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=REVIEW_REASON_MAX,
        help_text="Why DROP must not get this file; kept on the file and in the ledger. Its "
        "statuses are still owed and go into a new file at the next report run.",
    )


class GenerateForm(forms.Form):
    def __init__(self, *args: Any, cycles: QuerySet[DropCycle], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["cycle"] = _CycleChoice(
            queryset=cycles,
            help_text="Writes one file per list with the statuses DROP has not got yet, and "
            "amendment files for statuses that changed. Its work items stay owed until DROP "
            "takes the file (uploaded, or marked uploaded by hand).",
        )


# ---------------------------------------------------------------- borrowed actions


class WorkItemStatusForm(forms.Form):
    status_code = forms.TypedChoiceField(
        coerce=int,
        choices=[(status.value, status.short_label) for status in DropStatus],
    )
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=2000,
        help_text="Why this status is set by hand; kept with the item and in the ledger.",
    )


# Offered to those who may change work items only (Operators), not merely listed to all.
@admin.action(description="Set the DROP status by hand (with a reason)", permissions=["change"])
def set_work_item_status(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[WorkItem]
) -> HttpResponse | None:
    """For the work item admin: an intermediate page asks for the code and the reason."""
    if not _may_report(request):
        raise PermissionDenied
    form = WorkItemStatusForm(request.POST if "apply" in request.POST else None)
    if form.is_valid():
        done = 0
        batch = first_rows(queryset)
        for item in batch.rows:
            try:
                work_item_status_set(
                    work_item=item,
                    status_code=form.cleaned_data["status_code"],
                    reason=form.cleaned_data["reason"],
                    actor=staff_actor(request),
                )
            except ValidationError as exc:
                modeladmin.message_user(
                    request, f"{item.work_item_id}: {' '.join(exc.messages)}", messages.ERROR
                )
            else:
                done += 1
        if done:
            modeladmin.message_user(request, f"Set the status of {done} work item(s).")
        batch.tell(request)
        return None
    return action_form_page(
        modeladmin,
        request,
        queryset,
        action="set_work_item_status",
        title="Set the DROP status by hand",
        form=form,
        template="admin/integrations/workitem/set_status.html",
        items=taken(queryset)[:200],
    )


@admin.action(
    description="Export the outcome history of these requests (CSV)", permissions=["export"]
)
def export_outcomes_csv(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[DeletionRequest]
) -> StreamingHttpResponse:
    """For the deletion request admin: the selected rows ("select all" takes the whole
    filtered list), streamed; Auditors (and superusers) only: the admin's
    ``has_export_permission``."""
    outcome_export_record(
        actor=staff_actor(request), via="admin", filters={"requests": queryset.count()}
    )
    response = StreamingHttpResponse(
        deletion_outcomes_csv(requests=queryset), content_type="text/csv; charset=utf-8"
    )
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="outcomes-{stamp}.csv"'
    return response


@admin.action(
    description="Export the outcome history of these requests (JSONL)", permissions=["export"]
)
def export_outcomes_jsonl(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[DeletionRequest]
) -> StreamingHttpResponse:
    """As ``export_outcomes_csv``, one JSON object per line (the columns as keys)."""
    outcome_export_record(
        actor=staff_actor(request),
        via="admin",
        filters={"requests": queryset.count()},
        fmt="jsonl",
    )
    response = StreamingHttpResponse(
        exports.iter_lines("jsonl", OUTCOME_COLUMNS, deletion_outcomes(requests=queryset)),
        content_type="application/x-ndjson",
    )
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="outcomes-{stamp}.jsonl"'
    return response
