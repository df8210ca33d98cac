"""Integrations and SaaS connections in the admin: every change goes through their services.

- Add a webhook integration: its Webhook Secret is shown once, right after.
- Edit name and URL; untick "enabled" to disable (queued deliveries wait), tick it to enable
  (they are queued again). A 410 from the broker disables it by itself: the list shows why.
  A disabled integration or SaaS connection is paused, still a deletion target.
- "Retire for good" (an action with a written reason) ends an integration or SaaS connection:
  its open requests are cancelled and it can never be enabled again.
- On the change page, "Regenerate secret" (the new one is shown once; the old one keeps
  verifying callbacks for 24 hours) and "Send test notification" (the broker's answer is shown
  on the page).

ISI integrations (the broker's own REST API) get their forms, their connections inline and
"Check connection" from ``admin.isi``; the list's "Add ISI integration" opens their add form.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from unfold.admin import ModelAdmin

from integrations.admin import isi as isi_admin
from integrations.admin.actors import staff_actor
from integrations.admin.credentials import Credential, WriteOnlyCredentials
from integrations.admin.display import uuid_short
from integrations.admin.integration_kinds import ADD_KIND_PARAMETER, Created, KindPages
from integrations.admin.shown_once import SecretShownOnce, show_once
from integrations.dispatch import webhook
from integrations.drop.calendar import drop_time_text
from integrations.models import Integration, IntegrationKind, RequestState, SaasConnection
from integrations.services.integrations import (
    integration_disable,
    integration_enable,
    integration_retire,
    integration_secret_rotate,
    integration_test_send,
    integration_update,
    webhook_integration_create,
)
from integrations.services.saas import (
    categories_validate,
    saas_connection_create,
    saas_connection_disable,
    saas_connection_enable,
    saas_connection_retire,
    saas_connection_update,
)
from integrations.validators import target_url_validate


class _TargetUrlMixin:
    """The URL checked by the services' own rule (https, unless private targets are allowed)."""

    cleaned_data: dict[str, Any]

    def clean_url(self) -> str:
        url = self.cleaned_data.get("url") or ""
        if not url and not getattr(self, "url_required", True):
            return url
        try:
            return target_url_validate(url)
        except ValidationError as exc:
            raise forms.ValidationError(exc.message_dict["url"]) from None


class WebhookIntegrationAddForm(_TargetUrlMixin, forms.ModelForm):
    url = forms.URLField(
        label="URL",
        assume_scheme="https",
        max_length=500,
        help_text="Where dispatches are POSTed (https).",
    )

    class Meta:
        model = Integration
        fields = ["broker", "name", "url"]


class IntegrationChangeForm(_TargetUrlMixin, forms.ModelForm):
    url = forms.URLField(label="URL", assume_scheme="https", max_length=500, required=False)
    url_required = False  # an ISI integration has a base URL instead

    class Meta:
        model = Integration
        fields = ["name", "url", "enabled"]


class RetireForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=500,
        help_text="Why it is retired; kept with it, with each cancelled request and in the ledger.",
    )


def _retire_action(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet[Any],
    *,
    action: str,
    retire: Any,
) -> HttpResponse | None:
    """An intermediate page asks for the reason, then each selected target is retired by its
    service (``retire(target, reason, actor)``); one already retired is named, not changed."""
    form = RetireForm(request.POST if "apply" in request.POST else None)
    if form.is_valid():
        done = 0
        for target in queryset.order_by("pk"):
            try:
                retire(target, form.cleaned_data["reason"], staff_actor(request))
            except ValidationError as exc:
                modeladmin.message_user(request, _validation_text(exc), messages.ERROR)
            else:
                done += 1
        if done:
            modeladmin.message_user(
                request,
                f"Retired {done} for good: their open requests are cancelled, their work items "
                "settled on their other requests (or waiting for a target).",
            )
        return None
    opts = modeladmin.model._meta
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": f"Retire {opts.verbose_name_plural} for good",
        "form": form,
        "targets": queryset.order_by("pk")[:200],
        "count": queryset.count(),
        "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
        "select_across": request.POST.get("select_across", "0"),
        "action": action,
        "opts": opts,
    }
    return TemplateResponse(request, "admin/integrations/retire.html", context)


def _validation_text(error: ValidationError) -> str:
    if hasattr(error, "error_dict"):
        return "; ".join(f"{k}: {' '.join(v)}" for k, v in error.message_dict.items())
    return " ".join(error.messages)


def _webhook_secret_shown_once(
    integration: Integration, secret: str, title: str
) -> SecretShownOnce:
    """The page that shows a Webhook Secret once (integrations/admin/shown_once.py)."""
    change_url = reverse("admin:integrations_integration_change", args=[integration.pk])
    return SecretShownOnce(
        title=title,
        label="Webhook Secret",
        secret=secret,
        facts=[
            ("Integration", f"{integration.name} ({integration.broker.broker_id})"),
            ("integration_id", str(integration.uuid)),
            ("Dispatches go to", integration.url or integration.base_url),
            ("Deletion callbacks (PUT)", webhook.deletion_callback_url()),
            ("Resolution callbacks (PUT)", webhook.resolution_callback_url()),
        ],
        explanation=(
            "The broker's systems verify every dispatch with it and sign every callback with "
            "it (HMAC-SHA256 over '<timestamp>:<body>'). Callbacks also need an API key with "
            "the webhook_callback scope."
        ),
        guide_section="webhook-secret",
        guide_title="Webhook Secret",
        done_url=change_url,
        done_label=integration.name,
    )


def _webhook_create(request: HttpRequest, data: dict[str, Any], actor: str) -> Created:
    created = webhook_integration_create(
        broker=data["broker"], name=data["name"], url=data["url"], actor=actor
    )
    return Created(created.integration, created.webhook_secret)


def _webhook_update(integration: Integration, data: dict[str, Any], actor: str) -> None:
    integration_update(integration=integration, actor=actor, name=data["name"], url=data.get("url"))


_WEBHOOK_READONLY_FIELDS = [
    "uuid",
    "broker",
    "kind",
    "disabled_reason",
    "retired_at",
    "retired_reason",
    "callback_urls",
    "previous_secret_expires_at",
    "waiting",
    "created_at",
]

WEBHOOK_PAGES = KindPages(
    label="Webhook",
    add_form=WebhookIntegrationAddForm,
    change_form=IntegrationChangeForm,
    add_fields=["broker", "name", "url"],
    change_fields=[
        "uuid",
        "broker",
        "kind",
        "name",
        "url",
        "enabled",
        "disabled_reason",
        "retired_at",
        "retired_reason",
        "callback_urls",
        "previous_secret_expires_at",
        "waiting",
        "created_at",
    ],
    readonly_fields=_WEBHOOK_READONLY_FIELDS,
    create=_webhook_create,
    update=_webhook_update,
    secret_shown_once=_webhook_secret_shown_once,
)

# Each kind's pages; the add page takes ``?kind=`` (the webhook's when absent or unknown).
KIND_PAGES: dict[str, KindPages] = {
    IntegrationKind.WEBHOOK: WEBHOOK_PAGES,
    IntegrationKind.ISI: isi_admin.PAGES,
}


def kind_pages(request: HttpRequest, obj: Integration | None) -> KindPages:
    """The pages of ``obj``'s kind, or of the kind the add page was opened for."""
    kind = obj.kind if obj is not None else request.GET.get(ADD_KIND_PARAMETER, "")
    return KIND_PAGES.get(kind, WEBHOOK_PAGES)


@admin.register(Integration)
class IntegrationAdmin(WriteOnlyCredentials, ModelAdmin):
    credentials = [
        Credential("token", "Static bearer token", "credentials_changed_at"),
        Credential("client_secret", "Client secret", "credentials_changed_at"),
    ]
    list_display = ["name", "broker", "kind", "target", "enabled", "state", "created_at"]
    readonly_preprocess_fields = {"uuid": uuid_short}  # 8 characters, a copy button
    list_filter = ["enabled", "kind", "broker"]
    search_fields = ["name", "url", "base_url"]
    list_select_related = ["broker"]
    actions = ["disable_integrations", "retire_integrations"]
    change_form_template = "admin/integrations/integration/change_form.html"
    change_list_template = "admin/integrations/integration/change_list.html"

    @admin.display(description="URL")
    def target(self, obj: Integration) -> str:
        return obj.url or obj.base_url

    @admin.display(description="state")
    def state(self, obj: Integration) -> str:
        """One column for why it is not sending (a list must fit 1280 pixels)."""
        if obj.retired_at is not None:
            return f"retired: {obj.retired_reason}"
        return "" if obj.enabled else f"paused: {obj.disabled_reason}"

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any):
        pages = kind_pages(request, obj)
        kwargs["form"] = pages.change_form if obj else pages.add_form
        return super().get_form(request, obj, change=change, **kwargs)

    def get_inlines(self, request: HttpRequest, obj: Any) -> list[Any]:
        return list(kind_pages(request, obj).inlines) if obj is not None else []

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        pages = kind_pages(request, obj)
        return list(pages.change_fields if obj is not None else pages.add_fields)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        if obj is None:
            return []
        own = kind_pages(request, obj).readonly_fields
        return [*super().get_readonly_fields(request, obj), *own]

    @admin.display(description="Callback URLs given to the broker")
    def callback_urls(self, obj: Integration) -> str:
        return format_html(
            "{}<br>{}", webhook.deletion_callback_url(), webhook.resolution_callback_url()
        )

    @admin.display(description="Deliveries waiting")
    def waiting(self, obj: Integration) -> str:
        queued = obj.deletion_requests.filter(state=RequestState.QUEUED).count()
        undeliverable = obj.deletion_requests.filter(state=RequestState.UNDELIVERABLE).count()
        return f"{queued} queued, {undeliverable} undeliverable deletion requests"

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # requests and the ledger refer to it for good: disable it instead

    def save_model(self, request: HttpRequest, obj: Integration, form: Any, change: bool) -> None:
        actor = staff_actor(request)
        data = form.cleaned_data
        try:
            if not change:
                created = kind_pages(request, None).create(request, data, actor)
                obj.pk, obj.uuid = created.integration.pk, created.integration.uuid
                obj.created_secret = created.webhook_secret  # type: ignore[attr-defined]
                return
            current = Integration.objects.get(pk=obj.pk)
            # One edit, one integration.updated event: the name goes with the kind's settings.
            kind_pages(request, current).update(current, data, actor)
            if data["enabled"] and not current.enabled:
                queued = integration_enable(integration=current, actor=actor)
                messages.info(request, f"Enabled; {queued} waiting request(s) queued.")
            elif not data["enabled"] and current.enabled:
                integration_disable(integration=current, reason="disabled by staff", actor=actor)
        except ValidationError as exc:
            # Form validation ran already; this is a rule of the service (https only, ...).
            messages.error(request, _validation_text(exc))
            raise _Refused from exc

    def response_add(
        self, request: HttpRequest, obj: Integration, post_url_continue: str | None = None
    ) -> HttpResponse:
        secret = getattr(obj, "created_secret", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        pages = kind_pages(request, None)
        created = Integration.objects.select_related("broker").get(pk=obj.pk)
        return show_once(
            request, pages.secret_shown_once(created, secret, f"{pages.label} integration created")
        )

    def add_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().add_view(request, *args, **kwargs)
        except _Refused:
            return HttpResponseRedirect(request.get_full_path())

    def change_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().change_view(request, *args, **kwargs)
        except _Refused:
            return HttpResponseRedirect(request.get_full_path())

    @admin.action(description="Disable selected integrations", permissions=["change"])
    def disable_integrations(self, request: HttpRequest, queryset: QuerySet[Integration]) -> None:
        done = 0
        for integration in queryset.filter(enabled=True):
            integration_disable(
                integration=integration, reason="disabled by staff", actor=staff_actor(request)
            )
            done += 1
        self.message_user(request, f"Disabled {done} integration(s); their deliveries wait.")

    @admin.action(description="Retire selected integrations for good (with a reason)",
                  permissions=["change"])  # fmt: skip
    def retire_integrations(
        self, request: HttpRequest, queryset: QuerySet[Integration]
    ) -> HttpResponse | None:
        return _retire_action(
            self,
            request,
            queryset,
            action="retire_integrations",
            retire=lambda target, reason, actor: integration_retire(
                integration=target, reason=reason, actor=actor
            ),
        )

    # -- buttons on the change page ----------------------------------------------------------

    def get_urls(self) -> list[Any]:
        own = [
            path(
                "<int:pk>/rotate-secret/",
                self.admin_site.admin_view(self.rotate_secret_view),
                name="integrations_integration_rotate_secret",
            ),
            path(
                "<int:pk>/test-notification/",
                self.admin_site.admin_view(self.test_notification_view),
                name="integrations_integration_test_notification",
            ),
            path(
                "<int:pk>/check-connection/",
                self.admin_site.admin_view(self.check_connection_view),
                name="integrations_integration_check_connection",
            ),
        ]
        return own + super().get_urls()

    def _posted_integration(self, request: HttpRequest, pk: int) -> Integration:
        integration = get_object_or_404(Integration.objects.select_related("broker"), pk=pk)
        if request.method != "POST" or not self.has_change_permission(request, integration):
            raise PermissionDenied
        return integration

    def rotate_secret_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        integration = self._posted_integration(request, pk)
        secret = integration_secret_rotate(integration=integration, actor=staff_actor(request))
        pages = kind_pages(request, integration)
        shown = pages.secret_shown_once(integration, secret, "Webhook Secret regenerated")
        expires_at = integration.previous_secret_expires_at
        assert expires_at is not None  # the rotation just set it
        return show_once(
            request,
            dataclasses.replace(
                shown,
                explanation=f"{shown.explanation} The previous secret keeps verifying callbacks "
                f"until {drop_time_text(expires_at)}.",
            ),
        )

    def test_notification_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        integration = self._posted_integration(request, pk)
        result = integration_test_send(integration=integration, actor=staff_actor(request))
        answer = result.response_body[:500] or "(empty body)"
        if result.status is not None and 200 <= result.status < 300 and not result.error:
            messages.success(
                request,
                f"Test notification to {result.url}: HTTP {result.status} in "
                f"{result.duration_ms} ms. The broker answered: {answer}",
            )
        else:
            got = f"HTTP {result.status}" if result.status is not None else "no answer"
            messages.error(
                request,
                f"Test notification to {result.url} failed: {got}"
                f"{f' ({result.error})' if result.error else ''} after {result.duration_ms} ms."
                + (f" The broker answered: {answer}" if result.status is not None else ""),
            )
        return HttpResponseRedirect(reverse("admin:integrations_integration_change", args=[pk]))

    def check_connection_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """ISI: list the broker's connections again; its answer is shown on the page."""
        integration = self._posted_integration(request, pk)
        isi_admin.connection_check(request, integration)
        return HttpResponseRedirect(reverse("admin:integrations_integration_change", args=[pk]))


class _Refused(Exception):
    """A service refused the form's data; the message is already queued for staff."""


class SaasConnectionForm(_TargetUrlMixin, forms.ModelForm):
    url = forms.URLField(label="URL", assume_scheme="https", max_length=500)
    token = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Sent as 'Authorization: Bearer <token>'. Stored encrypted and never shown; "
        "leave empty to keep the current one (a new URL clears it unless entered again).",
    )
    categories = forms.CharField(
        initial="email",
        help_text="Comma-separated identifier categories it deletes by (email, phone, ...).",
    )

    class Meta:
        model = SaasConnection
        fields = ["broker", "name", "url", "enabled"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["categories"].initial = ", ".join(self.instance.identifier_categories)

    def clean_categories(self) -> list[str]:
        try:
            return categories_validate(self.cleaned_data["categories"].split(","))
        except ValidationError as exc:
            raise forms.ValidationError(exc.message_dict["categories"]) from None


@admin.register(SaasConnection)
class SaasConnectionAdmin(WriteOnlyCredentials, ModelAdmin):
    form = SaasConnectionForm
    credentials = [Credential("token", "Token", "token_changed_at")]
    list_display = [
        "name",
        "broker",
        "url",
        "categories",
        "enabled",
        "disabled_reason",
        "retired_at",
    ]
    list_filter = ["enabled", "broker"]
    search_fields = ["name", "url"]
    list_select_related = ["broker"]
    actions = ["disable_connections", "retire_connections"]

    @admin.display(description="Categories")
    def categories(self, obj: SaasConnection) -> str:
        return ", ".join(obj.identifier_categories)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        own = ["broker", "disabled_reason", "retired_at", "retired_reason"] if obj else []
        return [*own, *super().get_readonly_fields(request, obj)]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = ["broker", "name", "url", "token", "categories", "enabled"]
        return [*fields, "disabled_reason", "retired_at", "retired_reason"] if obj else fields

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(
        self, request: HttpRequest, obj: SaasConnection, form: Any, change: bool
    ) -> None:
        actor = staff_actor(request)
        data = form.cleaned_data
        categories = data["categories"]
        try:
            if not change:
                created = saas_connection_create(
                    broker=data["broker"],
                    name=data["name"],
                    url=data["url"],
                    token=data.get("token") or "",
                    categories=categories,
                    actor=actor,
                )
                obj.pk = created.pk
                if not data["enabled"]:
                    saas_connection_disable(
                        connection=created, reason="added disabled", actor=actor
                    )
                return
            current = SaasConnection.objects.get(pk=obj.pk)
            updated = saas_connection_update(
                connection=current,
                actor=actor,
                name=data["name"],
                url=data["url"],
                token=data.get("token") or None,
                categories=categories,
            )
            if current.token and not updated.token:
                messages.warning(
                    request,
                    "The token was cleared: it is never sent to a URL it was not entered for. "
                    "Enter it again.",
                )
            if data["enabled"] and not current.enabled:
                saas_connection_enable(connection=current, actor=actor)
            elif not data["enabled"] and current.enabled:
                saas_connection_disable(connection=current, reason="disabled by staff", actor=actor)
        except ValidationError as exc:
            messages.error(request, _validation_text(exc))
            raise _Refused from exc

    def add_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().add_view(request, *args, **kwargs)
        except _Refused:
            return HttpResponseRedirect(request.get_full_path())

    def change_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().change_view(request, *args, **kwargs)
        except _Refused:
            return HttpResponseRedirect(request.get_full_path())

    @admin.action(description="Disable selected SaaS connections", permissions=["change"])
    def disable_connections(self, request: HttpRequest, queryset: QuerySet[SaasConnection]) -> None:
        done = 0
        for connection in queryset.filter(enabled=True):
            saas_connection_disable(
                connection=connection, reason="disabled by staff", actor=staff_actor(request)
            )
            done += 1
        self.message_user(request, f"Disabled {done} SaaS connection(s).")

    @admin.action(description="Retire selected SaaS connections for good (with a reason)",
                  permissions=["change"])  # fmt: skip
    def retire_connections(
        self, request: HttpRequest, queryset: QuerySet[SaasConnection]
    ) -> HttpResponse | None:
        return _retire_action(
            self,
            request,
            queryset,
            action="retire_connections",
            retire=lambda target, reason, actor: saas_connection_retire(
                connection=target, reason=reason, actor=actor
            ),
        )
