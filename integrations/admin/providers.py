"""Service providers and contractors, and the directives they get, in the admin.

Connections managers register providers (name, contact, an S3 prefix or none: download
here). Operators and Auditors see every directive and download its CSV and ``.sig``
(each download a ledger event, so a POST); Operators record a provider's acknowledgement with its
reference ("Record acknowledgement"). Every change goes through
``services.providers`` (ledger events with the staff actor).
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from unfold.admin import ModelAdmin

from integrations.admin.action_pages import action_form_page
from integrations.admin.actors import staff_actor
from integrations.admin.as_shown import fields_as_shown
from integrations.admin.bounded_actions import first_keys, first_rows, taken
from integrations.admin.refusals import RefusalsShown, Refused
from integrations.drop.calendar import drop_date
from integrations.models import Directive, ServiceProvider
from integrations.selectors.directives import directive_ack_due, directive_ack_due_date
from integrations.services.providers.directives import (
    REFERENCE_MAX,
    directive_acknowledge,
    directive_download_record,
    directives_write_again,
)
from integrations.services.providers.providers import (
    s3_prefix_validate,
    service_provider_add,
    service_provider_update,
)

ACKNOWLEDGE_PERMISSION = "integrations.acknowledge_directive"
# The form each "download" button submits, with the page's CSRF token.
DOWNLOAD_FORM = "admin/integrations/directive/download_form.html"
DOWNLOAD_FORM_ID = "dp-directive-download"


# What its page edits.
PROVIDER_SETTINGS = ("name", "contact", "s3_prefix")


class ServiceProviderForm(forms.ModelForm):
    class Meta:
        model = ServiceProvider
        fields = ["broker", "name", "contact", "s3_prefix"]
        help_texts = {
            "s3_prefix": "s3://bucket/prefix/: each directive is written there (with boto3's "
            "credentials). Blank: staff download it here.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        fields_as_shown(self.fields, PROVIDER_SETTINGS)  # read by save_model's changed_data

    def clean_s3_prefix(self) -> str:
        return s3_prefix_validate(self.cleaned_data.get("s3_prefix") or "")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        # On the change page the broker is read-only, so Django skips its (broker, name)
        # check; the service would refuse the name after the form was accepted.
        name = (cleaned.get("name") or "").strip()
        if self.instance.pk and name:
            taken = ServiceProvider.objects.filter(broker_id=self.instance.broker_id, name=name)
            if taken.exclude(pk=self.instance.pk).exists():
                self.add_error("name", f"this broker already has a provider named {name!r}")
        return cleaned


@admin.register(ServiceProvider)
class ServiceProviderAdmin(RefusalsShown, ModelAdmin):
    form = ServiceProviderForm
    list_display = ["name", "broker", "contact", "s3_prefix", "created_at"]
    list_filter = ["broker"]
    search_fields = ["name", "contact"]
    list_select_related = ["broker"]
    fields = ["broker", "name", "contact", "s3_prefix"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["broker"] if obj is not None else []

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # its directives are evidence

    def save_model(
        self, request: HttpRequest, obj: ServiceProvider, form: Any, change: bool
    ) -> None:
        try:
            self._save(request, obj, form, change)
        except ValidationError as exc:
            # The form's checks passed, then the service refused: the name was taken
            # meanwhile (a second submit, a colleague). Nothing is saved; the page says why.
            messages.error(request, " ".join(exc.messages))
            raise Refused from exc

    def _save(self, request: HttpRequest, obj: ServiceProvider, form: Any, change: bool) -> None:
        if not change:
            fields = {f: getattr(obj, f) for f in PROVIDER_SETTINGS}
            created = service_provider_add(broker=obj.broker, **fields, actor=staff_actor(request))
            obj.pk = created.pk
            return
        # Only what was changed on the page: a field left as shown keeps the stored value,
        # which a colleague may have changed since the page was opened.
        changes = {f: getattr(obj, f) for f in PROVIDER_SETTINGS if f in form.changed_data}
        service_provider_update(
            ServiceProvider.objects.select_related("broker").get(pk=obj.pk),
            changes=changes,
            actor=staff_actor(request),
        )


class AcknowledgeForm(forms.Form):
    reference = forms.CharField(
        max_length=REFERENCE_MAX,
        help_text="The provider's reference for the deletion (its ticket, its letter).",
    )


def _acknowledged_before(directive: Directive) -> str:
    assert directive.acknowledged_at is not None
    return (
        f"directive {directive.pk} was already acknowledged on "
        f"{drop_date(directive.acknowledged_at)} by {directive.acknowledged_by} "
        f"({directive.acknowledgement_reference!r})"
    )


@admin.register(Directive)
class DirectiveAdmin(ModelAdmin):
    list_display = [
        "id",
        "broker_code",
        "provider",
        "reason",
        "created_at",
        "rows",
        "delivery",
        "acknowledgement",
        "download",
    ]
    list_filter = ["broker", "provider", "reason", ("acknowledged_at", admin.EmptyFieldListFilter)]
    search_fields = ["sha256", "provider__name", "acknowledgement_reference"]
    list_select_related = ["broker", "provider"]
    exclude = ["content"]
    readonly_fields = [
        "broker",
        "provider",
        "reason",
        "created_at",
        "rows",
        "rows_by_hash_type",
        "sha256",
        "signature",
        "key_fingerprint",
        "s3_uri",
        "delivered_at",
        "delivery_error",
        "acknowledgement_due",
        "acknowledged_at",
        "acknowledged_by",
        "acknowledgement_reference",
        "download",
    ]
    actions = ["acknowledge_directives", "write_directives_again"]
    list_after_template = DOWNLOAD_FORM
    change_form_outer_after_template = DOWNLOAD_FORM

    def get_queryset(self, request: HttpRequest) -> QuerySet[Directive]:
        return super().get_queryset(request).defer("content")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # what a provider was told is evidence

    def has_acknowledge_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(ACKNOWLEDGE_PERMISSION)

    @admin.display(description="Broker ID", ordering="broker__broker_id")
    def broker_code(self, obj: Directive) -> str:
        return obj.broker.broker_id

    @admin.display(description="delivery")
    def delivery(self, obj: Directive) -> str:
        if obj.s3_uri:
            return obj.s3_uri
        if obj.delivery_error:
            return f"not written: {obj.delivery_error}"
        return "download" if not obj.provider.s3_prefix else "being written"

    @admin.display(description="acknowledgement due")
    def acknowledgement_due(self, obj: Directive) -> Any:
        return directive_ack_due_date(obj)

    @admin.display(description="acknowledged", ordering="acknowledged_at")
    def acknowledgement(self, obj: Directive) -> str:
        if obj.acknowledged_at is not None:
            return f"{drop_date(obj.acknowledged_at)} {obj.acknowledgement_reference}"
        if directive_ack_due(obj) < timezone.now():
            return format_html('<strong class="text-red-600">{}</strong>', "overdue")
        return "awaiting"

    @admin.display(description="CSV and signature")
    def download(self, obj: Directive) -> str:
        # A download is a ledger event, so it is a POST: the button submits the page's one
        # download form (DOWNLOAD_FORM, outside the list's and the record's own forms).
        url = reverse("admin:integrations_directive_download", args=[obj.pk])
        return format_html(
            '<button type="submit" form="{}" formaction="{}" class="dp-post-button">{}</button>',
            DOWNLOAD_FORM_ID,
            url,
            "download",
        )

    @admin.action(
        description="Record the provider's acknowledgement (with its reference)",
        permissions=["acknowledge"],
    )
    def acknowledge_directives(
        self, request: HttpRequest, queryset: QuerySet[Directive]
    ) -> HttpResponse | None:
        form = AcknowledgeForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            actor, reference = staff_actor(request), form.cleaned_data["reference"].strip()
            done, already = 0, []
            batch = first_rows(queryset)
            for directive in batch.rows:
                if directive.acknowledged_at is not None:  # before this page was sent
                    already.append(directive)
                    continue
                try:
                    directive = directive_acknowledge(
                        directive=directive, reference=reference, actor=actor
                    )
                except ValidationError as exc:
                    self.message_user(request, " ".join(exc.messages), messages.ERROR)
                    continue
                # The service keeps the first acknowledgement: one recorded meanwhile (the
                # provider's key, a colleague's submit at the same moment) is not this one.
                if (directive.acknowledged_by, directive.acknowledgement_reference) == (
                    actor,
                    reference,
                ):
                    done += 1
                else:
                    already.append(directive)
            if already:
                self.message_user(
                    request,
                    "Not recorded, already acknowledged: "
                    + "; ".join(_acknowledged_before(d) for d in already[:10])
                    + (f"; and {len(already) - 10} more" if len(already) > 10 else ""),
                    messages.WARNING,
                )
            if done or not already:
                self.message_user(request, f"Recorded {done} acknowledgement(s).", messages.SUCCESS)
            batch.tell(request)
            return None
        return action_form_page(
            self,
            request,
            queryset,
            action="acknowledge_directives",
            title="Record a provider's acknowledgement",
            form=form,
            template="admin/integrations/directive/acknowledge.html",
            directives=taken(queryset.select_related("provider"))[:200],
        )

    # The Operators', who follow directives up (the same permission as acknowledging).
    @admin.action(
        description="Write to the provider's S3 prefix again (those not written)",
        permissions=["acknowledge"],
    )
    def write_directives_again(self, request: HttpRequest, queryset: QuerySet[Directive]) -> None:
        batch = first_keys(queryset)  # each a ledger event and a job queued
        queued = directives_write_again(directives=batch.chosen, actor=staff_actor(request))
        self.message_user(
            request,
            f"Queued {queued} directive(s) to be written again; each write is a ledger event."
            if queued
            else "None of these waits to be written (downloaded by hand, or written already).",
            messages.SUCCESS if queued else messages.WARNING,
        )
        batch.tell(request)

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path(
                "<int:pk>/download/",
                view(self.download_view),
                name="integrations_directive_download",
            ),
            *super().get_urls(),
        ]

    def download_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """A ZIP of the CSV and its ``.sig``, exactly as stored (stored, not deflated)."""
        if request.method != "POST":  # it writes a ledger event: no link or prefetch may trigger it
            return HttpResponseNotAllowed(["POST"])
        if not self.has_view_permission(request):
            raise PermissionDenied
        directive = get_object_or_404(Directive.objects.select_related("broker"), pk=pk)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
            archive.writestr(directive.file_name, bytes(directive.content))
            archive.writestr(f"{directive.file_name}.sig", f"{directive.signature}\n")
        directive_download_record(directive=directive, actor=staff_actor(request), via="admin")
        response = HttpResponse(buffer.getvalue(), content_type="application/zip")
        name = directive.file_name.removesuffix(".csv")
        response["Content-Disposition"] = f'attachment; filename="{name}.zip"'
        return response
